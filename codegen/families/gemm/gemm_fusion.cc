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

}  // namespace

std::optional<GegluMatch> MatchGeglu(const Graph& g, ValueId v, std::string* why) {
  std::optional<GegluMatch> m = MatchGatedProduct(g, v, why);
  if (!m.has_value()) return m;
  if (m->two_linears()) {
    if (why != nullptr) {
      *why =
          "gate and up are two linears (the kernel reads one weight of both: GEMM merge "
          "joins them with CompileOptions::freeze_weights)";
    }
    return std::nullopt;
  }
  if (!g.IsOp(m->act, OpId::kGelu)) {
    if (why != nullptr) *why = "the activation is not a GELU (the kernel's epilogue is gelu_tanh)";
    return std::nullopt;
  }
  if (g.node(m->act).attrs.approximate != GeluApprox::kTanh) {
    if (why != nullptr)
      *why = "the GELU is erf's (the kernel's epilogue is the tanh approximation)";
    return std::nullopt;
  }
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
    if (const std::string fan_out = GatedProductFanOut(*m, grp.users, grp.is_output);
        !fan_out.empty()) {
      refuse(fan_out);
      continue;
    }
    if (ctx.gated_gemv && HasGatedGemvRows(graph, *m)) {
      // The node would run the linear and an elementwise kernel at this size anyway (one row of
      // 128-row tiles is slower); the norm-linear family's gated GEMV takes it after a norm.
      refuse(absl::StrCat("at most ", kGatedGemvMaxRows,
                          " rows: the GEMV's gated product serves them (norm-linear family)"));
      continue;
    }
    const Node& lin = graph.node(m->linear);
    std::vector<TensorType> operands;
    for (ValueId i : lin.inputs) operands.push_back(graph.type(i));
    if (const std::string why_not = family_.RejectsOperands(operands); !why_not.empty()) {
      refuse(why_not);
      continue;
    }
    std::vector<ValueId> members = {m->linear, m->gate, m->up, m->act, m->mul};
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
