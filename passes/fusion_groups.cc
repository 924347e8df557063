// Fusion groups (see fusion_groups.h).
#include "passes/fusion_groups.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"

namespace kiln::passes {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;

namespace {

bool FloatOrBool(DType t) { return IsFloatingPoint(t) || t == DType::kBool; }

}  // namespace

bool IsLastDimSlice(const Graph& g, ValueId s, ValueId src, int64_t start, int64_t end) {
  if (!g.IsOp(s, OpId::kSlice) || g.node(s).inputs[0] != src) return false;
  const OpAttrs& a = g.node(s).attrs;
  const int64_t rank = g.type(src).rank(), dim = a.dim < 0 ? a.dim + rank : a.dim;
  const int64_t full = g.type(src).shape.back();
  return dim == rank - 1 && a.step == 1 && a.start == start &&
         (a.end == end || (end == full && a.end >= full));
}

std::string Unfusable(const Graph& g, ValueId v, const FamilyLimits& limits) {
  const Node& n = g.node(v);
  if (n.kind != NodeKind::kOp) return "not an op";
  const OpDef& def = GetOpDef(n.op);
  if (!def.is_elementwise()) return absl::StrCat(FusionKindName(def.kind), " boundary");
  if (!FloatOrBool(n.type.dtype)) return "integer dtype";
  for (ValueId in : n.inputs) {
    if (!FloatOrBool(g.type(in).dtype)) return "integer operand";
  }
  if (n.type.rank() > limits.max_rank) return absl::StrCat("rank above ", limits.max_rank);
  return "";
}

bool IsCatRoot(const Graph& g, ValueId root) {
  const Node& n = g.node(root);
  return n.kind == NodeKind::kOp && n.op == OpId::kCat;
}

std::string CatRootRefusal(const Graph& g, ValueId v, const FamilyLimits& limits) {
  if (!IsCatRoot(g, v)) return "not a cat";
  const Node& n = g.node(v);
  if (!FloatOrBool(n.type.dtype)) return "integer dtype";
  if (n.type.rank() > limits.max_rank) return absl::StrCat("rank above ", limits.max_rank);
  if (static_cast<int>(n.inputs.size()) + 1 > limits.max_operands) {
    return absl::StrCat("more than ", limits.max_operands - 1, " operands");
  }
  for (ValueId in : n.inputs) {
    const TensorType& t = g.type(in);
    if (t.shape != g.type(n.inputs[0]).shape || t.rank() != n.type.rank()) {
      return absl::StrCat("operands of different shapes (", ShapeString(g.type(n.inputs[0]).shape),
                          " and ", ShapeString(t.shape), ")");
    }
    if (t.dtype != n.type.dtype) {
      return absl::StrCat("an operand of dtype ", DTypeName(t.dtype), " promoted to ",
                          DTypeName(n.type.dtype));
    }
  }
  return "";
}

const Shape& GroupShape(const Graph& g, ValueId root) {
  return IsCatRoot(g, root) ? g.type(g.node(root).inputs[0]).shape : g.type(root).shape;
}

FusionGroups::FusionGroups(const Graph& g, const FamilyLimits& limits)
    : group_of(g.num_values(), -1),
      users(g.Users()),
      is_output(g.num_values(), false),
      limits(limits) {
  for (ValueId v : g.outputs()) is_output[v] = true;
}

std::vector<bool> DependentsOf(const Graph& g, const std::vector<ValueId>& roots) {
  std::vector<bool> d(g.num_values(), false);
  for (ValueId r : roots) d[r] = true;
  const ValueId first = *std::min_element(roots.begin(), roots.end());
  for (ValueId v = first; v < g.num_values(); ++v) {  // ids are in topological order
    for (ValueId u : g.node(v).inputs) d[v] = d[v] || d[u];
  }
  return d;
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

// Members other than the root that the group must store: used outside it, or graph outputs.
std::vector<ValueId> ExtraOutputs(const std::vector<ValueId>& members, const FusionGroups& grp,
                                  int gid) {
  std::vector<ValueId> extra;
  for (ValueId m : members) {
    if (m == members.back()) continue;
    bool outside = grp.is_output[m];
    for (ValueId u : grp.users[m]) outside |= grp.group_of[u] != gid;
    if (outside) extra.push_back(m);
  }
  return extra;
}

// Inputs plus stores of the group's kernel: a cat root stores each of its operands.
int OperandCount(const Graph& g, const std::vector<ValueId>& members, const FusionGroups& grp,
                 int gid) {
  const ValueId root = members.back();
  const size_t root_stores = IsCatRoot(g, root) ? g.node(root).inputs.size() : 1;
  return static_cast<int>(ExternalInputs(g, members, grp.group_of, gid).size() +
                          ExtraOutputs(members, grp, gid).size() + root_stores);
}

// Whether a path from `from` along uses leads into group `gid` once every group is one node: a
// value of another group reaches whatever any member of that group reaches (the fused kernel runs
// all of them at once). Value paths alone miss the cycle of two groups that each read a further
// output of the other, through a node between them (fuzz program 90033 hung the rewrite).
bool LeadsInto(const FusionGroups& grp, ValueId from, int gid) {
  std::vector<ValueId> stack = {from};
  std::vector<bool> seen(grp.group_of.size(), false), seen_group(grp.groups.size(), false);
  while (!stack.empty()) {
    const ValueId v = stack.back();
    stack.pop_back();
    if (seen[v]) continue;
    seen[v] = true;
    const int g = grp.group_of[v];
    if (g == gid) return true;
    for (ValueId u : grp.users[v]) stack.push_back(u);
    if (g >= 0 && !seen_group[g]) {
      seen_group[g] = true;
      for (ValueId m : grp.groups[g]) stack.push_back(m);
    }
  }
  return false;
}

// Why producer `in` may not join the group of `root` ("" if it may).
std::string Refusal(const Graph& g, ValueId in, ValueId root, const FusionGroups& grp, int gid) {
  std::string why = Unfusable(g, in, grp.limits);
  if (!why.empty()) return why;
  if (g.type(in).shape != GroupShape(g, root)) {
    return absl::StrCat("shape ", ShapeString(g.type(in).shape), " differs from the group's ",
                        ShapeString(GroupShape(g, root)));
  }
  if (!grp.multi_output && grp.is_output[in]) return "graph output (materialised)";
  for (ValueId u : grp.users[in]) {
    if (grp.group_of[u] == gid) continue;
    if (!grp.multi_output) return absl::StrCat("fan-out: also used by %", u);
    if (LeadsInto(grp, u, gid)) {
      return absl::StrCat("also used by %", u, ", which leads back into the group");
    }
  }
  return "";
}

std::string OpName(const Graph& g, ValueId v) {
  return g.node(v).kind == NodeKind::kOp ? GetOpDef(g.node(v).op).name : "value";
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
      std::string why = Refusal(g, in, root, grp, gid);
      if (why.empty()) {
        grp.group_of[in] = gid;
        members.push_back(in);
        std::sort(members.begin(), members.end());
        if (OperandCount(g, members, grp, gid) <= grp.limits.max_operands) {
          grew = true;
          continue;
        }
        members.erase(std::find(members.begin(), members.end(), in));
        grp.group_of[in] = -1;
        why = absl::StrCat("the kernel would have more than ", grp.limits.max_operands,
                           " inputs and outputs");
      }
      if (logged.insert({in, root}).second) {
        ctx.explain.push_back(absl::StrCat(grp.log_prefix, "not fused: %", in, " (", OpName(g, in),
                                           ") into the group of %", root, ": ", why));
      }
    }
  }
  std::sort(members.begin(), members.end());
  for (ValueId m : ExtraOutputs(members, grp, gid)) {
    ctx.explain.push_back(absl::StrCat(grp.log_prefix, "multi-output: %", m, " (", OpName(g, m),
                                       ") is also used outside the group of %", root,
                                       ": the fused kernel stores it"));
  }
}

namespace {

ValueId Find(std::vector<ValueId>& parent, ValueId v) {
  while (parent[v] != v) v = parent[v] = parent[parent[v]];
  return v;
}

}  // namespace

std::vector<BodySegment> BodySegments(const Graph& body) {
  std::vector<ValueId> parent(body.num_values());
  for (ValueId v = 0; v < body.num_values(); ++v) parent[v] = v;
  for (ValueId v = 0; v < body.num_values(); ++v) {
    if (body.node(v).kind != NodeKind::kOp) continue;
    for (ValueId in : body.node(v).inputs) {
      if (body.node(in).kind == NodeKind::kOp) parent[Find(parent, in)] = Find(parent, v);
    }
  }
  std::vector<BodySegment> segments;
  std::vector<int> segment_of(body.num_values(), -1);  // by component root
  for (size_t o = 0; o < body.outputs().size(); ++o) {
    int& s = segment_of[Find(parent, body.outputs()[o])];
    if (s < 0) {
      s = static_cast<int>(segments.size());
      segments.emplace_back();
    }
    segments[s].outputs.push_back(static_cast<int>(o));
  }
  std::vector<bool> reads(body.inputs().size());
  for (BodySegment& seg : segments) {
    const ValueId root = Find(parent, body.outputs()[seg.outputs[0]]);
    std::fill(reads.begin(), reads.end(), false);
    for (ValueId v = 0; v < body.num_values(); ++v) {
      const Node& n = body.node(v);
      if (n.kind != NodeKind::kOp || Find(parent, v) != root) continue;
      seg.ops.push_back(v);
      for (ValueId in : n.inputs) {
        const auto at = std::find(body.inputs().begin(), body.inputs().end(), in);
        if (at != body.inputs().end()) reads[at - body.inputs().begin()] = true;
      }
    }
    for (int o : seg.outputs) {  // an output that is a body input as it is
      const auto at = std::find(body.inputs().begin(), body.inputs().end(), body.outputs()[o]);
      if (at != body.inputs().end()) reads[at - body.inputs().begin()] = true;
    }
    for (size_t i = 0; i < reads.size(); ++i) {
      if (reads[i]) seg.inputs.push_back(static_cast<int>(i));
    }
  }
  return segments;
}

int SegmentOperands(const Graph& body, const BodySegment& s) {
  const ValueId first = body.outputs()[s.outputs[0]];
  const size_t cat_parts = IsCatRoot(body, first) ? body.node(first).inputs.size() - 1 : 0;
  return static_cast<int>(s.inputs.size() + s.outputs.size() + cat_parts);
}

namespace {

std::string KernelName(const Graph& g, const std::vector<ValueId>& members, int index) {
  std::vector<std::string> names;
  for (ValueId m : members) {
    const char* n = GetOpDef(g.node(m).op).name;
    if (names.empty() || names.back() != n) names.push_back(n);
  }
  if (names.size() > 6) {  // the first five, then the root's (what the group computes)
    names.resize(5);
    names.push_back(GetOpDef(g.node(members.back()).op).name);
  }
  return absl::StrCat("kiln_fused_", absl::StrJoin(names, "_"), "_", index);
}

// The body graph of a group: its external inputs, then the members in order; it returns the
// root, then the further outputs.
std::shared_ptr<Graph> BuildBody(const Graph& g, const std::vector<ValueId>& members,
                                 const std::vector<ValueId>& ext,
                                 const std::vector<ValueId>& extra) {
  auto body = std::make_shared<Graph>();
  std::vector<ValueId> map(g.num_values(), -1);
  for (ValueId e : ext) map[e] = body->AddInput(g.type(e));
  for (ValueId m : members) {
    const Node& n = g.node(m);
    absl::InlinedVector<ValueId, 3> ins;
    for (ValueId in : n.inputs) ins.push_back(map[in]);
    map[m] = body->AddOpWithType(n.op, ins, n.attrs, n.type);
  }
  std::vector<ValueId> outs = {map[members.back()]};
  for (ValueId x : extra) outs.push_back(map[x]);
  body->SetOutputs(std::move(outs));
  return body;
}

// One unit of the rewritten graph: a node kept as it is, or a whole group.
struct Unit {
  ValueId first;  // the node, or the group's root
  int gid = -1;   // the group, for group units
  bool done = false;
};

class Rewriter {
 public:
  Rewriter(const Graph& graph, const FusionGroups& grp)
      : g_(graph), grp_(grp), map_(graph.num_values(), -1) {}

  Graph Run() {
    std::vector<Unit> units;
    for (ValueId v = 0; v < g_.num_values(); ++v) {
      const int gid = grp_.group_of[v];
      const bool grouped = gid >= 0 && grp_.groups[gid].size() > 1;
      if (!grouped) units.push_back({v});
      if (grouped && grp_.groups[gid].back() == v) units.push_back({v, gid});
    }
    // Emit units in their original order, each as soon as what it reads exists: a node that
    // reads a group's further output waits for the group. Grouping never forms a cycle of groups
    // (LeadsInto); should one appear all the same, the first waiting group is emitted as its
    // separate nodes, so the rewrite always ends.
    for (size_t emitted = 0; emitted < units.size();) {
      const auto next = std::find_if(units.begin(), units.end(),
                                     [&](const Unit& u) { return !u.done && Ready(u); });
      if (next == units.end()) {
        Dissolve(units);
        continue;
      }
      Emit(*next);
      next->done = true;
      ++emitted;
    }
    out_.SetOutputsFrom(g_, map_);
    return std::move(out_);
  }

 private:
  // Replaces the first group unit not yet emitted by one unit per member.
  void Dissolve(std::vector<Unit>& units) const {
    const auto group = std::find_if(units.begin(), units.end(),
                                    [](const Unit& u) { return !u.done && u.gid >= 0; });
    if (group == units.end()) {
      throw Error(absl::InternalError("elementwise fusion: no node or group can be emitted"));
    }
    const std::vector<ValueId>& members = grp_.groups[group->gid];
    const auto at = units.erase(group);
    std::vector<Unit> singles;
    for (ValueId m : members) singles.push_back({m});
    units.insert(at, singles.begin(), singles.end());
  }

  bool Ready(const Unit& u) const {
    if (u.gid < 0) {
      for (ValueId in : g_.node(u.first).inputs) {
        if (map_[in] < 0) return false;
      }
      return true;
    }
    for (ValueId in : ExternalInputs(g_, grp_.groups[u.gid], grp_.group_of, u.gid)) {
      if (map_[in] < 0) return false;
    }
    return true;
  }

  void Emit(const Unit& u) {
    const Node& n = g_.node(u.first);
    if (u.gid < 0) {
      map_[u.first] = out_.AddCopy(n, map_);
      return;
    }
    const std::vector<ValueId>& members = grp_.groups[u.gid];
    const std::vector<ValueId> ext = ExternalInputs(g_, members, grp_.group_of, u.gid);
    const std::vector<ValueId> extra = ExtraOutputs(members, grp_, u.gid);
    Node f;
    f.kind = NodeKind::kFusion;
    for (ValueId e : ext) f.inputs.push_back(map_[e]);
    f.type = n.type;
    f.sym_dims = n.sym_dims;
    f.name = KernelName(g_, members, fused_++);
    f.body = BuildBody(g_, members, ext, extra);
    const ValueId fusion = out_.AddNode(std::move(f));
    map_[members.back()] = fusion;
    for (size_t k = 0; k < extra.size(); ++k) {
      map_[extra[k]] = out_.AddResult(fusion, static_cast<int>(k) + 1);
    }
  }

  const Graph& g_;
  const FusionGroups& grp_;
  std::vector<ValueId> map_;
  Graph out_;
  int fused_ = 0;
};

}  // namespace

bool RewriteFusionGroups(Graph& graph, const FusionGroups& grp) {
  bool any = false;
  for (const auto& m : grp.groups) any |= m.size() > 1;
  if (!any) return false;
  graph = Rewriter(graph, grp).Run();
  return true;
}

}  // namespace kiln::passes
