// Elementwise fusion (see fusion.h).
#include "passes/fusion.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ops/cuda/elementwise_cuda.h"

namespace kiln::passes {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;

namespace {

// The CUDA elementwise skeleton reads at most this many inputs per kernel.
constexpr int kMaxGroupInputs = cuda_ops::kMaxElementwiseInputs;

bool FloatOrBool(DType t) { return IsFloatingPoint(t) || t == DType::kBool; }

}  // namespace

std::string Unfusable(const Graph& g, ValueId v) {
  const Node& n = g.node(v);
  if (n.kind != NodeKind::kOp) return "not an op";
  const OpDef& def = GetOpDef(n.op);
  if (!def.is_elementwise()) return absl::StrCat(FusionKindName(def.kind), " boundary");
  if (!FloatOrBool(n.type.dtype)) return "integer dtype";
  for (ValueId in : n.inputs) {
    if (!FloatOrBool(g.type(in).dtype)) return "integer operand";
  }
  if (n.type.rank() > 8) return "rank above 8";
  return "";
}

FusionGroups::FusionGroups(const Graph& g)
    : group_of(g.num_values(), -1), users(g.Users()), is_output(g.num_values(), false) {
  for (ValueId v : g.outputs()) is_output[v] = true;
}

namespace {

// External values read by a group's members.
std::vector<ValueId> ExternalInputs(const Graph& g, const std::vector<ValueId>& members,
                                    const std::vector<int>& group_of, int gid) {
  std::vector<ValueId> ext;
  for (ValueId m : members) {
    for (ValueId in : g.node(m).inputs) {
      if (group_of[in] != gid && std::find(ext.begin(), ext.end(), in) == ext.end()) {
        ext.push_back(in);
      }
    }
  }
  return ext;
}

}  // namespace

void GrowFusionGroup(const Graph& g, ValueId root, FusionGroups& grp, PassContext& ctx) {
  const int gid = grp.group_of[root];
  std::vector<ValueId>& members = grp.groups[gid];
  std::set<std::pair<ValueId, ValueId>> logged;
  for (bool grew = true; grew;) {
    grew = false;
    for (ValueId in : ExternalInputs(g, members, grp.group_of, gid)) {
      if (grp.group_of[in] != -1 || g.node(in).kind != NodeKind::kOp) continue;
      std::string why = Unfusable(g, in);
      if (why.empty() && g.type(in).shape != g.type(root).shape) {
        why = absl::StrCat("shape ", ShapeString(g.type(in).shape), " differs from the group's ",
                           ShapeString(g.type(root).shape));
      }
      if (why.empty() && grp.is_output[in]) why = "graph output (materialised)";
      for (ValueId u : grp.users[in]) {
        if (why.empty() && grp.group_of[u] != gid) why = absl::StrCat("fan-out: also used by %", u);
      }
      if (why.empty()) {
        grp.group_of[in] = gid;
        members.push_back(in);
        if (static_cast<int>(ExternalInputs(g, members, grp.group_of, gid).size()) <=
            kMaxGroupInputs) {
          grew = true;
          continue;
        }
        members.pop_back();
        grp.group_of[in] = -1;
        why = absl::StrCat("group would read more than ", kMaxGroupInputs, " inputs");
      }
      if (logged.insert({in, root}).second) {
        ctx.explain.push_back(
            absl::StrCat(grp.log_prefix, "not fused: %", in, " (",
                         g.node(in).kind == NodeKind::kOp ? GetOpDef(g.node(in).op).name : "value",
                         ") into the group of %", root, ": ", why));
      }
    }
  }
  std::sort(members.begin(), members.end());
}

namespace {

void FindGroups(const Graph& g, FusionGroups& grp, PassContext& ctx) {
  for (ValueId v = g.num_values() - 1; v >= 0; --v) {
    if (grp.group_of[v] != -1 || !Unfusable(g, v).empty()) continue;
    grp.groups.push_back({v});
    grp.group_of[v] = static_cast<int>(grp.groups.size()) - 1;
    GrowFusionGroup(g, v, grp, ctx);
  }
}

std::string KernelName(const Graph& g, const std::vector<ValueId>& members, int index) {
  std::vector<std::string> names;
  for (ValueId m : members) {
    const char* n = GetOpDef(g.node(m).op).name;
    if (names.empty() || names.back() != n) names.push_back(n);
  }
  if (names.size() > 6) names.resize(6);
  return absl::StrCat("kiln_fused_", absl::StrJoin(names, "_"), "_", index);
}

// The body graph of a group: its external inputs, then the members in order.
std::shared_ptr<Graph> BuildBody(const Graph& g, const std::vector<ValueId>& members,
                                 const std::vector<ValueId>& ext) {
  auto body = std::make_shared<Graph>();
  std::vector<ValueId> map(g.num_values(), -1);
  for (ValueId e : ext) map[e] = body->AddInput(g.type(e));
  for (ValueId m : members) {
    const Node& n = g.node(m);
    absl::InlinedVector<ValueId, 3> ins;
    for (ValueId in : n.inputs) ins.push_back(map[in]);
    map[m] = body->AddOpWithType(n.op, ins, n.attrs, n.type);
  }
  body->SetOutputs({map[members.back()]});
  return body;
}

}  // namespace

bool RewriteFusionGroups(Graph& graph, const FusionGroups& grp) {
  bool any = false;
  for (const auto& m : grp.groups) any |= m.size() > 1;
  if (!any) return false;
  Graph out;
  std::vector<ValueId> map(graph.num_values(), -1);
  int fused = 0;
  for (ValueId v = 0; v < graph.num_values(); ++v) {
    const Node& n = graph.node(v);
    const int gid = grp.group_of[v];
    const bool in_group = gid >= 0 && grp.groups[gid].size() > 1;
    if (n.kind == NodeKind::kInput) {
      map[v] = out.AddInput(n.type, n.name);
    } else if (in_group && grp.groups[gid].back() != v) {
      continue;  // a member: lives in the root's body
    } else if (in_group) {
      const auto& members = grp.groups[gid];
      const auto ext = ExternalInputs(graph, members, grp.group_of, gid);
      Node f;
      f.kind = NodeKind::kFusion;
      for (ValueId e : ext) f.inputs.push_back(map[e]);
      f.type = n.type;
      f.name = KernelName(graph, members, fused++);
      f.body = BuildBody(graph, members, ext);
      map[v] = out.AddNode(std::move(f));
    } else {
      Node copy = n;
      for (ValueId& in : copy.inputs) in = map[in];
      map[v] = out.AddNode(std::move(copy));
    }
  }
  std::vector<ValueId> outs;
  for (ValueId v : graph.outputs()) outs.push_back(map[v]);
  out.SetOutputs(std::move(outs));
  graph = std::move(out);
  return true;
}

absl::StatusOr<bool> ElementwiseFusion::Run(Graph& graph, PassContext& ctx) {
  if (!ctx.fuse_elementwise) return false;
  FusionGroups grp(graph);
  FindGroups(graph, grp, ctx);
  return RewriteFusionGroups(graph, grp);
}

}  // namespace kiln::passes
