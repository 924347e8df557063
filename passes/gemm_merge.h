// GEMM merge: linear(x, w_i) ops without bias or epilogue that share x, with constant weights of
// one dtype and in-features, become one linear over the weights concatenated once at compile
// time, followed by slices (views) of its output (the GeGLU gate/up projections). Only when
// PassContext::merge_gemms, and only over frozen weights (PassContext::fold_constants: the
// concatenation is a copy); with weights read at each call the explain log says which linears
// would have merged and why they did not.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

class GemmMerge : public Pass {
 public:
  const char* name() const override { return "gemm-merge"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

}  // namespace kiln::passes
