// The tracer (see tracer.h): a DispatchHook that records into a Graph.
#include "ir/tracer.h"

#include <map>
#include <tuple>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "ops/dispatch.h"
#include "runtime/status.h"

namespace kiln::ir {
namespace {

Tensor MakePlaceholder(const TensorType& type) {
  // Storage of 0 bytes on Meta: no memory, a unique identity; the handle claims the real device.
  auto storage = std::make_shared<Storage>(0, kMeta);
  return Tensor(std::move(storage), 0, type.shape, ContiguousStrides(type.shape), type.dtype,
                type.device);
}

class Tracer final : public DispatchHook {
 public:
  explicit Tracer(Graph* graph) : graph_(graph) {}

  Tensor AddInput(const Tensor& example, int index) {
    KILN_CHECK(example.defined(), "compiled function: input ", index,
               " is an undefined tensor (Tensor())");
    const ValueId v = graph_->AddInput(example.type(), absl::StrCat("input", index));
    Tensor p = MakePlaceholder(example.type());
    values_[p.storage().get()] = v;
    return p;
  }

  ValueId ValueOf(const Tensor& t) {
    KILN_CHECK(t.defined(), "trace: an undefined tensor was used as an op input");
    if (auto it = values_.find(t.storage().get()); it != values_.end()) return it->second;
    KILN_CHECK(t.data_ptr() != nullptr || t.numel() == 0, "trace: tensor ", Describe(t.type()),
               " holds no data and was not produced inside the traced function");
    const auto key = std::make_tuple(t.storage().get(), t.offset(), t.shape(), t.strides());
    if (auto it = constants_.find(key); it != constants_.end()) return it->second;
    const ValueId v = graph_->AddConstant(t, absl::StrCat("const", constants_.size()));
    constants_.emplace(key, v);
    return v;
  }

  Tensor Record(const OpDef& def, absl::Span<const Tensor> inputs, const OpAttrs& attrs,
                bool in_place) override {
    absl::InlinedVector<ValueId, 3> ids;
    for (const Tensor& t : inputs) ids.push_back(ValueOf(t));
    const ValueId v = graph_->AddOp(def.id, ids, attrs);
    if (in_place) {
      KILN_CHECK(graph_->type(v).shape == inputs[0].shape(), def.name, "_: in-place result shape ",
                 ShapeString(graph_->type(v).shape), " differs from self's ",
                 inputs[0].shape_string());
      values_[inputs[0].storage().get()] = v;
      return inputs[0];
    }
    Tensor p = MakePlaceholder(graph_->type(v));
    values_[p.storage().get()] = v;
    return p;
  }

 private:
  Graph* graph_;
  std::unordered_map<const Storage*, ValueId> values_;
  std::map<std::tuple<const Storage*, int64_t, Shape, Strides>, ValueId> constants_;
};

}  // namespace

bool IsPlaceholder(const Tensor& t) {
  return t.defined() && t.storage() != nullptr && t.storage()->device().is_meta() &&
         !t.device().is_meta();
}

absl::StatusOr<Graph> Trace(const TensorFn& fn, const std::vector<Tensor>& examples) {
  Graph graph;
  Tracer tracer(&graph);
  try {
    std::vector<Tensor> placeholders;
    for (size_t i = 0; i < examples.size(); ++i) {
      placeholders.push_back(tracer.AddInput(examples[i], static_cast<int>(i)));
    }
    std::vector<Tensor> outs;
    {
      ScopedDispatchHook scope(&tracer);
      outs = fn(placeholders);
    }
    std::vector<ValueId> out_ids;
    for (const Tensor& t : outs) out_ids.push_back(tracer.ValueOf(t));
    graph.SetOutputs(std::move(out_ids));
  } catch (const Error& e) {
    return absl::Status(e.code(), absl::StrCat("while tracing: ", e.what()));
  }
  return graph;
}

}  // namespace kiln::ir
