// DCE, CSE and constant folding (see simplify.h).
#include "passes/simplify.h"

#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "ir/printer.h"
#include "ops/dispatch.h"
#include "runtime/status.h"

namespace kiln::passes {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;

void ReplaceAllUses(Graph& graph, ValueId from, ValueId to) {
  for (Node& n : graph.mutable_nodes()) {
    for (ValueId& v : n.inputs) {
      if (v == from) v = to;
    }
  }
  for (ValueId& v : graph.mutable_outputs()) {
    if (v == from) v = to;
  }
}

absl::StatusOr<bool> DeadCodeElimination::Run(Graph& graph, PassContext&) {
  std::vector<bool> live(graph.num_values(), false);
  for (ValueId v : graph.outputs()) live[v] = true;
  // A collective runs whether or not this rank uses its result: the other ranks wait for it.
  for (ValueId v = 0; v < graph.num_values(); ++v) {
    const Node& n = graph.node(v);
    if (n.kind == NodeKind::kOp && GetOpDef(n.op).collective) live[v] = true;
  }
  for (ValueId v = graph.num_values() - 1; v >= 0; --v) {
    if (!live[v]) continue;
    for (ValueId in : graph.node(v).inputs) live[in] = true;
  }
  int dead = 0;
  for (ValueId v = 0; v < graph.num_values(); ++v) {
    dead += !live[v] && graph.node(v).kind != NodeKind::kInput;
  }
  if (dead == 0) return false;
  graph.Compact(live);
  return true;
}

namespace {

// Per value: whether a graph output's storage is its own (the value is an output, or views lead
// from it to one).
std::vector<bool> OutputStorage(const Graph& graph) {
  std::vector<bool> out(graph.num_values(), false);
  for (ValueId v : graph.outputs()) out[v] = true;
  for (ValueId v = graph.num_values() - 1; v >= 0; --v) {
    const Node& n = graph.node(v);
    if (out[v] && n.kind == NodeKind::kOp && GetOpDef(n.op).view != nullptr && !n.inputs.empty()) {
      out[n.inputs[0]] = true;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<bool> CommonSubexpressionElimination::Run(Graph& graph, PassContext&) {
  // Two values that are (or are viewed by) outputs stay apart: eager returns two tensors, and a
  // write into one must not show in the other.
  const std::vector<bool> output_storage = OutputStorage(graph);
  // Key: op, inputs, printed attributes (covers exactly the fields the row reads).
  std::map<std::tuple<int, std::vector<ValueId>, std::string>, ValueId> seen;
  bool changed = false;
  for (ValueId v = 0; v < graph.num_values(); ++v) {
    const Node& n = graph.node(v);
    // Two calls of a collective are two exchanges, as in eager: another rank may pass them
    // different tensors, so they are never merged.
    if (n.kind != NodeKind::kOp || GetOpDef(n.op).collective) continue;
    const auto key = std::make_tuple(static_cast<int>(n.op),
                                     std::vector<ValueId>(n.inputs.begin(), n.inputs.end()),
                                     ir::PrintAttrs(GetOpDef(n.op), n.attrs));
    auto [it, inserted] = seen.emplace(key, v);
    if (!inserted && !(output_storage[v] && output_storage[it->second])) {
      ReplaceAllUses(graph, v, it->second);
      changed = true;
    }
  }
  return changed;
}

absl::StatusOr<bool> ConstantFolding::Run(Graph& graph, PassContext& ctx) {
  bool changed = false;
  for (ValueId v = 0; v < graph.num_values(); ++v) {
    Node& n = graph.mutable_node(v);
    if (n.kind != NodeKind::kOp || GetOpDef(n.op).kind == FusionKind::kMatmul) continue;
    if (GetOpDef(n.op).collective) continue;  // talks to the other ranks: only when the plan runs
    std::vector<Tensor> args;
    for (ValueId in : n.inputs) {
      const Node& p = graph.node(in);
      if (p.kind != NodeKind::kConstant || !p.constant.defined()) break;
      if (!p.local && !ctx.fold_constants) break;  // the user's tensor: read at call time
      args.push_back(p.constant);
    }
    if (args.size() != n.inputs.size()) continue;
    try {
      Tensor value = Dispatch(n.op, args, n.attrs);
      n.kind = NodeKind::kConstant;
      n.constant = value;
      n.local = true;  // the folded value is the plan's own
      n.name = absl::StrCat("folded_", GetOpDef(n.op).name, "_", v);
      n.inputs.clear();
      changed = true;
    } catch (const Error& e) {
      return absl::Status(e.code(), absl::StrCat("constant folding %", v, ": ", e.what()));
    }
  }
  return changed;
}

}  // namespace kiln::passes
