// Cat sinking (see cat_sinking.h).
#include "passes/cat_sinking.h"

#include <algorithm>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/op_def.h"

namespace kiln::passes {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;

namespace {

constexpr int kMaxRebuildDepth = 3;  // elementwise operands rebuilt on slices, at most this deep

bool IsElementwiseOp(const Graph& g, ValueId v) {
  const Node& n = g.node(v);
  return n.kind == NodeKind::kOp && GetOpDef(n.op).is_elementwise() && n.sym_dims == 0 &&
         !n.inputs.empty();
}

// The op `v` reads this cat through (one of its operands), where the rules allow sinking it.
struct Site {
  ValueId op = -1, cat = -1;
  int64_t dim = 0;  // the cat's dim in the op's output
};

std::optional<Site> SiteAt(const Graph& g, ValueId v, const std::vector<int>& uses, bool cuda) {
  if (!IsElementwiseOp(g, v) || (!cuda && g.type(v).device.is_cuda())) return std::nullopt;
  const Node& n = g.node(v);
  const int64_t rank = n.type.rank();
  for (ValueId c : n.inputs) {
    if (!g.IsOp(c, OpId::kCat) || g.node(c).sym_dims != 0) continue;
    const Node& cat = g.node(c);
    const auto reads = std::count(n.inputs.begin(), n.inputs.end(), c);
    if (uses[c] != reads || cat.inputs.size() < 2 ||
        cat.inputs.size() > static_cast<size_t>(kMaxSunkParts)) {
      continue;  // another user (or a graph output) needs the cat itself
    }
    if (!std::all_of(cat.inputs.begin(), cat.inputs.end(),
                     [&](ValueId p) { return g.type(p).dtype == cat.type.dtype; })) {
      continue;  // the cat promotes a part: the op on it would compute in the part's dtype
    }
    const int64_t crank = cat.type.rank();
    const int64_t cdim = cat.attrs.dim < 0 ? cat.attrs.dim + crank : cat.attrs.dim;
    const int64_t dim = cdim + (rank - crank);
    if (cdim < 0 || cdim >= crank || dim < 0 || n.type.shape[dim] != cat.type.shape[cdim]) {
      continue;  // broadcast along the cat's dim: every part would need the whole op
    }
    return Site{v, c, dim};
  }
  return std::nullopt;
}

// Builds the graph with `site` rewritten; nullopt when the rebuilt value's type differs.
class Rewriter {
 public:
  Rewriter(const Graph& g, const Site& site, const std::vector<int>& uses)
      : g_(g), site_(site), uses_(uses), map_(g.num_values(), -1) {}

  std::optional<Graph> Run() {
    for (ValueId v = 0; v < g_.num_values(); ++v) {
      if (v != site_.op) {
        map_[v] = out_.AddCopy(g_.node(v), map_);
        continue;
      }
      const Node& n = g_.node(v);
      const Node& cat = g_.node(site_.cat);
      const int64_t cdim = site_.dim - (n.type.rank() - cat.type.rank());
      std::vector<ValueId> parts;
      int64_t at = 0;
      for (ValueId part : cat.inputs) {
        const int64_t len = g_.type(part).shape[cdim];
        std::vector<ValueId> args;
        for (ValueId a : n.inputs) {
          args.push_back(a == site_.cat ? map_[part] : SliceAlong(a, at, len, 0));
        }
        parts.push_back(out_.AddOp(n.op, args, n.attrs));
        if (out_.type(parts.back()).dtype != n.type.dtype) return std::nullopt;
        at += len;
      }
      OpAttrs c;
      c.dim = site_.dim;
      map_[v] = out_.AddOp(OpId::kCat, parts, c);
      if (!(out_.type(map_[v]) == n.type)) return std::nullopt;
    }
    out_.SetOutputsFrom(g_, map_);
    return std::move(out_);
  }

 private:
  // Elements [start, start + len) along the site's dim of old value `v` (in the op's output
  // coordinates): `v` itself where it broadcasts along that dim, else an elementwise op used only
  // by the site rebuilt on sliced operands, else a slice of it.
  ValueId SliceAlong(ValueId v, int64_t start, int64_t len, int depth) {
    const TensorType& t = g_.type(v);
    const int64_t out_rank = g_.type(site_.op).rank();
    const int64_t d = site_.dim - (out_rank - t.rank());
    if (d < 0 || t.shape[d] == 1) return map_[v];
    if (depth < kMaxRebuildDepth && uses_[v] == 1 && IsElementwiseOp(g_, v) &&
        t.rank() == out_rank && t.shape[d] == g_.type(site_.op).shape[site_.dim]) {
      const Node& n = g_.node(v);
      std::vector<ValueId> args;
      for (ValueId a : n.inputs) {
        // An operand of lower rank lines up with v's last dims, as with the site's.
        args.push_back(SliceAlong(a, start, len, depth + 1));
      }
      return out_.AddOp(n.op, args, n.attrs);
    }
    OpAttrs s;
    s.dim = d;
    s.start = start;
    s.end = start + len;
    s.step = 1;
    return out_.AddOp(OpId::kSlice, {map_[v]}, s);
  }

  const Graph& g_;
  Site site_;
  const std::vector<int>& uses_;
  std::vector<ValueId> map_;
  Graph out_;
};

}  // namespace

absl::StatusOr<bool> CatSinking::Run(Graph& graph, PassContext& ctx) {
  bool changed = false;
  std::set<ValueId> refused;  // ids of the current graph whose rewrite changed the type
  for (bool again = true; again;) {
    again = false;
    const std::vector<int> uses = graph.UseCounts();
    for (ValueId v = 0; v < graph.num_values() && !again; ++v) {
      if (refused.count(v) != 0) continue;
      const std::optional<Site> site = SiteAt(graph, v, uses, ctx.cuda_cat_sinking);
      if (!site.has_value()) continue;
      std::optional<Graph> out = Rewriter(graph, *site, uses).Run();
      if (!out.has_value()) {
        refused.insert(v);
        continue;
      }
      ctx.explain.push_back(absl::StrCat("cat sinking: ", GetOpDef(graph.node(v).op).name, " %", v,
                                         " computes on the ", graph.node(site->cat).inputs.size(),
                                         " parts of cat %", site->cat, "; the cat follows it"));
      graph = std::move(*out);
      refused.clear();  // ids moved
      again = changed = true;
    }
  }
  return changed;
}

}  // namespace kiln::passes
