// Elementwise fusion: maximal trees of elementwise ops (with broadcasting inputs, casts and
// scalars) become one kFusion node whose body codegen turns into a single kernel.
//
// Rules (each refusal is written to the explain log with its reason):
// - a group grows from its last op backwards through producers that are elementwise, produce
//   the group's output shape, have floating/bool dtypes and are used only inside the group
//   (a producer with outside users or that is a graph output materialises: no recompute);
// - a group reads at most 3 distinct external values (the CUDA skeleton's limit);
// - groups of one op stay plain ops (their eager kernel is the same kernel).
// Requires a verified graph; guarantees every fusion body holds elementwise ops only.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

class ElementwiseFusion : public Pass {
 public:
  const char* name() const override { return "elementwise-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

// GEMM merge: linear(x, w_i) ops without bias or epilogue that share x, with constant weights of
// one dtype and in-features, become one linear over the weights concatenated once at compile
// time, followed by slices (views) of its output (the GeGLU gate/up projections).
class GemmMerge : public Pass {
 public:
  const char* name() const override { return "gemm-merge"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

}  // namespace kiln::passes
