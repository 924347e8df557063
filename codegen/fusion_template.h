// Kernel families: one object per family, registered in one table that the pass pipeline, the
// verifier and the executable consult. A family lives in one folder, codegen/families/<name>/:
//   <name>_fusion.{h,cc}  its match/grow pass (passes layer: asks the family, never the backend),
//   *_cuda.{h,cc}         its NVRTC skeleton and launcher (backend layer: eager ops use it too),
//   <name>_template.cc    this interface: the family's limits and refusals (passes::KernelFamily),
//                         how a node lowers to something that runs, how many launches that is,
//                         what the dumps show,
//   README.md             what it fuses and where to read more,
// plus one line in the table (fusion_template.cc). The pipeline runs the families' passes in
// table order (attention before softmax before pointwise: each takes what it can before the more
// general family); options switch a family off by its name (CompileOptions::disabled_families).
//
//   const FusionTemplate* t = TemplateFor(node);        // nullptr: a plain op
//   std::unique_ptr<FusedKernel> k = t->Lower(graph, node);
//   k->Run(inputs, outputs);
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "codegen/launch_count.h"
#include "ir/graph.h"
#include "passes/kernel_family.h"
#include "passes/pass.h"
#include "runtime/nvrtc.h"

namespace kiln::codegen {

// One lowered node, ready to run on its device.
class FusedKernel {
 public:
  virtual ~FusedKernel() = default;
  // Computes the node's outputs (allocated by the caller with the node's output types: the
  // fusion body's outputs, or the op's type) from its inputs. Enqueued on the current stream.
  // An output whose body op updates an operand (index_copy of a body input) already holds the
  // operand's value: it is the operand itself (the plan's in-place write, codegen/executable.h)
  // or the plan's copy of it.
  virtual void Run(absl::Span<const Tensor> inputs, absl::Span<const Tensor> outputs) const = 0;
  // Kernels and memsets one Run launches on inputs laid out like `inputs` (placeholders of the
  // plan's layouts: contents undefined), for the plan's kernels per step. The one place a family
  // says it: a generated kernel is one launch; a library call is counted by capturing it once
  // (CountLaunchesOnce).
  virtual LaunchCount Launches(absl::Span<const Tensor> inputs) const { return {1, 0, ""}; }
  // The compiled kernels' resources (registers, shared and local memory), for dumps and tests;
  // empty when nothing was compiled (the CPU, a library call).
  virtual std::vector<cuda::KernelFootprint> Footprints() const { return {}; }
  // A line for the explain log about a decision the lowering made ("" when none).
  virtual std::string explain() const { return ""; }
  // Whether Run launches only through registry ops (ops/dispatch.h) and linear's kernels: then the
  // plan's GEMV chain region may span the node (ops/cuda/gemv_chain.h), whose rule those keep.
  virtual bool LaunchesThroughOps() const { return false; }
};

class FusionTemplate : public passes::KernelFamily {
 public:
  // The pass that finds this family's groups, built with this family.
  virtual std::unique_ptr<passes::Pass> MakePass() const = 0;
  // Lowers `node` of `graph`; throws kiln::Error (an NVRTC log, an unsupported layout).
  virtual std::unique_ptr<FusedKernel> Lower(const ir::Graph& graph,
                                             const ir::Node& node) const = 0;
  // For dumps of fusion nodes: the kernel IR, the CUDA source and how it launches. Called only
  // when a dump or KILN_DEBUG asks for them.
  virtual std::string KernelIr(const ir::Node& node) const { return ""; }
  virtual std::string Source(const ir::Node& node) const { return ""; }
  virtual std::string LaunchNote(const ir::Node& node) const { return ""; }
};

// Every family, in pass order.
const std::vector<const FusionTemplate*>& FusionTemplates();
// The family owning `node` (nullptr: a plain op, view, input or constant).
const FusionTemplate* TemplateFor(const ir::Node& node);
// The family called `name` (nullptr: none), and every family's name, for option checks.
const FusionTemplate* TemplateNamed(const std::string& name);
std::string FamilyNames();
// The verifier's rule for fusion bodies: some family accepts the body (PassContext's
// check_fusion_body).
absl::Status CheckFusionBody(const ir::Graph& body);
// The pipeline: simplification (folding, CSE, canonicalisation, DCE, GEMM merge), then each
// family's pass in table order, then DCE.
passes::Pipeline CompilePipeline();

// The families (one folder each, codegen/families/<name>/).
const FusionTemplate& AttentionTemplate();
const FusionTemplate& GemmTemplate();
const FusionTemplate& GemmEpilogueTemplate();
const FusionTemplate& NormLinearTemplate();
const FusionTemplate& SoftmaxTemplate();
const FusionTemplate& PointwiseTemplate();

}  // namespace kiln::codegen
