// Graph printer and DOT export (see printer.h).
#include "ir/printer.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::ir {
namespace {

std::string Ref(ValueId v) { return absl::StrCat("%", v); }

std::string Refs(absl::Span<const ValueId> vs) {
  return absl::StrJoin(vs, ", ", [](std::string* out, ValueId v) { absl::StrAppend(out, "%", v); });
}

std::string FormatDouble(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::isnan(v)) return "nan";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

void PrintBody(const Graph& g, int indent, std::string* out);

void PrintNode(const Graph& g, ValueId v, int indent, std::string* out) {
  const Node& n = g.node(v);
  const std::string pad(indent, ' ');
  switch (n.kind) {
    case NodeKind::kInput:
      return;
    case NodeKind::kConstant:
      absl::StrAppend(out, pad, Ref(v), " = constant \"", n.name, "\" : ", PrintType(n.type), "\n");
      return;
    case NodeKind::kOp: {
      const OpDef& def = GetOpDef(n.op);
      const std::string attrs = PrintAttrs(def, n.attrs);
      absl::StrAppend(out, pad, Ref(v), " = ", def.name, "(", Refs(n.inputs), ")",
                      attrs.empty() ? "" : " ", attrs, " : ", PrintType(n.type), "\n");
      return;
    }
    case NodeKind::kFusion:
      absl::StrAppend(out, pad, Ref(v), " = fusion ", n.name, "(", Refs(n.inputs),
                      ") : ", PrintType(n.type), " {\n");
      PrintBody(*n.body, indent + 2, out);
      absl::StrAppend(out, pad, "}\n");
      return;
    case NodeKind::kResult:
      absl::StrAppend(out, pad, Ref(v), " = result ", Ref(n.inputs[0]), " #", n.index, " : ",
                      PrintType(n.type), "\n");
      return;
  }
}

void PrintBody(const Graph& g, int indent, std::string* out) {
  const std::string pad(indent, ' ');
  absl::StrAppend(out, pad, "graph(",
                  absl::StrJoin(g.inputs(), ", ",
                                [&](std::string* o, ValueId v) {
                                  absl::StrAppend(o, Ref(v), ": ", PrintType(g.type(v)));
                                }),
                  ") {\n");
  for (ValueId v = 0; v < g.num_values(); ++v) PrintNode(g, v, indent + 2, out);
  absl::StrAppend(out, pad, "  return ", Refs(g.outputs()), "\n", pad, "}\n");
}

}  // namespace

std::string PrintType(const TensorType& t) {
  std::string s = absl::StrCat(ShortDTypeName(t.dtype), ShapeString(t.shape));
  if (!(t.device == CUDA(0))) absl::StrAppend(&s, "@", t.device.str());
  return s;
}

namespace {

// An attribute value as the text form writes it (the parser reads each back).
std::string AttrText(double v) { return FormatDouble(v); }
std::string AttrText(const Scalar& v) { return v.ToString(); }
std::string AttrText(int64_t v) { return absl::StrCat(v); }
std::string AttrText(bool v) { return v ? "true" : "false"; }
std::string AttrText(const Shape& v) { return absl::StrCat("[", absl::StrJoin(v, ", "), "]"); }
std::string AttrText(GeluApprox v) { return v == GeluApprox::kTanh ? "tanh" : "none"; }
std::string AttrText(DType v) { return ShortDTypeName(v); }
std::string AttrText(Epilogue v) { return EpilogueName(v); }
std::string AttrText(ReduceOp v) { return ReduceOpName(v); }

}  // namespace

std::string PrintAttrs(const OpDef& def, const OpAttrs& a) {
  static const OpAttrs kDefaults;
  std::vector<std::string> parts;
  ForEachAttrRow([&](const auto& row) {
    if (!(def.attr_fields & row.field)) return;
    if (row.only_if_set && a.*row.member == kDefaults.*row.member) return;
    parts.push_back(absl::StrCat(row.key, "=", AttrText(a.*row.member)));
  });
  return parts.empty() ? "" : absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

std::string PrintGraph(const Graph& graph) {
  std::string out;
  PrintBody(graph, 0, &out);
  return out;
}

std::string ToDot(const Graph& g, const std::string& name) {
  std::string out = absl::StrCat("digraph ", name, " {\n  node [shape=box, fontname=monospace];\n");
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const Node& n = g.node(v);
    std::string label;
    switch (n.kind) {
      case NodeKind::kInput:
        label = absl::StrCat("input ", n.name);
        break;
      case NodeKind::kConstant:
        label = absl::StrCat("constant ", n.name);
        break;
      case NodeKind::kOp:
        label = GetOpDef(n.op).name;
        break;
      case NodeKind::kFusion:
        label = n.name;
        break;
      case NodeKind::kResult:
        label = absl::StrCat("result #", n.index);
        break;
    }
    absl::StrAppend(&out, "  v", v, " [label=\"%", v, " ", label, "\\n", PrintType(n.type), "\"",
                    n.kind == NodeKind::kFusion ? ", style=filled, fillcolor=lightblue" : "",
                    "];\n");
    for (ValueId in : n.inputs) absl::StrAppend(&out, "  v", in, " -> v", v, ";\n");
  }
  for (ValueId v : g.outputs()) absl::StrAppend(&out, "  v", v, " -> out;\n");
  return out + "}\n";
}

}  // namespace kiln::ir
