// The pointwise kernel family: fusion bodies of elementwise ops (any number of inputs and
// outputs, the outputs of one shape, the first one possibly a cat of values of that shape whose
// operands the kernel stores into the cat's slices), found by elementwise_fusion.h, lowered to
// the kernel IR and rendered by the elementwise skeletons (elementwise_cuda.h, which eager
// elementwise ops run as one-instruction programs); on the CPU the same program is evaluated in
// one pass.
#include <algorithm>

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
  CudaPointwise(const std::string& name, const kir::Program& p, CatSink cat)
      : kernels_(cuda_ops::CompileElementwiseKernels(name, p)), cat_(cat) {}
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    cuda_ops::LaunchElementwise(kernels_, in, StoreTargets(cat_, out));
  }
  std::vector<cuda::KernelFootprint> Footprints() const override {
    return cuda_ops::ElementwiseFootprints(kernels_);
  }

 private:
  cuda_ops::ElementwiseKernels kernels_;
  CatSink cat_;
};

class CpuPointwise final : public FusedKernel {
 public:
  CpuPointwise(kir::Program p, CatSink cat) : program_(std::move(p)), cat_(cat) {}
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    EvaluateProgramOnCpu(program_, in, StoreTargets(cat_, out));
  }

 private:
  kir::Program program_;
  CatSink cat_;
};

// The shape the kernel iterates over: a trailing cat's operand shape, else output 0's.
const Shape& IterationShape(const ir::Graph& body) {
  const ir::Node& root = body.node(body.outputs()[0]);
  return CatSinkOf(body).parts > 0 ? body.type(root.inputs[0]).shape : root.type.shape;
}

// Why a trailing cat cannot be stored by its operands ("" if it can, or there is none): only
// output 0 may be a cat, of body values of one shape and of its dtype.
std::string CatSinkRefusal(const ir::Graph& body) {
  for (size_t o = 0; o < body.outputs().size(); ++o) {
    const ir::Node& n = body.node(body.outputs()[o]);
    if (n.kind != ir::NodeKind::kOp || n.op != OpId::kCat) continue;
    if (o > 0) return absl::StrCat("output ", o, " is a cat (only output 0 may be one)");
    for (ir::ValueId in : n.inputs) {
      if (body.type(in).shape != body.type(n.inputs[0]).shape ||
          body.type(in).dtype != n.type.dtype) {
        return absl::StrCat("cat %", body.outputs()[o], " joins operands of different types");
      }
    }
  }
  for (ir::ValueId v = 0; v < body.num_values(); ++v) {
    const ir::Node& n = body.node(v);
    if (n.kind == ir::NodeKind::kOp && n.op == OpId::kCat && v != body.outputs()[0]) {
      return absl::StrCat("cat %", v, " is not the body's first output");
    }
  }
  return "";
}

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
      if (n.kind == ir::NodeKind::kOp && !GetOpDef(n.op).is_elementwise() && n.op != OpId::kCat) {
        return false;
      }
    }
    return true;
  }
  absl::Status VerifyBody(const ir::Graph& body) const override {
    if (std::string why = CatSinkRefusal(body); !why.empty()) {
      return absl::InternalError(absl::StrCat("pointwise body: ", why));
    }
    const Shape& shape = IterationShape(body);
    for (ir::ValueId v : body.outputs()) {
      if (v == body.outputs()[0] && CatSinkOf(body).parts > 0) continue;
      if (body.type(v).shape != shape) {
        return absl::InternalError(absl::StrCat(
            "pointwise body returns %", v, " of shape ", ShapeString(body.type(v).shape),
            " beside ", ShapeString(shape), ": every output has the iteration shape"));
      }
    }
    const size_t stores = body.outputs().size() + std::max(CatSinkOf(body).parts - 1, 0);
    if (body.inputs().size() + stores > static_cast<size_t>(cuda_ops::kMaxKernelOperands)) {
      return absl::InternalError(absl::StrCat(
          "pointwise body has ", body.inputs().size(), " inputs and ", stores,
          " stores, more than the kernel's ", cuda_ops::kMaxKernelOperands, " operands"));
    }
    return absl::OkStatus();
  }
  std::unique_ptr<passes::Pass> MakePass() const override {
    return std::make_unique<passes::ElementwiseFusion>(*this);
  }
  std::unique_ptr<FusedKernel> Lower(const ir::Graph&, const ir::Node& n) const override {
    kir::Program p = LowerFusionBody(*n.body);
    const CatSink cat = CatSinkOf(*n.body);
    if constexpr (kWithCuda) {
      if (n.type.device.is_cuda()) return std::make_unique<CudaPointwise>(n.name, p, cat);
    }
    return std::make_unique<CpuPointwise>(std::move(p), cat);
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
           "256 threads), _rows for [rows, cols] operands, else _strided; a trailing cat's "
           "operands are stored into its slices (strided outputs)";
  }
};

}  // namespace

const FusionTemplate& PointwiseTemplate() {
  static const Pointwise kTemplate;
  return kTemplate;
}

}  // namespace kiln::codegen
