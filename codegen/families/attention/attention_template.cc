// The attention kernel family: scaled_dot_product_attention nodes, written by the user or found
// in naive code by the attention fusion pass (attention_fusion.h), and fusion nodes of a KV-cache
// append with the attention reading the caches (the same pass); the kernel is kiln's flash
// attention (flash_attention_cuda.h, which the eager op runs too). Lowering runs the op
// through its backends (ops/ops.h: kiln's flash kernel on CUDA where it applies, the math form
// otherwise), chosen at run time like an eager call, so the plan follows the caller's
// SdpaBackendGuard.
#include "absl/strings/str_cat.h"
#include "codegen/families/attention/attention_fusion.h"
#include "codegen/families/attention/flash_attention_cuda.h"
#include "codegen/fusion_template.h"
#include "ops/cuda/index_cuda.h"
#include "ops/dispatch.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/build_config.h"
#include "runtime/settings.h"
#include "runtime/status.h"

namespace kiln::codegen {
namespace {

static_assert(passes::kKvAppendMaxRows == cuda_ops::kFlashDecodeMaxQueries);

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

// A KV-cache append fused with the attention that reads the caches (attention_fusion.h): on
// CUDA one decode kernel writes the new rows and attends (flash_decode_source.h); on the CPU, for
// operands that kernel does not take, with no index check to raise (an eager call outside a
// plan), or with KILN_KV_APPEND=off, the body's ops run one after the other (with the rotary
// embedding joined, the rotations of the query and the new keys first).
class KvAppendAttention final : public FusedKernel {
 public:
  explicit KvAppendAttention(const ir::Graph& body) {
    KILN_CHECK(passes::ParseKvAppendBody(body, &r_),
               "attention: a fusion body that is not a KV-cache append into an attention");
  }

  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    const Tensor k = Cache(in, out, r_.k_cache, r_.k_out), v = Cache(in, out, r_.v_cache, r_.v_out);
    absl::InlinedVector<Tensor, 4> attention = {in[r_.q], k, v};
    if (r_.mask >= 0) attention.push_back(in[r_.mask]);
    if (RunFused(in, attention, out[0])) return;
    OpAttrs copy;
    copy.dim = r_.dim;
    Tensor k_new = in[r_.k_new];
    if (r_.cos >= 0) {  // the body's rotations, as the ops compute them
      attention[0] = apply_rotary(attention[0], in[r_.cos], in[r_.sin]);
      k_new = apply_rotary(k_new, in[r_.cos], in[r_.sin]);
    }
    DispatchInPlace(OpId::kIndexCopy, {k, in[r_.slots], k_new}, copy);
    DispatchInPlace(OpId::kIndexCopy, {v, in[r_.slots], in[r_.v_new]}, copy);
    if (out[0].numel() > 0) {
      DispatchOut(OpId::kScaledDotProductAttention, attention, r_.attention, out[0]);
    }
  }

  // The fused kernel's launches are the attention's (one on sm_90); the ops' are two more.
  LaunchCount Launches(absl::Span<const Tensor> in) const override {
    if (in.empty() || !in[0].device().is_cuda()) return {1, 0, ""};
    absl::InlinedVector<Tensor, 4> attention = {in[r_.q], in[r_.k_cache], in[r_.v_cache]};
    if (r_.mask >= 0) attention.push_back(in[r_.mask]);
    LaunchCount c = CountLaunchesOnce(OpId::kScaledDotProductAttention, attention, r_.attention);
    if (Fusable(in, attention)) return c;
    c.kernels += 2;
    if (r_.cos >= 0) {
      for (int x : {r_.q, r_.k_new}) {
        const Tensor &t = in[x], &cos = in[r_.cos], &sin = in[r_.sin];
        c.kernels += CountCallLaunchesOnce(
                         absl::StrCat("rotate_half:", LaunchKey(OpId::kCat, {t, cos, sin}, {})),
                         [&] { apply_rotary(t, cos, sin); })
                         .kernels;
      }
    }
    return c;
  }

 private:
  // The updated cache: the node's output (holding the cache's value: FusedKernel::Run), or a
  // copy of the cache when the updated one is not an output.
  static Tensor Cache(absl::Span<const Tensor> in, absl::Span<const Tensor> out, int operand,
                      int output) {
    if (output >= 0) return out[output];
    const Tensor t = Tensor::Empty(in[operand].type());
    DispatchOut(OpId::kContiguous, {in[operand]}, {}, t);
    return t;
  }

  cuda_ops::FlashKvAppend Append(absl::Span<const Tensor> in) const {
    cuda_ops::FlashKvAppend a{in[r_.slots], in[r_.k_new], in[r_.v_new], nullptr};
    if (r_.cos >= 0) a.cos = in[r_.cos], a.sin = in[r_.sin];
    return a;
  }

  bool Fusable(absl::Span<const Tensor> in, absl::Span<const Tensor> attention) const {
    if (!fuse_ || current_sdpa_backend() == SdpaBackend::kMath) return false;
    return cuda_ops::FlashKvAppendUnsupportedReason(attention, r_.attention, Append(in)).empty();
  }

  // Launches the fused kernel when it may run; false when the ops must run instead.
  bool RunFused(absl::Span<const Tensor> in, absl::Span<const Tensor> attention,
                const Tensor& out) const {
    if constexpr (kWithCuda) {  // the launch and the flag exist only in a CUDA build
      if (out.numel() == 0 || !in[0].device().is_cuda() || !cuda_ops::FlashCanWrite(out) ||
          !Fusable(in, attention)) {
        return false;
      }
      cuda_ops::FlashKvAppend append = Append(in);
      append.bad = cuda_ops::KernelIndexFlag(out.device());
      if (append.bad == nullptr) return false;  // the index ops check before they write
      cuda_ops::LaunchFlashAttention(attention, r_.attention, out, &append);
      return true;
    }
    return false;
  }

  passes::KvAppendBody r_;
  const bool fuse_ = EnvBool("KILN_KV_APPEND");  // read when the plan is built (A/B)
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
    if (n.kind == ir::NodeKind::kFusion) return OwnsBody(*n.body);
    return n.kind == ir::NodeKind::kOp && n.op == OpId::kScaledDotProductAttention;
  }
  bool OwnsBody(const ir::Graph& body) const override {
    passes::KvAppendBody roles;
    return passes::ParseKvAppendBody(body, &roles);
  }
  std::unique_ptr<passes::Pass> MakePass() const override {
    return std::make_unique<passes::AttentionFusion>(*this);
  }
  std::unique_ptr<FusedKernel> Lower(const ir::Graph&, const ir::Node& n) const override {
    if (n.kind == ir::NodeKind::kFusion) return std::make_unique<KvAppendAttention>(*n.body);
    return std::make_unique<Sdpa>(n);
  }
  std::string LaunchNote(const ir::Node& n) const override {
    if (n.kind != ir::NodeKind::kFusion) return "";
    passes::KvAppendBody roles;
    const bool rotary = passes::ParseKvAppendBody(*n.body, &roles) && roles.cos >= 0;
    return absl::StrCat(
        "launch: kiln's decode attention kernel, which also ",
        rotary ? "rotates the query and the new keys (RoPE) and " : "",
        "writes the new key and value rows into the caches (CUDA, flash-kernel operands); "
        "otherwise ",
        rotary ? "the rotations, " : "", "index_copy twice, then the attention");
  }
};

}  // namespace

const FusionTemplate& AttentionTemplate() {
  static const Attention kTemplate;
  return kTemplate;
}

}  // namespace kiln::codegen
