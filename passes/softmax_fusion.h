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
// - only a softmax over the last dim (rank 1..8) is a root; others stay plain ops;
// - its prologue grows backwards by the elementwise fusion's rules (passes/fusion.h): producers
//   of the softmax's shape, floating/bool, used only by the chain, not graph outputs (the
//   softmax skeleton stores one value), within the kernel operand budget; inputs may broadcast,
//   like a [S, S] mask against [B, H, S, S] scores;
// - the softmax's single consumer is absorbed when it is a cast to a floating dtype (and the
//   softmax is not a graph output);
// - a softmax with nothing to absorb stays a plain op (its eager kernel is as good).
// Runs before elementwise fusion, which then leaves these fusions alone. Requires a verified
// graph; guarantees each new body is elementwise ops, a last-dim softmax, at most one cast after
// it (the body shape ir/verifier.h accepts and codegen/fused_softmax.h compiles).
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

class SoftmaxFusion : public Pass {
 public:
  const char* name() const override { return "softmax-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

}  // namespace kiln::passes
