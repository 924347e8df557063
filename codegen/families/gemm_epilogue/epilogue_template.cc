// The GEMM-epilogue kernel family: linear(+bias) followed by relu or tanh GELU, or added to a
// residual of its type, becomes one linear node with that epilogue
// (codegen/families/gemm_epilogue/epilogue_fusion.h), run as one cuBLASLt call with
// CUBLASLT_EPILOGUE_{RELU,GELU}[_BIAS], or with the residual as C and beta = 1 (or, for at most 8
// rows, possibly kiln's GEMV kernel with the epilogue inside: ops/cuda/matmul_cuda.h). On CUDA the
// fused form is timed once per shape against the plain GEMM followed by the activation or add
// kernel and the faster is kept (codegen/families/gemm_epilogue/epilogue_choice.h); the choice is
// in the explain log.
#include "codegen/families/gemm_epilogue/epilogue_choice.h"
#include "codegen/families/gemm_epilogue/epilogue_fusion.h"
#include "codegen/fusion_template.h"
#include "ops/dispatch.h"
#include "runtime/build_config.h"

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
  // The GEMM as cuBLASLt (or the GEMV) runs it, counted by capture (a split K adds kernels and a
  // memset), plus the activation or add kernel when the epilogue runs apart.
  LaunchCount Launches(absl::Span<const Tensor> in) const override {
    if (choice_.fused) return CountLaunchesOnce(OpId::kLinear, in, attrs_);
    OpAttrs gemm = attrs_;
    gemm.epilogue = Epilogue::kNone;
    LaunchCount c =
        CountLaunchesOnce(OpId::kLinear, HasResidual(attrs_) ? in.first(in.size() - 1) : in, gemm);
    ++c.kernels;
    return c;
  }
  std::string explain() const override { return choice_.explain; }
  // linear, and the activation or add op: registry ops only.
  bool LaunchesThroughOps() const override { return true; }

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
    return std::make_unique<passes::GemmEpilogueFusion>(*this);
  }
  std::unique_ptr<FusedKernel> Lower(const ir::Graph& g, const ir::Node& n) const override {
    if constexpr (kWithCuda) return std::make_unique<LinearEpilogue>(n, ChooseEpilogue(g, n));
    return std::make_unique<LinearEpilogue>(n, EpilogueChoice{});  // fused: the CPU's choice too
  }
};

}  // namespace

void RunSplit(absl::Span<const Tensor> in, const OpAttrs& attrs, const Tensor& out) {
  OpAttrs plain = attrs;
  plain.epilogue = Epilogue::kNone;
  if (HasResidual(attrs)) {
    const Tensor y = Dispatch(OpId::kLinear, in.subspan(0, in.size() - 1), plain);
    DispatchOut(OpId::kAdd, {y, in.back()}, {}, out);
    return;
  }
  OpAttrs act_attrs;
  const OpDef* act = EpilogueActivation(attrs.epilogue, &act_attrs);
  DispatchOut(act->id, {Dispatch(OpId::kLinear, in, plain)}, act_attrs, out);
}

const FusionTemplate& GemmEpilogueTemplate() {
  static const GemmEpilogue kTemplate;
  return kTemplate;
}

}  // namespace kiln::codegen
