// Softmax fusion: the elementwise ops that produce a softmax's input (scale, mask add,
// masked_fill, casts: any elementwise tree) and a cast of its result run inside the softmax
// kernel, as one kFusion node whose body ends in the softmax:
//
//   %5 = fusion kiln_fused_mul_scalar_masked_fill_softmax_0(%3, %4) : bf16[8, 16, 1024, 1024] {
//     graph(%0: bf16[8, 16, 1024, 1024], %1: bool[1024, 1024]) {
//       %2 = mul_scalar(%0) {scalar=0.125} : bf16[8, 16, 1024, 1024]
//       %3 = masked_fill(%2, %1) {scalar=-inf} : bf16[8, 16, 1024, 1024]
//       %4 = softmax(%3) {dim=-1} : bf16[8, 16, 1024, 1024]
//       return %4
//     }
//   }
//
// Rules (refusals go to the explain log, prefixed "softmax fusion: "):
// - only a softmax over the last dim (rank 1 up to the family's max_rank) is a root;
// - its prologue grows backwards by the elementwise fusion's rules (passes/fusion_groups.h):
// producers
//   of the softmax's shape, floating/bool, used only by the chain, not graph outputs (the
//   softmax skeleton stores one value), within the kernel operand budget; inputs may broadcast,
//   like a [S, S] mask against [B, H, S, S] scores;
// - the softmax's single consumer is absorbed when it is a cast to a floating dtype (and the
//   softmax is not a graph output);
// - a softmax with nothing to absorb stays a plain op (its eager kernel is as good).
// Runs before elementwise fusion, which then leaves these fusions alone; does nothing when the
// family is disabled. Requires a verified graph; guarantees each new body is elementwise ops, a
// last-dim softmax, at most one cast after it (the body shape the family's template verifies and
// its skeleton, fused_softmax_cuda.h, compiles).
#pragma once

#include "passes/kernel_family.h"

namespace kiln::passes {

class SoftmaxFusion : public FamilyPass {
 public:
  using FamilyPass::FamilyPass;
  const char* name() const override { return "softmax-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

// A softmax over the last dim of a tensor of rank >= 1: the op a softmax body ends in (before an
// optional cast), and the one the attention pattern looks for.
bool IsLastDimSoftmax(const ir::Node& n);

}  // namespace kiln::passes
