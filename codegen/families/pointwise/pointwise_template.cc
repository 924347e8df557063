// The pointwise kernel family: fusion bodies of elementwise ops (any number of inputs and
// outputs, the outputs of one shape, the first one possibly a cat of values of that shape whose
// operands the kernel stores into the cat's slices), found by elementwise_fusion.h, lowered to
// the kernel IR and rendered by the elementwise skeletons (elementwise_cuda.h, which eager
// elementwise ops run as one-instruction programs); on the CPU the same program is evaluated in
// one pass. A body of several independent segments (horizontal_fusion.h), each one such group,
// is one combo kernel running the segments' programs one after another.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/families/pointwise/elementwise_cuda.h"
#include "codegen/families/pointwise/elementwise_fusion.h"
#include "codegen/fused_kernel.h"
#include "codegen/fusion_template.h"
#include "passes/fusion_groups.h"
#include "runtime/build_config.h"
#include "runtime/status.h"

namespace kiln::codegen {
namespace {

class CudaPointwise final : public FusedKernel {
 public:
  CudaPointwise(const std::string& name, const kir::Program& p, CatSink cat)
      : kernels_(cuda_ops::CompileElementwiseKernels(name, p)), cat_(cat) {}
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    if (cat_.parts == 0) return cuda_ops::LaunchElementwise(kernels_, in, out);
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
    if (cat_.parts == 0) return EvaluateProgramOnCpu(program_, in, out);
    EvaluateProgramOnCpu(program_, in, StoreTargets(cat_, out));
  }

 private:
  kir::Program program_;
  CatSink cat_;
};

// One segment of a combo body: its program, cat and the node's operands it reads and writes.
struct Segment {
  kir::Program program;
  CatSink cat;
  std::vector<int> inputs, outputs;  // the node's input and output indices
  Shape shape;                       // of its first output
};

std::vector<Segment> SegmentsOf(const ir::Graph& body) {
  std::vector<Segment> segments;
  for (const passes::BodySegment& s : passes::BodySegments(body)) {
    const ir::Graph sub = SegmentBody(body, s);
    segments.push_back({LowerFusionBody(sub), CatSinkOf(sub), s.inputs, s.outputs,
                        sub.type(sub.outputs()[0]).shape});
  }
  return segments;
}

// Whether the body is one program: one segment, or segments that each store at the same positions
// of one shape (no cat), so the kernel is one multi-output elementwise kernel (vectorised), not a
// combo.
bool OneProgram(const std::vector<Segment>& segments) {
  if (segments.size() == 1) return true;
  for (const Segment& s : segments) {
    if (s.cat.parts > 0 || s.shape != segments[0].shape) return false;
  }
  return true;
}

// The tensors each segment reads and stores into, from the node's.
void SegmentTensors(const std::vector<Segment>& segments, absl::Span<const Tensor> in,
                    absl::Span<const Tensor> out, std::vector<std::vector<Tensor>>& ins,
                    std::vector<std::vector<Tensor>>& outs) {
  ins.resize(segments.size());
  outs.resize(segments.size());
  for (size_t k = 0; k < segments.size(); ++k) {
    std::vector<Tensor> mine;
    for (int o : segments[k].outputs) mine.push_back(out[o]);
    outs[k] = StoreTargets(segments[k].cat, mine);
    ins[k].clear();
    for (int i : segments[k].inputs) ins[k].push_back(in[i]);
  }
}

class CudaCombo final : public FusedKernel {
 public:
  CudaCombo(const std::string& name, std::vector<Segment> segments)
      : segments_(std::move(segments)), kernel_(cuda_ops::CompileComboKernel(name, Programs())) {
    base_ = name;
  }
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    std::vector<std::vector<Tensor>> ins, outs;
    SegmentTensors(segments_, in, out, ins, outs);
    cuda_ops::LaunchCombo(kernel_, ins, outs);
  }
  std::vector<cuda::KernelFootprint> Footprints() const override {
    return {ValueOrThrow(cuda::FootprintOf(kernel_.kernel, base_ + "_combo"))};
  }

 private:
  std::vector<kir::Program> Programs() const {
    std::vector<kir::Program> p;
    for (const Segment& s : segments_) p.push_back(s.program);
    return p;
  }
  std::vector<Segment> segments_;
  cuda_ops::ComboKernel kernel_;
  std::string base_;
};

class CpuCombo final : public FusedKernel {
 public:
  explicit CpuCombo(std::vector<Segment> segments) : segments_(std::move(segments)) {}
  void Run(absl::Span<const Tensor> in, absl::Span<const Tensor> out) const override {
    std::vector<std::vector<Tensor>> ins, outs;
    SegmentTensors(segments_, in, out, ins, outs);
    for (size_t k = 0; k < segments_.size(); ++k) {
      if (outs[k][0].numel() > 0) EvaluateProgramOnCpu(segments_[k].program, ins[k], outs[k]);
    }
  }

 private:
  std::vector<Segment> segments_;
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

// One segment's rule: a trailing cat as refused above, every other output of the iteration shape.
absl::Status VerifySegment(const ir::Graph& body) {
  if (std::string why = CatSinkRefusal(body); !why.empty()) {
    return absl::InternalError(absl::StrCat("pointwise body: ", why));
  }
  const Shape& shape = IterationShape(body);
  for (ir::ValueId v : body.outputs()) {
    if (v == body.outputs()[0] && CatSinkOf(body).parts > 0) continue;
    if (body.type(v).shape != shape) {
      return absl::InternalError(
          absl::StrCat("pointwise body returns %", v, " of shape ", ShapeString(body.type(v).shape),
                       " beside ", ShapeString(shape), ": every output has the iteration shape"));
    }
  }
  return absl::OkStatus();
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
    size_t operands = 0;
    for (const passes::BodySegment& seg : passes::BodySegments(body)) {
      KILN_RETURN_IF_ERROR(VerifySegment(SegmentBody(body, seg)));
      operands += passes::SegmentOperands(body, seg);
    }
    if (operands > static_cast<size_t>(cuda_ops::kMaxKernelOperands)) {
      return absl::InternalError(absl::StrCat("pointwise body has ", operands,
                                              " inputs and stores over its segments, more than "
                                              "the kernel's ",
                                              cuda_ops::kMaxKernelOperands, " operands"));
    }
    return absl::OkStatus();
  }
  std::unique_ptr<passes::Pass> MakePass() const override {
    return std::make_unique<passes::ElementwiseFusion>(*this);
  }
  std::unique_ptr<FusedKernel> Lower(const ir::Graph&, const ir::Node& n) const override {
    std::vector<Segment> segments = SegmentsOf(*n.body);
    if (!OneProgram(segments)) {
      if constexpr (kWithCuda) {
        if (n.type.device.is_cuda())
          return std::make_unique<CudaCombo>(n.name, std::move(segments));
      }
      return std::make_unique<CpuCombo>(std::move(segments));
    }
    kir::Program p = LowerFusionBody(*n.body);
    const CatSink cat = CatSinkOf(*n.body);
    if constexpr (kWithCuda) {
      if (n.type.device.is_cuda()) return std::make_unique<CudaPointwise>(n.name, p, cat);
    }
    return std::make_unique<CpuPointwise>(std::move(p), cat);
  }
  std::string KernelIr(const ir::Node& n) const override {
    const std::vector<Segment> segments = SegmentsOf(*n.body);
    if (OneProgram(segments)) return LowerFusionBody(*n.body).ToString();
    std::string text;
    for (size_t k = 0; k < segments.size(); ++k) {
      absl::StrAppend(&text, "segment ", k, " (node outputs ",
                      absl::StrJoin(segments[k].outputs, ", "), "):\n",
                      segments[k].program.ToString());
    }
    return text;
  }
  std::string Source(const ir::Node& n) const override {
    const std::vector<Segment> segments = SegmentsOf(*n.body);
    if (OneProgram(segments))
      return cuda_ops::RenderElementwiseSource(n.name, LowerFusionBody(*n.body));
    std::vector<kir::Program> programs;
    for (const Segment& s : segments) programs.push_back(s.program);
    return cuda_ops::RenderComboSource(n.name, programs);
  }
  std::string LaunchNote(const ir::Node&) const override {
    return "launch: 256 threads per block, grid from the SM count (grid-stride loops); _contig "
           "when every operand is contiguous and aligned (_small, one block, when that work fits "
           "256 threads), _rows for [rows, cols] operands, else _strided; a trailing cat's "
           "operands are stored into its slices (strided outputs); several segments: one _combo "
           "kernel walking them one after another (strided, 32-bit indices)";
  }
};

}  // namespace

const FusionTemplate& PointwiseTemplate() {
  static const Pointwise kTemplate;
  return kTemplate;
}

}  // namespace kiln::codegen
