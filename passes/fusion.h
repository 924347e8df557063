// Elementwise fusion: maximal trees of elementwise ops (with broadcasting inputs, casts and
// scalars) become one kFusion node whose body codegen turns into a single kernel.
//
// Rules (each refusal is written to the explain log with its reason):
// - a group grows from its last op backwards through producers that are elementwise, produce
//   the group's output shape and have floating/bool dtypes;
// - a producer that is also used outside the group, or is a graph output, joins the group as a
//   further output (multi-output fusion: the kernel stores it once, `result` nodes hand it to
//   its other users) unless one of those users leads back into the group (a cycle); it is
//   neither materialised by a kernel of its own nor recomputed;
// - a group has at most cuda_ops::kMaxKernelOperands inputs plus outputs (the kernel-parameter
//   budget of the generated skeletons);
// - groups of one op stay plain ops (their eager kernel is the same kernel).
// Requires a verified graph; guarantees every fusion body holds elementwise ops only, returns
// the group's root first and then its further outputs, and keeps the graph topologically
// ordered (a group's other users move after it).
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
  bool multi_output = true;  // producers used outside join as further outputs (else refused)
};

// Why `v` cannot be an elementwise fusion member at all ("" if it can).
std::string Unfusable(const ir::Graph& g, ir::ValueId v);
// Grows the group of `root` (already in groups) backwards to a fixed point by the rules above;
// logs each refusal once.
void GrowFusionGroup(const ir::Graph& g, ir::ValueId root, FusionGroups& groups, PassContext& ctx);
// Replaces each group of two or more members by one kFusion node (body: the external inputs,
// then the members; outputs: the root, then each member used outside the group, reached through
// result nodes), named kiln_fused_<ops>_<n>, placed where its inputs are ready; nodes that use
// its further outputs follow it. Returns whether it changed the graph.
bool RewriteFusionGroups(ir::Graph& graph, const FusionGroups& groups);

}  // namespace kiln::passes
