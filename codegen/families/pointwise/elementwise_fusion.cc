// The pointwise family's pass (see elementwise_fusion.h).
#include "codegen/families/pointwise/elementwise_fusion.h"

#include "passes/fusion_groups.h"

namespace kiln::passes {
namespace {

// Groups rooted at each value not yet grouped, from the last value backwards.
void FindGroups(const ir::Graph& g, FusionGroups& grp, PassContext& ctx) {
  for (ir::ValueId v = g.num_values() - 1; v >= 0; --v) {
    if (grp.group_of[v] != -1 || !Unfusable(g, v, grp.limits).empty()) continue;
    grp.groups.push_back({v});
    grp.group_of[v] = static_cast<int>(grp.groups.size()) - 1;
    GrowFusionGroup(g, v, grp, ctx);
  }
}

// The device the graph computes on (its first op's), for the family's limits.
Device GraphDevice(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes()) {
    if (n.kind == ir::NodeKind::kOp) return n.type.device;
  }
  return kCPU;
}

}  // namespace

absl::StatusOr<bool> ElementwiseFusion::Run(ir::Graph& graph, PassContext& ctx) {
  if (!ctx.Enabled(family_.name())) return false;
  FusionGroups grp(graph, family_.Limits(GraphDevice(graph)));
  grp.multi_output = ctx.multi_output;
  FindGroups(graph, grp, ctx);
  return RewriteFusionGroups(graph, grp);
}

}  // namespace kiln::passes
