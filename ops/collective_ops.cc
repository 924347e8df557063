// The collectives as registry ops (see distributed.h and collective_ops.h): the table of live
// process groups the ops name by id (and GroupRef's lookup in it), the rows' inference and
// kernel, the public functions, and ProcessGroup's torch.distributed-style forms over them.
#include "ops/collective_ops.h"

#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "ops/dispatch.h"
#include "ops/distributed.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {
namespace {

struct GroupTable {
  std::mutex mu;
  std::unordered_map<int64_t, ProcessGroup*> live;
  int64_t next_id = 1;
};

GroupTable& Groups() {
  static auto* table = new GroupTable();  // never destroyed: groups may outlive static teardown
  return *table;
}

}  // namespace

ProcessGroup::ProcessGroup() {
  GroupTable& t = Groups();
  std::lock_guard<std::mutex> lock(t.mu);
  id_ = t.next_id++;
  t.live[id_] = this;
}

ProcessGroup::~ProcessGroup() {
  GroupTable& t = Groups();
  std::lock_guard<std::mutex> lock(t.mu);
  t.live.erase(id_);
}

ProcessGroup* FindProcessGroup(int64_t id) {
  GroupTable& t = Groups();
  std::lock_guard<std::mutex> lock(t.mu);
  const auto it = t.live.find(id);
  return it == t.live.end() ? nullptr : it->second;
}

ProcessGroup& GroupRef::get(const char* who) const {
  KILN_CHECK(defined(), who, ": not split over a process group");
  ProcessGroup* group = FindProcessGroup(id_);
  KILN_CHECK(group != nullptr, who, ": the process group it was split over (id ", id_, ", ", world_,
             " ranks) no longer exists; a split model must not outlive its group");
  return *group;
}

void ProcessGroup::all_reduce(Tensor& t, ReduceOp op) { copy_(t, kiln::all_reduce(t, *this, op)); }

Tensor ProcessGroup::all_gather(const Tensor& t) { return kiln::all_gather(t, *this); }

Tensor ProcessGroup::reduce_scatter(const Tensor& t, ReduceOp op) {
  return kiln::reduce_scatter(t, *this, op);
}

void ProcessGroup::broadcast(Tensor& t, int src) { copy_(t, kiln::broadcast(t, *this, src)); }

namespace {

OpAttrs CollectiveAttrs(const ProcessGroup& group, ReduceOp op = ReduceOp::kSum, int src = 0) {
  OpAttrs a;
  a.group = group.id();
  a.reduce = op;
  a.src = src;
  return a;
}

}  // namespace

Tensor all_reduce(const Tensor& t, ProcessGroup& group, ReduceOp op) {
  return Dispatch(OpId::kAllReduce, {t}, CollectiveAttrs(group, op));
}

Tensor all_gather(const Tensor& t, ProcessGroup& group) {
  return Dispatch(OpId::kAllGather, {t}, CollectiveAttrs(group));
}

Tensor reduce_scatter(const Tensor& t, ProcessGroup& group, ReduceOp op) {
  return Dispatch(OpId::kReduceScatter, {t}, CollectiveAttrs(group, op));
}

Tensor broadcast(const Tensor& t, ProcessGroup& group, int src) {
  return Dispatch(OpId::kBroadcast, {t}, CollectiveAttrs(group, ReduceOp::kSum, src));
}

namespace collective {
namespace {

using Result = absl::StatusOr<TensorType>;

absl::Status Invalid(std::string msg) { return absl::InvalidArgumentError(std::move(msg)); }

// The attributes' group, or why there is none.
absl::StatusOr<ProcessGroup*> GroupOf(const OpAttrs& a) {
  ProcessGroup* g = FindProcessGroup(a.group);
  if (g == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "process group ", a.group,
        " does not exist (destroyed, or never made in this process: a compiled function or an IR "
        "text names the group it was traced with)"));
  }
  return g;
}

absl::StatusOr<int> WorldOf(const OpAttrs& a) {
  KILN_ASSIGN_OR_RETURN(const ProcessGroup* g, GroupOf(a));
  return g->world_size();
}

absl::Status RequireReducible(const TensorType& t) {
  if (t.dtype == DType::kBool) {
    return Invalid(
        "a reduction over the ranks does not take bool tensors (cast to an integer "
        "dtype)");
  }
  return absl::OkStatus();
}

}  // namespace

Result InferAllReduce(absl::Span<const TensorType> in, const OpAttrs& a) {
  KILN_RETURN_IF_ERROR(WorldOf(a).status());
  KILN_RETURN_IF_ERROR(RequireReducible(in[0]));
  return in[0];
}

Result InferAllGather(absl::Span<const TensorType> in, const OpAttrs& a) {
  KILN_ASSIGN_OR_RETURN(const int world, WorldOf(a));
  if (in[0].rank() == 0) return Invalid("all_gather needs a tensor of rank >= 1 (dim 0 grows)");
  TensorType out = in[0];
  out.shape[0] *= world;
  return out;
}

Result InferReduceScatter(absl::Span<const TensorType> in, const OpAttrs& a) {
  KILN_ASSIGN_OR_RETURN(const int world, WorldOf(a));
  KILN_RETURN_IF_ERROR(RequireReducible(in[0]));
  if (in[0].rank() == 0 || in[0].shape[0] % world != 0) {
    return Invalid(absl::StrCat("dim 0 of ", ShapeString(in[0].shape),
                                " must be a multiple of the world size ", world));
  }
  TensorType out = in[0];
  out.shape[0] /= world;
  return out;
}

Result InferBroadcast(absl::Span<const TensorType> in, const OpAttrs& a) {
  KILN_ASSIGN_OR_RETURN(const int world, WorldOf(a));
  if (a.src < 0 || a.src >= world) {
    return Invalid(absl::StrCat("source rank ", a.src, " is not in 0..", world - 1));
  }
  return in[0];
}

void Run(const OpDef& def, absl::Span<const Tensor> inputs, const Tensor& out,
         const OpAttrs& attrs) {
  ProcessGroup* group = ValueOrThrow(GroupOf(attrs));  // inference found it; still there?
  switch (def.id) {
    case OpId::kAllReduce:
      return group->AllReduceInto(inputs[0], out, attrs.reduce);
    case OpId::kAllGather:
      return group->AllGatherInto(inputs[0], out);
    case OpId::kReduceScatter:
      return group->ReduceScatterInto(inputs[0], out, attrs.reduce);
    case OpId::kBroadcast:
      return group->BroadcastInto(inputs[0], out, static_cast<int>(attrs.src));
    default:
      KILN_FAIL(def.name, ": not a collective");
  }
}

}  // namespace collective
}  // namespace kiln
