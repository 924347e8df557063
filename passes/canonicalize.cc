// Canonicalisation rules and their driver (see canonicalize.h).
#include "passes/canonicalize.h"

#include <functional>

namespace kiln::passes {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;

namespace {

// transpose(x, d0, d1) that swaps the last two dims of x.
bool IsLastTwoTranspose(const Graph& g, ValueId v) {
  if (!g.IsOp(v, OpId::kTranspose)) return false;
  const Node& n = g.node(v);
  const int64_t rank = g.type(n.inputs[0]).rank();
  if (rank < 2) return false;
  auto wrap = [rank](int64_t d) { return d < 0 ? d + rank : d; };
  const int64_t a = wrap(n.attrs.dim), b = wrap(n.attrs.dim2);
  return std::min(a, b) == rank - 2 && std::max(a, b) == rank - 1;
}

struct Rule {
  const char* name;
  // Rewrites node `v` in place if the pattern matches; returns whether it did.
  std::function<bool(Graph&, ValueId, const std::vector<int>& uses)> apply;
};

bool FoldTransposeIntoFlags(Graph& g, ValueId v, const std::vector<int>&) {
  if (!g.IsOp(v, OpId::kMatmul)) return false;
  Node& n = g.mutable_node(v);
  for (int side = 0; side < 2; ++side) {
    bool& flag = side == 0 ? n.attrs.transpose_a : n.attrs.transpose_b;
    if (flag || !IsLastTwoTranspose(g, n.inputs[side])) continue;
    n.inputs[side] = g.node(n.inputs[side]).inputs[0];
    flag = true;
    return true;
  }
  return false;
}

bool MatmulBiasToLinear(Graph& g, ValueId v, const std::vector<int>& uses) {
  if (!g.IsOp(v, OpId::kAdd)) return false;
  Node& n = g.mutable_node(v);
  for (int side = 0; side < 2; ++side) {
    const ValueId mm = n.inputs[side], bias = n.inputs[1 - side];
    if (!g.IsOp(mm, OpId::kMatmul) || uses[mm] != 1) continue;
    const Node& m = g.node(mm);
    const TensorType& w = g.type(m.inputs[1]);
    // matmul(x, wᵀ) with w [N, K], written either as a transpose view or as the flag.
    const bool weight_t = m.attrs.transpose_b && !m.attrs.transpose_a && w.rank() == 2;
    const TensorType& b = g.type(bias);
    if (!weight_t || b.rank() != 1 || b.shape[0] != w.shape[0] || b.dtype != n.type.dtype ||
        g.type(mm).dtype != n.type.dtype || g.type(mm).shape != n.type.shape) {
      continue;
    }
    n.op = OpId::kLinear;
    n.inputs = {m.inputs[0], m.inputs[1], bias};
    n.attrs = OpAttrs{};
    return true;
  }
  return false;
}

// as_strided_scatter(base, copy(view, src)) -> as_strided_scatter(base, src) when the copy
// neither broadcasts nor converts src: the scatter reads src's values itself (any strides), so
// the traced `copy_(slice(cache, ...), k)` writes k into the cache without first materialising it.
bool ScatterReadsCopySource(Graph& g, ValueId v, const std::vector<int>&) {
  if (!g.IsOp(v, OpId::kAsStridedScatter)) return false;
  Node& n = g.mutable_node(v);
  const ValueId copy = n.inputs[1];
  if (!g.IsOp(copy, OpId::kCopy)) return false;
  const ValueId src = g.node(copy).inputs[1];
  if (!(g.type(src) == g.type(copy))) return false;
  n.inputs[1] = src;
  return true;
}

const std::vector<Rule>& Rules() {
  static const auto* rules = new std::vector<Rule>{
      {"transpose-into-flags", FoldTransposeIntoFlags},
      {"matmul-bias-to-linear", MatmulBiasToLinear},
      {"scatter-reads-copy-source", ScatterReadsCopySource},
  };
  return *rules;
}

}  // namespace

absl::StatusOr<bool> Canonicalize::Run(Graph& graph, PassContext& ctx) {
  bool changed = false;
  for (bool again = true; again;) {
    again = false;
    const std::vector<int> uses = graph.UseCounts();
    for (ValueId v = 0; v < graph.num_values() && !again; ++v) {
      for (const Rule& r : Rules()) {
        if (r.apply(graph, v, uses)) {
          ctx.explain.push_back(std::string("canonicalize: ") + r.name + " at %" +
                                std::to_string(v));
          again = changed = true;
          break;
        }
      }
    }
  }
  return changed;
}

}  // namespace kiln::passes
