// The gemm kernel family: a GeGLU MLP's merged gate/up linear and its gelu_tanh(gate) * up
// (gemm_fusion.h) as one fusion node. On an sm_90 GPU, for more than 8 rows where the operands
// suit it, one launch of kiln's Hopper GEMM (gemm_cuda.h) over the gate and up weights
// interleaved in groups of 8 computes the product in its epilogue from the float32 accumulators;
// the interleaved weight (and bias) is made once at lowering when the weight is a constant, else
// on each run (one copy). Elsewhere the linear runs (cuBLASLt, or the GEMV for a few rows) and a
// generated elementwise kernel (the pointwise family's) computes gelu_tanh(gate) * up from its
// two halves: what the graph ran before this family. On the CPU the body's ops run one by one.
#include <algorithm>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/families/gemm/gemm_fusion.h"
#include "codegen/fusion_template.h"
#include "codegen/launch_count.h"
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "runtime/build_config.h"
#include "runtime/settings.h"
#include "runtime/status.h"

#if KILN_WITH_CUDA
#include "codegen/families/gemm/gemm_cuda.h"
#include "codegen/families/pointwise/elementwise_cuda.h"
#include "runtime/cuda.h"
#endif

namespace kiln::codegen {
namespace {

using ir::Node;
using ir::NodeKind;
using ir::ValueId;

constexpr int64_t kFewRows = 8;  // at most this many rows take the linear and elementwise kernel

// The body's GeGLU pattern (its root is the body's output).
passes::GegluMatch BodyMatch(const ir::Graph& body) {
  const std::optional<passes::GegluMatch> m =
      passes::MatchGeglu(body, body.outputs().at(0), nullptr);
  KILN_CHECK(m.has_value(), "gemm family: the fusion body is not a GeGLU pattern");
  return *m;
}

// The fusion node's operands: x, the merged weight, the bias (or undefined), as body inputs.
struct Operands {
  int x = 0, w = 1, bias = -1;
};
Operands OperandsOf(const ir::Graph& body, const passes::GegluMatch& m) {
  const Node& lin = body.node(m.linear);
  auto input_index = [&](ValueId v) {
    const auto it = std::find(body.inputs().begin(), body.inputs().end(), v);
    KILN_CHECK(it != body.inputs().end(), "gemm family: the linear's operand %", v,
               " is not a body input");
    return static_cast<int>(it - body.inputs().begin());
  };
  Operands o{input_index(lin.inputs[0]), input_index(lin.inputs[1]), -1};
  if (lin.inputs.size() > 2) o.bias = input_index(lin.inputs[2]);
  return o;
}

// The body, op by op (the CPU's way, and the reference of the CUDA paths).
class BodyOps final : public FusedKernel {
 public:
  explicit BodyOps(const ir::Graph& body) : body_(body) {}
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    std::vector<Tensor> v(body_.num_values());
    for (size_t i = 0; i < body_.inputs().size(); ++i) v[body_.inputs()[i]] = in[i];
    for (ValueId id = 0; id < body_.num_values(); ++id) {
      const Node& n = body_.node(id);
      if (n.kind != NodeKind::kOp) continue;
      std::vector<Tensor> args;
      for (ValueId a : n.inputs) args.push_back(v[a]);
      if (id == body_.outputs()[0]) {
        DispatchOut(n.op, args, n.attrs, out[0]);
      } else {
        v[id] = Dispatch(n.op, args, n.attrs);
      }
    }
  }
  LaunchCount Launches(absl::Span<const Tensor> in) const override {
    return {static_cast<int>(std::count_if(
                body_.nodes().begin(), body_.nodes().end(),
                [](const Node& n) { return n.kind == NodeKind::kOp && n.op != OpId::kSlice; })),
            0, ""};
  }

 private:
  ir::Graph body_;
};

#if KILN_WITH_CUDA
class CudaGeglu final : public FusedKernel {
 public:
  CudaGeglu(const ir::Graph& graph, const Node& n)
      : match_(BodyMatch(*n.body)), ops_(OperandsOf(*n.body, match_)), name_(n.name) {
    // A constant weight (and bias) is interleaved once, here; with static shapes on an sm_90 GPU
    // the kernel is loaded here too when a cache has it (else it compiles in the background and
    // the fallback's kernel is compiled here), or compiled here with background compiles off
    // (lowering runs nodes in parallel threads), not in the first call.
    const Node& w = graph.node(n.inputs[ops_.w]);
    if (w.kind == NodeKind::kConstant && w.constant.device().is_cuda()) {
      weight_ = Interleave(w.constant);
      if (ops_.bias >= 0 && graph.node(n.inputs[ops_.bias]).kind == NodeKind::kConstant) {
        bias_ = Interleave(graph.node(n.inputs[ops_.bias]).constant);
      }
    }
    const cuda::DeviceProps& props = cuda::Props(n.type.device.index);
    const int64_t f = n.type.shape.back(), k = w.type.shape.back();
    if (props.major == 9 && props.minor == 0 && n.sym_dims == 0 && f > 0 &&
        NumElements(n.type.shape) / f > kFewRows) {
      const cuda_ops::GemmConfig c = cuda_ops::Sm90GegluConfigFor(
          n.type.dtype, NumElements(n.type.shape) / f, 2 * f, k, ops_.bias >= 0, props.sm_count);
      if (!background_) {
        cuda_ops::PrepareSm90Gemm(c);
      } else if (!cuda_ops::Sm90GemmKernelReady(c)) {
        Apart(n.type.dtype);  // the fallback's kernel, compiled now: the first calls run it
      }
    }
  }
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    const Tensor& x = in[ops_.x];
    const int64_t k = x.size(-1), m = x.numel() / k, f = out[0].size(-1);
    const std::optional<Tensor> x2 = RowsOf(x, m, k);
    const Tensor o2 = out[0].as_strided({m, f}, {f, 1}, out[0].offset());
    // A few rows (decode) stream the weight: the linear's GEMV choice serves them better than
    // one row of 128-row tiles (H200, the 1-token MLP: 16.4 µs apart, 17.4 fused).
    if (x2.has_value() && m > kFewRows) {
      const Tensor w = weight_.defined() ? weight_ : Interleave(in[ops_.w]);
      const Tensor b = ops_.bias < 0     ? Tensor()
                       : bias_.defined() ? bias_
                                         : Interleave(in[ops_.bias]);
      if (cuda_ops::Sm90GemmApplies(*x2, w, b, o2, /*geglu=*/true) && KernelReady(*x2, w, b, o2)) {
        return cuda_ops::RunSm90Geglu(*x2, w, b, o2);
      }
    }
    std::vector<Tensor> lin_in = {x, in[ops_.w]};
    if (ops_.bias >= 0) lin_in.push_back(in[ops_.bias]);
    const Tensor y = Dispatch(OpId::kLinear, lin_in, {});
    const int64_t last = y.dim() - 1;
    const Tensor first = slice(y, last, 0, f), second = slice(y, last, f, 2 * f);
    cuda_ops::LaunchElementwise(
        Apart(out[0].dtype()),
        match_.gate_first ? std::vector<Tensor>{first, second} : std::vector<Tensor>{second, first},
        {out[0]});
  }
  LaunchCount Launches(absl::Span<const Tensor> in) const override {
    std::vector<Tensor> outs = {Tensor::Empty(OutShape(in), in[0].dtype(), in[0].device())};
    std::string key = absl::StrCat("gemm geglu ", name_, weight_.defined() ? " const" : "");
    for (const Tensor& t : in) {  // the kernel's path depends on rows, strides and alignment
      absl::StrAppend(&key, " ", t.shape_string(), "/", absl::StrJoin(t.strides(), ","), "@",
                      reinterpret_cast<uintptr_t>(t.data_ptr()) % 16);
    }
    return CountCallLaunchesOnce(key, [&] { Run(in, outs); });
  }
  std::vector<cuda::KernelFootprint> Footprints() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return elementwise_.has_value() ? cuda_ops::ElementwiseFootprints(*elementwise_)
                                    : std::vector<cuda::KernelFootprint>{};
  }
  std::string explain() const override {
    return absl::StrCat("gemm: ", name_, weight_.defined() ? " (weight interleaved once)" : "",
                        ": kiln's sm_90 GeGLU GEMM where the operands suit it, else the linear",
                        " and ", name_, "_apart");
  }

 private:
  // Whether the GEMM's kernel for these operands can run now. With background compiles
  // (KILN_BACKGROUND_COMPILE=on) a kernel no cache has compiles on a background thread while
  // calls run the fallback; a CUDA graph capture (or a launch count) waits for it, so a captured
  // plan has it.
  bool KernelReady(const Tensor& x2, const Tensor& w, const Tensor& b, const Tensor& o2) const {
    if (!background_ || cuda::Capturing()) return true;
    return cuda_ops::Sm90GemmKernelReady(
        cuda_ops::Sm90GegluConfigFor(o2.dtype(), x2.size(0), w.size(0), x2.size(1), b.defined(),
                                     cuda::Props(o2.device().index).sm_count));
  }
  // The gate and up halves of a merged [2f, ...] weight or bias, interleaved for the kernel.
  Tensor Interleave(const Tensor& merged) const {
    const int64_t f = merged.size(0) / 2;
    const Tensor first = slice(merged, 0, 0, f), second = slice(merged, 0, f, 2 * f);
    return match_.gate_first ? cuda_ops::InterleaveGeglu(first, second)
                             : cuda_ops::InterleaveGeglu(second, first);
  }
  // The elementwise gelu_tanh(gate) * up of the fallback (gelu kept in float32: one reader),
  // compiled when first needed.
  const cuda_ops::ElementwiseKernels& Apart(DType t) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!elementwise_.has_value()) {
      kir::Program p({t, t});
      OpAttrs tanh;
      tanh.approximate = GeluApprox::kTanh;
      const int g = p.Apply(OpId::kGelu, {p.Load(0)}, tanh, t);
      p.Store(p.Apply(OpId::kMul, {g, p.Load(1)}, {}, t), t);
      elementwise_ = cuda_ops::CompileElementwiseKernels(name_ + "_apart", p);
    }
    return *elementwise_;
  }
  // x's rows as one [m, k] matrix with unit column stride, without a copy; nullopt if none.
  static std::optional<Tensor> RowsOf(const Tensor& x, int64_t m, int64_t k) {
    if (x.dim() == 2) return x;
    if (!x.is_contiguous()) return std::nullopt;
    return x.as_strided({m, k}, {k, 1}, x.offset());
  }
  Shape OutShape(absl::Span<const Tensor> in) const {
    Shape s = in[ops_.x].shape();
    s.back() = in[ops_.w].size(0) / 2;
    return s;
  }

  passes::GegluMatch match_;
  Operands ops_;
  const bool background_ = EnvBool("KILN_BACKGROUND_COMPILE");  // read at lowering (A/B)
  std::string name_;
  mutable std::mutex mu_;
  mutable std::optional<cuda_ops::ElementwiseKernels> elementwise_;
  Tensor weight_, bias_;
};
#endif

class GemmFamily final : public FusionTemplate {
 public:
  const char* name() const override { return "gemm"; }
  std::string RejectsOperands(absl::Span<const TensorType> ops) const override {
    if (ops.size() < 2) return "a linear needs x and a weight";
    const TensorType& x = ops[0];
    const TensorType& w = ops[1];
    if (!x.device.is_cuda()) return "the GeGLU GEMM runs on CUDA only";
    if (x.dtype != DType::kBFloat16 && x.dtype != DType::kFloat16) {
      return absl::StrCat("the GeGLU GEMM takes bf16 or f16, not ", DTypeName(x.dtype));
    }
    if (w.rank() != 2 || w.shape[1] % 8 != 0 || w.shape[1] < 8 || w.shape[0] % 16 != 0 ||
        w.shape[0] < 16) {
      return absl::StrCat(
          "the GeGLU GEMM needs k a positive multiple of 8 and 2f of 16, got a weight ",
          ShapeString(w.shape));
    }
    return "";
  }
  bool Owns(const Node& n) const override {
    return n.kind == NodeKind::kFusion && OwnsBody(*n.body);
  }
  bool OwnsBody(const ir::Graph& body) const override {
    return body.outputs().size() == 1 && passes::MatchGeglu(body, body.outputs()[0], nullptr);
  }
  std::unique_ptr<passes::Pass> MakePass() const override {
    return std::make_unique<passes::GegluGemmFusion>(*this);
  }
  std::unique_ptr<FusedKernel> Lower(const ir::Graph& graph, const Node& n) const override {
#if KILN_WITH_CUDA
    if (n.type.device.is_cuda()) return std::make_unique<CudaGeglu>(graph, n);
#endif
    return std::make_unique<BodyOps>(*n.body);
  }
  std::string LaunchNote(const Node&) const override {
    return "launch: on an sm_90 GPU one persistent GEMM (TMA, wgmma) with gelu_tanh(gate) * up "
           "in its epilogue; elsewhere the linear and one elementwise kernel";
  }
};

}  // namespace

const FusionTemplate& GemmTemplate() {
  static const GemmFamily kTemplate;
  return kTemplate;
}

}  // namespace kiln::codegen
