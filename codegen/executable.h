// The executable plan of a compiled graph: a flat list of steps (fused kernels, library ops
// through the eager kernels, views) replayed over the graph's values. Each intermediate is
// released right after its last use (liveness), so the caching allocator hands its block to the
// next step that needs one: peak memory follows the live set, not the sum of all values. Fused
// kernels (elementwise, or a softmax with its prologue) are compiled for the graph's device when
// the plan is built (NVRTC, in parallel threads; cached on disk), or evaluated on the CPU for CPU
// graphs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "ops/cuda/elementwise_cuda.h"
#include "ops/cuda/fused_softmax_cuda.h"

namespace kiln::codegen {

struct Step {
  ir::ValueId value;
  bool launches_kernel;                // views and constants do not (a reshape that copies does)
  cuda_ops::ElementwiseKernels cuda;   // fusion steps on CUDA
  std::vector<ir::ValueId> last_uses;  // values dead after this step: released to the allocator
  bool split_epilogue = false;  // linear + activation measured faster than the fused epilogue
  bool softmax_fusion = false;  // a fusion ending in a softmax (codegen/fused_softmax.h)
  cuda_ops::FusedSoftmaxKernels softmax;  // its kernels on CUDA
  // Launches a library call adds on CUDA (codegen/launch_count.h): cuBLASLt's split-K reduction
  // kernels and memsets, operand copies inside matmul. Found by capturing the call once.
  int extra_kernels = 0;
  int memsets = 0;
};

class Executable {
 public:
  static absl::StatusOr<std::unique_ptr<Executable>> Build(ir::Graph graph);

  // Runs the plan on inputs matching the graph's input types (any strides).
  std::vector<Tensor> Run(const std::vector<Tensor>& inputs) const;

  const ir::Graph& graph() const { return graph_; }
  bool on_cuda() const;  // every input and output is a CUDA tensor
  // Kernels one Run launches (for inputs with contiguous strides): one per fused kernel and op
  // step, one per reshape whose input's strides force a copy, two for a split epilogue, plus what
  // each cuBLASLt call launches besides its GEMM (measured on CUDA, see launch_count.h).
  int kernels_per_step() const;
  int memsets_per_step() const;  // memsets one Run issues (cuBLASLt split-K workspaces)
  int fused_kernels() const;
  double nvrtc_ms() const { return nvrtc_ms_; }
  // The measured GEMM-epilogue choices (codegen/epilogue_choice.h), one line each.
  const std::vector<std::string>& epilogue_choices() const { return epilogue_choices_; }
  // Peak bytes of intermediates alive at once under the liveness release (views own nothing;
  // inputs, constants and outputs are not counted), and the sum of all intermediates (what a
  // plan that kept every value would hold).
  int64_t planned_peak_bytes() const { return planned_peak_bytes_; }
  int64_t total_intermediate_bytes() const { return total_intermediate_bytes_; }

 private:
  explicit Executable(ir::Graph graph) : graph_(std::move(graph)) {}
  absl::Status Prepare();
  void CountLaunches();
  void PlanMemory();

  ir::Graph graph_;
  std::vector<Step> steps_;
  double nvrtc_ms_ = 0;
  std::vector<std::string> epilogue_choices_;
  int64_t planned_peak_bytes_ = 0, total_intermediate_bytes_ = 0;
  std::vector<bool> pinned_;  // graph outputs and the values they are views of
};

}  // namespace kiln::codegen
