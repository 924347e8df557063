// Fusion templates: one object per kernel family, registered in one table that the pass
// pipeline, the verifier and the executable consult. A family knows
//   - which graph nodes are its own (a fusion node whose body has its shape, or an op node such as
//     a linear with an activation epilogue),
//   - the rule its fusion bodies obey (checked by the verifier after every pass),
//   - the pass that finds and grows its groups (match/grow, in passes/),
//   - how to lower one of its nodes to something that runs: kernels compiled with NVRTC (through
//     the kernel IR) or a library call, or the CPU evaluation of the same program,
//   - what the dumps show of it (kernel IR, CUDA source, launch configuration).
// The pipeline runs the families' passes in table order (attention before softmax before
// pointwise: each takes what it can before the more general family). Adding a family is one
// file with its template, one line in the table, and its tests.
//
//   const FusionTemplate* t = TemplateFor(node);        // nullptr: a plain op
//   std::unique_ptr<FusedKernel> k = t->Lower(graph, node);
//   k->Run(inputs, outputs);
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ir/graph.h"
#include "passes/pass.h"

namespace kiln::codegen {

// One lowered node, ready to run on its device.
class FusedKernel {
 public:
  virtual ~FusedKernel() = default;
  // Computes the node's outputs (allocated by the caller with the node's output types: the
  // fusion body's outputs, or the op's type) from its inputs. Enqueued on the current stream.
  virtual void Run(absl::Span<const Tensor> inputs, absl::Span<const Tensor> outputs) const = 0;
  // Kernels one Run launches (what the plan's kernels-per-step counts).
  virtual int kernel_launches() const { return 1; }
  // A line for the explain log about a decision the lowering made ("" when none).
  virtual std::string explain() const { return ""; }
};

class FusionTemplate {
 public:
  virtual ~FusionTemplate() = default;
  virtual const char* name() const = 0;
  // Whether `node` belongs to this family.
  virtual bool Owns(const ir::Node& node) const = 0;
  // Whether a fusion body has this family's shape (the verifier's dispatch), and its full rule.
  virtual bool OwnsBody(const ir::Graph& body) const { return false; }
  virtual absl::Status VerifyBody(const ir::Graph& body) const { return absl::OkStatus(); }
  // The pass that finds this family's groups.
  virtual std::unique_ptr<passes::Pass> MakePass() const = 0;
  // Lowers `node` of `graph`; throws kiln::Error (an NVRTC log, an unsupported layout).
  virtual std::unique_ptr<FusedKernel> Lower(const ir::Graph& graph,
                                             const ir::Node& node) const = 0;
  // For dumps of fusion nodes: the kernel IR, the CUDA source and how it launches.
  virtual std::string KernelIr(const ir::Node& node) const { return ""; }
  virtual std::string Source(const ir::Node& node) const { return ""; }
  virtual std::string LaunchNote(const ir::Node& node) const { return ""; }
};

// Every family, in pass order.
const std::vector<const FusionTemplate*>& FusionTemplates();
// The family owning `node` (nullptr: a plain op, view, input or constant).
const FusionTemplate* TemplateFor(const ir::Node& node);
// The verifier's rule for fusion bodies: some family accepts the body (PassContext's
// check_fusion_body).
absl::Status CheckFusionBody(const ir::Graph& body);
// The pipeline: simplification (folding, CSE, canonicalisation, DCE, GEMM merge), then each
// family's pass in table order, then DCE.
passes::Pipeline CompilePipeline();

// The families (one file each).
const FusionTemplate& AttentionTemplate();
const FusionTemplate& GemmEpilogueTemplate();
const FusionTemplate& SoftmaxTemplate();
const FusionTemplate& PointwiseTemplate();

}  // namespace kiln::codegen
