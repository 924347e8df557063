// A decode step's one-row GEMVs, deferred and launched together as one chain kernel
// (gemv_kernels.h GemvChain). Between two attention kernels a transformer's decode step runs
// four GEMVs in a row (output projection, the MLP's two linears, the next layer's qkv): each a
// launch whose ramp-up and first HBM round trip cost more than its bytes. A compiled plan opens a
// chain region over runs of steps that launch only through registry ops (codegen/executable.cc);
// inside it, linear's GEMV (matmul_cuda.cc RunGemv) hands its arguments to DeferGemv instead of
// launching, and the pending GEMVs launch as one kernel at the region's end or at the first launch
// of anything else.
//
// The rule that keeps it correct: every launch on this thread while GEMVs are pending is preceded
// by FlushDeferredGemvs(), so the device sees the launches in program order. The flush points:
// every registry op's kernel but linear's (ops/dispatch.cc RunKernel), linear's own non-GEMV paths
// (cuBLASLt, kiln's GEMM, the k == 0 fill: matmul_cuda.cc), every device timing
// (device_timing.cc: GemvChainPause), a GEMV the chain does not take, and the region's end. A step
// that launches in any other way is outside the regions (the executable flushes before it).
// Copies through the runtime (kiln::to, to_vector: runtime CopyBytes) are no flush points: a
// plan's steps never make them (a compiled graph runs on one device and reads no value on the
// host), and code that opens a region itself must flush before one.
// A pending GEMV keeps its operands' tensors alive until it is launched: a temporary released
// before the launch (a residual made contiguous, the plan's last use of a value) would otherwise
// go back to the caching allocator while still to be read.
//
//   const bool opened = cuda_ops::BeginGemvChain();
//   ... linear, linear, norm-linear ...          // deferred
//   cuda_ops::EndGemvChain(opened);              // one launch (one GEMV: a plain launch)
//
// Thread-local: each thread has its own region and pending list. Off by default: in GPT-2's
// batch-1 decode step (H100, compiled + CUDA graph) the chains brought 71 kernels a step to 36 and
// the tokens/s to 0.64x (a layer's four GEMVs 27.5 us as one chain kernel, ~16.6 as four
// launches: the grid barriers and L2 round trips cost more than the launches they save).
// KILN_GEMV_CHAIN=on or SetGemvChainEnabled(true) turns it on.
#pragma once

#include <vector>

#include "runtime/cuda.h"
#include "runtime/tensor.h"

namespace kiln::cuda_kernels {
struct GemvArgs;
}

namespace kiln::cuda_ops {

// Whether chains are on: SetGemvChainEnabled's value once called, else KILN_GEMV_CHAIN (read
// once). Process-wide; a region already open stays open.
bool GemvChainEnabled();
void SetGemvChainEnabled(bool on);

// Opens this thread's chain region, or one level more inside an open one (a plan run inside a
// region its caller opened); false, and nothing opened, when chains are off. Pass the result to
// the End or Abandon that closes it.
bool BeginGemvChain();
// Launches what is pending and closes the level Begin opened (`opened`: Begin's result). Throws
// kiln::Error when the launch fails.
void EndGemvChain(bool opened);
// The same while unwinding from an exception: what is pending still launches (it may write
// tensors the caller holds), and an error doing so drops it instead of throwing.
void AbandonGemvChain(bool opened) noexcept;

namespace internal {
// This thread's chain state as two flags (gemv_chain.cc keeps them in step with it), read inline:
// the eager dispatcher and linear's GEMV pay one thread-local load when no region is open.
inline thread_local bool t_deferring = false;  // a region is open and not paused
inline thread_local bool t_pending = false;    // GEMVs wait to be launched
void LaunchPendingGemvs();
}  // namespace internal

// Launches this thread's pending GEMVs (one chain kernel; nothing when none is pending), inside
// a profiler op range "gemv_chain" while a profiler records.
inline void FlushDeferredGemvs() {
  if (internal::t_pending) internal::LaunchPendingGemvs();
}

// Whether DeferGemv may take a GEMV now (a region is open and not paused): checked before the
// caller gathers the operands.
inline bool DeferringGemvs() { return internal::t_deferring; }

// Takes `op` into the pending chain when a region is open, not paused, and the chain takes it
// (gemv_kernels.h GemvChainTakes) on `stream`: true, and the caller launches nothing. Otherwise
// flushes what is pending and returns false: the caller launches `op` itself.
// `operands`: the tensors op's pointers point into, held until the launch.
bool DeferGemv(const cuda_kernels::GemvArgs& op, cuda::StreamHandle stream,
               std::vector<Tensor> operands);

// Launches this thread's chains have saved so far (a chain of n GEMVs saves n - 1), for the plan's
// kernel count.
int GemvChainLaunchesSaved();

// While alive, this thread defers nothing (a device timing runs every path for real); flushes
// first.
class GemvChainPause {
 public:
  GemvChainPause();
  ~GemvChainPause();
  GemvChainPause(const GemvChainPause&) = delete;
  GemvChainPause& operator=(const GemvChainPause&) = delete;
};

// While alive, this thread's regions start afresh: a region the caller holds open defers nothing,
// and only regions opened meanwhile do (a CUDA graph capture: the plan run inside it opens its own
// region and closes it, launching what it holds into the graph, before the capture ends; a GEMV
// deferred into the caller's region would launch after it, outside the graph). Flushes first;
// the caller's regions are open again afterwards.
class GemvChainIsolate {
 public:
  GemvChainIsolate();
  ~GemvChainIsolate();
  GemvChainIsolate(const GemvChainIsolate&) = delete;
  GemvChainIsolate& operator=(const GemvChainIsolate&) = delete;

 private:
  int saved_open_ = 0, saved_paused_ = 0;
};

}  // namespace kiln::cuda_ops
