// Fusion codegen for CUDA and the CPU evaluator (see fused_kernel.h).
#include "codegen/fused_kernel.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "codegen/fused_softmax.h"
#include "ops/cpu/loops.h"
#include "runtime/status.h"

namespace kiln::codegen {
namespace {

using ir::Node;
using ir::NodeKind;
using ir::ValueId;

std::string FloatLiteral(double v) {
  if (std::isnan(v)) return "__int_as_float(0x7fc00000)";
  if (std::isinf(v)) return v > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)";
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.9gf", v);
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s.insert(s.size() - 1, ".0");
  return s;
}

// Rounds a float value through a narrower dtype, as an explicit cast in eager mode does.
std::string RoundTo(DType t, const std::string& v) {
  switch (t) {
    case DType::kBFloat16:
      return absl::StrCat("kiln_bf16_to_f(kiln_f_to_bf16(", v, "))");
    case DType::kFloat16:
      return absl::StrCat("kiln_f16_to_f(kiln_f_to_f16(", v, "))");
    case DType::kBool:
      return absl::StrCat("((", v, ") != 0.f ? 1.f : 0.f)");
    default:
      return v;
  }
}

}  // namespace

std::string FusionExpression(const ir::Graph& body) {
  return ValueExpression(body, body.outputs()[0]);
}

std::string ValueExpression(const ir::Graph& body, ValueId value) {
  std::vector<std::string> expr(body.num_values());
  for (size_t i = 0; i < body.inputs().size(); ++i) expr[body.inputs()[i]] = absl::StrCat("$", i);
  for (ValueId v = 0; v <= value; ++v) {
    const Node& n = body.node(v);
    if (n.kind != NodeKind::kOp) continue;
    std::string e(GetOpDef(n.op).cuda_expr);
    // Operands are spliced in as parenthesised subexpressions (the tree is inlined; nvcc folds
    // repeated pure math). Placeholders of the body inputs ($k) survive for the renderer.
    e = absl::StrReplaceAll(
        e, {{"$scalar", FloatLiteral(n.attrs.scalar)},
            {"$approximate", n.attrs.approximate == GeluApprox::kTanh ? "1" : "0"}});
    std::string out;
    for (size_t c = 0; c < e.size(); ++c) {
      if (e[c] == '$' && c + 1 < e.size() && std::isdigit(static_cast<unsigned char>(e[c + 1]))) {
        absl::StrAppend(&out, "(", expr[n.inputs[e[c + 1] - '0']], ")");
        ++c;
      } else {
        out.push_back(e[c]);
      }
    }
    expr[v] = n.op == OpId::kCast ? RoundTo(n.type.dtype, out) : out;
  }
  return expr[value];
}

std::vector<DType> FusionInputTypes(const ir::Graph& body) {
  std::vector<DType> types;
  for (ValueId v : body.inputs()) types.push_back(body.type(v).dtype);
  return types;
}

std::string FusionSource(const ir::Node& fusion) {
  if (SoftmaxOfFusion(*fusion.body) >= 0) return SoftmaxFusionSource(fusion);
  return cuda_ops::RenderElementwiseSource(fusion.name, FusionExpression(*fusion.body),
                                           FusionInputTypes(*fusion.body), fusion.type.dtype);
}

std::string FusionLaunchNote(const ir::Node& fusion) {
  if (SoftmaxOfFusion(*fusion.body) >= 0) return SoftmaxFusionLaunchNote(fusion);
  return "launch: 256 threads per block, grid from the SM count (grid-stride loops)";
}

namespace {

// One body op flattened for the element loop: no node lookups per element.
struct Instr {
  ScalarFn fn;
  const OpAttrs* attrs;
  int args[3];
  int nargs;
  int dst;
  bool round;  // an explicit cast: round through its dtype like the eager cast does
  DType dtype;
};

std::vector<Instr> Flatten(const ir::Graph& body) {
  std::vector<Instr> prog;
  for (ValueId v = 0; v < body.num_values(); ++v) {
    const Node& n = body.node(v);
    if (n.kind != NodeKind::kOp) continue;
    Instr in{GetOpDef(n.op).scalar, &n.attrs,    {0, 0, 0}, static_cast<int>(n.inputs.size()), v,
             n.op == OpId::kCast,   n.type.dtype};
    for (int k = 0; k < in.nargs; ++k) in.args[k] = n.inputs[k];
    prog.push_back(in);
  }
  return prog;
}

}  // namespace

void EvaluateFusionOnCpu(const ir::Graph& body, absl::Span<const Tensor> inputs,
                         const Tensor& out) {
  const int n_in = static_cast<int>(inputs.size());
  KILN_CHECK(n_in + 1 <= cpu::kMaxOperands, "fusion: at most ", cpu::kMaxOperands - 1, " inputs");
  absl::InlinedVector<Strides, 9> strides = {out.strides()};
  std::vector<LoadFn> load;
  std::vector<const void*> src;
  for (const Tensor& t : inputs) {
    strides.push_back(cpu::BroadcastStrides(t, out.shape()));
    load.push_back(LoaderFor(t.dtype()));
    src.push_back(t.data_ptr());
  }
  const std::vector<Instr> prog = Flatten(body);
  const StoreFn store = StorerFor(out.dtype());
  void* dst = out.data_ptr();
  std::vector<double> vals(body.num_values());
  const ValueId root = body.outputs()[0];
  cpu::ForEachElement(out.shape(), strides, [&](const int64_t* off) {
    for (int i = 0; i < n_in; ++i) vals[body.inputs()[i]] = load[i](src[i], off[i + 1]);
    for (const Instr& in : prog) {
      double args[3];
      for (int k = 0; k < in.nargs; ++k) args[k] = vals[in.args[k]];
      double v = in.fn(args, *in.attrs);
      if (in.round) {
        double scratch;
        StorerFor(in.dtype)(&scratch, 0, v);
        v = LoaderFor(in.dtype)(&scratch, 0);
      }
      vals[in.dst] = v;
    }
    store(dst, off[0], vals[root]);
  });
}

}  // namespace kiln::codegen
