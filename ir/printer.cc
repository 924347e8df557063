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

std::string PrintAttrs(const OpDef& def, const OpAttrs& a) {
  std::vector<std::string> parts;
  const uint32_t f = def.attr_fields;
  if (f & kAttrScalar) parts.push_back(absl::StrCat("scalar=", FormatDouble(a.scalar)));
  if (f & kAttrEps) parts.push_back(absl::StrCat("eps=", FormatDouble(a.eps)));
  if (f & kAttrDim) parts.push_back(absl::StrCat("dim=", a.dim));
  if (f & kAttrDim2) parts.push_back(absl::StrCat("dim2=", a.dim2));
  if (f & kAttrSlice) {
    parts.push_back(absl::StrCat("start=", a.start, ", end=", a.end, ", step=", a.step));
  }
  if (f & kAttrDiagonal) parts.push_back(absl::StrCat("diagonal=", a.diagonal));
  if (f & kAttrDims) parts.push_back(absl::StrCat("dims=[", absl::StrJoin(a.dims, ", "), "]"));
  if (f & kAttrKeepdim) parts.push_back(absl::StrCat("keepdim=", a.keepdim ? "true" : "false"));
  if ((f & kAttrAllDims) && a.all_dims) parts.push_back("all_dims=true");
  if ((f & kAttrTranspose) && a.transpose_a) parts.push_back("transpose_a=true");
  if ((f & kAttrTranspose) && a.transpose_b) parts.push_back("transpose_b=true");
  if (f & kAttrApproximate) {
    parts.push_back(a.approximate == GeluApprox::kTanh ? "approximate=tanh" : "approximate=none");
  }
  if (f & kAttrDType) parts.push_back(absl::StrCat("dtype=", ShortDTypeName(a.dtype)));
  if (f & kAttrStrided) {
    parts.push_back(
        absl::StrCat("strides=[", absl::StrJoin(a.strides, ", "), "], offset=", a.offset));
  }
  if (f & kAttrTopK) {
    parts.push_back(absl::StrCat("k=", a.k, ", largest=", a.largest ? "true" : "false"));
  }
  if ((f & kAttrEpilogue) && a.epilogue != Epilogue::kNone) {
    parts.push_back(absl::StrCat("epilogue=", EpilogueName(a.epilogue)));
  }
  if (f & kAttrAttention) {
    parts.push_back(absl::StrCat("scale=", FormatDouble(a.scale)));
    if (a.is_causal) parts.push_back("is_causal=true");
    if (a.enable_gqa) parts.push_back("enable_gqa=true");
  }
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
