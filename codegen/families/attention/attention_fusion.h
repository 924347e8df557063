// Attention fusion: attention written the naive way becomes one scaled_dot_product_attention
// node (kiln's flash kernel on CUDA, the math form on the CPU):
//
//   %s = matmul(%q, %k) {transpose_b=true}      (canonicalisation folded the transpose)
//   %t = mul_scalar(%s) {scalar=0.125}          (or div_scalar; or the scale folded into q)
//   %u = masked_fill(%t, %m) {scalar=-inf}      (a constant bool mask; or add(%t, %a), additive)
//   %p = softmax(%u) {dim=-1}
//   %o = matmul(%p, %v)
//   ->
//   %o = scaled_dot_product_attention(%q, %k, %v) {scale=0.125, is_causal=true}
//
// The scale, mask and additive terms may come in any order, each at most once; the in-place
// variants (masked_fill_, mul_) trace to the same ops. A constant mask that is exactly the causal
// pattern (true above the diagonal) becomes is_causal (the kernel skips the masked tiles); another
// constant bool mask becomes its complement (SDPA's true means "take part"); an additive mask may
// be any value. Near-misses are refused with a line in the explain log ("attention fusion: ..."):
// scores or probabilities used elsewhere, a softmax not over the last dim, a mask that is not
// constant, a fill value that is not -inf, mixed dtypes, or operands the family's kernel does not
// take (KernelFamily::RejectsOperands: kiln's flash kernel on CUDA; then the softmax fusion
// handles the chain). Does nothing when the family is disabled.
// Requires a verified, canonicalised graph; rewrites the final matmul in place (its operands are
// all defined before it) and leaves the chain dead for DCE.
#pragma once

#include "passes/kernel_family.h"

namespace kiln::passes {

class AttentionFusion : public FamilyPass {
 public:
  using FamilyPass::FamilyPass;
  const char* name() const override { return "attention-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

}  // namespace kiln::passes
