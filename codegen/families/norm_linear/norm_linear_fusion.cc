// Norm-linear fusion (see norm_linear_fusion.h).
#include "codegen/families/norm_linear/norm_linear_fusion.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "passes/fusion_groups.h"
#include "passes/gated_product.h"

namespace kiln::passes {

using ir::Graph;
using ir::Node;
using ir::ValueId;

namespace {

constexpr char kLog[] = "norm-linear fusion: ";

bool IsNorm(const Graph& g, ValueId v) {
  return g.IsOp(v, OpId::kLayerNorm) || g.IsOp(v, OpId::kRmsNorm);
}

// The operand types the family is asked about: the linear's output, the norm's operands, the
// linear's operands after x.
std::vector<TensorType> OperandTypes(const Graph& g, ValueId norm, ValueId lin) {
  std::vector<TensorType> t = {g.type(lin)};
  for (ValueId v : g.node(norm).inputs) t.push_back(g.type(v));
  const auto& in = g.node(lin).inputs;
  for (size_t i = 1; i < in.size(); ++i) t.push_back(g.type(in[i]));
  return t;
}

// Why norm `norm` cannot join its users, the linears `lins` (in id order; "" if it can).
std::string Refusal(const Graph& g, ValueId norm, const std::vector<ValueId>& lins,
                    const FusionGroups& grp, const KernelFamily& family) {
  for (ValueId u : grp.users[norm]) {
    if (!g.IsOp(u, OpId::kLinear) || g.node(u).inputs[0] != norm) {
      return absl::StrCat("fan-out: %", norm, " is also used by %", u, ", not a linear's x");
    }
  }
  if (grp.is_output[norm]) return absl::StrCat("%", norm, " is a graph output (materialised)");
  if (grp.group_of[norm] != -1) return "already in a group";
  if (g.node(norm).sym_dims != 0) {
    return "symbolic dims (a dynamic shape): the fused node's shape is fixed at compile time";
  }
  const std::vector<bool> downstream = DependentsOf(g, lins);
  for (ValueId lin : lins) {
    const auto& in = g.node(lin).inputs;
    for (size_t i = 1; i < in.size(); ++i) {
      if (in[i] == norm) return absl::StrCat("linear %", lin, " also reads the norm as an operand");
      if (downstream[in[i]]) {  // the node would sit on a cycle through its own output
        return absl::StrCat("linear %", lin, " reads %", in[i], ", which depends on linear %",
                            lins.front() == lin ? lins.back() : lins.front());
      }
    }
    if (grp.group_of[lin] != -1) return absl::StrCat("linear %", lin, " is already in a group");
    if (g.node(lin).sym_dims != 0) {
      return "symbolic dims (a dynamic shape): the fused node's shape is fixed at compile time";
    }
    if (std::string why = family.RejectsOperands(OperandTypes(g, norm, lin)); !why.empty()) {
      return why;
    }
  }
  return "";
}

// The gated product that linear `lin` feeds with its two halves (or as the gate, beside another
// linear of the norm as the up), whose values only it uses, else nullopt (`why` then says why, when
// a product was found).
std::optional<GatedProductMatch> GatedProductOf(const Graph& g, ValueId lin,
                                                const FusionGroups& grp, std::string* why) {
  for (ValueId s : grp.users[lin]) {
    for (ValueId mul : grp.users[s]) {  // the up (slice or linear) is the mul's operand
      std::optional<GatedProductMatch> m = MatchGatedProduct(g, mul, nullptr);
      if (!m.has_value() || m->linear != lin) continue;
      std::string fan_out = GatedProductFanOut(*m, grp.users, grp.is_output);
      for (ValueId v : {m->gate, m->up, m->act, m->mul}) {
        if (fan_out.empty() && grp.group_of[v] != -1) {
          fan_out = absl::StrCat("%", v, " is already in a group");
        }
      }
      if (fan_out.empty()) return m;
      *why = fan_out;
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<bool> NormLinearFusion::Run(Graph& graph, PassContext& ctx) {
  if (!ctx.Enabled(family_.name())) return false;
  FusionGroups grp(graph, {});
  grp.log_prefix = kLog;
  for (ValueId v = 0; v < graph.num_values(); ++v) {
    if (!IsNorm(graph, v) || grp.users[v].empty()) continue;
    std::vector<ValueId> lins = grp.users[v];
    std::sort(lins.begin(), lins.end());
    lins.erase(std::unique(lins.begin(), lins.end()), lins.end());
    const bool feeds_a_linear = std::any_of(lins.begin(), lins.end(), [&](ValueId u) {
      return graph.IsOp(u, OpId::kLinear) && graph.node(u).inputs[0] == v;
    });
    if (!feeds_a_linear) continue;
    std::string pair = absl::StrCat("%", v, " (", GetOpDef(graph.node(v).op).name, ") -> linear");
    for (ValueId lin : lins) absl::StrAppend(&pair, " %", lin);
    if (const std::string why = Refusal(graph, v, lins, grp, family_); !why.empty()) {
      ctx.explain.push_back(absl::StrCat(kLog, "not fused: ", pair, ": ", why));
      continue;
    }
    const int gid = static_cast<int>(grp.groups.size());
    std::vector<ValueId> members = {v};  // id order: the norm comes first
    members.insert(members.end(), lins.begin(), lins.end());
    std::string products;
    for (ValueId lin : ctx.gated_gemv ? lins : std::vector<ValueId>{}) {
      std::string why;
      const std::optional<GatedProductMatch> m = GatedProductOf(graph, lin, grp, &why);
      if (!why.empty()) {
        ctx.explain.push_back(
            absl::StrCat(kLog, "linear %", lin, " joins without its gated product: ", why));
      }
      if (!m.has_value()) continue;
      members.insert(members.end(), {m->gate, m->up, m->act, m->mul});
      absl::StrAppend(&products, "; linear %", lin, " with its gated product ",
                      GetOpDef(graph.node(m->act).op).name, "(%", m->gate, ") * %", m->up, " at %",
                      m->mul);
    }
    std::sort(members.begin(), members.end());  // two linears' product: its gate and up joined
    members.erase(std::unique(members.begin(), members.end()), members.end());
    for (ValueId m : members) grp.group_of[m] = gid;
    grp.groups.push_back(std::move(members));
    ctx.explain.push_back(absl::StrCat(kLog, pair, ": ", lins.size() == 1 ? "one GEMV" : "GEMVs",
                                       " that normalise the rows themselves", products));
  }
  return RewriteFusionGroups(graph, grp);
}

}  // namespace kiln::passes
