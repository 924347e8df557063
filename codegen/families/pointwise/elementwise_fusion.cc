// The pointwise family's pass (see elementwise_fusion.h).
#include "codegen/families/pointwise/elementwise_fusion.h"

#include "absl/strings/str_cat.h"
#include "codegen/families/pointwise/horizontal_fusion.h"
#include "passes/fusion_groups.h"

namespace kiln::passes {
namespace {

// Whether `v` may root a group: an elementwise op, or a cat whose kernel stores its operands
// (refused cats are logged).
bool CanRoot(const ir::Graph& g, ir::ValueId v, const FusionGroups& grp, PassContext& ctx) {
  if (Unfusable(g, v, grp.limits).empty()) return true;
  if (!IsCatRoot(g, v)) return false;
  const std::string why = CatRootRefusal(g, v, grp.limits);
  if (!why.empty()) {
    ctx.explain.push_back(absl::StrCat(grp.log_prefix, "cat %", v,
                                       " stays a kernel of its own (its producers do not store "
                                       "into it): ",
                                       why));
  }
  return why.empty();
}

// Groups rooted at each value not yet grouped, from the last value backwards.
void FindGroups(const ir::Graph& g, FusionGroups& grp, PassContext& ctx) {
  for (ir::ValueId v = g.num_values() - 1; v >= 0; --v) {
    if (grp.group_of[v] != -1 || !CanRoot(g, v, grp, ctx)) continue;
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
  const bool grouped = RewriteFusionGroups(graph, grp);
  return CombineSmallFusions(graph, family_, ctx) || grouped;
}

}  // namespace kiln::passes
