// Softmax fusion (see softmax_fusion.h): roots at last-dim softmaxes, prologues grown with the
// elementwise fusion's group machinery, an optional cast consumer appended.
#include "codegen/families/softmax/softmax_fusion.h"

#include "absl/strings/str_cat.h"
#include "passes/fusion_groups.h"

namespace kiln::passes {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;

namespace {

constexpr char kLog[] = "softmax fusion: ";

std::string OpName(const Graph& g, ValueId v) {
  const Node& n = g.node(v);
  return n.kind == NodeKind::kOp ? GetOpDef(n.op).name : "value";
}

// Why softmax `v` cannot end a softmax fusion ("" if it can).
std::string RootRefusal(const Graph& g, ValueId v, const FamilyLimits& limits) {
  const Node& n = g.node(v);
  if (!IsLastDimSoftmax(n)) {
    return n.type.rank() == 0 ? "a 0-d softmax"
                              : absl::StrCat("over dim ", n.attrs.dim, " of ",
                                             ShapeString(n.type.shape), ", not the last dim");
  }
  if (n.type.rank() > limits.max_rank) return absl::StrCat("rank above ", limits.max_rank);
  return "";
}

// The consumer of softmax `s` that its fusion absorbs: its only user, a cast to a floating
// dtype; -1 if there is none. Logs why an elementwise consumer stays outside.
ValueId CastConsumer(const Graph& g, ValueId s, const FusionGroups& grp, PassContext& ctx) {
  const std::vector<ValueId>& users = grp.users[s];
  bool elementwise_user = false;
  for (ValueId u : users) {
    elementwise_user |= g.node(u).kind == NodeKind::kOp && GetOpDef(g.node(u).op).is_elementwise();
  }
  if (!elementwise_user) return -1;  // a boundary anyway (matmul, view, ...)
  auto refuse = [&](ValueId u, const std::string& why) {
    ctx.explain.push_back(absl::StrCat(kLog, "not fused: %", u, " (", OpName(g, u),
                                       ") after the softmax %", s, ": ", why));
    return ValueId{-1};
  };
  const ValueId u = users.front();
  if (grp.is_output[s]) return refuse(u, "the softmax is a graph output (materialised)");
  if (users.size() > 1)
    return refuse(u, absl::StrCat("fan-out: the softmax has ", users.size(), " users"));
  if (g.node(u).op != OpId::kCast) return refuse(u, "only a cast is fused after a softmax");
  if (!IsFloatingPoint(g.type(u).dtype)) return refuse(u, "cast to a non-floating dtype");
  if (grp.group_of[u] != -1) return -1;
  return u;
}

}  // namespace

bool IsLastDimSoftmax(const Node& n) {
  if (n.kind != NodeKind::kOp || n.op != OpId::kSoftmax) return false;
  const int64_t rank = n.type.rank();
  return rank >= 1 && (n.attrs.dim == -1 || n.attrs.dim == rank - 1);
}

absl::StatusOr<bool> SoftmaxFusion::Run(Graph& graph, PassContext& ctx) {
  if (!ctx.Enabled(family_.name())) return false;
  FusionGroups grp(graph, {});
  grp.log_prefix = kLog;
  grp.multi_output = false;  // the softmax skeleton stores the softmax only
  for (ValueId v = 0; v < graph.num_values(); ++v) {
    const Node& n = graph.node(v);
    if (n.kind != NodeKind::kOp || n.op != OpId::kSoftmax) continue;
    grp.limits = family_.Limits(n.type.device);
    if (const std::string why = RootRefusal(graph, v, grp.limits); !why.empty()) {
      ctx.explain.push_back(absl::StrCat(kLog, "%", v, " (softmax) stays alone: ", why));
      continue;
    }
    const int gid = static_cast<int>(grp.groups.size());
    grp.groups.push_back({v});
    grp.group_of[v] = gid;
    GrowFusionGroup(graph, v, grp, ctx);
    if (const ValueId cast = CastConsumer(graph, v, grp, ctx); cast >= 0) {
      grp.groups[gid].push_back(cast);  // after the softmax: members stay in id order
      grp.group_of[cast] = gid;
    }
  }
  return RewriteFusionGroups(graph, grp);
}

}  // namespace kiln::passes
