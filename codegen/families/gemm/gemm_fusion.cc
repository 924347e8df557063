// GeGLU GEMM fusion (see gemm_fusion.h): matched at muls, rewritten as a fusion group.
#include "codegen/families/gemm/gemm_fusion.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "passes/fusion_groups.h"

namespace kiln::passes {

using ir::Graph;
using ir::Node;
using ir::ValueId;

namespace {

constexpr char kLog[] = "gemm fusion: ";

// Whether `s` is slice [start, end) of `src`'s last dim, step 1.
bool IsLastDimSlice(const Graph& g, ValueId s, ValueId src, int64_t start, int64_t end) {
  if (!g.IsOp(s, OpId::kSlice) || g.node(s).inputs[0] != src) return false;
  const OpAttrs& a = g.node(s).attrs;
  const int64_t rank = g.type(src).rank();
  return (a.dim == -1 || a.dim == rank - 1) && a.step == 1 && a.start == start && a.end == end;
}

}  // namespace

std::optional<GegluMatch> MatchGeglu(const Graph& g, ValueId v, std::string* why) {
  auto no = [&](const std::string& reason) -> std::optional<GegluMatch> {
    if (why != nullptr) *why = reason;
    return std::nullopt;
  };
  if (!g.IsOp(v, OpId::kMul)) return std::nullopt;
  GegluMatch m;
  m.mul = v;
  const auto& in = g.node(v).inputs;
  const int which = g.IsOp(in[0], OpId::kGelu) ? 0 : g.IsOp(in[1], OpId::kGelu) ? 1 : -1;
  if (which < 0) return std::nullopt;  // not a mul of a GELU: no GeGLU, nothing to say
  m.gelu = in[which];
  m.up = in[1 - which];
  m.gate = g.node(m.gelu).inputs[0];
  if (!g.IsOp(m.gate, OpId::kSlice) || !g.IsOp(m.up, OpId::kSlice)) {
    return no("the GELU's input and the other factor are not slices");
  }
  m.linear = g.node(m.gate).inputs[0];
  if (!g.IsOp(m.linear, OpId::kLinear) || g.node(m.up).inputs[0] != m.linear) {
    return no("the two factors are not slices of one linear");
  }
  const int64_t width = g.type(m.linear).shape.back(), f = width / 2;
  m.gate_first = IsLastDimSlice(g, m.gate, m.linear, 0, f);
  const bool halves =
      width % 2 == 0 && (m.gate_first ? IsLastDimSlice(g, m.up, m.linear, f, width)
                                      : IsLastDimSlice(g, m.gate, m.linear, f, width) &&
                                            IsLastDimSlice(g, m.up, m.linear, 0, f));
  if (!halves) return no("the slices are not the two halves of the linear's last dim");
  if (g.node(m.gelu).attrs.approximate != GeluApprox::kTanh) {
    return no("the GELU is erf's (the kernel's epilogue is the tanh approximation)");
  }
  if (g.node(m.linear).attrs.epilogue != Epilogue::kNone) {
    return no("the linear already has an epilogue");
  }
  if (!(g.type(v) == g.type(m.gate))) return no("the product's type differs from the gate's");
  return m;
}

absl::StatusOr<bool> GegluGemmFusion::Run(Graph& graph, PassContext& ctx) {
  if (!ctx.Enabled(family_.name())) return false;
  FusionGroups grp(graph, {});
  grp.log_prefix = kLog;
  grp.multi_output = false;
  for (ValueId v = 0; v < graph.num_values(); ++v) {
    std::string why;
    const std::optional<GegluMatch> m = MatchGeglu(graph, v, &why);
    auto refuse = [&](const std::string& reason) {
      ctx.explain.push_back(absl::StrCat(kLog, "mul %", v, " not fused with its linear: ", reason));
    };
    if (!m.has_value()) {
      if (!why.empty()) refuse(why);
      continue;
    }
    const std::pair<ValueId, ValueId> single_use[] = {
        {m->gate, m->gelu}, {m->gelu, m->mul}, {m->up, m->mul}};
    std::string fan_out;
    for (const auto& [value, user] : single_use) {
      if (grp.users[value] != std::vector<ValueId>{user} || grp.is_output[value]) {
        fan_out = absl::StrCat("%", value, " has other users or is a graph output");
      }
    }
    std::vector<ValueId> lin_users = grp.users[m->linear];
    std::sort(lin_users.begin(), lin_users.end());
    if (lin_users != std::vector<ValueId>{std::min(m->gate, m->up), std::max(m->gate, m->up)} ||
        grp.is_output[m->linear]) {
      fan_out = absl::StrCat("the linear %", m->linear, " has other users or is a graph output");
    }
    if (!fan_out.empty()) {
      refuse(fan_out);
      continue;
    }
    const Node& lin = graph.node(m->linear);
    std::vector<TensorType> operands;
    for (ValueId i : lin.inputs) operands.push_back(graph.type(i));
    if (const std::string why_not = family_.RejectsOperands(operands); !why_not.empty()) {
      refuse(why_not);
      continue;
    }
    std::vector<ValueId> members = {m->linear, m->gate, m->up, m->gelu, m->mul};
    std::sort(members.begin(), members.end());
    if (members.back() != m->mul) {
      refuse("the mul is not the last of the pattern's values");
      continue;
    }
    const int gid = static_cast<int>(grp.groups.size());
    grp.groups.push_back(members);
    for (ValueId u : members) grp.group_of[u] = gid;
    ctx.explain.push_back(absl::StrCat(kLog, "GeGLU: linear %", m->linear, " -> gelu_tanh(%",
                                       m->gate, ") * %", m->up, " as one GEMM at %", m->mul));
  }
  return RewriteFusionGroups(graph, grp);
}

}  // namespace kiln::passes
