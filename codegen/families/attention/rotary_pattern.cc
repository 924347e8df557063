// The rotary embedding's pattern (see rotary_pattern.h).
#include "codegen/families/attention/rotary_pattern.h"

#include <algorithm>
#include <utility>

#include "passes/fusion_groups.h"

namespace kiln::passes {

using ir::Graph;
using ir::ValueId;

namespace {

// Whether %v = mul(%a, %t) or mul(%t, %a) for some %t; sets *t.
bool IsMulOf(const Graph& g, ValueId v, ValueId a, ValueId* t) {
  if (!g.IsOp(v, OpId::kMul)) return false;
  const auto& in = g.node(v).inputs;
  if (in[0] != a && in[1] != a) return false;
  *t = in[0] == a ? in[1] : in[0];
  return true;
}

// Matches cat(sub(P, Q), add(R, S)) once the halves x1, x2 are known.
bool MatchWithHalves(const Graph& g, ValueId lo, ValueId hi, ValueId x1, ValueId x2,
                     RotaryMatch* m) {
  const auto& s = g.node(lo).inputs;  // sub(x1·cos, x2·sin)
  ValueId cos = -1, sin = -1, cos2 = -1, sin2 = -1;
  if (!IsMulOf(g, s[0], x1, &cos) || !IsMulOf(g, s[1], x2, &sin)) return false;
  const auto& a = g.node(hi).inputs;  // add(x2·cos, x1·sin), either order
  for (const auto& [r, t] : {std::pair{a[0], a[1]}, std::pair{a[1], a[0]}}) {
    if (IsMulOf(g, r, x2, &cos2) && IsMulOf(g, t, x1, &sin2) && cos2 == cos && sin2 == sin) {
      m->cos = cos;
      m->sin = sin;
      m->ops = {x1, x2, s[0], s[1], r, t, lo, hi};
      return true;
    }
  }
  return false;
}

// The matched pattern `r` when its tables fit and no op but %y is used elsewhere.
bool Accept(const Graph& g, ValueId y, const std::vector<int>& uses, const RotaryMatch& r,
            RotaryMatch* m) {
  const TensorType& t = g.type(y);
  for (ValueId table : {r.cos, r.sin}) {  // the muls' types say they broadcast to the halves
    const TensorType& tt = g.type(table);
    if (tt.dtype != t.dtype || tt.shape.empty() || tt.shape.back() != t.shape.back() / 2 ||
        table == r.x || std::find(r.ops.begin(), r.ops.end(), table) != r.ops.end()) {
      return false;
    }
  }
  for (size_t i = 0; i + 1 < r.ops.size(); ++i) {  // the halves are read twice, the rest once
    const ValueId op = r.ops[i];
    if (uses[op] != (i < 2 ? 2 : 1) || g.type(op).dtype != t.dtype) return false;
  }
  *m = r;
  return true;
}

}  // namespace

bool MatchRotary(const Graph& g, ValueId y, const std::vector<int>& uses, RotaryMatch* m) {
  if (!g.IsOp(y, OpId::kCat) || g.node(y).inputs.size() != 2) return false;
  const TensorType& t = g.type(y);
  const int64_t rank = t.rank(), dim = g.node(y).attrs.dim;
  if (rank < 1 || (dim < 0 ? dim + rank : dim) != rank - 1 || !IsFloatingPoint(t.dtype) ||
      t.shape.back() % 2 != 0) {
    return false;
  }
  const ValueId lo = g.node(y).inputs[0], hi = g.node(y).inputs[1];
  if (!g.IsOp(lo, OpId::kSub) || !g.IsOp(hi, OpId::kAdd)) return false;
  const ValueId p = g.node(lo).inputs[0], q = g.node(lo).inputs[1];  // x1·cos, x2·sin
  if (!g.IsOp(p, OpId::kMul) || !g.IsOp(q, OpId::kMul)) return false;
  const int64_t full = t.shape.back(), half = full / 2;
  for (ValueId x1 : g.node(p).inputs) {
    if (!g.IsOp(x1, OpId::kSlice)) continue;
    const ValueId x = g.node(x1).inputs[0];
    if (!(g.type(x) == t) || !IsLastDimSlice(g, x1, x, 0, half)) continue;
    for (ValueId x2 : g.node(q).inputs) {
      RotaryMatch r;
      if (!IsLastDimSlice(g, x2, x, half, full) || !MatchWithHalves(g, lo, hi, x1, x2, &r)) {
        continue;
      }
      r.x = x;
      r.ops.push_back(y);
      return Accept(g, y, uses, r, m);
    }
  }
  return false;
}

}  // namespace kiln::passes
