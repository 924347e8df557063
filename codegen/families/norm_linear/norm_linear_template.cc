// The norm-linear kernel family: a layer_norm or rms_norm and the linear that reads it
// (norm_linear_fusion.h), on CUDA one launch of kiln's GEMV that normalises the x rows itself
// (ops/cuda/matmul_cuda.h NormLinearGemv: every CTA computes the few rows' statistics and writes
// the normalised rows, rounded to the dtype as the eager norm's output is, to shared memory once,
// so the linear sees what it would have seen). The GEMV is chosen per problem against the norm's
// kernel followed by the linear, as linear's GEMV is against cuBLASLt; where the GEMV does not
// take the call (more rows at run time, an unsupported layout, KILN_GEMV=off) or loses, the node
// runs the norm into a temporary and then the linear, as eager does.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codegen/families/norm_linear/norm_linear_fusion.h"
#include "codegen/fusion_template.h"
#include "codegen/launch_count.h"
#include "ops/cuda/gemv_limits.h"
#include "ops/cuda/matmul_cuda.h"
#include "ops/dispatch.h"
#include "runtime/build_config.h"

namespace kiln::codegen {
namespace {

using ir::Node;
using ir::NodeKind;
using ir::ValueId;

bool IsNormOp(const Node& n) {
  return n.kind == NodeKind::kOp && (n.op == OpId::kLayerNorm || n.op == OpId::kRmsNorm);
}

// A body of this family: its inputs, a norm, and linears reading the norm as x, each an output
// (the outputs in any order).
bool IsNormLinearBody(const ir::Graph& body) {
  const ValueId first = static_cast<ValueId>(body.inputs().size());
  const int linears = body.num_values() - first - 1;
  if (linears < 1 || body.outputs().size() != static_cast<size_t>(linears)) return false;
  if (!IsNormOp(body.node(first))) return false;
  std::vector<bool> seen(body.num_values(), false);
  for (ValueId o : body.outputs()) {
    if (o <= first || o >= body.num_values() || seen[o]) return false;
    seen[o] = true;
    const Node& lin = body.node(o);
    if (lin.kind != NodeKind::kOp || lin.op != OpId::kLinear || lin.inputs[0] != first) {
      return false;
    }
  }
  return true;
}

class NormLinearKernel final : public FusedKernel {
 public:
  explicit NormLinearKernel(const ir::Graph& body) {
    const ValueId first = static_cast<ValueId>(body.inputs().size());
    const Node& norm = body.node(first);
    norm_op_ = norm.op;
    norm_attrs_ = norm.attrs;
    norm_type_ = norm.type;
    for (ValueId v : norm.inputs) norm_in_.push_back(v);  // body inputs are 0..first-1
    for (ValueId o : body.outputs()) {                    // out[i] is output i's linear
      const Node& lin = body.node(o);
      Linear l{lin.attrs, {}};
      for (size_t i = 1; i < lin.inputs.size(); ++i) l.rest.push_back(lin.inputs[i]);
      linears_.push_back(std::move(l));
    }
  }

  // Each linear as one GEMV that normalises the rows itself where it runs so (NormLinearGemv),
  // else the norm once into a temporary that the remaining linears share, then the linear.
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    const std::vector<Tensor> norm_in = Pick(in, norm_in_);
    Tensor normed;  // the norm's output, made by the first linear that needs it
    auto norm_into = [&](const Tensor& dst) { DispatchOut(norm_op_, norm_in, norm_attrs_, dst); };
    for (size_t i = 0; i < linears_.size(); ++i) {
      const Linear& l = linears_[i];
      const std::vector<Tensor> rest = Pick(in, l.rest);
      auto linear_of = [&](const Tensor& x, const Tensor& dst) {
        std::vector<Tensor> lin = {x};
        lin.insert(lin.end(), rest.begin(), rest.end());
        DispatchOut(OpId::kLinear, lin, l.attrs, dst);
      };
      auto norm_then_linear = [&](const Tensor& dst) {  // what the fused GEMV is timed against
        const Tensor x = Tensor::Empty(norm_type_.shape, norm_type_.dtype, dst.device());
        norm_into(x);
        linear_of(x, dst);
      };
      if constexpr (kWithCuda) {
        if (out[i].device().is_cuda() &&
            cuda_ops::NormLinearGemv(norm_op_, norm_in, norm_attrs_.eps, rest, l.attrs, out[i],
                                     norm_then_linear)) {
          continue;
        }
      }
      if (!normed.defined()) {
        normed = Tensor::Empty(norm_type_.shape, norm_type_.dtype, out[i].device());
        norm_into(normed);
      }
      linear_of(normed, out[i]);
    }
  }

  // One GEMV per linear, or with the norm's kernel and the linears' launches: whichever Run
  // chooses, counted by capturing a run.
  LaunchCount Launches(absl::Span<const Tensor> in) const override {
    const std::vector<Tensor> norm_in = Pick(in, norm_in_);
    std::string key = absl::StrCat("norm_linear|", LaunchKey(norm_op_, norm_in, norm_attrs_));
    std::vector<Tensor> outs;
    for (const Linear& l : linears_) {
      const std::vector<Tensor> rest = Pick(in, l.rest);
      absl::StrAppend(&key, "|", LaunchKey(OpId::kLinear, rest, l.attrs));
      outs.push_back(Tensor::Empty({OutShape(norm_type_, rest), norm_type_.dtype, in[0].device()}));
    }
    return CountCallLaunchesOnce(key, [&] { Run(in, outs); });
  }
  // The GEMV (matmul_cuda.h), the norm and linear ops: registry ops and linear's kernels only.
  bool LaunchesThroughOps() const override { return true; }

 private:
  struct Linear {
    OpAttrs attrs;
    std::vector<ValueId> rest;  // positions in the node's inputs of w, bias?, residual?
  };

  static std::vector<Tensor> Pick(absl::Span<const Tensor> in, const std::vector<ValueId>& at) {
    std::vector<Tensor> t;
    for (ValueId v : at) t.push_back(in[v]);
    return t;
  }
  // A linear's output shape: the norm's with the last dim w's rows.
  static Shape OutShape(const TensorType& norm, const std::vector<Tensor>& rest) {
    Shape s = norm.shape;
    s.back() = rest[0].size(0);
    return s;
  }

  OpId norm_op_ = OpId::kLayerNorm;
  OpAttrs norm_attrs_;
  TensorType norm_type_;
  std::vector<ValueId> norm_in_;  // positions in the node's inputs
  std::vector<Linear> linears_;   // in the body's output order
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
    return std::make_unique<NormLinearKernel>(*n.body);
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
