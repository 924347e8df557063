// The executable plan (see executable.h).
#include "codegen/executable.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "codegen/epilogue_choice.h"
#include "codegen/fused_kernel.h"
#include "codegen/fused_softmax.h"
#include "codegen/launch_count.h"
#include "ops/dispatch.h"
#include "ops/views.h"
#include "profiler/host.h"
#include "runtime/status.h"

namespace kiln::codegen {

using ir::Node;
using ir::NodeKind;
using ir::ValueId;

absl::StatusOr<std::unique_ptr<Executable>> Executable::Build(ir::Graph graph) {
  std::unique_ptr<Executable> e(new Executable(std::move(graph)));
  KILN_RETURN_IF_ERROR(e->Prepare());
  return e;
}

absl::Status Executable::Prepare() {
  std::vector<size_t> fusions;
  for (ValueId v = 0; v < graph_.num_values(); ++v) {
    const Node& n = graph_.node(v);
    if (n.kind == NodeKind::kInput || n.kind == NodeKind::kConstant) continue;
    const bool view = n.kind == NodeKind::kOp && GetOpDef(n.op).view != nullptr;
    steps_.push_back({v, !view, {}});
    steps_.back().softmax_fusion = n.kind == NodeKind::kFusion && SoftmaxOfFusion(*n.body) >= 0;
    if (n.kind == NodeKind::kOp && n.op == OpId::kLinear && n.attrs.epilogue != Epilogue::kNone) {
      const EpilogueChoice c = ChooseEpilogue(graph_, n);
      steps_.back().split_epilogue = !c.fused;
      if (!c.explain.empty()) epilogue_choices_.push_back(c.explain);
    }
    if (n.kind == NodeKind::kFusion && n.type.device.is_cuda())
      fusions.push_back(steps_.size() - 1);
  }
  CountLaunches();
  // Liveness: the last step reading each intermediate releases it (never inputs, constants or
  // graph outputs).
  std::vector<int> last(graph_.num_values(), -1);
  for (size_t i = 0; i < steps_.size(); ++i) {
    for (ValueId in : graph_.node(steps_[i].value).inputs) last[in] = static_cast<int>(i);
  }
  // A view keeps its base's storage alive: the base lives as long as its last view.
  std::vector<bool>& pinned = pinned_;  // outputs and what they view
  pinned.assign(graph_.num_values(), false);
  for (ValueId v : graph_.outputs()) pinned[v] = true;
  for (ValueId v = graph_.num_values() - 1; v >= 0; --v) {
    const Node& n = graph_.node(v);
    if (n.kind != NodeKind::kOp || GetOpDef(n.op).view == nullptr) continue;
    last[n.inputs[0]] = std::max(last[n.inputs[0]], last[v]);
    pinned[n.inputs[0]] = pinned[n.inputs[0]] || pinned[v];
  }
  for (ValueId v = 0; v < graph_.num_values(); ++v) {
    if (pinned[v]) last[v] = -1;
  }
  for (ValueId v = 0; v < graph_.num_values(); ++v) {
    const NodeKind k = graph_.node(v).kind;
    if (last[v] >= 0 && k != NodeKind::kInput && k != NodeKind::kConstant) {
      steps_[last[v]].last_uses.push_back(v);
    }
  }
  PlanMemory();
  // Compile the distinct fused kernels in parallel threads.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<absl::Status> status(fusions.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < fusions.size(); ++i) {
    threads.emplace_back([&, i] {
      Step& s = steps_[fusions[i]];
      const Node& n = graph_.node(s.value);
      try {
        if (s.softmax_fusion) {
          s.softmax = CompileSoftmaxFusion(n);
        } else {
          s.cuda = cuda_ops::CompileElementwiseKernels(n.name, FusionExpression(*n.body),
                                                       FusionInputTypes(*n.body), n.type.dtype);
        }
      } catch (const Error& e) {
        status[i] = e.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  nvrtc_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (const absl::Status& s : status) KILN_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

namespace {

// Strides each value has when the plan runs on contiguous inputs, as Meta tensors (no memory):
// op and fusion outputs are fresh contiguous tensors, constants keep their own strides, views
// follow their input. A reshape whose input cannot be viewed that way is a copy: `copies`.
std::vector<Tensor> PlanLayouts(const ir::Graph& g, std::vector<bool>* copies) {
  std::vector<Tensor> layout(g.num_values());
  copies->assign(g.num_values(), false);
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const Node& n = g.node(v);
    const Tensor fresh = Tensor::Empty(n.type.shape, n.type.dtype, kMeta);
    layout[v] = fresh;
    if (n.kind == NodeKind::kConstant) {
      layout[v] = fresh.as_strided(n.constant.shape(), n.constant.strides(), 0);
    } else if (n.kind == NodeKind::kOp && GetOpDef(n.op).view != nullptr) {
      const Tensor& in = layout[n.inputs[0]];
      if (n.op != OpId::kReshape) {
        layout[v] = GetOpDef(n.op).view(in, n.type, n.attrs);
      } else if (auto s = views::ViewStrides(in, n.type.shape)) {
        layout[v] = in.as_strided(n.type.shape, *s, in.offset());
      } else {
        (*copies)[v] = true;
      }
    }
  }
  return layout;
}

// A CUDA tensor with `layout`'s shape and strides (contents undefined), or the constant itself.
Tensor Placeholder(const Node& n, const Tensor& layout) {
  if (n.kind == NodeKind::kConstant) return n.constant;
  int64_t extent = 1;
  for (int64_t d = 0; d < layout.dim(); ++d)
    extent += (layout.shape()[d] - 1) * layout.strides()[d];
  if (layout.numel() == 0) extent = 0;
  const Tensor base = Tensor::Empty({layout.offset() + extent}, n.type.dtype, n.type.device);
  return base.as_strided(layout.shape(), layout.strides(), layout.offset());
}

}  // namespace

// Copying reshapes launch a kernel; on CUDA each cuBLASLt call is captured once to count what it
// launches besides the GEMM (launch_count.h).
void Executable::CountLaunches() {
  std::vector<bool> copies;
  const std::vector<Tensor> layout = PlanLayouts(graph_, &copies);
  for (Step& s : steps_) {
    const Node& n = graph_.node(s.value);
    if (copies[s.value]) s.launches_kernel = true;
    const bool gemm = n.kind == NodeKind::kOp && (n.op == OpId::kMatmul || n.op == OpId::kLinear);
    if (!gemm || !n.type.device.is_cuda()) continue;
    std::vector<Tensor> args;
    for (ValueId in : n.inputs) args.push_back(Placeholder(graph_.node(in), layout[in]));
    OpAttrs attrs = n.attrs;
    if (s.split_epilogue) attrs.epilogue = Epilogue::kNone;
    const LaunchCount c = CountLaunchesOnce(n.op, args, attrs);
    s.extra_kernels = c.kernels - 1;
    s.memsets = c.memsets;
  }
}

void Executable::PlanMemory() {
  auto owned_bytes = [&](ValueId v) -> int64_t {
    const Node& n = graph_.node(v);
    const bool view = n.kind == NodeKind::kOp && GetOpDef(n.op).view != nullptr;
    if (view || pinned_[v]) return 0;
    return n.type.numel() * DTypeSize(n.type.dtype);
  };
  int64_t live = 0;
  for (const Step& s : steps_) {
    live += owned_bytes(s.value);
    total_intermediate_bytes_ += owned_bytes(s.value);
    planned_peak_bytes_ = std::max(planned_peak_bytes_, live);
    for (ValueId dead : s.last_uses) live -= owned_bytes(dead);
  }
}

namespace {

void RunSoftmaxFusion(const Step& s, const Node& n, absl::Span<const Tensor> args,
                      const Tensor& out) {
  if (n.type.device.is_cuda()) {
    cuda_ops::LaunchFusedSoftmax(s.softmax, args, out);
  } else {
    EvaluateSoftmaxFusionOnCpu(*n.body, args, out);
  }
}

}  // namespace

std::vector<Tensor> Executable::Run(const std::vector<Tensor>& inputs) const {
  std::vector<Tensor> env(graph_.num_values());
  for (size_t i = 0; i < graph_.inputs().size(); ++i) env[graph_.inputs()[i]] = inputs[i];
  for (ValueId v = 0; v < graph_.num_values(); ++v) {
    if (graph_.node(v).kind == NodeKind::kConstant) env[v] = graph_.node(v).constant;
  }
  absl::InlinedVector<Tensor, 8> args;
  for (const Step& s : steps_) {
    const Node& n = graph_.node(s.value);
    args.clear();
    for (ValueId in : n.inputs) args.push_back(env[in]);
    if (s.split_epilogue) {  // measured: GEMM, then the activation kernel
      OpAttrs plain = n.attrs, act_attrs;
      plain.epilogue = Epilogue::kNone;
      const OpDef* act = EpilogueActivation(n.attrs.epilogue, &act_attrs);
      env[s.value] = Dispatch(act->id, {Dispatch(n.op, args, plain)}, act_attrs);
      for (ValueId dead : s.last_uses) env[dead] = Tensor();
      continue;
    }
    if (n.kind == NodeKind::kOp) {
      env[s.value] = Dispatch(n.op, args, n.attrs);
      for (ValueId dead : s.last_uses) env[dead] = Tensor();
      continue;
    }
    std::optional<profiler::OpRange> range;  // a fused kernel is one op to the profiler
    if (KILN_PREDICT_FALSE(profiler::IsActive())) range.emplace(profiler::Intern(n.name), args);
    Tensor out = Tensor::Empty(n.type);
    if (out.numel() > 0) {
      if (s.softmax_fusion) {
        RunSoftmaxFusion(s, n, args, out);
      } else if (n.type.device.is_cuda()) {
        cuda_ops::LaunchElementwise(s.cuda, args, out);
      } else {
        EvaluateFusionOnCpu(*n.body, args, out);
      }
    }
    env[s.value] = std::move(out);
    for (ValueId dead : s.last_uses) env[dead] = Tensor();
  }
  std::vector<Tensor> outs;
  for (ValueId v : graph_.outputs()) outs.push_back(env[v]);
  return outs;
}

bool Executable::on_cuda() const {
  for (ValueId v : graph_.inputs()) {
    if (!graph_.node(v).type.device.is_cuda()) return false;
  }
  for (ValueId v : graph_.outputs()) {
    if (!graph_.node(v).type.device.is_cuda()) return false;
  }
  return !graph_.outputs().empty();
}

int Executable::kernels_per_step() const {
  int k = 0;
  for (const Step& s : steps_) k += s.launches_kernel + s.split_epilogue + s.extra_kernels;
  return k;
}

int Executable::memsets_per_step() const {
  int k = 0;
  for (const Step& s : steps_) k += s.memsets;
  return k;
}

int Executable::fused_kernels() const {
  int k = 0;
  for (const Step& s : steps_) k += graph_.node(s.value).kind == NodeKind::kFusion;
  return k;
}

}  // namespace kiln::codegen
