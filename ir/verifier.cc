// The graph verifier (see verifier.h). Each check is one function returning the first violation;
// `where` prefixes messages about fusion bodies with the fusion that holds them.
#include "ir/verifier.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ir/printer.h"
#include "ops/custom_op.h"
#include "runtime/status.h"

namespace kiln::ir {
namespace {

bool IsValue(const Graph& g, ValueId v) { return v >= 0 && v < g.num_values(); }

// "%3 (add)", "%1 (constant \"w\")", "%4 (fusion kiln_fused_0)", "%0 (input)".
std::string Describe(const Graph& g, ValueId v) {
  const Node& n = g.node(v);
  switch (n.kind) {
    case NodeKind::kInput:
      return absl::StrCat("%", v, " (input)");
    case NodeKind::kConstant:
      return absl::StrCat("%", v, " (constant \"", n.name, "\")");
    case NodeKind::kOp:
      if (!IsKnownOp(n.op)) return absl::StrCat("%", v, " (op #", static_cast<int>(n.op), ")");
      return absl::StrCat("%", v, " (", GetOpDef(n.op).name, ")");
    case NodeKind::kFusion:
      return absl::StrCat("%", v, " (fusion ", n.name, ")");
    case NodeKind::kResult:
      return absl::StrCat("%", v, " (result #", n.index, ")");
  }
  return absl::StrCat("%", v);
}

absl::Status Fail(const std::string& where, absl::string_view message) {
  return absl::InternalError(absl::StrCat(where, message));
}

absl::Status VerifyGraph(const Graph& g, const std::string& where, const FusionBodyCheck& check);

absl::Status CheckOperandsDefined(const Graph& g, ValueId v, const std::string& where) {
  for (ValueId in : g.node(v).inputs) {
    if (!IsValue(g, in)) {
      return Fail(where, absl::StrCat(Describe(g, v), ": operand %", in, " does not exist"));
    }
    if (in >= v) {
      return Fail(
          where, absl::StrCat(Describe(g, v), ": operand %", in, " is used before its definition"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckInputsAndOutputs(const Graph& g, const std::string& where) {
  std::vector<bool> listed(g.num_values(), false);
  for (ValueId v : g.inputs()) {
    if (!IsValue(g, v)) return Fail(where, absl::StrCat("graph input %", v, " does not exist"));
    if (g.node(v).kind != NodeKind::kInput) {
      return Fail(where, absl::StrCat("graph input ", Describe(g, v), " is not an input node"));
    }
    listed[v] = true;
  }
  for (ValueId v = 0; v < g.num_values(); ++v) {
    if (g.node(v).kind == NodeKind::kInput && !listed[v]) {
      return Fail(where, absl::StrCat("%", v, " is an input node but not a graph input"));
    }
  }
  for (ValueId v : g.outputs()) {
    if (!IsValue(g, v)) return Fail(where, absl::StrCat("graph output %", v, " does not exist"));
  }
  return absl::OkStatus();
}

absl::Status CheckOp(const Graph& g, ValueId v, const std::string& where) {
  const Node& n = g.node(v);
  if (!IsKnownOp(n.op)) return Fail(where, absl::StrCat(Describe(g, v), ": unknown op id"));
  const OpDef& def = GetOpDef(n.op);
  const int arity = static_cast<int>(n.inputs.size());
  if (arity < def.min_inputs || arity > def.max_inputs) {
    return Fail(
        where,
        absl::StrCat(Describe(g, v), ": takes ", def.min_inputs,
                     def.min_inputs == def.max_inputs ? "" : absl::StrCat("..", def.max_inputs),
                     " operands, has ", arity));
  }
  absl::InlinedVector<TensorType, 3> types;
  for (ValueId in : n.inputs) {
    types.push_back(g.type(in));
    if (types.back().device != types.front().device) {
      return Fail(where, absl::StrCat(Describe(g, v), ": operands on different devices, ",
                                      PrintType(types.front()), " and ", PrintType(types.back())));
    }
  }
  const absl::StatusOr<TensorType> inferred = def.infer(types, n.attrs);
  if (!inferred.ok()) {
    return Fail(where, absl::StrCat(Describe(g, v),
                                    ": type inference fails: ", inferred.status().message()));
  }
  if (!(*inferred == n.type)) {
    return Fail(where, absl::StrCat(Describe(g, v), ": recorded type ", PrintType(n.type),
                                    " differs from the inferred ", PrintType(*inferred)));
  }
  return absl::OkStatus();
}

// The body's interface: its inputs are the node's operands, its one output the node's value.
absl::Status CheckFusionInterface(const Graph& g, ValueId v, const std::string& where) {
  const Node& n = g.node(v);
  const Graph& body = *n.body;
  if (body.inputs().size() != n.inputs.size()) {
    return Fail(where, absl::StrCat(Describe(g, v), ": body has ", body.inputs().size(),
                                    " inputs but the node has ", n.inputs.size(), " operands"));
  }
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const TensorType& want = g.type(n.inputs[i]);
    const TensorType& got = body.type(body.inputs()[i]);
    if (!(want == got)) {
      return Fail(where,
                  absl::StrCat(Describe(g, v), ": body input ", i, " has type ", PrintType(got),
                               " but operand %", n.inputs[i], " has ", PrintType(want)));
    }
  }
  if (body.outputs().empty())
    return Fail(where, absl::StrCat(Describe(g, v), ": body returns nothing"));
  const TensorType& out = body.type(body.outputs()[0]);
  if (!(out == n.type)) {
    return Fail(where, absl::StrCat(Describe(g, v), ": body returns ", PrintType(out),
                                    " but the node's type is ", PrintType(n.type)));
  }
  return absl::OkStatus();
}

// A body holds ops only (no constants, no nested fusions); which ops is the kernel family's rule
// (`check`, from codegen/fusion_template.h).
absl::Status CheckFusionBodyOps(const Graph& g, ValueId v, const std::string& where,
                                const FusionBodyCheck& check) {
  const Graph& body = *g.node(v).body;
  for (ValueId b = 0; b < body.num_values(); ++b) {
    const NodeKind k = body.node(b).kind;
    if (k != NodeKind::kInput && k != NodeKind::kOp) {
      return Fail(where, absl::StrCat(Describe(g, v), ": body value ", Describe(body, b),
                                      " is not an op; fusion bodies hold ops only"));
    }
  }
  if (!check) return absl::OkStatus();
  const absl::Status s = check(body);
  if (s.ok()) return s;
  return Fail(where, absl::StrCat(Describe(g, v), ": ", s.message()));
}

// A result names a further output of the fusion before it, with that output's type.
absl::Status CheckResult(const Graph& g, ValueId v, const std::string& where) {
  const Node& n = g.node(v);
  if (n.inputs.size() != 1 || g.node(n.inputs[0]).kind != NodeKind::kFusion) {
    return Fail(where, absl::StrCat(Describe(g, v), ": a result takes one fusion operand"));
  }
  const Graph& body = *g.node(n.inputs[0]).body;
  if (n.index < 1 || n.index >= static_cast<int>(body.outputs().size())) {
    return Fail(where, absl::StrCat(Describe(g, v), ": index ", n.index, " but the fusion %",
                                    n.inputs[0], " returns ", body.outputs().size(), " values"));
  }
  const TensorType& want = body.type(body.outputs()[n.index]);
  if (!(want == n.type)) {
    return Fail(where, absl::StrCat(Describe(g, v), ": type ", PrintType(n.type), " but output #",
                                    n.index, " of %", n.inputs[0], " is ", PrintType(want)));
  }
  return absl::OkStatus();
}

absl::Status CheckFusion(const Graph& g, ValueId v, const std::string& where,
                         const FusionBodyCheck& check) {
  if (g.node(v).body == nullptr) return Fail(where, absl::StrCat(Describe(g, v), ": no body"));
  KILN_RETURN_IF_ERROR(VerifyGraph(
      *g.node(v).body, absl::StrCat(where, "in the body of ", Describe(g, v), ": "), check));
  KILN_RETURN_IF_ERROR(CheckFusionInterface(g, v, where));
  return CheckFusionBodyOps(g, v, where, check);
}

absl::Status CheckNode(const Graph& g, ValueId v, const std::string& where,
                       const FusionBodyCheck& check) {
  const Node& n = g.node(v);
  KILN_RETURN_IF_ERROR(CheckOperandsDefined(g, v, where));
  switch (n.kind) {
    case NodeKind::kInput:
    case NodeKind::kConstant:
      if (!n.inputs.empty()) {
        return Fail(where, absl::StrCat(Describe(g, v), ": has operands but defines a leaf"));
      }
      if (n.constant.defined() && !(n.constant.type() == n.type)) {
        return Fail(where,
                    absl::StrCat(Describe(g, v), ": recorded type ", PrintType(n.type),
                                 " differs from its tensor's ", PrintType(n.constant.type())));
      }
      return absl::OkStatus();
    case NodeKind::kOp:
      return CheckOp(g, v, where);
    case NodeKind::kFusion:
      return CheckFusion(g, v, where, check);
    case NodeKind::kResult:
      return CheckResult(g, v, where);
  }
  return Fail(where, absl::StrCat("%", v, ": unknown node kind"));
}

absl::Status VerifyGraph(const Graph& g, const std::string& where, const FusionBodyCheck& check) {
  KILN_RETURN_IF_ERROR(CheckInputsAndOutputs(g, where));
  for (ValueId v = 0; v < g.num_values(); ++v) {
    KILN_RETURN_IF_ERROR(CheckNode(g, v, where, check));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Verify(const Graph& graph, const FusionBodyCheck& check) {
  return VerifyGraph(graph, "", check);
}

}  // namespace kiln::ir
