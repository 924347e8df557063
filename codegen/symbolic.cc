// Symbolic dims (see symbolic.h).
#include "codegen/symbolic.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/printer.h"
#include "runtime/status.h"

namespace kiln::codegen {
namespace {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::SymInt;
using ir::ValueId;

// Two probe assignments (distinct primes per symbol, small enough that tensors a function builds
// from a size while tracing stay small).
constexpr int64_t kProbes[2][4] = {{97, 89, 83, 79}, {131, 127, 113, 109}};
constexpr int kMaxSymbols = 4;

std::vector<TensorType> WithSymbols(std::vector<TensorType> types, const SymbolicShapes& s,
                                    absl::Span<const int64_t> values) {
  for (size_t j = 0; j < s.symbols.size(); ++j) {
    for (auto [input, dim] : s.symbols[j].dims) types[input].shape[dim] = values[j];
  }
  return types;
}

std::vector<int64_t> ValuesIn(const std::vector<TensorType>& types, const SymbolicShapes& s) {
  std::vector<int64_t> v;
  for (const auto& sym : s.symbols) {
    v.push_back(types[sym.dims[0].first].shape[sym.dims[0].second]);
  }
  return v;
}

bool HasSizeAttrs(const Node& n) {
  return n.kind == NodeKind::kOp &&
         (n.op == OpId::kReshape || n.op == OpId::kExpand || n.op == OpId::kSlice);
}

// The size attributes of a view, in the order sym_attrs keeps them.
std::vector<int64_t> SizeAttrs(const Node& n) {
  if (n.op == OpId::kSlice) return {n.attrs.start, n.attrs.end};
  return std::vector<int64_t>(n.attrs.dims.begin(), n.attrs.dims.end());
}

OpAttrs WithoutSizes(const Node& n) {
  OpAttrs a = n.attrs;
  if (!HasSizeAttrs(n)) return a;
  if (n.op == OpId::kSlice) {
    a.start = a.end = 0;
  } else {
    a.dims.assign(a.dims.size(), 0);
  }
  return a;
}

// A formula through the three points (probe 0, probe 1, real), or nullopt.
struct Point {
  int64_t value;
  const std::vector<int64_t>* symbols;
};

std::optional<SymInt> Fit(const Point p[3]) {
  if (p[0].value == p[1].value && p[1].value == p[2].value) return SymInt{p[0].value};
  const int n = static_cast<int>(p[0].symbols->size());
  for (int a = 0; a < n; ++a) {
    for (int b = -1; b < n; ++b) {
      if (b >= 0 && b < a) continue;
      auto mono = [&](const Point& q) { return (*q.symbols)[a] * (b < 0 ? 1 : (*q.symbols)[b]); };
      const int64_t den = mono(p[0]) - mono(p[1]), num = p[0].value - p[1].value;
      if (den == 0 || num % den != 0) continue;
      SymInt s{0, num / den, a, b};
      s.offset = p[0].value - s.scale * mono(p[0]);
      if (s.Eval(*p[2].symbols) == p[2].value) return s;
    }
  }
  return std::nullopt;
}

std::string Where(const Graph& g, ValueId v) {
  const Node& n = g.node(v);
  const char* what = n.kind == NodeKind::kOp         ? GetOpDef(n.op).name
                     : n.kind == NodeKind::kConstant ? "constant"
                                                     : "input";
  return absl::StrCat("%", v, " (", what, ")");
}

// "" when nodes `a` and `b` of two traces are one node but for sizes (the same op, operands,
// dtype, device, rank, other attributes and constant), else how they differ.
std::string SameNodeBarSizes(const Node& a, const Node& b) {
  if (a.kind != b.kind || a.op != b.op || a.inputs != b.inputs || a.type.dtype != b.type.dtype ||
      a.type.device != b.type.device || a.type.rank() != b.type.rank()) {
    return "another op, operand, dtype, device or rank";
  }
  if (!(WithoutSizes(a) == WithoutSizes(b))) return "a non-size attribute";
  if (b.kind == NodeKind::kConstant && !a.constant.is_same(b.constant) &&
      !(a.constant.storage() == b.constant.storage() && a.constant.shape() == b.constant.shape() &&
        a.constant.offset() == b.constant.offset())) {
    return absl::StrCat("a constant of shape ", b.constant.shape_string(), " built from the sizes");
  }
  return "";
}

// Checks node v of the three traces is one node and annotates it in `out`.
absl::Status Unify(const Graph* g[3], const std::vector<int64_t>* syms[3], ValueId v, Node& out) {
  const Node* n[3] = {&g[0]->node(v), &g[1]->node(v), &g[2]->node(v)};
  const auto mismatch = [&](const std::string& what) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(*g[2], v), " differs between sizes: ", what));
  };
  for (int k = 0; k < 2; ++k) {
    if (const std::string differ = SameNodeBarSizes(*n[k], *n[2]); !differ.empty()) {
      return mismatch(differ);
    }
  }
  for (int64_t d = 0; d < n[2]->type.rank(); ++d) {
    if (n[0]->type.shape[d] != n[2]->type.shape[d] || n[1]->type.shape[d] != n[2]->type.shape[d]) {
      out.sym_dims |= 1u << d;
    }
  }
  if (!HasSizeAttrs(*n[2])) return absl::OkStatus();
  const std::vector<int64_t> a[3] = {SizeAttrs(*n[0]), SizeAttrs(*n[1]), SizeAttrs(*n[2])};
  if (a[0].size() != a[2].size() || a[1].size() != a[2].size()) return mismatch("size list length");
  std::vector<SymInt> f;
  bool symbolic = false;
  for (size_t i = 0; i < a[2].size(); ++i) {
    const Point p[3] = {{a[0][i], syms[0]}, {a[1][i], syms[1]}, {a[2][i], syms[2]}};
    const std::optional<SymInt> s = Fit(p);
    if (!s) {
      return mismatch(absl::StrCat("size attribute #", i, " is ", a[0][i], ", ", a[1][i], ", ",
                                   a[2][i], ": no offset + scale·s formula fits"));
    }
    symbolic |= !s->is_constant();
    f.push_back(*s);
  }
  if (symbolic) out.sym_attrs = std::move(f);
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> SymbolicShapes::Values(absl::Span<const Tensor> inputs) const {
  std::vector<int64_t> v;
  for (const Symbol& s : symbols) v.push_back(inputs[s.dims[0].first].size(s.dims[0].second));
  return v;
}

bool SymbolicShapes::Admits(const std::vector<TensorType>& traced,
                            absl::Span<const Tensor> inputs) const {
  if (traced.size() != inputs.size()) return false;
  for (size_t i = 0; i < traced.size(); ++i) {  // first: the symbols' dims below exist
    const Tensor& t = inputs[i];
    if (!t.defined() || t.dtype() != traced[i].dtype || t.device() != traced[i].device ||
        t.dim() != traced[i].rank()) {
      return false;
    }
  }
  std::vector<std::vector<bool>> symbolic(traced.size());
  for (size_t i = 0; i < traced.size(); ++i) symbolic[i].assign(traced[i].rank(), false);
  for (const Symbol& s : symbols) {
    const int64_t value = inputs[s.dims[0].first].size(s.dims[0].second);
    for (auto [i, d] : s.dims) {
      if (inputs[i].size(d) != value) return false;
      symbolic[i][d] = true;
    }
  }
  for (size_t i = 0; i < traced.size(); ++i) {
    const Tensor& t = inputs[i];
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (!symbolic[i][d] && t.size(d) != traced[i].shape[d]) return false;
    }
  }
  return true;
}

std::string SymbolicShapes::Describe() const {
  std::vector<std::string> parts;
  for (size_t j = 0; j < symbols.size(); ++j) {
    std::vector<std::string> dims;
    for (auto [i, d] : symbols[j].dims) dims.push_back(absl::StrCat("input", i, "[", d, "]"));
    parts.push_back(absl::StrCat("s", j, " = ", absl::StrJoin(dims, " = ")));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, "; ");
}

std::optional<SymbolicShapes> SymbolsBetween(const std::vector<TensorType>& a,
                                             const std::vector<TensorType>& b) {
  if (a.size() != b.size()) return std::nullopt;
  std::map<std::pair<int64_t, int64_t>, int> symbol_of;  // (size in a, size in b) -> symbol
  SymbolicShapes s;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].dtype != b[i].dtype || a[i].device != b[i].device || a[i].rank() != b[i].rank()) {
      return std::nullopt;
    }
    for (int64_t d = 0; d < a[i].rank(); ++d) {
      if (a[i].shape[d] == b[i].shape[d]) continue;
      auto [it, added] = symbol_of.try_emplace({a[i].shape[d], b[i].shape[d]}, s.symbols.size());
      if (added) s.symbols.emplace_back();
      s.symbols[it->second].dims.push_back({static_cast<int>(i), static_cast<int>(d)});
    }
  }
  if (s.empty() || s.symbols.size() > kMaxSymbols) return std::nullopt;
  return s;
}

absl::StatusOr<SymbolicShapes> NamedSymbols(const std::vector<TensorType>& types,
                                            const std::vector<std::pair<int, int>>& dims) {
  std::map<int64_t, int> symbol_of;  // size -> symbol
  SymbolicShapes s;
  for (auto [i, d] : dims) {
    if (i < 0 || i >= static_cast<int>(types.size()) || d < 0 || d >= types[i].rank()) {
      return absl::InvalidArgumentError(absl::StrCat("compile: dynamic dim (input ", i, ", dim ", d,
                                                     ") does not exist in the example inputs"));
    }
    auto [it, added] = symbol_of.try_emplace(types[i].shape[d], s.symbols.size());
    if (added) s.symbols.emplace_back();
    s.symbols[it->second].dims.push_back({i, d});
  }
  if (s.symbols.size() > kMaxSymbols) {
    return absl::InvalidArgumentError(
        absl::StrCat("compile: at most ", kMaxSymbols, " distinct dynamic sizes"));
  }
  return s;
}

namespace {

// ir::Trace at `types`; an exception the user's function throws (any, not only kiln::Error) is
// an error status: at sizes the caller never passed, it only means "not this program".
absl::StatusOr<Graph> TraceAt(const ir::TensorFn& fn, const std::vector<TensorType>& types,
                              std::vector<std::optional<ir::OutputAlias>>* aliases = nullptr) {
  try {
    return ir::Trace(fn, types, std::vector<Strides>(types.size()), nullptr, aliases);
  } catch (const std::exception& e) {
    std::vector<std::string> shapes;
    for (const TensorType& t : types) shapes.push_back(ShapeString(t.shape));
    return absl::FailedPreconditionError(absl::StrCat("the function threw while traced at sizes ",
                                                      absl::StrJoin(shapes, ", "), ": ", e.what()));
  }
}

}  // namespace

std::vector<std::vector<int64_t>> TracedValues(const std::vector<TensorType>& types,
                                               const SymbolicShapes& symbols) {
  const size_t n = symbols.symbols.size();
  return {ValuesIn(types, symbols), std::vector<int64_t>(kProbes[0], kProbes[0] + n),
          std::vector<int64_t>(kProbes[1], kProbes[1] + n)};
}

absl::Status SameProgramAt(const ir::TensorFn& fn, const Graph& symbolic,
                           const std::vector<TensorType>& types, const SymbolicShapes& symbols,
                           absl::Span<const int64_t> values) {
  KILN_ASSIGN_OR_RETURN(const Graph g, TraceAt(fn, WithSymbols(types, symbols, values)));
  if (g.num_values() != symbolic.num_values() || g.outputs() != symbolic.outputs() ||
      g.input_updates() != symbolic.input_updates()) {
    return absl::FailedPreconditionError("the traced program changes with the sizes");
  }
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const Node &a = g.node(v), &b = symbolic.node(v);
    const auto mismatch = [&](const std::string& what) {
      return absl::FailedPreconditionError(
          absl::StrCat(Where(g, v), " differs at these sizes: ", what));
    };
    if (const std::string differ = SameNodeBarSizes(a, b); !differ.empty()) return mismatch(differ);
    for (int64_t d = 0; d < a.type.rank(); ++d) {
      if ((b.sym_dims >> d & 1u) == 0 && a.type.shape[d] != b.type.shape[d]) {
        return mismatch(
            absl::StrCat("dim ", d, " is ", a.type.shape[d], ", traced as ", b.type.shape[d]));
      }
    }
    if (HasSizeAttrs(a)) {
      Node expected = b;
      expected.attrs = InstantiateAttrs(b, values);
      if (SizeAttrs(a) != SizeAttrs(expected)) {
        return mismatch("a size attribute no formula of the traces gives");
      }
    }
  }
  return absl::OkStatus();
}

// The outputs that are one input, whole, in every trace; an error when an output is a view of an
// input (a window whose layout changes with the sizes: a plan per size returns that view, as
// eager does, where a symbolic plan would return a copy). A window of another output is returned
// as a tensor of its own by a symbolic plan (same values; later writes through one miss the other).
absl::StatusOr<std::vector<std::optional<ir::OutputAlias>>> WholeInputs(
    const std::vector<std::optional<ir::OutputAlias>> (&aliases)[3]) {
  std::vector<std::optional<ir::OutputAlias>> out(aliases[2].size());
  for (size_t k = 0; k < out.size(); ++k) {
    bool whole = true;
    for (int t = 0; t < 3; ++t) {
      const std::optional<ir::OutputAlias>& a = aliases[t][k];
      if (a.has_value() && !a->whole_input && a->output < 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "output ", k, " is a view of input ", a->input,
            " (its window changes with the sizes: a plan per size returns it as eager does)"));
      }
      whole = whole && a.has_value() && a->whole_input && aliases[2][k].has_value() &&
              a->input == aliases[2][k]->input;
    }
    if (whole) out[k] = ir::OutputAlias{.input = aliases[2][k]->input, .whole_input = true};
  }
  return out;
}

absl::StatusOr<Graph> TraceSymbolic(const ir::TensorFn& fn, const std::vector<TensorType>& types,
                                    const SymbolicShapes& symbols,
                                    std::vector<std::optional<ir::OutputAlias>>* whole_inputs) {
  if (symbols.symbols.size() > kMaxSymbols) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxSymbols, " symbolic sizes"));
  }
  std::vector<int64_t> values[3];
  Graph graphs[3];
  std::vector<std::optional<ir::OutputAlias>> aliases[3];
  for (int k = 0; k < 2; ++k) {
    values[k].assign(kProbes[k], kProbes[k] + symbols.symbols.size());
    KILN_ASSIGN_OR_RETURN(graphs[k],
                          TraceAt(fn, WithSymbols(types, symbols, values[k]), &aliases[k]));
  }
  values[2] = ValuesIn(types, symbols);
  KILN_ASSIGN_OR_RETURN(graphs[2], TraceAt(fn, types, &aliases[2]));
  const Graph* g[3] = {&graphs[0], &graphs[1], &graphs[2]};
  const std::vector<int64_t>* syms[3] = {&values[0], &values[1], &values[2]};
  if (graphs[0].num_values() != graphs[2].num_values() ||
      graphs[1].num_values() != graphs[2].num_values() ||
      graphs[0].outputs() != graphs[2].outputs() || graphs[1].outputs() != graphs[2].outputs()) {
    return absl::FailedPreconditionError("the traced program changes with the sizes");
  }
  for (ValueId v = 0; v < graphs[2].num_values(); ++v) {
    KILN_RETURN_IF_ERROR(Unify(g, syms, v, graphs[2].mutable_node(v)));
  }
  if (whole_inputs != nullptr) {
    if (aliases[0].size() != aliases[2].size() || aliases[1].size() != aliases[2].size()) {
      return absl::FailedPreconditionError("the traced outputs change with the sizes");
    }
    KILN_ASSIGN_OR_RETURN(*whole_inputs, WholeInputs(aliases));
  }
  return std::move(graphs[2]);
}

OpAttrs InstantiateAttrs(const Node& n, absl::Span<const int64_t> values) {
  OpAttrs a = n.attrs;
  if (n.sym_attrs.empty()) return a;
  if (n.op == OpId::kSlice) {
    a.start = n.sym_attrs[0].Eval(values);
    a.end = n.sym_attrs[1].Eval(values);
    return a;
  }
  for (size_t i = 0; i < a.dims.size(); ++i) a.dims[i] = n.sym_attrs[i].Eval(values);
  return a;
}

}  // namespace kiln::codegen
