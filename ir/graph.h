// The graph IR of kiln: a small SSA graph whose nodes are registry ops.
//
// Every node defines exactly one value; a value's id is its node's index, and nodes are kept in
// topological order (a node only uses values defined before it). Besides op nodes there are
// graph inputs, constants (existing tensors such as weights, referred to, not copied) and fusion
// nodes, whose body is a subgraph that codegen turns into one kernel: elementwise ops, or
// elementwise ops ending in a last-dim softmax and at most one cast after it (a softmax fusion).
//
// Text form (prints and parses back, see printer.h):
//   graph(%0: bfloat16[8192, 768]) {
//     %1 = constant "gate.weight" : bfloat16[3072, 768]
//     %2 = linear(%0, %1) : bfloat16[8192, 3072]
//     %3 = gelu(%2) {approximate=tanh} : bfloat16[8192, 3072]
//     return %3
//   }
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "ops/op_def.h"

namespace kiln::ir {

using ValueId = int32_t;

enum class NodeKind : uint8_t { kInput, kConstant, kOp, kFusion };

class Graph;

struct Node {
  NodeKind kind = NodeKind::kOp;
  OpId op = OpId::kNumOps;  // kOp only
  absl::InlinedVector<ValueId, 3> inputs;
  OpAttrs attrs;
  TensorType type;
  std::string name;             // inputs/constants: a label; fusions: the kernel name
  Tensor constant;              // kConstant: the referenced tensor
  std::shared_ptr<Graph> body;  // kFusion: the body's inputs are this node's inputs in order,
                                // its single output is this node's value
};

class Graph {
 public:
  ValueId AddInput(TensorType type, std::string name = "");
  ValueId AddConstant(Tensor value, std::string name = "");
  // Infers the type with the op's registry Infer; throws kiln::Error on bad input.
  ValueId AddOp(OpId op, absl::Span<const ValueId> inputs, const OpAttrs& attrs = {});
  // Adds an op whose type is already known (parser, passes); checked by the verifier.
  ValueId AddOpWithType(OpId op, absl::Span<const ValueId> inputs, const OpAttrs& attrs,
                        TensorType type);
  ValueId AddNode(Node node);
  void SetOutputs(std::vector<ValueId> outputs) { outputs_ = std::move(outputs); }

  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& mutable_nodes() { return nodes_; }
  const Node& node(ValueId v) const { return nodes_[v]; }
  Node& mutable_node(ValueId v) { return nodes_[v]; }
  const TensorType& type(ValueId v) const { return nodes_[v].type; }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  std::vector<ValueId>& mutable_outputs() { return outputs_; }
  int num_values() const { return static_cast<int>(nodes_.size()); }

  // Number of uses of each value (by nodes and by the graph outputs).
  std::vector<int> UseCounts() const;
  // The nodes using each value, in node order (graph outputs not included).
  std::vector<std::vector<ValueId>> Users() const;
  // True when `v` is an op node of kind `op`.
  bool IsOp(ValueId v, OpId op) const {
    return nodes_[v].kind == NodeKind::kOp && nodes_[v].op == op;
  }
  // Rebuilds the graph keeping only `keep` nodes (in order) and renumbering values; inputs are
  // always kept. Returns old->new ids (-1 for dropped).
  std::vector<ValueId> Compact(const std::vector<bool>& keep);

 private:
  std::vector<Node> nodes_;
  std::vector<ValueId> inputs_, outputs_;
};

// A softmax over the last dim of a tensor of rank >= 1: the op a softmax fusion's body ends in
// (before an optional cast; passes/softmax_fusion.h).
bool IsLastDimSoftmax(const Node& n);

// Short dtype names used in the text form: f32, f16, bf16, bool, i32, i64.
const char* ShortDTypeName(DType t);

}  // namespace kiln::ir
