// GEMM epilogue fusion (see epilogue_fusion.h).
#include "codegen/families/gemm_epilogue/epilogue_fusion.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ir/printer.h"
#include "passes/gated_product.h"
#include "passes/simplify.h"

namespace kiln::passes {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;

namespace {

bool IsActivation(const Graph& g, ValueId v) {
  return g.IsOp(v, OpId::kRelu) || g.IsOp(v, OpId::kGelu);
}

// The epilogue that computes relu/gelu node `act`; kNone with the reason in `why` if none does.
Epilogue EpilogueFor(const Node& act, std::string* why) {
  if (act.op == OpId::kRelu) return Epilogue::kRelu;
  if (act.attrs.approximate == GeluApprox::kTanh) return Epilogue::kGeluTanh;
  *why =
      "cuBLASLt's GELU epilogue is the tanh approximation; erf GELU stays in an elementwise "
      "kernel";
  return Epilogue::kNone;
}

// Why linear `lin` cannot take its user `act` into its epilogue ("" if it can, with the epilogue
// in `epilogue`).
std::string WhyNot(const Graph& g, ValueId lin, ValueId act, const std::vector<ValueId>& users,
                   bool is_output, Epilogue* epilogue) {
  const Node& l = g.node(lin);
  if (l.attrs.epilogue != Epilogue::kNone) {
    return absl::StrCat("the linear already has epilogue=", EpilogueName(l.attrs.epilogue));
  }
  std::string why;
  *epilogue = EpilogueFor(g.node(act), &why);
  if (!why.empty()) return why;
  for (ValueId u : users) {
    if (u != act) return absl::StrCat("fan-out: %", lin, " is also used by %", u);
  }
  if (is_output) return absl::StrCat("%", lin, " is a graph output (materialised)");
  if (!(g.type(act) == l.type)) {
    return absl::StrCat("the activation's type ", ir::PrintType(g.type(act)),
                        " differs from the linear's ", ir::PrintType(l.type));
  }
  return "";
}

// Whether activation `act` is the gate of a gated product of two linears that the norm-linear
// family's gated GEMV serves (passes/gated_product.h): in the gate's epilogue it would leave the
// product without its activation.
bool GateOfAGatedGemv(const Graph& g, ValueId act, const std::vector<std::vector<ValueId>>& users) {
  if (users[act].size() != 1) return false;
  const std::optional<GatedProductMatch> m = MatchGatedProduct(g, users[act][0], nullptr);
  return m.has_value() && m->two_linears() && m->act == act && HasGatedGemvRows(g, *m);
}

// The other operand of add node `add` when linear `lin` is one of them; -1 if both are `lin`.
ValueId OtherOperand(const Graph& g, ValueId add, ValueId lin) {
  const auto& in = g.node(add).inputs;
  if (in[0] == lin && in[1] == lin) return -1;
  return in[0] == lin ? in[1] : in[0];
}

// Why linear `lin` cannot take add node `add`'s other operand as its residual ("" if it can).
std::string WhyNotResidual(const Graph& g, ValueId lin, ValueId add,
                           const std::vector<ValueId>& users, bool is_output) {
  const Node& l = g.node(lin);
  if (l.attrs.epilogue != Epilogue::kNone) {
    return absl::StrCat("the linear already has epilogue=", EpilogueName(l.attrs.epilogue));
  }
  for (ValueId u : users) {
    if (u != add) return absl::StrCat("fan-out: %", lin, " is also used by %", u);
  }
  if (is_output) return absl::StrCat("%", lin, " is a graph output (materialised)");
  const ValueId r = OtherOperand(g, add, lin);
  if (r < 0) return "the add reads the linear twice";
  if (!(g.type(r) == l.type) || !(g.type(add) == l.type)) {
    return absl::StrCat("the residual %", r, " is ", ir::PrintType(g.type(r)), " and the sum ",
                        ir::PrintType(g.type(add)), ", not the linear's ", ir::PrintType(l.type),
                        " (no broadcasting or casting in the GEMM's C)");
  }
  if (r > lin) return absl::StrCat("the residual %", r, " is computed after the linear");
  return "";
}

// linear(x, w[, b]) -> add with another value r of its type: one linear(x, w[, b], r)
// {epilogue=add} (cuBLASLt's C with beta = 1), if allowed; the explain log says which.
bool FuseResidual(Graph& graph, ValueId v, const std::vector<ValueId>& users, bool is_output,
                  PassContext& ctx) {
  for (ValueId add : users) {
    if (!graph.IsOp(add, OpId::kAdd)) continue;
    const std::string pair = absl::StrCat("linear %", v, " -> add %", add);
    const std::string why = WhyNotResidual(graph, v, add, users, is_output);
    if (!why.empty()) {
      ctx.explain.push_back(absl::StrCat("not fused: ", pair, " (GEMM residual): ", why));
      return false;
    }
    const ValueId r = OtherOperand(graph, add, v);
    Node& l = graph.mutable_node(v);
    l.inputs.push_back(r);
    l.attrs.epilogue = Epilogue::kAdd;
    ReplaceAllUses(graph, add, v);
    ctx.explain.push_back(absl::StrCat("GEMM epilogue: ", pair, " -> linear {epilogue=add} at %", v,
                                       " (residual %", r, ")"));
    return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<bool> GemmEpilogueFusion::Run(Graph& graph, PassContext& ctx) {
  if (!ctx.Enabled(family_.name())) return false;
  const std::vector<std::vector<ValueId>> users = graph.Users();
  std::vector<bool> is_output(graph.num_values(), false);
  for (ValueId v : graph.outputs()) is_output[v] = true;
  bool changed = false;
  for (ValueId v = 0; v < graph.num_values(); ++v) {
    if (!graph.IsOp(v, OpId::kLinear)) continue;
    if (FuseResidual(graph, v, users[v], is_output[v], ctx)) {
      changed = true;
      continue;
    }
    for (ValueId act : users[v]) {
      if (!IsActivation(graph, act)) continue;
      const std::string pair =
          absl::StrCat("linear %", v, " -> ", GetOpDef(graph.node(act).op).name, " %", act);
      Epilogue epilogue = Epilogue::kNone;
      std::string why = WhyNot(graph, v, act, users[v], is_output[v], &epilogue);
      if (why.empty() && ctx.gated_gemv && GateOfAGatedGemv(graph, act, users)) {
        why = absl::StrCat("the gate of a gated product of at most ", kGatedGemvMaxRows,
                           " rows: the GEMV's gated product serves it (norm-linear family)");
      }
      if (!why.empty()) {
        ctx.explain.push_back(absl::StrCat("not fused: ", pair, " (GEMM epilogue): ", why));
        continue;
      }
      // `act` is v's only user: v now computes act's value, whose uses move to v.
      graph.mutable_node(v).attrs.epilogue = epilogue;
      ReplaceAllUses(graph, act, v);
      ctx.explain.push_back(absl::StrCat(
          "GEMM epilogue: ", pair, " -> linear {epilogue=", EpilogueName(epilogue), "} at %", v));
      changed = true;
      break;
    }
  }
  return changed;
}

}  // namespace kiln::passes
