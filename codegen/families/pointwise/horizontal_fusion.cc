// Horizontal fusion of small pointwise kernels (see horizontal_fusion.h).
#include "codegen/families/pointwise/horizontal_fusion.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "passes/fusion_groups.h"

namespace kiln::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;

// The elements a fusion node's kernel walks: each segment's first output (a stored cat's parts
// are as many elements as the cat).
int64_t Elements(const Graph& body) {
  int64_t n = 0;
  for (const BodySegment& s : BodySegments(body))
    n += body.type(body.outputs()[s.outputs[0]]).numel();
  return n;
}

// Operands of the combo kernel: each segment's inputs and stores.
int Operands(const Graph& body) {
  int n = 0;
  for (const BodySegment& s : BodySegments(body)) n += SegmentOperands(body, s);
  return n;
}

bool Candidate(const Graph& g, ValueId v, const KernelFamily& family) {
  const Node& n = g.node(v);
  if (n.kind != NodeKind::kFusion || n.sym_dims != 0 || !family.OwnsBody(*n.body)) return false;
  for (ValueId o : n.body->outputs()) {  // an empty output would skip the whole node's run
    const int64_t numel = n.body->type(o).numel();
    if (numel == 0 || numel > kMaxComboElements) return false;
  }
  return Elements(*n.body) <= kMaxComboElements;
}

// The fusion after `a` that may join it, if any: the first candidate before anything reads a.
std::optional<ValueId> Partner(const Graph& g, ValueId a, const KernelFamily& family,
                               const std::vector<std::vector<ValueId>>& users) {
  const Node& na = g.node(a);
  std::vector<bool> of_a(g.num_values(), false);
  of_a[a] = true;
  for (ValueId u : users[a]) of_a[u] = g.node(u).kind == NodeKind::kResult;
  for (ValueId v = a + 1; v < g.num_values(); ++v) {
    const Node& n = g.node(v);
    if (n.kind == NodeKind::kResult && n.inputs[0] == a) continue;
    const bool reads_a =
        std::any_of(n.inputs.begin(), n.inputs.end(), [&](ValueId in) { return of_a[in]; });
    if (reads_a) return std::nullopt;
    if (!Candidate(g, v, family) || n.type.device != na.type.device) continue;
    const int64_t elements = Elements(*na.body) + Elements(*n.body);
    if (elements > kMaxComboElements) return std::nullopt;
    if (Operands(*na.body) + Operands(*n.body) > family.Limits(na.type.device).max_operands) {
      return std::nullopt;
    }
    return v;
  }
  return std::nullopt;
}

// The body of `a` and `b` side by side: a's inputs, b's inputs not among them, a's ops, b's ops;
// a's outputs, then b's. `inputs` receives the joined node's operands.
std::shared_ptr<Graph> JoinBodies(const Node& a, const Node& b, std::vector<ValueId>& inputs) {
  auto body = std::make_shared<Graph>();
  std::vector<ValueId> outputs;
  for (const Node* n : {&a, &b}) {
    const Graph& from = *n->body;
    std::vector<ValueId> map(from.num_values(), -1);
    for (size_t i = 0; i < from.inputs().size(); ++i) {
      const auto at = std::find(inputs.begin(), inputs.end(), n->inputs[i]);
      if (at != inputs.end()) {
        map[from.inputs()[i]] = body->inputs()[at - inputs.begin()];
        continue;
      }
      inputs.push_back(n->inputs[i]);
      map[from.inputs()[i]] = body->AddInput(from.type(from.inputs()[i]));
    }
    for (ValueId v = 0; v < from.num_values(); ++v) {
      if (from.node(v).kind != NodeKind::kInput) map[v] = body->AddCopy(from.node(v), map);
    }
    for (ValueId o : from.outputs()) outputs.push_back(map[o]);
  }
  body->SetOutputs(std::move(outputs));
  return body;
}

// A kernel name without its "kiln_fused_" (the joined name says it once).
std::string WithoutPrefix(const std::string& name) {
  constexpr char kPrefix[] = "kiln_fused_";
  return name.rfind(kPrefix, 0) == 0 ? name.substr(sizeof(kPrefix) - 1) : name;
}

// `g` with `a` and `b` joined into one node at b's place.
Graph Join(const Graph& g, ValueId a, ValueId b) {
  const Node& na = g.node(a);
  const Node& nb = g.node(b);
  const int a_outputs = static_cast<int>(na.body->outputs().size());
  Graph out;
  std::vector<ValueId> map(g.num_values(), -1), a_results;
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const Node& n = g.node(v);
    const bool result = n.kind == NodeKind::kResult;
    if (v == a || (result && n.inputs[0] == a)) {
      if (v != a) a_results.push_back(v);
      continue;
    }
    if (result && n.inputs[0] == b) {
      map[v] = out.AddResult(map[a], a_outputs + n.index);
      continue;
    }
    if (v != b) {
      map[v] = out.AddCopy(n, map);
      continue;
    }
    std::vector<ValueId> operands;
    Node joined;
    joined.kind = NodeKind::kFusion;
    joined.body = JoinBodies(na, nb, operands);
    for (ValueId in : operands) joined.inputs.push_back(map[in]);
    joined.type = na.type;
    joined.name = absl::StrCat(na.name, "_and_", WithoutPrefix(nb.name));
    map[a] = out.AddNode(std::move(joined));
    for (ValueId r : a_results) map[r] = out.AddResult(map[a], g.node(r).index);
    map[b] = out.AddResult(map[a], a_outputs);
  }
  out.SetOutputsFrom(g, map);
  return out;
}

}  // namespace

bool CombineSmallFusions(Graph& graph, const KernelFamily& family, PassContext& ctx) {
  if (!ctx.horizontal_fusion) return false;
  bool changed = false;
  for (ValueId a = 0; a < graph.num_values(); ++a) {
    if (!Candidate(graph, a, family)) continue;
    const std::optional<ValueId> b = Partner(graph, a, family, graph.Users());
    if (!b) continue;
    ctx.explain.push_back(absl::StrCat(
        "horizontal fusion: ", graph.node(a).name, " %", a, " and ", graph.node(*b).name, " %", *b,
        " run as one kernel (independent, ",
        Elements(*graph.node(a).body) + Elements(*graph.node(*b).body), " elements in all)"));
    graph = Join(graph, a, *b);
    changed = true;
    a = -1;  // ids moved: look again from the start (the joined node may take a third)
  }
  return changed;
}

}  // namespace kiln::passes
