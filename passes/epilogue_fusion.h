// GEMM epilogue fusion: linear(x, w[, b]) whose only user is relu, or gelu{approximate=tanh},
// becomes one linear{epilogue=relu | gelu_tanh}: cuBLASLt applies bias and activation in the
// GEMM's epilogue (CPU: the same scalar function, applied before the store), saving the
// activation's kernel and a round trip of the GEMM's output through memory.
//
// Rules (each refusal of a linear -> relu/gelu pair is written to the explain log with its
// reason):
// - the activation is the linear's only user, the linear is not a graph output (its
//   pre-activation value would still be needed) and has no epilogue yet;
// - gelu must be the tanh approximation: cuBLASLt's GELU epilogue is tanh, so erf GELU stays in
//   an elementwise kernel;
// - the activation's type equals the linear's (always true for float linears; checked anyway).
// Requires a verified graph; run after canonicalisation (which turns matmul + bias into linear)
// and GEMM merge (which only merges linears without an epilogue), before elementwise fusion.
// Guarantees types and order are kept: the activation's uses read the linear instead, and the
// activation is left dead for DCE.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

class GemmEpilogueFusion : public Pass {
 public:
  const char* name() const override { return "gemm-epilogue-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

}  // namespace kiln::passes
