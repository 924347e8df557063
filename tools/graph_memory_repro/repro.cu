// A minimal program for the question issue #13 asks: does compute-sanitizer's memcheck report
// correct CUDA-graph code as out of bounds when two allocation nodes of one graph share a
// virtual address? No kiln code is involved: plain CUDA runtime calls and two tiny kernels.
//
// The graph (captured from one stream) is kiln's pattern for intermediates:
//   A = cudaMallocAsync(16 KiB); fill(A); sum(A) -> out[0]; cudaFreeAsync(A)
//   B = cudaMallocAsync( 4 KiB); fill(B); sum(B) -> out[1]; cudaFreeAsync(B)
// Graph memory reuses A's freed address for B. Every access stays inside its own allocation,
// and the sums are checked, so any memcheck report on the graph run is about the tool, not the
// program. The same kernels run once without a graph (stream-ordered allocations) as the
// control, and `--plant` adds one real out-of-bounds read (element n of B) to show that memcheck
// does see real errors inside a graph. `--keep-b` is kiln's pattern for a compiled function's
// outputs: B is allocated by the graph but not freed in it (the caller owns it after the replay
// and frees it, stream-ordered, before the next replay).
//
//   nvcc -O2 -arch=sm_90 -o repro repro.cu
//   compute-sanitizer --tool memcheck ./repro            # graph + control
//   compute-sanitizer --tool memcheck ./repro --plant    # control for the tool itself
//   compute-sanitizer --tool memcheck ./repro --keep-b   # B outlives the graph
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

__global__ void Fill(float* a, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) a[i] = 1;
}

// Sums a[0 .. n + extra): extra = 1 plants one read past the end.
__global__ void Sum(const float* a, int n, int extra, float* out) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n + extra; i += gridDim.x * blockDim.x)
    atomicAdd(out, i < n ? a[i] : 0.f * a[i]);
}

constexpr int kBig = 4096, kSmall = 1024;  // 16 KiB and 4 KiB of floats

// The two allocate / fill / sum / free blocks on `s`; returns the two device addresses used.
void Enqueue(cudaStream_t s, float* out, int extra, bool keep_b, void** addr_a, void** addr_b) {
  float* a = nullptr;
  float* b = nullptr;
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&a), kBig * sizeof(float), s));
  Fill<<<8, 128, 0, s>>>(a, kBig);
  Sum<<<8, 128, 0, s>>>(a, kBig, 0, out);
  CHECK(cudaFreeAsync(a, s));
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&b), kSmall * sizeof(float), s));
  Fill<<<8, 128, 0, s>>>(b, kSmall);
  Sum<<<8, 128, 0, s>>>(b, kSmall, extra, out + 1);
  if (!keep_b) CHECK(cudaFreeAsync(b, s));
  *addr_a = a;
  *addr_b = b;
}

bool CheckSums(const char* what, float* out, int runs) {
  float host[2];
  CHECK(cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost));
  const bool ok = host[0] == float(kBig) * runs && host[1] == float(kSmall) * runs;
  std::printf("%s: sums %.0f %.0f (want %d %d) %s\n", what, host[0], host[1], kBig * runs,
              kSmall * runs, ok ? "OK" : "WRONG");
  return ok;
}

int main(int argc, char** argv) {
  const bool plant = argc > 1 && std::strcmp(argv[1], "--plant") == 0;
  const bool keep_b = argc > 1 && std::strcmp(argv[1], "--keep-b") == 0;
  const int extra = plant ? 1 : 0;
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* out = nullptr;
  CHECK(cudaMalloc(&out, 2 * sizeof(float)));
  bool ok = true;

  // Control: the same work stream-ordered, no graph.
  CHECK(cudaMemset(out, 0, 2 * sizeof(float)));
  void *ea, *eb;
  Enqueue(s, out, extra, keep_b, &ea, &eb);
  if (keep_b) CHECK(cudaFreeAsync(eb, s));
  CHECK(cudaStreamSynchronize(s));
  ok &= CheckSums("stream-ordered (no graph)", out, 1);

  // The graph: captured once, replayed three times.
  CHECK(cudaMemset(out, 0, 2 * sizeof(float)));
  cudaGraph_t graph;
  void *ga, *gb;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  Enqueue(s, out, extra, keep_b, &ga, &gb);
  CHECK(cudaStreamEndCapture(s, &graph));
  size_t n = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeMemAlloc) continue;
    cudaMemAllocNodeParams p;
    CHECK(cudaGraphMemAllocNodeGetParams(node, &p));
    std::printf("graph allocation node: %p, %zu bytes\n", p.dptr, p.bytesize);
  }
  std::printf("A at %p, B at %p: %s\n", ga, gb, ga == gb ? "the same address" : "different");
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < 3; ++r) {
    CHECK(cudaGraphLaunch(exec, s));
    if (keep_b) CHECK(cudaFreeAsync(gb, s));  // the caller frees B before the next replay
  }
  CHECK(cudaStreamSynchronize(s));
  ok &= CheckSums("CUDA graph, 3 replays", out, 3);
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaFree(out));
  std::printf("%s\n", ok ? "all sums right" : "a sum is wrong");
  return ok ? 0 : 1;
}
