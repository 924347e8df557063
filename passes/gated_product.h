// The gated product of a GLU MLP (GeGLU, SwiGLU, ReGLU) in a graph: a mul of an activation of one
// half of a linear's last dim and the other half,
//
//   %2 = linear(%0, %1) : bf16[1, 16384]            (gate and up merged, GEMM merge)
//   %3 = slice(%2) {dim=-1, start=0, end=8192}       up
//   %4 = slice(%2) {dim=-1, start=8192, end=16384}   gate
//   %5 = silu(%4)
//   %6 = mul(%5, %3)
//
// or of an activation of one linear and another linear of the same x and weight shape (the
// gate_proj and up_proj of transformers' MLPs, unmerged: GEMM merge joins them only for frozen
// weights),
//
//   %3 = linear(%0, %1) : bf16[1, 8192]   gate
//   %4 = linear(%0, %2) : bf16[1, 8192]   up
//   %5 = silu(%3)
//   %6 = mul(%5, %4)
//
// matched at the mul, either operand order, either half the gate. Kernel families that compute
// the product from the linear's sums (the gemm family's GeGLU GEMM, the norm-linear family's gated
// GEMV) match it here and add their own rules (which activations, who else uses the values).
#pragma once

#include <optional>
#include <string>

#include "ir/graph.h"

namespace kiln::passes {

// Rows at most of a product the GEMV computes (ops/cuda/gemv_limits.h kGemvMaxRows; the norm-linear
// family checks they agree): passes decide with it whether a product is a decode step's.
inline constexpr int64_t kGatedGemvMaxRows = 8;

struct GatedProductMatch {
  ir::ValueId linear = -1, gate = -1, up = -1, act = -1, mul = -1;
  bool gate_first = false;  // the gate is the linear's first half
  // Two linears: `linear` and `gate` are the gate's linear, `up` the up's (no slices).
  bool two_linears() const { return gate == linear; }
};

// The pattern rooted at mul `v` with a relu, gelu (either approximation) or silu as the
// activation, or nullopt. `why` (when given) receives the reason a mul of an activation is not
// one; a value that is no mul of an activation leaves it empty. The linear must have no epilogue
// and the product the gate's type.
std::optional<GatedProductMatch> MatchGatedProduct(const ir::Graph& g, ir::ValueId v,
                                                   std::string* why);

// Whether the product's rows are static and at most kGatedGemvMaxRows (a decode step's): the
// norm-linear family's gated GEMV serves it, so other families leave its parts alone.
bool HasGatedGemvRows(const ir::Graph& g, const GatedProductMatch& m);

// The gated product's values that only its own ops may use (the slices, the activation and the
// linear, whose users must be exactly the two slices; or the two linears and the activation): ""
// when none has another user or is a graph output, else which one. `users` and `is_output` as
// FusionGroups computes them.
std::string GatedProductFanOut(const GatedProductMatch& m,
                               const std::vector<std::vector<ir::ValueId>>& users,
                               const std::vector<bool>& is_output);

}  // namespace kiln::passes
