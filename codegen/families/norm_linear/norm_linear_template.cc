// The norm-linear kernel family: a layer_norm or rms_norm and the linear that reads it
// (norm_linear_fusion.h), on CUDA one launch of kiln's GEMV that normalises the x rows itself
// (ops/cuda/matmul_cuda.h NormLinearGemv: every CTA computes the few rows' statistics and writes
// the normalised rows, rounded to the dtype as the eager norm's output is, to shared memory once,
// so the linear sees what it would have seen). The GEMV is chosen per problem against the norm's
// kernel followed by the linear, as linear's GEMV is against cuBLASLt; where the GEMV does not
// take the call (more rows at run time, an unsupported layout, KILN_GEMV=off) or loses, the node
// runs the norm into a temporary and then the linear, as eager does.
//
// An output that is the gated product of a GLU MLP (act(gate) · up over the two halves of a merged
// linear's output, or over two linears of the norm, passes/gated_product.h) is one launch of the
// gated GEMV (GemvArgs::w_up): the norm, both sums and the product, the linear outputs never
// written. It is timed against the way it ran before this family took it: the linear(s) as above
// into temporaries, then a generated elementwise kernel (the pointwise family's) for the product.
#include <algorithm>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "codegen/families/norm_linear/norm_linear_fusion.h"
#include "codegen/fusion_template.h"
#include "codegen/launch_count.h"
#include "ops/cuda/gemv_limits.h"
#include "ops/cuda/matmul_cuda.h"
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "passes/gated_product.h"
#include "runtime/build_config.h"

#if KILN_WITH_CUDA
#include "codegen/families/pointwise/elementwise_cuda.h"
#endif

namespace kiln::codegen {
namespace {

using ir::Node;
using ir::NodeKind;
using ir::ValueId;

static_assert(passes::kGatedGemvMaxRows == cuda_kernels::kGemvMaxRows,
              "the passes' decode row count is the GEMV's");

bool IsNormOp(const Node& n) {
  return n.kind == NodeKind::kOp && (n.op == OpId::kLayerNorm || n.op == OpId::kRmsNorm);
}

// A body of this family: its inputs, a norm, and per output a linear reading the norm as x or the
// gated product of one (passes/gated_product.h); nothing else (the outputs in any order).
bool IsNormLinearBody(const ir::Graph& body) {
  const ValueId first = static_cast<ValueId>(body.inputs().size());
  if (first >= body.num_values() || !IsNormOp(body.node(first))) return false;
  std::vector<bool> covered(body.num_values(), false);
  covered[first] = true;
  auto cover = [&](ValueId v) {
    if (v <= first || covered[v]) return false;
    covered[v] = true;
    return true;
  };
  for (ValueId o : body.outputs()) {
    if (o <= first || o >= body.num_values()) return false;
    const Node& n = body.node(o);
    if (n.kind == NodeKind::kOp && n.op == OpId::kLinear) {
      if (n.inputs[0] != first || !cover(o)) return false;
      continue;
    }
    const std::optional<passes::GatedProductMatch> m = passes::MatchGatedProduct(body, o, nullptr);
    if (!m.has_value() || body.node(m->linear).inputs[0] != first) return false;
    // Two linears: the gate is the linear itself.
    std::vector<ValueId> values = {m->linear, m->up, m->act, m->mul};
    if (!m->two_linears()) values.push_back(m->gate);
    for (ValueId v : values) {
      if (!cover(v)) return false;
    }
  }
  return std::all_of(covered.begin() + first, covered.end(), [](bool c) { return c; });
}

class NormLinearKernel final : public FusedKernel {
 public:
  explicit NormLinearKernel(const ir::Graph& body, std::string name) : name_(std::move(name)) {
    const ValueId first = static_cast<ValueId>(body.inputs().size());
    const Node& norm = body.node(first);
    norm_op_ = norm.op;
    norm_attrs_ = norm.attrs;
    norm_type_ = norm.type;
    for (ValueId v : norm.inputs) norm_in_.push_back(v);  // body inputs are 0..first-1
    for (ValueId o : body.outputs()) {                    // out[i] is output i's linear
      Linear l;
      ValueId lin = o;
      if (const std::optional<passes::GatedProductMatch> m =
              passes::MatchGatedProduct(body, o, nullptr)) {
        lin = m->linear;
        const Node& act = body.node(m->act);
        l.gated = cuda_ops::GatedProduct{act.op, act.attrs.approximate, m->gate_first};
        l.act_attrs = act.attrs;
        if (m->two_linears()) {
          const Node& up = body.node(m->up);
          l.up_rest.assign(up.inputs.begin() + 1, up.inputs.end());
          l.up_attrs = up.attrs;
        }
      }
      l.attrs = body.node(lin).attrs;
      for (size_t i = 1; i < body.node(lin).inputs.size(); ++i) {
        l.rest.push_back(body.node(lin).inputs[i]);
      }
      gated_ = gated_ || l.gated.has_value();
      linears_.push_back(std::move(l));
    }
#if KILN_WITH_CUDA
    products_.resize(linears_.size());
#endif
  }

  // Each linear as one GEMV that normalises the rows itself where it runs so (NormLinearGemv),
  // else the norm once into a temporary that the remaining linears share, then the linear; a
  // gated product as one gated GEMV where it runs so, else its linear so and then the product.
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    const std::vector<Tensor> norm_in = Pick(in, norm_in_);
    Tensor normed;  // the norm's output, made by the first linear that needs it
    auto norm_into = [&](const Tensor& dst) { DispatchOut(norm_op_, norm_in, norm_attrs_, dst); };
    // Linear `l` of the normalised rows into dst: the GEMV that normalises them where it runs
    // so, else the linear of `normed` (the norm's output, made by the first linear that needs it).
    auto linear_into = [&](const OpAttrs& attrs, const std::vector<Tensor>& rest, const Tensor& dst,
                           Tensor& normed) {
      auto linear_of = [&](const Tensor& x, const Tensor& to) {
        std::vector<Tensor> lin = {x};
        lin.insert(lin.end(), rest.begin(), rest.end());
        DispatchOut(OpId::kLinear, lin, attrs, to);
      };
      auto norm_then_linear = [&](const Tensor& to) {  // what the fused GEMV is timed against
        const Tensor x = Tensor::Empty(norm_type_.shape, norm_type_.dtype, to.device());
        norm_into(x);
        linear_of(x, to);
      };
      if constexpr (kWithCuda) {
        if (dst.device().is_cuda() &&
            cuda_ops::NormLinearGemv(norm_op_, norm_in, norm_attrs_.eps, rest, attrs, dst,
                                     norm_then_linear)) {
          return;
        }
      }
      if (!normed.defined()) {
        normed = Tensor::Empty(norm_type_.shape, norm_type_.dtype, dst.device());
        norm_into(normed);
      }
      linear_of(normed, dst);
    };
    for (size_t i = 0; i < linears_.size(); ++i) {
      const Linear& l = linears_[i];
      const std::vector<Tensor> rest = Pick(in, l.rest);
      if (!l.gated.has_value()) {
        linear_into(l.attrs, rest, out[i], normed);
        continue;
      }
      // The linear(s) into temporaries, then the product (of the merged linear's halves). Its
      // own norm output: the choice times it whole, call after call.
      const std::vector<Tensor> up_rest = Pick(in, l.up_rest);
      auto apart = [&](const Tensor& dst) {
        Shape shape = dst.shape();
        shape.back() = rest[0].size(0);
        const Tensor y = Tensor::Empty(shape, dst.dtype(), dst.device());
        Tensor own_normed;
        linear_into(l.attrs, rest, y, own_normed);
        if (up_rest.empty()) return Product(i, y, dst);
        const Tensor y_up = Tensor::Empty(shape, dst.dtype(), dst.device());
        linear_into(l.up_attrs, up_rest, y_up, own_normed);
        Product(i, y, y_up, dst);
      };
      if constexpr (kWithCuda) {
        cuda_ops::GatedProduct gated = *l.gated;
        if (!up_rest.empty()) {
          gated.up_weight = up_rest[0];
          if (up_rest.size() > 1) gated.up_bias = up_rest[1];
        }
        if (out[i].device().is_cuda() &&
            cuda_ops::NormLinearGemv(norm_op_, norm_in, norm_attrs_.eps, rest, l.attrs, out[i],
                                     apart, &gated)) {
          continue;
        }
      }
      apart(out[i]);
    }
  }

  // One GEMV per linear, or with the norm's kernel and the linears' launches (and a gated
  // product's kernel): whichever Run chooses, counted by capturing a run.
  LaunchCount Launches(absl::Span<const Tensor> in) const override {
    const std::vector<Tensor> norm_in = Pick(in, norm_in_);
    std::string key = absl::StrCat("norm_linear|", LaunchKey(norm_op_, norm_in, norm_attrs_));
    std::vector<Tensor> outs;
    for (const Linear& l : linears_) {
      const std::vector<Tensor> rest = Pick(in, l.rest);
      absl::StrAppend(&key, "|", LaunchKey(OpId::kLinear, rest, l.attrs));
      if (l.gated.has_value()) {  // the choice's problem names the gate (gemv_choice.h)
        absl::StrAppend(&key, " glu ", GetOpDef(l.gated->act).name,
                        l.gated->approximate == GeluApprox::kTanh ? " tanh" : "",
                        l.gated->gate_first ? " first" : "");
      }
      if (!l.up_rest.empty()) {
        absl::StrAppend(&key, " up ", LaunchKey(OpId::kLinear, Pick(in, l.up_rest), l.up_attrs));
      }
      Shape shape = norm_type_.shape;
      shape.back() = rest[0].size(0) / (l.gated.has_value() && l.up_rest.empty() ? 2 : 1);
      outs.push_back(Tensor::Empty(shape, norm_type_.dtype, in[0].device()));
    }
    return CountCallLaunchesOnce(key, [&] { Run(in, outs); });
  }
  std::vector<cuda::KernelFootprint> Footprints() const override {
#if KILN_WITH_CUDA
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<cuda::KernelFootprint> all;
    for (const auto& k : products_) {
      if (!k.has_value()) continue;
      for (const cuda::KernelFootprint& f : cuda_ops::ElementwiseFootprints(*k)) all.push_back(f);
    }
    return all;
#else
    return {};
#endif
  }
  // The GEMV (matmul_cuda.h), the norm and linear ops: registry ops and linear's kernels only,
  // unless a gated product's elementwise kernel may run.
  bool LaunchesThroughOps() const override { return !gated_; }

 private:
  struct Linear {
    OpAttrs attrs;
    std::vector<ValueId> rest;  // positions in the node's inputs of w, bias?, residual?
    std::optional<cuda_ops::GatedProduct> gated;  // the output is act(gate) · up of its halves
    OpAttrs act_attrs;                            // the gate activation's
    std::vector<ValueId> up_rest;  // a gated product of two linears: the up's w, bias?
    OpAttrs up_attrs;
  };

  // dst = act(gate) · up from the halves of y (linear i's output).
  void Product(size_t i, const Tensor& y, const Tensor& dst) const {
    const int64_t last = y.dim() - 1, f = dst.size(-1);
    const Tensor first = slice(y, last, 0, f), second = slice(y, last, f, 2 * f);
    const bool gate_first = linears_[i].gated->gate_first;
    Product(i, gate_first ? first : second, gate_first ? second : first, dst);
  }
  // dst = act(gate) · up: the generated elementwise kernel on CUDA, the ops elsewhere.
  void Product(size_t i, const Tensor& gate, const Tensor& up, const Tensor& dst) const {
    const Linear& l = linears_[i];
#if KILN_WITH_CUDA
    if (dst.device().is_cuda()) {
      return cuda_ops::LaunchElementwise(ProductKernel(i, dst.dtype()), {gate, up}, {dst});
    }
#endif
    DispatchOut(OpId::kMul, {Dispatch(l.gated->act, {gate}, l.act_attrs), up}, {}, dst);
  }
#if KILN_WITH_CUDA
  // Linear i's product kernel (the activation kept in float32: one reader), compiled when first
  // needed (the node's outputs share one dtype).
  const cuda_ops::ElementwiseKernels& ProductKernel(size_t i, DType t) const {
    const Linear& l = linears_[i];
    std::lock_guard<std::mutex> lock(mu_);
    std::optional<cuda_ops::ElementwiseKernels>& k = products_[i];
    if (!k.has_value()) {
      kir::Program p({t, t});
      const int g = p.Apply(l.gated->act, {p.Load(0)}, l.act_attrs, t);
      p.Store(p.Apply(OpId::kMul, {g, p.Load(1)}, {}, t), t);
      k = cuda_ops::CompileElementwiseKernels(absl::StrCat(name_, "_product", i), p);
    }
    return *k;
  }
#endif

  static std::vector<Tensor> Pick(absl::Span<const Tensor> in, const std::vector<ValueId>& at) {
    std::vector<Tensor> t;
    for (ValueId v : at) t.push_back(in[v]);
    return t;
  }

  std::string name_;
  OpId norm_op_ = OpId::kLayerNorm;
  OpAttrs norm_attrs_;
  TensorType norm_type_;
  std::vector<ValueId> norm_in_;  // positions in the node's inputs
  std::vector<Linear> linears_;   // in the body's output order
  bool gated_ = false;            // some output is a gated product
  mutable std::mutex mu_;
#if KILN_WITH_CUDA
  mutable std::vector<std::optional<cuda_ops::ElementwiseKernels>> products_;  // per linear
#endif
};

class NormLinear final : public FusionTemplate {
 public:
  const char* name() const override { return "norm_linear"; }
  // Operands: the linear's output type, the norm's operands, the linear's after x.
  std::string RejectsOperands(absl::Span<const TensorType> t) const override {
    const TensorType& out = t[0];
    if (!out.device.is_cuda()) return "on the CPU the norm and the linear run as two ops anyway";
    for (const TensorType& u : t) {
      if (u.dtype != out.dtype || u.device != out.device) {
        return absl::StrCat("operands of several dtypes or devices (", Describe(u), " beside ",
                            Describe(out), ")");
      }
    }
    if (out.dtype != DType::kFloat32 && out.dtype != DType::kFloat16 &&
        out.dtype != DType::kBFloat16) {
      return absl::StrCat("the GEMV takes float32, float16 and bfloat16, not ",
                          DTypeName(out.dtype));
    }
    const int64_t n = out.rank() == 0 ? 0 : out.shape.back();
    const int64_t rows = n == 0 ? 0 : out.numel() / n;
    if (rows < 1 || rows > cuda_kernels::kGemvMaxRows) {
      return absl::StrCat(rows, " rows: the GEMV takes 1 to ", cuda_kernels::kGemvMaxRows);
    }
    return "";
  }
  bool Owns(const Node& n) const override {
    return n.kind == NodeKind::kFusion && OwnsBody(*n.body);
  }
  bool OwnsBody(const ir::Graph& body) const override { return IsNormLinearBody(body); }
  std::unique_ptr<passes::Pass> MakePass() const override {
    return std::make_unique<passes::NormLinearFusion>(*this);
  }
  std::unique_ptr<FusedKernel> Lower(const ir::Graph&, const Node& n) const override {
    return std::make_unique<NormLinearKernel>(*n.body, n.name);
  }
  std::string LaunchNote(const Node& n) const override {
    return "launch: kiln's GEMV normalising the rows itself (CUDA, at most " +
           std::to_string(cuda_kernels::kGemvMaxRows) +
           " rows, where it times faster); otherwise the norm, then the linear";
  }
};

}  // namespace

const FusionTemplate& NormLinearTemplate() {
  static const NormLinear kTemplate;
  return kTemplate;
}

}  // namespace kiln::codegen
