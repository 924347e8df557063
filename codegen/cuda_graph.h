// CUDA graph replay of an executable plan (CompileOptions::cuda_graphs).
//
// Capture runs the plan once on a private stream under stream capture, so every step (cuBLASLt
// GEMMs, fused NVRTC kernels, eager kernels) becomes one node of a CUDA graph; a call then costs
// one cudaGraphLaunch instead of one dispatch per step.
//
//  - Inputs: the graph reads static input buffers filled by memcpy nodes at its head. Each call
//    points those nodes at the caller's tensors (cudaGraphExecMemcpyNodeSetParams1D when a
//    pointer changed; no re-capture). Non-contiguous inputs are made contiguous first.
//  - Intermediates: cudaMallocAsync/cudaFreeAsync inside the capture become graph memory nodes,
//    so they live in the graph's own pool and liveness reuse carries over.
//  - Outputs: allocation nodes that the graph does not free; each replay hands them to the
//    caller as new storages (freed with cudaFreeAsync when dropped, as CUDA requires before the
//    next launch). If the caller still holds the previous call's outputs, that call runs the
//    plan without the graph instead (reported in fallbacks()), so a result is never overwritten.
//
// Capture refuses (with the reason) graphs whose outputs alias an input or a constant.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codegen/executable.h"
#include "runtime/cuda.h"

namespace kiln::codegen {

class CudaGraphPlan {
 public:
  // Captures `exe` for inputs like `inputs` (the plan must have run once, so every kernel is
  // compiled and every GEMM planned).
  static absl::StatusOr<std::unique_ptr<CudaGraphPlan>> Capture(const Executable& exe,
                                                                const std::vector<Tensor>& inputs);
  ~CudaGraphPlan();
  CudaGraphPlan(const CudaGraphPlan&) = delete;
  CudaGraphPlan& operator=(const CudaGraphPlan&) = delete;

  // One call: replays the graph on the current stream (or runs the plan, see above).
  std::vector<Tensor> Run(const std::vector<Tensor>& inputs);

  int64_t replays() const { return replays_; }
  int64_t fallbacks() const { return fallbacks_; }
  int nodes() const { return nodes_; }

 private:
  explicit CudaGraphPlan(const Executable& exe) : exe_(exe) {}
  absl::Status CaptureOnce(const std::vector<Tensor>& inputs);
  absl::Status FindInputCopies();
  bool PreviousOutputsHeld() const;

  struct OutputTemplate {  // where a replay leaves output i
    void* data;
    size_t nbytes;
    Device device;
    int64_t offset;
    Shape shape;
    Strides strides;
    DType dtype;
  };

  const Executable& exe_;
  cuda::Stream stream_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::vector<Tensor> static_inputs_;
  std::vector<cudaGraphNode_t> input_copies_;  // memcpy node per input
  std::vector<const void*> bound_sources_;     // what each memcpy node reads now
  std::vector<OutputTemplate> outputs_;
  std::vector<std::weak_ptr<Storage>> handed_out_;  // the last replay's output storages
  int64_t replays_ = 0, fallbacks_ = 0;
  int nodes_ = 0;
};

}  // namespace kiln::codegen
