// The gated product of a GLU MLP (see gated_product.h).
#include "passes/gated_product.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "passes/fusion_groups.h"

namespace kiln::passes {

using ir::Graph;
using ir::ValueId;

namespace {

bool IsGateActivation(const Graph& g, ValueId v) {
  return g.IsOp(v, OpId::kRelu) || g.IsOp(v, OpId::kGelu) || g.IsOp(v, OpId::kSilu);
}

// The gated product `m` (mul, act, gate and up set) of two linears, gate and up, of one x: their
// weights (and biases) of one shape, no epilogue, the product of the gate's type.
template <typename No>
std::optional<GatedProductMatch> TwoLinears(const Graph& g, GatedProductMatch m, No no) {
  m.linear = m.gate;
  const ir::Node &gate = g.node(m.gate), &up = g.node(m.up);
  if (gate.inputs[0] != up.inputs[0]) return no("the two linears read different x");
  if (gate.inputs.size() != up.inputs.size() || !(g.type(gate.inputs[1]) == g.type(up.inputs[1])) ||
      (gate.inputs.size() > 2 && !(g.type(gate.inputs[2]) == g.type(up.inputs[2])))) {
    return no("the two linears' weights (or biases) differ in shape or type");
  }
  if (gate.attrs.epilogue != Epilogue::kNone || up.attrs.epilogue != Epilogue::kNone) {
    return no("a linear already has an epilogue");
  }
  if (!(g.type(m.mul) == g.type(m.gate)) || !(g.type(m.up) == g.type(m.gate))) {
    return no("the product's type differs from the gate's");
  }
  return m;
}

}  // namespace

std::optional<GatedProductMatch> MatchGatedProduct(const Graph& g, ValueId v, std::string* why) {
  auto no = [&](const std::string& reason) -> std::optional<GatedProductMatch> {
    if (why != nullptr) *why = reason;
    return std::nullopt;
  };
  if (!g.IsOp(v, OpId::kMul)) return std::nullopt;
  GatedProductMatch m;
  m.mul = v;
  const auto& in = g.node(v).inputs;
  const int which = IsGateActivation(g, in[0]) ? 0 : IsGateActivation(g, in[1]) ? 1 : -1;
  if (which < 0) return std::nullopt;  // not a mul of an activation: nothing to say
  m.act = in[which];
  m.up = in[1 - which];
  m.gate = g.node(m.act).inputs[0];
  if (g.IsOp(m.gate, OpId::kLinear) && g.IsOp(m.up, OpId::kLinear)) return TwoLinears(g, m, no);
  if (!g.IsOp(m.gate, OpId::kSlice) || !g.IsOp(m.up, OpId::kSlice)) {
    return no("the activation's input and the other factor are not slices");
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
  if (g.node(m.linear).attrs.epilogue != Epilogue::kNone) {
    return no("the linear already has an epilogue");
  }
  if (!(g.type(v) == g.type(m.gate))) return no("the product's type differs from the gate's");
  return m;
}

bool HasGatedGemvRows(const Graph& g, const GatedProductMatch& m) {
  const TensorType& out = g.type(m.mul);
  return g.node(m.mul).sym_dims == 0 && out.rank() > 0 && out.shape.back() > 0 &&
         out.numel() / out.shape.back() <= kGatedGemvMaxRows;
}

std::string GatedProductFanOut(const GatedProductMatch& m,
                               const std::vector<std::vector<ValueId>>& users,
                               const std::vector<bool>& is_output) {
  const std::pair<ValueId, ValueId> single_use[] = {{m.gate, m.act}, {m.act, m.mul}, {m.up, m.mul}};
  for (const auto& [value, user] : single_use) {
    if (users[value] != std::vector<ValueId>{user} || is_output[value]) {
      return absl::StrCat("%", value, " has other users or is a graph output");
    }
  }
  if (m.two_linears()) return "";  // the linears are the gate and the up
  std::vector<ValueId> lin_users = users[m.linear];
  std::sort(lin_users.begin(), lin_users.end());
  if (lin_users != std::vector<ValueId>{std::min(m.gate, m.up), std::max(m.gate, m.up)} ||
      is_output[m.linear]) {
    return absl::StrCat("the linear %", m.linear, " has other users or is a graph output");
  }
  return "";
}

}  // namespace kiln::passes
