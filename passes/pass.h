// The pass interface and the pipeline (XLA's HloPassInterface / HloPassPipeline).
//
// A pass transforms a Graph in place and says whether it changed anything. The pipeline runs
// the verifier after every pass, can dump the graph after each one, and collects the fusion
// explain log. Passes hold no global mutable state.
//
//   PassContext ctx;
//   Pipeline p;
//   p.Add(std::make_unique<DeadCodeElimination>());
//   KILN_RETURN_IF_ERROR(p.Run(graph, ctx));
#pragma once

#include <algorithm>
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
  // Kernel families switched off by name ("attention", "softmax", ...): their passes change
  // nothing (CompileOptions::disabled_families).
  std::vector<std::string> disabled_families;
  bool multi_output = true;       // a group stores a member used outside it (else: materialised)
  bool horizontal_fusion = true;  // small independent pointwise kernels: one combo kernel
  bool gated_gemv = true;         // a GLU MLP's gated product joins its norm-linear node
  bool kv_rope = true;            // RoPE of a decode step's q and k joins its KV-append attention
  bool cuda_cat_sinking = true;   // cat sinking (cat_sinking.h) of CUDA values too
  bool merge_gemms = true;        // linears sharing an input: one GEMM
  bool fold_constants = true;     // evaluate ops over constants (weights) at compile time
  // One line per fusion decision; Pipeline::Run prefixes each with the pass that wrote it and the
  // graph its %N number, the one the pass was given ("[fusion; %N as in 07_dce] ...", StageName).
  std::vector<std::string> explain;
  // Called with (pass name, graph, whether the pass changed it) after each pass, e.g. for dumps.
  std::function<void(const std::string&, const ir::Graph&, bool)> after_pass;
  // The kernel families' rules for fusion bodies, checked by the verifier after every pass
  // (codegen/fusion_template.h provides them).
  ir::FusionBodyCheck check_fusion_body;

  bool Enabled(const std::string& family) const {
    return std::find(disabled_families.begin(), disabled_families.end(), family) ==
           disabled_families.end();
  }
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual const char* name() const = 0;
  virtual absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) = 0;
};

// The name of the graph after stage `index` of a compile (0: "traced", then one per pass in
// order): "07_dce". Dumps write that graph to <name>.txt; explain lines refer to it.
std::string StageName(int index, const std::string& stage);

class Pipeline {
 public:
  void Add(std::unique_ptr<Pass> pass) { passes_.push_back(std::move(pass)); }
  // Runs every pass once in order, verifying after each.
  absl::Status Run(ir::Graph& graph, PassContext& ctx) const;

 private:
  std::vector<std::unique_ptr<Pass>> passes_;
};

}  // namespace kiln::passes
