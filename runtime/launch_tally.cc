// Launches counted by stream capture (see CountCapturedLaunches in cuda.h).
#include <string>
#include <vector>

#include "runtime/cuda_api.h"
#include "runtime/status.h"

namespace kiln::cuda {
namespace {

void CountNodes(cudaGraph_t graph, LaunchTally* c) {
  size_t n = 0;
  KILN_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  KILN_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    KILN_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeKernel) ++c->kernels;
    if (type == cudaGraphNodeTypeMemset) ++c->memsets;
    if (type == cudaGraphNodeTypeGraph) {
      cudaGraph_t child = nullptr;
      KILN_CUDA_CHECK(cudaGraphChildGraphNodeGetGraph(node, &child));
      CountNodes(child, c);
    }
  }
}

// The stream used only for these captures. Never destroyed and never given real work: anything
// a library caches per stream during a capture can then never be used for real.
StreamHandle CaptureStream() {
  static auto* stream = new cuda::Stream();
  return stream->get();
}

LaunchTally Measure(const std::function<void()>& call) {
  call();  // plans the GEMM, makes per-shape choices, allocates the workspace outside the capture
  cuda::Synchronize();
  const StreamHandle stream = CaptureStream();
  cuda::StreamGuard guard(stream);
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  std::string error;
  try {
    call();  // its output is freed inside the capture too
  } catch (const Error& e) {
    error = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  cudaGetLastError();  // a failed capture leaves its error behind
  LaunchTally c;
  if (error.empty() && end == cudaSuccess && graph != nullptr) {
    CountNodes(graph, &c);
  } else {
    c.error = error.empty() ? cudaGetErrorString(end) : error;
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  return c;
}

}  // namespace

LaunchTally CountCapturedLaunches(const std::function<void()>& call) {
  try {
    return Measure(call);
  } catch (const Error& e) {
    cudaGetLastError();
    return LaunchTally{0, 0, e.what()};
  }
}

}  // namespace kiln::cuda
