// Attention fusion (see attention_fusion.h).
#include "codegen/families/attention/attention_fusion.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "codegen/families/attention/rotary_pattern.h"
#include "codegen/families/softmax/softmax_fusion.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "passes/fusion_groups.h"
#include "runtime/status.h"

namespace kiln::passes {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;

namespace {

constexpr char kLog[] = "attention fusion: ";

// One naive attention found in the graph.
struct Match {
  ValueId root = -1;  // the final matmul, rewritten in place
  ValueId q = -1, k = -1, v = -1;
  ValueId mask = -1;        // an additive mask, or a masked_fill's bool mask (true = masked out)
  bool bool_mask = false;   // masked_fill with `mask`
  bool known_mask = false;  // the bool mask is a constant whose values may be read now
  bool causal = false;      // the known bool mask is exactly the causal pattern
  double scale = 1.0;
};

bool IsOp(const Graph& g, ValueId v, OpId op) { return g.IsOp(v, op); }

// Whether constant `mask` (bool, true = masked out) is the causal pattern over [L, S] scores:
// leading dims of size 1, and element (i, j) true exactly when j > i.
bool IsCausalMask(const Tensor& mask, int64_t l, int64_t s) {
  if (mask.dim() < 2 || mask.size(-2) != l || mask.size(-1) != s) return false;
  for (int64_t d = 0; d + 2 < mask.dim(); ++d) {
    if (mask.size(d) != 1) return false;
  }
  const std::vector<double> bits = to_vector(to(mask, kCPU));
  for (int64_t i = 0; i < l; ++i) {
    for (int64_t j = 0; j < s; ++j) {
      if ((bits[i * s + j] != 0) != (j > i)) return false;
    }
  }
  return true;
}

// Whether a masked_fill mask (true: hidden) hides every one of the s keys of some row: there
// softmax gives NaN (0/0), where SDPA gives zeros. A mask of 0 elements hides no row.
bool HidesAWholeRow(const Tensor& mask, int64_t s) {
  if (mask.numel() == 0 || s == 0) return false;
  const int64_t cols = mask.dim() == 0 ? 1 : mask.size(-1);  // 1: broadcast over the keys
  const std::vector<double> bits = to_vector(to(contiguous(mask), kCPU));
  for (size_t row = 0; row < bits.size(); row += cols) {
    if (std::all_of(bits.begin() + row, bits.begin() + row + cols,
                    [](double b) { return b != 0; })) {
      return true;
    }
  }
  return false;
}

// The type of the mask operand the attention node gets: a bool keep-mask for a known mask, an
// additive mask in q's dtype for one computed each call, the additive term itself otherwise.
TensorType MaskType(const Match& m, const Graph& g) {
  TensorType t = g.type(m.mask);
  if (m.bool_mask) t.dtype = m.known_mask ? DType::kBool : g.type(m.q).dtype;
  return t;
}

class Matcher {
 public:
  Matcher(const Graph& g, PassContext& ctx, const KernelFamily& family)
      : g_(g), ctx_(ctx), family_(family), uses_(g.UseCounts()) {}

  // Matches the attention ending at matmul `root`; false (with an explain line for near-misses)
  // when it is none.
  bool Run(ValueId root, Match* m) {
    const Node& r = g_.node(root);
    if (!IsOp(g_, root, OpId::kMatmul) || r.attrs.transpose_a || r.attrs.transpose_b) return false;
    const ValueId p = r.inputs[0];
    if (!IsOp(g_, p, OpId::kSoftmax)) return false;
    m->root = root;
    m->v = r.inputs[1];
    if (!IsLastDimSoftmax(g_.node(p))) return Refuse(root, "the softmax is not over the last dim");
    if (uses_[p] != 1) return Refuse(root, "the probabilities are used elsewhere");
    ValueId x = g_.node(p).inputs[0];
    if (!PeelScoreOps(root, &x, m)) return false;
    if (!IsOp(g_, x, OpId::kMatmul)) return Refuse(root, "the scores are not a matmul");
    if (uses_[x] != 1) return Refuse(root, "the scores are used elsewhere");
    const Node& s = g_.node(x);
    if (s.attrs.transpose_a || !s.attrs.transpose_b) {
      return Refuse(root, "the scores are not q·kᵀ (the key operand is not transposed)");
    }
    m->q = s.inputs[0];
    m->k = s.inputs[1];
    PeelQueryScale(m);
    return CheckOperands(root, m);
  }

 private:
  bool Refuse(ValueId root, const std::string& why) {
    ctx_.explain.push_back(
        absl::StrCat(kLog, "not fused: the attention ending at %", root, ": ", why));
    return false;
  }

  // Walks from the softmax input back over the scale, the mask and the additive term.
  bool PeelScoreOps(ValueId root, ValueId* x, Match* m) {
    bool scaled = false, masked = false;
    while (true) {
      const Node& n = g_.node(*x);
      if (n.kind != NodeKind::kOp) return true;
      const bool scale_op = n.op == OpId::kMulScalar || n.op == OpId::kDivScalar;
      const bool mask_op = n.op == OpId::kMaskedFill || n.op == OpId::kAdd;
      if (!scale_op && !mask_op) return true;
      if (uses_[*x] != 1) return Refuse(root, "the scores are used elsewhere");
      if (scale_op) {
        if (scaled) return true;
        scaled = true;
        m->scale *= n.op == OpId::kMulScalar ? n.attrs.scalar.to_double()
                                             : 1.0 / n.attrs.scalar.to_double();
        *x = n.inputs[0];
        continue;
      }
      if (masked) return Refuse(root, "two masks");
      masked = true;
      if (n.op == OpId::kMaskedFill) {
        if (!(std::isinf(n.attrs.scalar.to_double()) && n.attrs.scalar.to_double() < 0)) {
          return Refuse(root, "the masked_fill value is not -inf");
        }
        // A constant made while tracing (or frozen) is read now: a causal pattern becomes
        // is_causal. Any other mask (an input, the caller's tensor) becomes an additive mask
        // computed each call.
        const Node& mask = g_.node(n.inputs[1]);
        m->known_mask = mask.kind == NodeKind::kConstant && mask.constant.defined() &&
                        (mask.local || ctx_.fold_constants);
        m->mask = n.inputs[1];
        m->bool_mask = true;
        *x = n.inputs[0];
        continue;
      }
      const bool first_is_chain =
          g_.node(n.inputs[0]).kind == NodeKind::kOp && g_.node(n.inputs[0]).op != OpId::kExpand;
      *x = n.inputs[first_is_chain ? 0 : 1];
      m->mask = n.inputs[first_is_chain ? 1 : 0];
    }
  }

  // A scale applied to q before the product.
  void PeelQueryScale(Match* m) {
    const Node& q = g_.node(m->q);
    if (uses_[m->q] != 1 || q.kind != NodeKind::kOp) return;
    if (q.op != OpId::kMulScalar && q.op != OpId::kDivScalar) return;
    m->scale *=
        q.op == OpId::kMulScalar ? q.attrs.scalar.to_double() : 1.0 / q.attrs.scalar.to_double();
    m->q = q.inputs[0];
  }

  bool CheckOperands(ValueId root, Match* m) {
    const TensorType &q = g_.type(m->q), &k = g_.type(m->k), &v = g_.type(m->v);
    if (q.dtype != k.dtype || q.dtype != v.dtype) return Refuse(root, "q, k and v differ in dtype");
    if (m->known_mask) {
      const Tensor& mask = g_.node(m->mask).constant;
      if (HidesAWholeRow(mask, k.shape[k.rank() - 2])) {
        return Refuse(root,
                      "the mask hides every key of a row (softmax gives NaN there, SDPA zeros)");
      }
      m->causal = IsCausalMask(mask, q.shape[q.rank() - 2], k.shape[k.rank() - 2]);
    }
    std::vector<TensorType> types = {q, k, v};
    if (m->mask >= 0 && !m->causal) types.push_back(MaskType(*m, g_));
    if (const std::string why = family_.RejectsOperands(types); !why.empty()) {
      return Refuse(root, absl::StrCat("the attention kernel does not take these operands: ", why));
    }
    return true;
  }

  const Graph& g_;
  PassContext& ctx_;
  const KernelFamily& family_;
  std::vector<int> uses_;
};

// SDPA's bool mask means "take part": the complement of a masked_fill mask.
Tensor KeepMask(const Tensor& masked_out) {
  std::vector<double> bits = to_vector(to(masked_out, kCPU));
  for (double& b : bits) b = b != 0 ? 0.0 : 1.0;
  return to(from_vector(bits, masked_out.shape(), DType::kBool), masked_out.device());
}

// The mask operand of match `m` in `out`: a complemented known mask (a new constant), the
// additive term, or masked_fill(zeros, mask) {-inf}: a bool mask known only at run time as an
// additive mask (one small elementwise kernel a call).
ValueId MaskOperand(const Graph& g, const Match& m, const std::vector<ValueId>& map, Graph& out,
                    ValueId root) {
  if (!m.bool_mask) return map[m.mask];
  if (m.known_mask) {
    const ValueId keep =
        out.AddConstant(KeepMask(g.node(m.mask).constant), absl::StrCat("keep_mask_", root));
    out.mutable_node(keep).local = true;
    return keep;
  }
  const TensorType t = MaskType(m, g);
  const ValueId zeros =
      out.AddConstant(kiln::zeros(t.shape, t.dtype, t.device), absl::StrCat("zeros_", root));
  out.mutable_node(zeros).local = true;
  OpAttrs fill;
  fill.scalar = -INFINITY;
  return out.AddOp(OpId::kMaskedFill, {zeros, map[m.mask]}, fill);
}

// Rebuilds the graph with each match's root replaced by one attention node (a new mask operand
// placed just before it).
Graph Rewrite(const Graph& g, const std::map<ValueId, Match>& matches) {
  Graph out;
  std::vector<ValueId> map(g.num_values(), -1);
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const Node& n = g.node(v);
    auto it = matches.find(v);
    if (it == matches.end()) {
      map[v] = out.AddCopy(n, map);
      continue;
    }
    const Match& m = it->second;
    absl::InlinedVector<ValueId, 4> ins = {map[m.q], map[m.k], map[m.v]};
    if (m.mask >= 0 && !m.causal) ins.push_back(MaskOperand(g, m, map, out, v));
    OpAttrs a;
    a.scale = m.scale;
    a.is_causal = m.causal;
    map[v] = out.AddOpWithType(OpId::kScaledDotProductAttention, ins, a, n.type);
    out.mutable_node(map[v]).sym_dims = n.sym_dims;
  }
  out.SetOutputsFrom(g, map);
  return out;
}

// ---- KV-cache appends joining the attention that reads them ---------------------------------

constexpr char kAppendLog[] = "attention fusion: KV append ";

int64_t WrapDim(int64_t dim, int64_t rank) { return dim < 0 ? dim + rank : dim; }

// Why index_copy writes `k` and `v` are not one KV append (two caches, one index, rows along dim
// -2): "" when they are. The pass's rule and the body's (ParseKvAppendBody).
std::string KvWritesRefusal(const Graph& g, ValueId k, ValueId v) {
  const Node &kn = g.node(k), &vn = g.node(v);
  if (k == v) return "the key and the value are one index_copy";
  if (kn.inputs[0] == vn.inputs[0]) return "the key and value caches are one tensor";
  if (kn.inputs[1] != vn.inputs[1]) return "the key and value rows go to different index tensors";
  const int64_t rank = g.type(k).rank();
  if (rank < 2 || WrapDim(kn.attrs.dim, rank) != rank - 2 ||
      WrapDim(vn.attrs.dim, g.type(v).rank()) != rank - 2) {
    return "the rows are not written along the key-row dim (-2)";
  }
  return "";
}

// Why the cache writes feeding attention node `a` (its key and value are index_copy nodes) cannot
// join it ("" when they can).
std::string AppendRefusal(const Graph& g, ValueId a, const FusionGroups& grp,
                          const KernelFamily& family) {
  const Node& n = g.node(a);
  const ValueId k = n.inputs[1], v = n.inputs[2];
  const Node &kn = g.node(k), &vn = g.node(v);
  if (std::string why = KvWritesRefusal(g, k, v); !why.empty()) return why;
  const TensorType& slots = g.type(kn.inputs[1]);
  if (slots.rank() != 1 || slots.shape[0] < 1 || slots.shape[0] > kKvAppendMaxRows) {
    return absl::StrCat("the index is ", Describe(slots), "; the fused append takes 1 to ",
                        kKvAppendMaxRows, " rows");
  }
  const TensorType& q = g.type(n.inputs[0]);
  if (q.rank() < 2 || q.shape[q.rank() - 2] > kKvAppendMaxRows) {
    return absl::StrCat("query ", Describe(q), ": the fused append takes up to ", kKvAppendMaxRows,
                        " query rows (a decode step)");
  }
  if ((n.sym_dims | kn.sym_dims | vn.sym_dims) != 0) {
    return "symbolic dims (a dynamic shape): the fused node's shape is fixed at compile time";
  }
  if (grp.group_of[k] != -1 || grp.group_of[v] != -1) return "a write is already in a group";
  const std::vector<bool> after = DependentsOf(g, {k, v});
  for (const Node* m : {&n, &kn, &vn}) {
    for (ValueId in : m->inputs) {
      if (in != k && in != v && after[in]) {
        return absl::StrCat("%", in, ", which the node would read, depends on the writes");
      }
    }
  }
  std::vector<TensorType> types;
  for (ValueId in : n.inputs) types.push_back(g.type(in));
  if (std::string why = family.RejectsOperands(types); !why.empty()) {
    return absl::StrCat("the attention kernel does not take these operands: ", why);
  }
  return "";
}

// Whether the query %q and the new keys %k_new are both rotations (rotary_pattern.h) by the same
// tables, each read only by the attention / the cache write: the pass's rule and the body's
// (ParseKvAppendBody). False with the near miss in *why ("" when neither is a rotation).
bool MatchRotaryPair(const Graph& g, ValueId q, ValueId k_new, const std::vector<int>& uses,
                     RotaryMatch* rq, RotaryMatch* rk, std::string* why) {
  const bool mq = MatchRotary(g, q, uses, rq), mk = MatchRotary(g, k_new, uses, rk);
  if (!mq && !mk) return false;
  if (!mq || !mk) {
    *why = absl::StrCat("only the ", mq ? "query" : "new key", " is a rotation");
  } else if (rq->cos != rk->cos || rq->sin != rk->sin) {
    *why = "the query and the new key rotate by different tables";
  } else if (uses[q] != 1 || uses[k_new] != 1) {
    *why = "a rotated query or key is used elsewhere";
  }
  return why->empty();
}

// Whether a rotary table [.., half] of rank <= 4 broadcasts over the heads of [B, H, T, half]
// (the decode kernel reads one row per batch and row).
bool OneRowForEveryHead(const TensorType& t) {
  return t.rank() <= 4 && (t.rank() < 3 || t.shape[t.rank() - 3] == 1);
}

// The rotary embeddings of the query and the new keys of a KV append into attention %a, when both
// can join its node (attention_fusion.h): their ops, or empty with the reason in *why ("" when
// neither input is a rotation at all).
std::vector<ValueId> RotaryOps(const Graph& g, ValueId a, const FusionGroups& grp,
                               const std::vector<int>& uses, std::string* why) {
  const Node& n = g.node(a);
  RotaryMatch rq, rk;
  if (!MatchRotaryPair(g, n.inputs[0], g.node(n.inputs[1]).inputs[2], uses, &rq, &rk, why)) {
    return {};
  }
  if (!OneRowForEveryHead(g.type(rq.cos)) || !OneRowForEveryHead(g.type(rq.sin))) {
    *why = "the tables do not broadcast over the heads";
  }
  std::vector<ValueId> ops = rq.ops;
  ops.insert(ops.end(), rk.ops.begin(), rk.ops.end());
  for (ValueId op : ops) {
    if (!why->empty()) break;
    if (grp.group_of[op] != -1) *why = absl::StrCat("%", op, " is already in a group");
    if (g.node(op).sym_dims != 0) *why = "symbolic dims (a dynamic shape)";
  }
  const std::vector<bool> after = DependentsOf(g, {n.inputs[1], n.inputs[2]});
  for (ValueId in : {rq.x, rk.x, rq.cos, rq.sin}) {
    if (why->empty() && after[in]) *why = absl::StrCat("%", in, " depends on the writes");
  }
  return why->empty() ? ops : std::vector<ValueId>{};
}

// Groups each attention node whose key and value are index_copy writes with them (and with the
// rotary embeddings of its query and new keys, PassContext::kv_rope); rewrites the graph when any
// formed.
bool FuseKvAppends(Graph& graph, PassContext& ctx, const KernelFamily& family) {
  FusionGroups grp(graph, {});
  grp.log_prefix = kAppendLog;
  const std::vector<int> uses = graph.UseCounts();
  const bool rope = ctx.kv_rope;
  for (ValueId a = 0; a < graph.num_values(); ++a) {
    if (!graph.IsOp(a, OpId::kScaledDotProductAttention)) continue;
    const ValueId k = graph.node(a).inputs[1], v = graph.node(a).inputs[2];
    if (!graph.IsOp(k, OpId::kIndexCopy) || !graph.IsOp(v, OpId::kIndexCopy)) continue;
    if (const std::string why = AppendRefusal(graph, a, grp, family); !why.empty()) {
      ctx.explain.push_back(absl::StrCat(kAppendLog, "not fused: the writes %", k, ", %", v,
                                         " into the caches attention %", a, " reads: ", why));
      continue;
    }
    const int gid = static_cast<int>(grp.groups.size());
    std::vector<ValueId> members = {k, v, a};
    std::string why, rotary;
    if (rope) {
      const std::vector<ValueId> ops = RotaryOps(graph, a, grp, uses, &why);
      members.insert(members.end(), ops.begin(), ops.end());
      if (!ops.empty()) rotary = ", rotating the query and the new keys (the rotary embedding)";
      if (!why.empty()) {
        ctx.explain.push_back(absl::StrCat(kAppendLog, "into attention %", a,
                                           ": the rotary embedding not joined: ", why));
      }
    }
    std::sort(members.begin(), members.end());
    for (ValueId m : members) grp.group_of[m] = gid;
    grp.groups.push_back(std::move(members));
    ctx.explain.push_back(absl::StrCat(kAppendLog, "%", k, ", %", v, " -> attention %", a,
                                       ": one kernel writes the new rows and attends over them",
                                       rotary));
  }
  return RewriteFusionGroups(graph, grp);
}

}  // namespace

bool ParseKvAppendBody(const Graph& body, KvAppendBody* roles) {
  const auto& outs = body.outputs();
  if (outs.empty() || !body.IsOp(outs[0], OpId::kScaledDotProductAttention)) return false;
  int ops = 0;
  for (const Node& n : body.nodes()) ops += n.kind == NodeKind::kOp ? 1 : 0;
  const Node& a = body.node(outs[0]);
  if (a.inputs.size() < 3) return false;
  const ValueId k = a.inputs[1], v = a.inputs[2];
  if (!body.IsOp(k, OpId::kIndexCopy) || !body.IsOp(v, OpId::kIndexCopy) ||
      !KvWritesRefusal(body, k, v).empty()) {
    return false;
  }
  auto input_of = [&](ValueId x) {  // the body-input position of x, or -1
    const auto& in = body.inputs();
    const auto it = std::find(in.begin(), in.end(), x);
    return it == in.end() ? -1 : static_cast<int>(it - in.begin());
  };
  const Node &kn = body.node(k), &vn = body.node(v);
  KvAppendBody r;
  ValueId q = a.inputs[0], k_new = kn.inputs[2];
  RotaryMatch rq, rk;
  std::string near_miss;
  if (MatchRotaryPair(body, q, k_new, body.UseCounts(), &rq, &rk, &near_miss)) {
    q = rq.x, k_new = rk.x;
    r.cos = input_of(rq.cos), r.sin = input_of(rq.sin);
    if (r.cos < 0 || r.sin < 0) return false;
    ops -= static_cast<int>(rq.ops.size() + rk.ops.size());
  }
  if (ops != 3) return false;
  r.q = input_of(q);
  r.mask = a.inputs.size() > 3 ? input_of(a.inputs[3]) : -1;
  r.k_cache = input_of(kn.inputs[0]), r.v_cache = input_of(vn.inputs[0]);
  r.slots = input_of(kn.inputs[1]);
  r.k_new = input_of(k_new), r.v_new = input_of(vn.inputs[2]);
  const int64_t rank = body.type(k).rank();
  r.dim = static_cast<int>(WrapDim(kn.attrs.dim, rank));
  r.attention = a.attrs;
  for (size_t o = 1; o < outs.size(); ++o) {
    if (outs[o] == k) r.k_out = static_cast<int>(o);
    if (outs[o] == v) r.v_out = static_cast<int>(o);
  }
  const bool operands = r.q >= 0 && r.k_cache >= 0 && r.v_cache >= 0 && r.slots >= 0 &&
                        r.k_new >= 0 && r.v_new >= 0 && (a.inputs.size() == 3 || r.mask >= 0);
  if (!operands) return false;
  *roles = r;
  return true;
}

absl::StatusOr<bool> AttentionFusion::Run(Graph& graph, PassContext& ctx) {
  if (!ctx.Enabled(family_.name())) return false;
  std::map<ValueId, Match> matches;
  Matcher matcher(graph, ctx, family_);
  for (ValueId v = 0; v < graph.num_values(); ++v) {
    Match m;
    if (!matcher.Run(v, &m)) continue;
    std::vector<TensorType> types = {graph.type(m.q), graph.type(m.k), graph.type(m.v)};
    if (m.mask >= 0 && !m.causal) types.push_back(MaskType(m, graph));
    OpAttrs a;
    a.scale = m.scale;
    a.is_causal = m.causal;
    try {  // the attention op's own rules (shapes, mask broadcast) have the last word
      const TensorType t = InferTypesOrThrow(GetOpDef(OpId::kScaledDotProductAttention), types, a);
      if (!(t == graph.type(v))) continue;
    } catch (const Error& e) {
      ctx.explain.push_back(
          absl::StrCat(kLog, "not fused: the attention ending at %", v, ": ", e.what()));
      continue;
    }
    ctx.explain.push_back(absl::StrCat(
        kLog, "%", v, " and its scores chain became one ", "scaled_dot_product_attention (scale ",
        m.scale, m.causal ? ", causal" : "", m.mask >= 0 && !m.causal ? ", with a mask" : "", ")"));
    matches.emplace(v, m);
  }
  if (!matches.empty()) graph = Rewrite(graph, matches);
  const bool appended = FuseKvAppends(graph, ctx, family_);
  return !matches.empty() || appended;
}

}  // namespace kiln::passes
