// GEMM merge (see gemm_merge.h): one GEMM over concatenated weights for linears that share x.
#include "passes/gemm_merge.h"

#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "ops/factories.h"

namespace kiln::passes {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;

namespace {

// A linear without bias or epilogue on a constant 2-D weight.
bool Mergeable(const Graph& g, const Node& n) {
  return n.kind == NodeKind::kOp && n.op == OpId::kLinear && n.inputs.size() == 2 &&
         n.attrs.epilogue == Epilogue::kNone && g.node(n.inputs[1]).kind == NodeKind::kConstant &&
         g.node(n.inputs[1]).constant.defined();
}

// Concatenates weights along dim 0: a byte copy of each contiguous one into its rows (the device's
// copy kernel for a strided one).
Tensor ConcatRows(const std::vector<Tensor>& ws) {
  int64_t rows = 0;
  for (const Tensor& w : ws) rows += w.size(0);
  Tensor out = empty({rows, ws[0].size(1)}, ws[0].dtype(), ws[0].device());
  const OpDef& copy = GetOpDef(OpId::kContiguous);
  const KernelFn kernel = out.device().is_cuda() ? copy.cuda : copy.cpu;
  int64_t at = 0;
  for (const Tensor& w : ws) {
    const Tensor dst = out.as_strided(w.shape(), out.strides(), at * out.stride(0));
    if (w.is_contiguous() && w.device() == out.device() && w.dtype() == out.dtype()) {
      // a byte copy: no kernel to compile
      CopyBytes(dst.data_ptr(), dst.device(), w.data_ptr(), w.device(),
                w.numel() * w.element_size());
    } else {
      kernel(copy, {&w, 1}, dst, {});
    }
    at += w.size(0);
  }
  return out;
}

// "gate.weight+up.weight": the weights of a group's linears by their constants' names.
std::string WeightNames(const Graph& g, const std::vector<ValueId>& linears) {
  std::string names;
  for (ValueId m : linears) {
    absl::StrAppend(&names, names.empty() ? "" : "+", g.node(g.node(m).inputs[1]).name);
  }
  return names;
}

}  // namespace

absl::StatusOr<bool> GemmMerge::Run(Graph& graph, PassContext& ctx) {
  if (!ctx.merge_gemms) return false;
  // Groups: (x, weight dtype, in-features) -> linears in order.
  std::map<std::tuple<ValueId, int, int64_t>, std::vector<ValueId>> groups;
  for (ValueId v = 0; v < graph.num_values(); ++v) {
    const Node& n = graph.node(v);
    if (!Mergeable(graph, n)) continue;
    const TensorType& w = graph.type(n.inputs[1]);
    groups[{n.inputs[0], static_cast<int>(w.dtype), w.shape[1]}].push_back(v);
  }
  std::map<ValueId, const std::vector<ValueId>*> first_of;
  for (const auto& [key, members] : groups) {
    if (members.size() > 1) first_of[members.front()] = &members;
  }
  if (first_of.empty()) return false;
  if (!ctx.fold_constants) {  // the concatenation is a copy: only weights frozen at compile time
    for (const auto& [first, members] : first_of) {
      ctx.explain.push_back(absl::StrCat(
          "not merged: ", members->size(), " linears on %", graph.node(first).inputs[0], " (",
          WeightNames(graph, *members),
          "): their weights are read at each call; with "
          "CompileOptions::freeze_weights they run as one GEMM over the weights concatenated "
          "once"));
    }
    return false;
  }
  Graph out;
  std::vector<ValueId> map(graph.num_values(), -1);
  for (ValueId v = 0; v < graph.num_values(); ++v) {
    const Node& n = graph.node(v);
    if (map[v] != -1) continue;  // a merged linear, already replaced by its slice
    auto it = first_of.find(v);
    if (it == first_of.end()) {
      map[v] = out.AddCopy(n, map);
      continue;
    }
    std::vector<Tensor> weights;
    for (ValueId m : *it->second) weights.push_back(graph.node(graph.node(m).inputs[1]).constant);
    const std::string names = WeightNames(graph, *it->second);
    const ValueId w = out.AddConstant(ConcatRows(weights), absl::StrCat("merged(", names, ")"));
    out.mutable_node(w).local = true;  // the plan's own copy
    const ValueId y = out.AddOp(OpId::kLinear, {map[n.inputs[0]], w});
    int64_t at = 0;
    for (ValueId m : *it->second) {
      OpAttrs s;
      s.dim = -1;
      s.start = at;
      s.end = at += graph.type(m).shape.back();
      map[m] = out.AddOp(OpId::kSlice, {y}, s);
    }
    ctx.explain.push_back(absl::StrCat("merged ", it->second->size(), " linears on %", n.inputs[0],
                                       " into one GEMM (", names, ")"));
  }
  out.SetOutputsFrom(graph, map);
  graph = std::move(out);
  return true;
}

}  // namespace kiln::passes
