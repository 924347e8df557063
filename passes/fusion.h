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

#include <string>
#include <vector>

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

// ---- Fusion groups, shared with the softmax fusion (passes/softmax_fusion.h) ----------------

// Groups of values being fused: members in increasing id order, the last one the root.
struct FusionGroups {
  explicit FusionGroups(const ir::Graph& g);
  std::vector<int> group_of;                     // value -> group id or -1
  std::vector<std::vector<ir::ValueId>> groups;  // members; last = root
  std::vector<std::vector<ir::ValueId>> users;   // value -> its consumers
  std::vector<bool> is_output;                   // graph outputs
  std::string log_prefix;                        // prefixes this pass's explain lines
};

// Why `v` cannot be an elementwise fusion member at all ("" if it can).
std::string Unfusable(const ir::Graph& g, ir::ValueId v);
// Grows the group of `root` (already in groups) backwards to a fixed point by the rules above;
// logs each refusal once.
void GrowFusionGroup(const ir::Graph& g, ir::ValueId root, FusionGroups& groups, PassContext& ctx);
// Replaces each group of two or more members by one kFusion node at its root (body: the
// external inputs, then the members), named kiln_fused_<ops>_<n>. Returns whether it changed
// the graph.
bool RewriteFusionGroups(ir::Graph& graph, const FusionGroups& groups);

}  // namespace kiln::passes
