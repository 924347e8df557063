// GeGLU GEMM fusion: the merged gate/up linear of a GeGLU MLP and the `gelu_tanh(gate) * up` that
// reads its two halves become one kFusion node of the gemm family, whose kernel (on the H200)
// writes only the product: the [m, 2f] linear output never reaches memory.
//
//   %2 = linear(%0, %1) : bf16[8192, 6144]                  (after GEMM merge, %1 [6144, 768])
//   %3 = slice(%2) {dim=-1, start=0, end=3072} ...           up
//   %4 = slice(%2) {dim=-1, start=3072, end=6144} ...        gate
//   %5 = gelu(%4) {approximate=tanh}
//   %6 = mul(%5, %3)
// becomes
//   %3 = fusion kiln_fused_linear_slice_slice_gelu_mul_0(%0, %1) : bf16[8192, 3072] { ... }
//
// Rules (refusals go to the explain log, prefixed "gemm fusion: "): the mul's operands are a
// tanh GELU of one half of the linear's last dim and the other half (either order, either half
// the gate); the linear has no epilogue and only those two slices as users, each slice and the
// GELU have one user, none is a graph output; with PassContext::gated_gemv, more than 8 rows (a
// decode step's at most 8 would run the linear and an elementwise kernel anyway, and after a norm
// the norm-linear family's gated GEMV takes the product); the family takes the operands (CUDA,
// bf16/f16, k and f multiples of 8: RejectsOperands). Runs before elementwise fusion. Does nothing
// when the family is disabled.
#pragma once

#include <optional>
#include <string>

#include "passes/gated_product.h"
#include "passes/kernel_family.h"

namespace kiln::passes {

class GegluGemmFusion : public FamilyPass {
 public:
  using FamilyPass::FamilyPass;
  const char* name() const override { return "gemm-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

// The GeGLU pattern rooted at mul `v` (passes/gated_product.h with a tanh GELU: the kernel's
// epilogue), or nullopt. `why` (when given) receives the reason a mul of an activation is not one.
using GegluMatch = GatedProductMatch;
std::optional<GegluMatch> MatchGeglu(const ir::Graph& g, ir::ValueId v, std::string* why);

}  // namespace kiln::passes
