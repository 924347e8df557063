// Canonicalisation: rewrites written as data (a list of pattern -> replacement rules, run by
// one driver to a fixed point, like tinygrad's PatternMatcher). Rules:
// - transpose-into-flags: matmul(transpose(a, -2, -1), b) -> matmul(a, b) {transpose_a}, and
//   the same for b: the GEMM reads the operand in place instead of through a view;
// - matmul-to-linear: add(matmul(x, transpose(w)), b) with a 2-D weight and a 1-D bias of the
//   output width -> linear(x, w, b) (one GEMM with the bias in its epilogue); the matmul must
//   have no other user. add(b, matmul(...)) too;
// - scatter-reads-copy-source: as_strided_scatter(base, copy(view, src)) ->
//   as_strided_scatter(base, src) when the copy keeps src's shape and dtype (a traced write
//   through a view, `copy_(slice(cache, 2, 0, t), k)`, then reads k in place).
// Requires a verified graph; keeps types and order (nodes are rewritten in place), leaves the
// replaced producers dead for DCE.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

class Canonicalize : public Pass {
 public:
  const char* name() const override { return "canonicalize"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

}  // namespace kiln::passes
