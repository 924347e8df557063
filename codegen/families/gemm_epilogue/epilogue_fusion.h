// GEMM epilogue fusion, two rules:
// - linear(x, w[, b]) whose only user is relu, or gelu{approximate=tanh}, becomes one
//   linear{epilogue=relu | gelu_tanh}: cuBLASLt applies bias and activation in the GEMM's
//   epilogue (CPU: the same scalar function, applied before the store), saving the activation's
//   kernel and a round trip of the GEMM's output through memory;
// - linear(x, w[, b]) whose only user adds it to a value r of its own type (a residual,
//   `h = x + proj(y)`) becomes linear(x, w[, b], r){epilogue=add}: r is the GEMM's C with
//   beta = 1 (the GEMV adds it in its store), saving the add's kernel and two passes over the sum.
//
// Rules (each refusal of a pair is written to the explain log with its reason):
// - the activation or add is the linear's only user, the linear is not a graph output (its value
//   would still be needed) and has no epilogue yet;
// - gelu must be the tanh approximation: cuBLASLt's GELU epilogue is tanh, so erf GELU stays in
//   an elementwise kernel;
// - the activation's type equals the linear's (always true for float linears; checked anyway);
// - the residual has exactly the linear's type (no broadcast, no cast: C is read as D is
//   written), is not the linear itself, and is computed before it (the linear reads it).
// Requires a verified graph; run after canonicalisation (which turns matmul + bias into linear)
// and GEMM merge (which only merges linears without an epilogue), before elementwise fusion.
// Does nothing when the family is disabled. Guarantees types and order are kept: the activation's
// or add's uses read the linear instead, and it is left dead for DCE.
#pragma once

#include "passes/kernel_family.h"

namespace kiln::passes {

class GemmEpilogueFusion : public FamilyPass {
 public:
  using FamilyPass::FamilyPass;
  const char* name() const override { return "gemm-epilogue-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

}  // namespace kiln::passes
