// The pass interface and the pipeline (XLA's HloPassInterface / HloPassPipeline).
//
// A pass transforms a Graph in place and says whether it changed anything. The pipeline runs
// the verifier after every pass, can dump the graph after each one, and collects the fusion
// explain log. Passes hold no global mutable state.
//
//   Pipeline p;
//   p.Add(std::make_unique<DeadCodeElimination>());
//   KILN_RETURN_IF_ERROR(p.Run(graph, &context));
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "ir/verifier.h"

namespace kiln::passes {

// What passes share with their caller: options, the explain log, dump hooks.
struct PassContext {
  bool fuse_elementwise = true;
  bool fuse_softmax = true;
  bool fuse_attention = true;  // naive attention -> one scaled_dot_product_attention
  bool multi_output = true;    // a group stores a member used outside it (else: materialised)  //
                               // scale/mask prologues and a cast into the softmax kernel
  bool merge_gemms = true;
  bool fold_constants = true;        // evaluate ops over constants (weights) at compile time
  bool fuse_gemm_epilogues = true;   // linear + relu / tanh GELU -> linear{epilogue}
  std::vector<std::string> explain;  // one line per fusion decision
  // Called with (pass name, graph) after each pass, e.g. to write dumps.
  std::function<void(const std::string&, const ir::Graph&)> after_pass;
  // The kernel families' rules for fusion bodies, checked by the verifier after every pass
  // (codegen/fusion_template.h provides them).
  ir::FusionBodyCheck check_fusion_body;
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual const char* name() const = 0;
  virtual absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) = 0;
};

class Pipeline {
 public:
  void Add(std::unique_ptr<Pass> pass) { passes_.push_back(std::move(pass)); }
  // Runs every pass once in order, verifying after each.
  absl::Status Run(ir::Graph& graph, PassContext& ctx) const;

 private:
  std::vector<std::unique_ptr<Pass>> passes_;
};

// The default compile pipeline: constant folding, CSE, canonicalisation, DCE, GEMM merge, GEMM
// epilogue fusion, DCE, softmax fusion, elementwise fusion, DCE.
Pipeline DefaultPipeline();

}  // namespace kiln::passes
