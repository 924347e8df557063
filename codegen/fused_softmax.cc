// Softmax fusion codegen for CUDA and the CPU (see fused_softmax.h).
#include "codegen/fused_softmax.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/fused_kernel.h"
#include "runtime/status.h"

namespace kiln::codegen {

using ir::Node;
using ir::NodeKind;
using ir::ValueId;

namespace {

// The prologue's expression (the softmax input's), its input dtypes, the row length.
struct Parts {
  std::string expr;
  std::vector<DType> in_types;
  int64_t row_len;
};

Parts PartsOf(const Node& fusion) {
  const ir::Graph& body = *fusion.body;
  const ValueId s = SoftmaxOfFusion(body);
  KILN_CHECK(s >= 0, "softmax fusion ", fusion.name, ": its body has no softmax");
  return {ValueExpression(body, body.node(s).inputs[0]), FusionInputTypes(body),
          body.type(s).shape.back()};
}

std::string Describe(const char* variant, const cuda_ops::SoftmaxRowLayout& l) {
  if (l.iters == 0) {
    return absl::StrCat(variant, ": a block of ", l.threads,
                        " threads per row, three passes over the inputs");
  }
  return absl::StrCat(variant, ": ", l.vec, "-element loads, ", l.group, " threads per row, ",
                      l.iters, " loads per thread kept in registers, ", l.threads,
                      " threads per block");
}

}  // namespace

ValueId SoftmaxOfFusion(const ir::Graph& body) {
  for (ValueId v = 0; v < body.num_values(); ++v) {
    if (ir::IsLastDimSoftmax(body.node(v))) return v;
  }
  return -1;
}

std::string SoftmaxFusionSource(const Node& fusion) {
  const Parts p = PartsOf(fusion);
  return cuda_ops::RenderFusedSoftmaxSource(fusion.name, p.expr, p.in_types, fusion.type.dtype,
                                            p.row_len);
}

std::string SoftmaxFusionLaunchNote(const Node& fusion) {
  const Parts p = PartsOf(fusion);
  std::string note = absl::StrCat("launch: rows of ", p.row_len, "; ",
                                  Describe("strided", cuda_ops::PlanSoftmaxRows(p.row_len, 1)));
  if (const int vec = cuda_ops::FusedSoftmaxVectorWidth(p.in_types, fusion.type.dtype, p.row_len);
      vec > 0) {
    absl::StrAppend(&note, "; ", Describe("vec", cuda_ops::PlanSoftmaxRows(p.row_len, vec)),
                    " (when every input is contiguous along the row and aligned)");
  }
  return note;
}

cuda_ops::FusedSoftmaxKernels CompileSoftmaxFusion(const Node& fusion) {
  const Parts p = PartsOf(fusion);
  return cuda_ops::CompileFusedSoftmaxKernels(fusion.name, p.expr, p.in_types, fusion.type.dtype,
                                              p.row_len);
}

void EvaluateSoftmaxFusionOnCpu(const ir::Graph& body, absl::Span<const Tensor> inputs,
                                const Tensor& out) {
  const ValueId s = SoftmaxOfFusion(body);
  KILN_CHECK(s >= 0, "softmax fusion: its body has no softmax");
  const Node& softmax = body.node(s);
  const ValueId x = softmax.inputs[0];
  Tensor logits;
  const auto input = std::find(body.inputs().begin(), body.inputs().end(), x);
  if (input != body.inputs().end()) {
    logits = inputs[input - body.inputs().begin()];
  } else {  // the prologue: the body up to x, returning x
    ir::Graph prologue = body;
    std::vector<bool> keep(body.num_values());
    for (ValueId v = 0; v < body.num_values(); ++v) keep[v] = v <= x;
    prologue.Compact(keep);  // keeps the ids up to x
    prologue.SetOutputs({x});
    logits = Tensor::Empty(softmax.type.shape, DType::kFloat32, kCPU);
    EvaluateFusionOnCpu(prologue, inputs, logits);
  }
  const OpDef& def = GetOpDef(OpId::kSoftmax);
  def.cpu(def, {logits}, out, softmax.attrs);
}

}  // namespace kiln::codegen
