// CUDA graph replay of an executable plan (CompileOptions::cuda_graphs).
//
// Capture runs the plan once on a private stream under stream capture, so every step (cuBLASLt
// GEMMs, fused NVRTC kernels, eager kernels) becomes one node of a CUDA graph; a call then costs
// one cudaGraphLaunch instead of one dispatch per step.
//
//  - Inputs, two bindings. By address: the graph reads the caller's tensors where they are, so
//    it is valid for those addresses and strides only; CudaGraphCache keeps one such graph per
//    address set (inputs reused across calls, rotating sets, the caching allocator handing the
//    same blocks back). Copy-in: the graph reads static buffers filled by memcpy nodes at its
//    head, which each call points at the caller's tensors (cudaGraphExecMemcpyNodeSetParams1D,
//    no re-capture) — one graph for any address, at the price of copying the inputs; the cache
//    switches to it when inputs keep arriving at new addresses.
//  - Intermediates and outputs: from an arena the plan owns (runtime/capture_arena.h), sized from
//    the plan's memory plan and captured again at the size the capture needed when it did not
//    fit; liveness reuse carries over (a freed range goes to the next allocation). With no graph
//    memory nodes between them, kernels launched as programmatic dependents form programmatic
//    edges (KILN_PDL_GRAPHS). Plans needing more than KILN_CAPTURE_ARENA_MB (or with it 0) keep
//    graph memory nodes: cudaMallocAsync/cudaFreeAsync in the capture, the graph's own pool.
//  - Outputs are handed to the caller as new storages each replay (arena outputs keep the arena
//    alive; graph allocations are freed with cudaFreeAsync when dropped, as CUDA requires before
//    the next launch). If the caller still holds the previous call's outputs, that call runs the
//    plan without the graph instead (reported in fallbacks()), so a result is never overwritten.
//
// Inputs the function writes in place are written by the plan's last steps, inside the graph
// (by address: the caller's tensors themselves; copy-in: the graph's copies, copied back after
// each replay).
//
// Capture refuses (with the reason) graphs whose outputs alias an input or a constant. A plan
// with symbolic dims gets one graph per concrete shape (shapes are part of the key), captured
// the second time a shape comes.
//
// Not thread-safe: CompiledFn serialises calls that replay graphs.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codegen/executable.h"
#include "runtime/capture_arena.h"
#include "runtime/cuda.h"

struct CUgraph_st;      // cudaGraph_t
struct CUgraphExec_st;  // cudaGraphExec_t
struct CUgraphNode_st;  // cudaGraphNode_t

namespace kiln::codegen {

class CudaGraphPlan {
 public:
  enum class Binding { kByAddress, kCopyIn };
  // Captures `exe` for inputs like `inputs` (the plan must have run once, so every kernel is
  // compiled and every GEMM planned). kByAddress graphs may only be run on inputs with the same
  // data pointers and strides.
  static absl::StatusOr<std::unique_ptr<CudaGraphPlan>> Capture(const Executable& exe,
                                                                const std::vector<Tensor>& inputs,
                                                                Binding binding);
  ~CudaGraphPlan();
  CudaGraphPlan(const CudaGraphPlan&) = delete;
  CudaGraphPlan& operator=(const CudaGraphPlan&) = delete;

  // One call: replays the graph on the current stream (or runs the plan, see above).
  std::vector<Tensor> Run(const std::vector<Tensor>& inputs);

  int64_t replays() const { return replays_; }
  int64_t fallbacks() const { return fallbacks_; }
  int nodes() const { return nodes_; }
  size_t arena_bytes() const;  // 0: the graph allocates with memory nodes
  // The arena the plan would have needed, when that was over KILN_CAPTURE_ARENA_MB (else 0).
  size_t arena_over_limit() const { return arena_over_limit_; }
  int memory_nodes() const { return memory_nodes_; }              // MEM_ALLOC and MEM_FREE
  int programmatic_edges() const { return programmatic_edges_; }  // kernel -> dependent kernel

 private:
  CudaGraphPlan(const Executable& exe, Binding binding) : exe_(exe), binding_(binding) {}
  absl::Status CaptureOnce(const std::vector<Tensor>& inputs, size_t arena_bytes);
  absl::Status FindInputCopies();
  absl::Status CountNodesAndEdges();
  std::vector<Tensor> AdoptOutputs();
  bool PreviousOutputsHeld() const;

  struct OutputTemplate {  // where a replay leaves output i
    void* data;
    size_t nbytes;
    Device device;
    int64_t offset;
    Shape shape;
    Strides strides;
    DType dtype;
    bool in_arena;  // else a graph allocation
  };

  const Executable& exe_;
  Binding binding_;
  cuda::Stream stream_;
  ::CUgraph_st* graph_ = nullptr;  // cudaGraph_t (this header needs no CUDA header)
  ::CUgraphExec_st* exec_ = nullptr;
  std::vector<Tensor> static_inputs_;
  Tensor index_flag_;            // raised by captured index kernels on a bad index
  bool checks_indices_ = false;  // the graph has such kernels: read the flag after each replay
  std::vector<::CUgraphNode_st*> input_copies_;  // memcpy node per input
  std::vector<const void*> bound_sources_;       // what each memcpy node reads now
  std::vector<OutputTemplate> outputs_;
  std::vector<std::weak_ptr<Storage>> handed_out_;  // the last replay's output storages
  std::shared_ptr<cuda::CaptureArena> arena_;
  size_t arena_over_limit_ = 0;
  cuda::Event replayed_;  // recorded after each replay: the arena outlives it
  int64_t replays_ = 0, fallbacks_ = 0;
  int nodes_ = 0, memory_nodes_ = 0, programmatic_edges_ = 0;
};

// The CUDA graphs of one compiled signature (see the top of this file): by-address graphs keyed
// by the inputs' data pointers and strides, least recently used evicted beyond kMaxByAddress;
// after kMaxCaptures by-address captures, one copy-in graph serves every call. A plan that
// cannot be captured runs without a graph, and Describe() says why.
class CudaGraphCache {
 public:
  static constexpr int kMaxByAddress = 4, kMaxCaptures = 16;
  explicit CudaGraphCache(const Executable& exe) : exe_(exe) {}
  std::vector<Tensor> Run(const std::vector<Tensor>& inputs);
  // "pending (...)", "on: ..." or "off: <why>".
  std::string Describe() const;
  // Counts the calls that captured a graph or turned graphs off: Describe() changes only with it
  // (the replay path compares this instead of formatting a description per call).
  int64_t changes() const { return changes_; }

 private:
  using Key = std::vector<int64_t>;
  static Key AddressKey(const std::vector<Tensor>& inputs);  // addresses, shapes, strides
  static bool IsAddressKeyOf(const Key& key, const std::vector<Tensor>& inputs);  // no allocation
  static Key ShapeKey(const std::vector<Tensor>& inputs);
  std::vector<Tensor> CaptureAfterRun(const std::vector<Tensor>& inputs, const Key& key);

  const Executable& exe_;
  std::vector<std::pair<Key, std::unique_ptr<CudaGraphPlan>>> by_address_;  // most recent first
  std::unique_ptr<CudaGraphPlan> copy_in_;
  Key copy_in_shapes_;       // the shapes the copy-in graph was captured for
  std::set<Key> seen_once_;  // symbolic plans: keys run once without a graph
  int captures_ = 0;
  int64_t changes_ = 0;
  std::string off_reason_;
};

}  // namespace kiln::codegen
