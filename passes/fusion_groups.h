// Fusion groups: the machinery the elementwise-style families share (the pointwise family's pass,
// codegen/families/pointwise/elementwise_fusion.h, and the softmax family's prologue,
// codegen/families/softmax/softmax_fusion.h). A group grows from its root backwards through
// elementwise producers by these rules (each refusal is written to the explain log):
// - a member is elementwise, produces the group's output shape, has a floating/bool dtype and a
//   rank within the family's limits;
// - a producer that is also used outside the group, or is a graph output, joins it as a further
//   output (multi-output fusion: the kernel stores it once, `result` nodes hand it to its other
//   users) unless one of those users leads back into the group (a cycle), or multi-output is off;
// - a group has at most the family's max_operands inputs plus outputs (FamilyLimits).
// A cat whose operands share one shape may root a group too (CatRootRefusal; the pointwise
// family's pass asks): its members have that shape, and the kernel stores each operand into its
// slice of the cat's result, as Inductor lays a concat's producers out in the result, so the
// cat costs no kernel of its own (RoPE's cat of its rotated halves).
// The rewrite replaces each group of two or more members by one kFusion node and keeps the graph
// topologically ordered (a group's other users move after it).
#pragma once

#include <string>
#include <vector>

#include "passes/kernel_family.h"
#include "passes/pass.h"

namespace kiln::passes {

// Groups of values being fused: members in increasing id order, the last one the root.
struct FusionGroups {
  FusionGroups(const ir::Graph& g, const FamilyLimits& limits);
  std::vector<int> group_of;                     // value -> group id or -1
  std::vector<std::vector<ir::ValueId>> groups;  // members; last = root
  std::vector<std::vector<ir::ValueId>> users;   // value -> its consumers
  std::vector<bool> is_output;                   // graph outputs
  std::string log_prefix;                        // prefixes this pass's explain lines
  bool multi_output = true;  // producers used outside join as further outputs (else refused)
  FamilyLimits limits;       // of the family whose kernels the groups become
};

// Which values depend on any of `roots` (the roots included): a group that reads one of them
// while holding a root would sit on a cycle through its own output.
std::vector<bool> DependentsOf(const ir::Graph& g, const std::vector<ir::ValueId>& roots);

// Whether %s is slice [start, end) of %src's last dim, step 1 (an end past the dim, which the
// slice clamps, counts as the dim's end). The patterns' halves of a row (GLU, RoPE).
bool IsLastDimSlice(const ir::Graph& g, ir::ValueId s, ir::ValueId src, int64_t start, int64_t end);

// Why `v` cannot be an elementwise fusion member at all ("" if it can).
std::string Unfusable(const ir::Graph& g, ir::ValueId v, const FamilyLimits& limits);
// Why the cat `v` cannot root a group ("" if it can): it must be a cat of operands of one shape
// and of its dtype (no promotion), floating or bool, within the family's rank,
// whose operands fit the kernel's stores.
std::string CatRootRefusal(const ir::Graph& g, ir::ValueId v, const FamilyLimits& limits);
// Whether `root` is a cat rooting a group (a cat reaches a group only as its root).
bool IsCatRoot(const ir::Graph& g, ir::ValueId root);
// The shape of a group's members: a cat root's operand shape, else the root's.
const Shape& GroupShape(const ir::Graph& g, ir::ValueId root);
// The independent parts of a fusion body: its ops split into connected components (joined
// through the values they pass each other, not through the body inputs they share), in the order
// of their first output. A group's body is one segment; the pointwise family's horizontal fusion
// (codegen/families/pointwise/horizontal_fusion.h) joins small independent kernels into one body
// of several, which one kernel runs one after another.
struct BodySegment {
  std::vector<ir::ValueId> ops;  // in id order
  std::vector<int> inputs;       // the body inputs it reads (indices, increasing)
  std::vector<int> outputs;      // the body outputs it computes (indices, increasing)
};
std::vector<BodySegment> BodySegments(const ir::Graph& body);
// Inputs plus stores of a segment's kernel (a cat first output: one store per part).
int SegmentOperands(const ir::Graph& body, const BodySegment& s);
// Grows the group of `root` (already in groups) backwards to a fixed point by the rules above;
// logs each refusal once.
void GrowFusionGroup(const ir::Graph& g, ir::ValueId root, FusionGroups& groups, PassContext& ctx);
// Replaces each group of two or more members by one kFusion node (body: the external inputs,
// then the members; outputs: the root, then each member used outside the group, reached through
// result nodes), named kiln_fused_<ops>_<n>, placed where its inputs are ready; nodes that use
// its further outputs follow it. Returns whether it changed the graph.
bool RewriteFusionGroups(ir::Graph& graph, const FusionGroups& groups);

}  // namespace kiln::passes
