// The graph IR of kiln: a small SSA graph whose nodes are registry ops.
//
// Every node defines exactly one value; a value's id is its node's index, and nodes are kept in
// topological order (a node only uses values defined before it). Besides op nodes there are
// graph inputs, constants (existing tensors such as weights, referred to, not copied), fusion
// nodes, whose body is a subgraph that codegen turns into one kernel (which bodies a kernel family
// accepts is the family's business: codegen/fusion_template.h), and results: a fusion whose body
// returns several values defines the first itself and each further one through a result node
// (`%7 = result %5 #1 : ...`, multi-output fusion).
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
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "ops/op_def.h"

namespace kiln::ir {

using ValueId = int32_t;

enum class NodeKind : uint8_t { kInput, kConstant, kOp, kFusion, kResult };

class Graph;

// An integer of the graph as a function of its symbolic dims (codegen/symbolic.h): offset +
// scale·s[a] (·s[b] when b >= 0), or just offset when a < 0. Views whose size attributes follow a
// symbolic dim carry one per size attribute.
struct SymInt {
  int64_t offset = 0, scale = 0;
  int a = -1, b = -1;
  bool is_constant() const { return a < 0; }
  int64_t Eval(absl::Span<const int64_t> symbols) const {
    if (a < 0) return offset;
    return offset + scale * symbols[a] * (b < 0 ? 1 : symbols[b]);
  }
  friend bool operator==(const SymInt&, const SymInt&) = default;
};

struct Node {
  NodeKind kind = NodeKind::kOp;
  OpId op = OpId::kNumOps;  // kOp only
  absl::InlinedVector<ValueId, 3> inputs;
  OpAttrs attrs;
  TensorType type;
  std::string name;               // inputs/constants: a label; fusions: the kernel name
  Tensor constant;                // kConstant: the referenced tensor
  bool local = false;             // kConstant: made while tracing and held by nothing else (a
                                  // mask built inside the function): safe to fold; others are
                                  // the user's (weights) and are read at call time
  std::shared_ptr<Graph> body;    // kFusion: the body's inputs are this node's inputs in order,
                                  // its first output is this node's value
  int index = 0;                  // kResult: which output of its fusion (inputs[0]), >= 1
  uint32_t sym_dims = 0;          // bit d: dim d of `type` is symbolic (sizes read at run time)
  std::vector<SymInt> sym_attrs;  // views with symbolic sizes: their size attributes (dims list,
                                  // or slice start and end), evaluated per call
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
  // For passes that rebuild a graph from `from`: adds a copy of node `n` of it (an input stays an
  // input) with its operands renamed through `map` (from's value id -> this graph's), and takes
  // from's outputs and input updates through `map`.
  ValueId AddCopy(const Node& n, absl::Span<const ValueId> map);
  void SetOutputsFrom(const Graph& from, absl::Span<const ValueId> map);
  void SetOutputs(std::vector<ValueId> outputs) { outputs_ = std::move(outputs); }
  // Inputs the traced function wrote in place: the last input_updates().size() outputs are their
  // new values, input_updates()[k] naming the input the k-th of them is copied back into.
  const std::vector<int>& input_updates() const { return input_updates_; }
  // The outputs the traced function returned (those before the input updates).
  size_t num_user_outputs() const { return outputs_.size() - input_updates_.size(); }
  std::vector<int>& mutable_input_updates() { return input_updates_; }

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
  // Adds `%r = result %fusion #index` typed as the body's output `index`.
  ValueId AddResult(ValueId fusion, int index);
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
  std::vector<int> input_updates_;
};

// Short dtype names used in the text form: f32, f16, bf16, bool, i32, i64.
const char* ShortDTypeName(DType t);

// Renames the graph's constants after the named tensors they are: the same storage, offset,
// shape and strides takes the name; another view of a named tensor's storage takes the name
// with " (view)". The first name of a tensor registered twice (tied weights) wins; constants
// matching no name keep theirs.
void NameConstants(Graph* graph, absl::Span<const std::pair<std::string, Tensor>> names);

}  // namespace kiln::ir
