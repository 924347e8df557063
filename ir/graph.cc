// Graph construction and maintenance (see graph.h).
#include "ir/graph.h"

#include "ops/dispatch.h"
#include "runtime/status.h"

namespace kiln::ir {

ValueId Graph::AddNode(Node node) {
  nodes_.push_back(std::move(node));
  return static_cast<ValueId>(nodes_.size() - 1);
}

ValueId Graph::AddCopy(const Node& n, absl::Span<const ValueId> map) {
  if (n.kind == NodeKind::kInput) return AddInput(n.type, n.name);
  Node copy = n;
  for (ValueId& in : copy.inputs) in = map[in];
  return AddNode(std::move(copy));
}

void Graph::SetOutputsFrom(const Graph& from, absl::Span<const ValueId> map) {
  std::vector<ValueId> outs;
  for (ValueId v : from.outputs()) outs.push_back(map[v]);
  SetOutputs(std::move(outs));
  input_updates_ = from.input_updates();
}

ValueId Graph::AddInput(TensorType type, std::string name) {
  Node n;
  n.kind = NodeKind::kInput;
  n.type = std::move(type);
  n.name = std::move(name);
  const ValueId v = AddNode(std::move(n));
  inputs_.push_back(v);
  return v;
}

ValueId Graph::AddConstant(Tensor value, std::string name) {
  Node n;
  n.kind = NodeKind::kConstant;
  n.type = value.type();
  n.constant = std::move(value);
  n.name = std::move(name);
  return AddNode(std::move(n));
}

ValueId Graph::AddOp(OpId op, absl::Span<const ValueId> inputs, const OpAttrs& attrs) {
  absl::InlinedVector<TensorType, 3> types;
  for (ValueId v : inputs) types.push_back(type(v));
  return AddOpWithType(op, inputs, attrs, InferTypesOrThrow(GetOpDef(op), types, attrs));
}

ValueId Graph::AddOpWithType(OpId op, absl::Span<const ValueId> inputs, const OpAttrs& attrs,
                             TensorType type) {
  Node n;
  n.op = op;
  n.inputs.assign(inputs.begin(), inputs.end());
  n.attrs = attrs;
  n.type = std::move(type);
  return AddNode(std::move(n));
}

ValueId Graph::AddResult(ValueId fusion, int index) {
  Node n;
  n.kind = NodeKind::kResult;
  n.inputs = {fusion};
  n.index = index;
  const Graph& body = *nodes_[fusion].body;
  n.type = body.type(body.outputs()[index]);
  return AddNode(std::move(n));
}

std::vector<std::vector<ValueId>> Graph::Users() const {
  std::vector<std::vector<ValueId>> users(nodes_.size());
  for (ValueId v = 0; v < num_values(); ++v) {
    for (ValueId in : nodes_[v].inputs) users[in].push_back(v);
  }
  return users;
}

std::vector<int> Graph::UseCounts() const {
  std::vector<int> uses(nodes_.size(), 0);
  for (const Node& n : nodes_) {
    for (ValueId v : n.inputs) ++uses[v];
  }
  for (ValueId v : outputs_) ++uses[v];
  return uses;
}

std::vector<ValueId> Graph::Compact(const std::vector<bool>& keep) {
  std::vector<ValueId> remap(nodes_.size(), -1);
  std::vector<Node> kept;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!keep[i] && nodes_[i].kind != NodeKind::kInput) continue;
    Node n = std::move(nodes_[i]);
    for (ValueId& v : n.inputs) v = remap[v];
    remap[i] = static_cast<ValueId>(kept.size());
    kept.push_back(std::move(n));
  }
  nodes_ = std::move(kept);
  for (ValueId& v : inputs_) v = remap[v];
  for (ValueId& v : outputs_) v = remap[v];
  return remap;
}

void NameConstants(Graph* graph, absl::Span<const std::pair<std::string, Tensor>> names) {
  if (names.empty()) return;
  for (Node& n : graph->mutable_nodes()) {
    if (n.kind != NodeKind::kConstant || !n.constant.defined()) continue;
    const Tensor& c = n.constant;
    const std::string* view_of = nullptr;
    for (const auto& [name, t] : names) {
      if (!t.defined() || t.storage() != c.storage()) continue;
      if (t.offset() == c.offset() && t.shape() == c.shape() && t.strides() == c.strides()) {
        n.name = name;
        view_of = nullptr;
        break;
      }
      if (view_of == nullptr) view_of = &name;
    }
    if (view_of != nullptr) n.name = *view_of + " (view)";
  }
}

const char* ShortDTypeName(DType t) {
  static constexpr const char* kNames[] = {"f32", "f16", "bf16", "bool", "i32", "i64"};
  return kNames[static_cast<int>(t)];
}

}  // namespace kiln::ir
