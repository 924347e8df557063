// Launches of one library call, measured by stream capture (see launch_count.h).
#include "codegen/launch_count.h"

#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ops/dispatch.h"
#include "runtime/cuda.h"
#include "runtime/status.h"

namespace kiln::codegen {

std::string LaunchKey(OpId op, absl::Span<const Tensor> inputs, const OpAttrs& a) {
  std::string key = absl::StrCat(GetOpDef(op).name, "|", EpilogueName(a.epilogue), "|",
                                 a.transpose_a, a.transpose_b);
  for (const Tensor& t : inputs) {
    absl::StrAppend(&key, "|", Describe(t.type()), "/", absl::StrJoin(t.strides(), ","), "@",
                    reinterpret_cast<uintptr_t>(t.data_ptr()) % 256);
  }
  return key;
}

namespace {

void CountNodes(cudaGraph_t graph, LaunchCount* c) {
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
cudaStream_t CaptureStream() {
  static auto* stream = new cuda::Stream();
  return stream->get();
}

LaunchCount Measure(const std::function<void()>& call) {
  call();  // plans the GEMM, makes per-shape choices, allocates the workspace outside the capture
  cuda::Synchronize();
  const cudaStream_t stream = CaptureStream();
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
  LaunchCount c{0, 0, ""};
  if (error.empty() && end == cudaSuccess && graph != nullptr) {
    CountNodes(graph, &c);
  } else {
    c = LaunchCount{1, 0, error.empty() ? cudaGetErrorString(end) : error};
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  return c;
}

}  // namespace

LaunchCount CountLaunchesOnce(OpId op, absl::Span<const Tensor> inputs, const OpAttrs& attrs) {
  if (inputs.empty() || !inputs[0].device().is_cuda()) return {1, 0, "not on CUDA"};
  return CountCallLaunchesOnce(LaunchKey(op, inputs, attrs), [&] { Dispatch(op, inputs, attrs); });
}

LaunchCount CountCallLaunchesOnce(const std::string& key, const std::function<void()>& call) {
  if (cuda::Capturing()) return {1, 0, "the caller is capturing"};
  static std::mutex mu;  // guards `cache` (not held while measuring)
  static auto* cache = new std::map<std::string, LaunchCount>;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache->find(key); it != cache->end()) return it->second;
  }
  LaunchCount c;
  try {
    c = Measure(call);
  } catch (const Error& e) {
    cudaGetLastError();
    c = LaunchCount{1, 0, e.what()};
  }
  std::lock_guard<std::mutex> lock(mu);
  return cache->emplace(key, c).first->second;
}

}  // namespace kiln::codegen
