// The softmax kernel family: bodies of elementwise ops ending in a softmax over the last dim and
// at most one cast after it (softmax_fusion.h). On CUDA the ops before the softmax are the
// prologue program (kernel IR) of one generated softmax kernel (fused_softmax_cuda.h)
// that evaluates it on load and stores in the output's dtype (a trailing cast costs nothing). On
// the CPU the prologue is evaluated into a float32 buffer and the registry's CPU softmax writes
// the output: the same math as the kernel (no rounding between the softmax and the cast).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codegen/families/pointwise/elementwise_cuda.h"
#include "codegen/families/softmax/fused_softmax_cuda.h"
#include "codegen/families/softmax/softmax_fusion.h"
#include "codegen/fused_kernel.h"
#include "codegen/fusion_template.h"
#include "runtime/build_config.h"
#include "runtime/status.h"

namespace kiln::codegen {
namespace {

using ir::Node;
using ir::NodeKind;
using ir::ValueId;

ValueId SoftmaxOf(const ir::Graph& body) {
  for (ValueId v = 0; v < body.num_values(); ++v) {
    if (passes::IsLastDimSoftmax(body.node(v))) return v;
  }
  return -1;
}

// The row length the kernel is compiled for (0: read at run time, for a symbolic last dim).
int64_t RowLength(const Node& fusion) {
  const ir::Graph& body = *fusion.body;
  const int last = static_cast<int>(fusion.type.rank()) - 1;
  const bool symbolic = (fusion.sym_dims >> last) & 1;
  return symbolic ? 0 : body.type(SoftmaxOf(body)).shape.back();
}

kir::Program Prologue(const ir::Graph& body) {
  return LowerBodyValue(body, body.node(SoftmaxOf(body)).inputs[0]);
}

class CudaSoftmax final : public FusedKernel {
 public:
  explicit CudaSoftmax(const Node& n)
      : kernels_(cuda_ops::CompileFusedSoftmaxKernels(n.name, Prologue(*n.body), n.type.dtype,
                                                      {.row_len = RowLength(n)})) {}
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    cuda_ops::LaunchFusedSoftmax(kernels_, in, out[0]);
  }
  std::vector<cuda::KernelFootprint> Footprints() const override {
    return cuda_ops::FusedSoftmaxFootprints(kernels_);
  }

 private:
  cuda_ops::FusedSoftmaxKernels kernels_;
};

class CpuSoftmax final : public FusedKernel {
 public:
  explicit CpuSoftmax(const ir::Graph& body)
      : body_(body), prologue_(Prologue(body)), softmax_(SoftmaxOf(body)) {}
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    const Node& softmax = body_.node(softmax_);
    const ValueId x = softmax.inputs[0];
    const auto input = std::find(body_.inputs().begin(), body_.inputs().end(), x);
    Tensor logits;
    if (input != body_.inputs().end()) {
      logits = in[input - body_.inputs().begin()];
    } else {
      logits = Tensor::Empty(out[0].shape(), DType::kFloat32, kCPU);
      EvaluateProgramOnCpu(prologue_, in, {logits});
    }
    const OpDef& def = GetOpDef(OpId::kSoftmax);
    def.cpu(def, {logits}, out[0], softmax.attrs);
  }

 private:
  ir::Graph body_;
  kir::Program prologue_;
  ValueId softmax_;
};

std::string Describe(const char* variant, const cuda_ops::SoftmaxRowLayout& l) {
  if (l.iters == 0) {
    return absl::StrCat(variant, ": a block of ", l.threads,
                        " threads per row, three passes over the inputs");
  }
  return absl::StrCat(variant, ": ", l.vec, "-element loads, ", l.group, " threads per row, ",
                      l.iters, " loads per thread kept in registers, ", l.threads,
                      " threads per block");
}

class Softmax final : public FusionTemplate {
 public:
  const char* name() const override { return "softmax"; }
  // The prologue is rendered like a pointwise body: the same operand budget.
  passes::FamilyLimits Limits(Device) const override {
    return {cuda_ops::kMaxKernelOperands, cuda_ops::kMaxKernelRank};
  }
  bool Owns(const Node& n) const override {
    return n.kind == NodeKind::kFusion && OwnsBody(*n.body);
  }
  bool OwnsBody(const ir::Graph& body) const override { return SoftmaxOf(body) >= 0; }
  absl::Status VerifyBody(const ir::Graph& body) const override {
    const ValueId s = SoftmaxOf(body);
    for (ValueId b = 0; b < body.num_values(); ++b) {
      const Node& n = body.node(b);
      if (n.kind == NodeKind::kInput || b == s) continue;
      if (!GetOpDef(n.op).is_elementwise()) {
        return absl::InternalError(absl::StrCat(
            "softmax body value %", b, " (", GetOpDef(n.op).name,
            ") is not elementwise; a softmax body holds elementwise ops, a last-dim softmax and "
            "at most one cast of it"));
      }
      if (b > s && (n.op != OpId::kCast || n.inputs[0] != s || b != s + 1)) {
        return absl::InternalError(absl::StrCat("softmax body value %", b, " (",
                                                GetOpDef(n.op).name, ") follows the softmax %", s,
                                                "; only one cast of the softmax may"));
      }
    }
    if (body.outputs().size() != 1 || body.outputs()[0] != body.num_values() - 1) {
      return absl::InternalError(absl::StrCat(
          "softmax body must return exactly its last value (the softmax or its cast), returns ",
          body.outputs().size(), " values"));
    }
    return absl::OkStatus();
  }
  std::unique_ptr<passes::Pass> MakePass() const override {
    return std::make_unique<passes::SoftmaxFusion>(*this);
  }
  std::unique_ptr<FusedKernel> Lower(const ir::Graph&, const Node& n) const override {
    if constexpr (kWithCuda) {
      if (n.type.device.is_cuda()) return std::make_unique<CudaSoftmax>(n);
    }
    return std::make_unique<CpuSoftmax>(*n.body);
  }
  std::string KernelIr(const Node& n) const override {
    return absl::StrCat("prologue (the softmax's input):\n", Prologue(*n.body).ToString(),
                        "then: softmax over the last dim, stored as ", DTypeName(n.type.dtype),
                        "\n");
  }
  std::string Source(const Node& n) const override {
    return cuda_ops::RenderFusedSoftmaxSource(n.name, Prologue(*n.body), n.type.dtype,
                                              {.row_len = RowLength(n)});
  }
  std::string LaunchNote(const Node& n) const override {
    const int64_t len = RowLength(n);
    if (len == 0)
      return "launch: rows of run-time length; " + Describe("strided", {1, 512, 0, 512});
    std::string note = absl::StrCat("launch: rows of ", len, "; ",
                                    Describe("strided", cuda_ops::PlanSoftmaxRows(len, 1)));
    const kir::Program p = Prologue(*n.body);
    if (const int vec = cuda_ops::FusedSoftmaxVectorWidth(p.input_types(), n.type.dtype, len);
        vec > 0) {
      absl::StrAppend(&note, "; ", Describe("vec", cuda_ops::PlanSoftmaxRows(len, vec)),
                      " (when every input is contiguous along the row and aligned)");
    }
    return note;
  }
};

}  // namespace

const FusionTemplate& SoftmaxTemplate() {
  static const Softmax kTemplate;
  return kTemplate;
}

}  // namespace kiln::codegen
