// The pointwise kernel family: fusion bodies of elementwise ops (any number of inputs and
// outputs, the outputs of one shape), found by elementwise_fusion.h, lowered to the kernel IR and
// rendered by the elementwise skeletons (elementwise_cuda.h, which eager elementwise ops run as
// one-instruction programs); on the CPU the same program is evaluated in one pass.
#include "absl/strings/str_cat.h"
#include "codegen/families/pointwise/elementwise_cuda.h"
#include "codegen/families/pointwise/elementwise_fusion.h"
#include "codegen/fused_kernel.h"
#include "codegen/fusion_template.h"
#include "runtime/build_config.h"

namespace kiln::codegen {
namespace {

class CudaPointwise final : public FusedKernel {
 public:
  CudaPointwise(const std::string& name, const kir::Program& p)
      : kernels_(cuda_ops::CompileElementwiseKernels(name, p)) {}
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    cuda_ops::LaunchElementwise(kernels_, in, out);
  }
  std::vector<cuda::KernelFootprint> Footprints() const override {
    return cuda_ops::ElementwiseFootprints(kernels_);
  }

 private:
  cuda_ops::ElementwiseKernels kernels_;
};

class CpuPointwise final : public FusedKernel {
 public:
  explicit CpuPointwise(kir::Program p) : program_(std::move(p)) {}
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    EvaluateProgramOnCpu(program_, in, out);
  }

 private:
  kir::Program program_;
};

class Pointwise final : public FusionTemplate {
 public:
  const char* name() const override { return "pointwise"; }
  passes::FamilyLimits Limits(Device) const override {
    return {cuda_ops::kMaxKernelOperands, cuda_ops::kMaxKernelRank};
  }
  bool Owns(const ir::Node& n) const override {
    return n.kind == ir::NodeKind::kFusion && OwnsBody(*n.body);
  }
  bool OwnsBody(const ir::Graph& body) const override {
    for (const ir::Node& n : body.nodes()) {
      if (n.kind == ir::NodeKind::kOp && !GetOpDef(n.op).is_elementwise()) return false;
    }
    return true;
  }
  absl::Status VerifyBody(const ir::Graph& body) const override {
    const Shape& shape = body.type(body.outputs()[0]).shape;
    for (ir::ValueId v : body.outputs()) {
      if (body.type(v).shape != shape) {
        return absl::InternalError(absl::StrCat(
            "pointwise body returns %", v, " of shape ", ShapeString(body.type(v).shape),
            " beside ", ShapeString(shape), ": every output has the iteration shape"));
      }
    }
    if (body.inputs().size() + body.outputs().size() >
        static_cast<size_t>(cuda_ops::kMaxKernelOperands)) {
      return absl::InternalError(absl::StrCat(
          "pointwise body has ", body.inputs().size(), " inputs and ", body.outputs().size(),
          " outputs, more than the kernel's ", cuda_ops::kMaxKernelOperands, " operands"));
    }
    return absl::OkStatus();
  }
  std::unique_ptr<passes::Pass> MakePass() const override {
    return std::make_unique<passes::ElementwiseFusion>(*this);
  }
  std::unique_ptr<FusedKernel> Lower(const ir::Graph&, const ir::Node& n) const override {
    kir::Program p = LowerFusionBody(*n.body);
    if constexpr (kWithCuda) {
      if (n.type.device.is_cuda()) return std::make_unique<CudaPointwise>(n.name, p);
    }
    return std::make_unique<CpuPointwise>(std::move(p));
  }
  std::string KernelIr(const ir::Node& n) const override {
    return LowerFusionBody(*n.body).ToString();
  }
  std::string Source(const ir::Node& n) const override {
    return cuda_ops::RenderElementwiseSource(n.name, LowerFusionBody(*n.body));
  }
  std::string LaunchNote(const ir::Node&) const override {
    return "launch: 256 threads per block, grid from the SM count (grid-stride loops); _contig "
           "when every operand is contiguous and aligned (_small, one block, when that work fits "
           "256 threads), _rows for [rows, cols] operands, else _strided";
  }
};

}  // namespace

const FusionTemplate& PointwiseTemplate() {
  static const Pointwise kTemplate;
  return kTemplate;
}

}  // namespace kiln::codegen
