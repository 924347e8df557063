// The executable plan of a compiled graph: a flat list of steps (nodes a kernel family lowered —
// fused kernels, GEMMs with epilogues —, library ops through the eager kernels, views) replayed
// over the graph's values. Each intermediate is released right after its last use (liveness),
// so the caching allocator hands its block to the next step that needs one: peak memory follows
// the live set, not the sum of all values. Family nodes are lowered when the plan is built
// (CUDA kernels compiled with NVRTC in parallel threads and cached on disk; CPU graphs evaluate
// the same kernel IR).
//
// A plan built with symbolic dims (codegen/symbolic.h) reads every size from the call's inputs:
// ops infer their output types from the actual operands as in eager mode, fused kernels
// allocate outputs of the broadcast input shape, and the size attributes of views are evaluated
// from the call's symbol values.
//
// In place: a node whose kernel can update its first operand (OpDef::updates_self: index_copy,
// and as_strided_scatter, the traced form of a write through a view such as
// `copy_(slice(cache, 2, 0, t), k)`), and an elementwise node whose result has its first
// operand's type (the traced add_(x, ...) or copy_(x, src): a decode step's next token and
// position), runs in place on a graph input that the function writes anyway
// (Graph::input_updates) when no later step reads the input's old value; it is then not copied
// back. A decode step writing one row of a KV cache moves that row, and a prefill writing the
// prompt's rows moves those, not the cache. At run time the input must not share memory with
// another input, nor in part with another operand of the node, else the node runs out of place
// as traced. A fusion node whose body output updates one of its operands that way (the attention
// family's KV-cache append) is given the operand itself as that output, under the same rules
// (and no overlap at all with its other operands); else a fresh output that the plan fills with
// the operand's value before the kernel runs.
//
// On CUDA a Run defers the index checks of gather and index_copy kernels to one wait at its end
// (ops/cuda/index_cuda.h), before the inputs written in place are copied back.
//
// Run() is const and keeps no state between calls: one plan may run from several threads.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codegen/fusion_template.h"
#include "codegen/symbolic.h"
#include "ir/graph.h"
#include "runtime/cuda.h"

namespace kiln::codegen {

// A fusion output whose body op updates one of the node's operands (an updates_self op, index_copy,
// of a body input: a KV cache the attention family's node appends to; see "In place" above). The
// kernel gets the operand itself when the plan may write it (input >= 0, and no overlap at run
// time), else a fresh output that the plan first fills with the operand's value.
struct UpdatedOutput {
  int output = 0;   // the body output
  int operand = 0;  // the node's operand it updates
  int input = -1;   // that operand's graph input index when it may be written in place, else -1
};

struct Step {
  enum class Kind { kOp, kView, kFamily, kResult };
  ir::ValueId value;
  Kind kind = Kind::kOp;
  std::shared_ptr<const FusedKernel> kernel;  // kFamily
  std::vector<ir::ValueId> results;           // kFamily fusions: result node of output k + 1
  std::vector<ir::ValueId> last_uses;         // values dead after this step: released
  int in_place_input = -1;  // kOp on an input it may update in place (see the header): its index
  std::vector<UpdatedOutput> updated_outputs;  // kFamily fusions
};

// What one Run launches, for inputs of contiguous strides at the traced sizes: kernels of fused
// nodes and ops, a kernel per reshape whose input forces a copy, and what each cuBLASLt call adds
// on CUDA (split-K reductions and memsets, found by capturing it once: launch_count.h).
struct LaunchTally {
  int kernels = 0, memsets = 0;
};

class Executable {
 public:
  // `symbols` describes the graph's symbolic dims (none: a plan for the graph's exact types).
  static absl::StatusOr<std::unique_ptr<Executable>> Build(ir::Graph graph,
                                                           SymbolicShapes symbols = {});

  // Runs the plan on inputs matching the graph's input types (any strides; with symbolic dims,
  // any sizes of those dims); returns the function's outputs. Inputs the function writes in
  // place (Graph::input_updates) are written, as the plan's last steps.
  std::vector<Tensor> Run(const std::vector<Tensor>& inputs) const;

  const ir::Graph& graph() const { return graph_; }
  const SymbolicShapes& symbols() const { return symbols_; }
  bool on_cuda() const;  // every input and output is a CUDA tensor
  // Kernels and memsets one Run launches (LaunchTally; measured on first use, which on CUDA runs
  // each GEMM once under capture), less the launches the last Run's GEMV chains saved
  // (ops/cuda/gemv_chain.h: consecutive one-row GEMVs as one kernel; known once a Run happened).
  int kernels_per_step() const {
    return Tally().kernels - chain_launches_saved_.load(std::memory_order_relaxed);
  }
  int memsets_per_step() const { return Tally().memsets; }
  int fused_kernels() const;
  // The lowered kernel of node `v` (nullptr: no family owns it), for dumps and tests.
  const FusedKernel* kernel_of(ir::ValueId v) const;
  // Inputs written in place that are copied back after the plan (those a step updates in place
  // are not).
  int input_copy_backs() const;
  // Lowering the fused nodes to kernels (in parallel, NVRTC included).
  double lowering_ms() const { return lowering_ms_; }
  int num_steps() const { return static_cast<int>(steps_.size()); }
  // Decisions the lowerings made (GEMM-epilogue timings,
  // codegen/families/gemm_epilogue/epilogue_choice.h), one a line.
  const std::vector<std::string>& lowering_notes() const { return lowering_notes_; }
  // Peak bytes of intermediates alive at once under the liveness release (views and values
  // written into an input in place own nothing; inputs, constants and outputs are not counted),
  // and the sum of all intermediates (what a
  // plan that kept every value would hold), at the traced sizes.
  int64_t planned_peak_bytes() const { return planned_peak_bytes_; }
  int64_t total_intermediate_bytes() const { return total_intermediate_bytes_; }
  // Bytes of the outputs the plan allocates (inputs, and outputs written into an input in place,
  // take none), at the traced sizes.
  int64_t planned_output_bytes() const { return planned_output_bytes_; }

 private:
  Executable(ir::Graph graph, SymbolicShapes symbols)
      : graph_(std::move(graph)), symbols_(std::move(symbols)) {}
  absl::Status Prepare();
  absl::Status LowerFamilies();
  void PlanLiveness();
  void PlanInPlace(const std::vector<int>& last_read);
  void PlanOutputCopies();
  void PlanMemory();
  void RunFamily(const Step& s, absl::Span<const Tensor> args, const std::vector<Tensor>& inputs,
                 std::vector<Tensor>& env) const;
  int InPlaceInput(ir::ValueId self, int step, const std::vector<int>& last_read) const;
  bool WritesOverFirstOperand(const ir::Node& n) const;
  void RunSteps(const std::vector<Tensor>& inputs, std::vector<Tensor>& env) const;
  void WriteBackInputs(const std::vector<Tensor>& inputs, const std::vector<Tensor>& env) const;
  const LaunchTally& Tally() const;
  LaunchTally CountLaunches() const;

  ir::Graph graph_;
  SymbolicShapes symbols_;
  std::vector<Step> steps_;
  double lowering_ms_ = 0;
  std::vector<std::string> lowering_notes_;
  int64_t planned_peak_bytes_ = 0, total_intermediate_bytes_ = 0, planned_output_bytes_ = 0;
  std::vector<bool> pinned_;       // graph outputs and the values they are views of
  std::vector<bool> copy_output_;  // outputs that are (views of) constants: returned as copies
  mutable std::once_flag tally_once_;
  mutable LaunchTally tally_;
  mutable std::atomic<int> chain_launches_saved_{0};
  // The CUDA constants' storages: no kernel of a run writes them (cuda::ScopedPlanRun; an input
  // the function writes that overlaps a captured tensor runs eagerly, compile.cc
  // AliasingConflict, and an exported plan's constants are its own).
  std::vector<cuda::ByteRange> read_only_;
};

}  // namespace kiln::codegen
