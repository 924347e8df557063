// The GEMM-epilogue kernel family: linear(+bias) followed by relu or tanh GELU, or added to a
// residual of its type, becomes one linear node with that epilogue (passes/epilogue_fusion.h),
// run as one cuBLASLt call with CUBLASLT_EPILOGUE_{RELU,GELU}[_BIAS], or with the residual as C
// and beta = 1 (or, for at most 8 rows, possibly kiln's GEMV kernel with the epilogue inside:
// ops/cuda/matmul_cuda.h). On CUDA the fused form is timed once per shape against the plain GEMM
// followed by the activation or add kernel and the faster is kept (codegen/epilogue_choice.h);
// the choice is in the explain log.
#include "codegen/epilogue_choice.h"
#include "codegen/fusion_template.h"
#include "ops/dispatch.h"
#include "passes/epilogue_fusion.h"

namespace kiln::codegen {
namespace {

class LinearEpilogue final : public FusedKernel {
 public:
  LinearEpilogue(const ir::Node& n, EpilogueChoice choice)
      : attrs_(n.attrs), choice_(std::move(choice)) {}
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    if (choice_.fused) {
      DispatchOut(OpId::kLinear, in, attrs_, out[0]);
      return;
    }
    RunSplit(in, attrs_, out[0]);
  }
  int kernel_launches() const override { return choice_.fused ? 1 : 2; }
  std::string explain() const override { return choice_.explain; }

 private:
  OpAttrs attrs_;
  EpilogueChoice choice_;
};

class GemmEpilogue final : public FusionTemplate {
 public:
  const char* name() const override { return "gemm_epilogue"; }
  bool Owns(const ir::Node& n) const override {
    return n.kind == ir::NodeKind::kOp && n.op == OpId::kLinear &&
           n.attrs.epilogue != Epilogue::kNone;
  }
  std::unique_ptr<passes::Pass> MakePass() const override {
    return std::make_unique<passes::GemmEpilogueFusion>();
  }
  std::unique_ptr<FusedKernel> Lower(const ir::Graph& g, const ir::Node& n) const override {
    return std::make_unique<LinearEpilogue>(n, ChooseEpilogue(g, n));
  }
};

}  // namespace

const FusionTemplate& GemmEpilogueTemplate() {
  static const GemmEpilogue kTemplate;
  return kTemplate;
}

}  // namespace kiln::codegen
