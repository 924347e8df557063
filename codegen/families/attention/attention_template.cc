// The attention kernel family: scaled_dot_product_attention nodes, written by the user or found
// in naive code by the attention fusion pass (attention_fusion.h); the kernel is kiln's flash
// attention (flash_attention_cuda.h, which the eager op runs too). Lowering runs the op
// through its backends (ops/ops.h: kiln's flash kernel on CUDA where it applies, the math form
// otherwise), chosen at run time like an eager call, so the plan follows the caller's
// SdpaBackendGuard.
#include "codegen/families/attention/attention_fusion.h"
#include "codegen/families/attention/flash_attention_cuda.h"
#include "codegen/fusion_template.h"
#include "ops/dispatch.h"

namespace kiln::codegen {
namespace {

class Sdpa final : public FusedKernel {
 public:
  explicit Sdpa(const ir::Node& n) : attrs_(n.attrs) {}
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    DispatchOut(OpId::kScaledDotProductAttention, in, attrs_, out[0]);
  }
  // Counted by capturing the op on CUDA: the flash kernel is one launch, up to four query rows
  // run the split-key kernel (one launch on sm_90, where a row's splits merge in their cluster;
  // before it, or with KILN_FD_CLUSTER=off, a combine kernel too), and the math form runs its
  // matmuls, scale, mask and softmax. On the CPU: one kernel.
  LaunchCount Launches(absl::Span<const Tensor> in) const override {
    if (in.empty() || !in[0].device().is_cuda()) return {1, 0, ""};
    return CountLaunchesOnce(OpId::kScaledDotProductAttention, in, attrs_);
  }

 private:
  OpAttrs attrs_;
};

class Attention final : public FusionTemplate {
 public:
  const char* name() const override { return "attention"; }
  // Types the flash kernel cannot take on CUDA; on the CPU the math form takes any.
  std::string RejectsOperands(absl::Span<const TensorType> types) const override {
    if (types.empty() || !types[0].device.is_cuda()) return "";
    return cuda_ops::FlashAttentionTypesUnsupported(types);
  }
  bool Owns(const ir::Node& n) const override {
    return n.kind == ir::NodeKind::kOp && n.op == OpId::kScaledDotProductAttention;
  }
  std::unique_ptr<passes::Pass> MakePass() const override {
    return std::make_unique<passes::AttentionFusion>(*this);
  }
  std::unique_ptr<FusedKernel> Lower(const ir::Graph&, const ir::Node& n) const override {
    return std::make_unique<Sdpa>(n);
  }
};

}  // namespace

const FusionTemplate& AttentionTemplate() {
  static const Attention kTemplate;
  return kTemplate;
}

}  // namespace kiln::codegen
