// CUDA runtime layer of kiln: device discovery, the per-thread current stream, stream/event
// wrappers, checked calls, the caching device allocator and host<->device copies.
//
// kiln links the CUDA runtime statically and never links the driver library directly, so the
// same binary runs (CPU only) on machines without a GPU: cuda::IsAvailable() is false there and
// every CUDA tensor operation throws a kiln::Error saying so.
//
//   if (kiln::cuda::IsAvailable()) {
//     cudaStream_t s = kiln::cuda::CurrentStream();
//     KILN_CUDA_CHECK(cudaMemsetAsync(p, 0, n, s));
//   }
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "runtime/device.h"
#include "runtime/storage.h"

namespace kiln::cuda {

bool IsAvailable();  // a usable CUDA device and driver are present
int DeviceCount();

struct DeviceProps {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int sm_count = 0;
  size_t total_memory = 0;
  size_t l2_bytes = 0;
  int max_shared_per_block_optin = 0;
};
const DeviceProps& Props(int device = 0);

// The stream kiln launches on for this thread (default: the legacy default stream 0, like
// torch). Set it with SetCurrentStream or a StreamGuard.
//
// Threads (torch's rules): any thread may issue ops; work several threads issue on one stream
// runs in issue order; the caching allocator, the cuBLASLt handle and plan cache and the NVRTC
// kernel cache are thread-safe; memory is freed on the stream it was allocated on, so it is not
// reused while work queued there may still read it. Handing a tensor to work on another stream
// without synchronising (an event, or cudaStreamSynchronize) is the caller's to order.
cudaStream_t CurrentStream();
void SetCurrentStream(cudaStream_t stream);
void Synchronize();  // the current device
// Whether `stream` is being captured into a CUDA graph. A query that fails (the legacy stream
// while another stream captures in global mode) counts as capturing, its error cleared: nothing
// may wait for the stream or time it then either.
bool Capturing(cudaStream_t stream = CurrentStream());
// Whether the work this thread issues now will be replayed from a CUDA graph: the current stream
// is capturing, or a ScopedGraphReplay is alive (the plain run that precedes a plan's capture, so
// that choices made there are made for the graph). Choices whose winner depends on launch overhead
// read it (ops/cuda/gemv_choice.h: a graph replays one fused kernel with less overhead than two).
bool ForGraphReplay();
class ScopedGraphReplay {
 public:
  ScopedGraphReplay();
  ~ScopedGraphReplay();
  ScopedGraphReplay(const ScopedGraphReplay&) = delete;
  ScopedGraphReplay& operator=(const ScopedGraphReplay&) = delete;

 private:
  bool previous_;
};

// Programmatic dependent launch (sm_90 and later): launches `kernel` (a __global__ function, or a
// cudaKernel_t cast to const void*) on `stream` so that it may begin while the kernel before it
// finishes: its blocks become resident and wait on the device, and the launch latency and ramp-up
// overlap the predecessor's tail. The rule that keeps it correct: such a kernel executes
// griddepcontrol.wait (kiln_grid_dependency_sync() in generated sources, GridDependencySync() in
// ops/cuda) before it reads anything an earlier kernel may write or writes anything an earlier
// kernel may read; before it, only prefetches of data that no kernel writes while it runs
// (weights). The wait covers every earlier kernel (each waited for its own predecessor), so a
// buffer the memory planner reuses is safe. Kernels without the wait, and every kernel with
// KILN_PDL=off, on an older GPU or into a CUDA graph capture (captured plans replayed slower with
// programmatic edges on the H200), launch plainly. Returns the launch's error.
cudaError_t LaunchDependent(const void* kernel, dim3 grid, dim3 block, void** args,
                            size_t shared_bytes, cudaStream_t stream);
// Whether LaunchDependent overlaps launches on `device` (KILN_PDL and compute capability >= 9.0).
bool DependentLaunchEnabled(int device);
// Whether a launch on `stream` of `device` now is a dependent one: enabled there and the stream
// not capturing. Launchers that cannot call LaunchDependent (ops/cuda/*.cu) pass this on.
bool UseDependentLaunch(int device, cudaStream_t stream = CurrentStream());

// Throws kiln::Error naming `call` and the CUDA error string unless `err` is cudaSuccess.
// Out-of-memory becomes kResourceExhausted, everything else kInternal.
void Check(cudaError_t err, const char* call, const char* file, int line);
// The same as a Status, for infrastructure code.
absl::Status ToStatus(cudaError_t err, const char* call);

// Caching device allocator statistics (bytes).
struct MemoryStats {
  size_t allocated = 0;  // held by live tensors
  size_t reserved = 0;   // held by the pool (allocated + cached)
  size_t peak_allocated = 0;
  size_t cached = 0;  // freed blocks the allocator keeps for reuse on their stream (host cache)
};
MemoryStats GetMemoryStats();
void ResetPeakMemoryStats();
// Returns the allocator's cached blocks to the pool (torch.cuda.empty_cache()).
void EmptyCache();

// Copies between host and device buffers (any direction) on the current stream; synchronous
// with respect to the host when either side is host memory.
void Copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);

// The caching allocator, or nullptr when no GPU is usable (Storage picks it up for kCUDA).
Allocator* DeviceAllocator();

class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void Record(cudaStream_t stream);
  void Synchronize();
  float ElapsedMs(const Event& since) const;  // since -> this
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class Stream {
 public:
  Stream();   // a new non-blocking stream
  ~Stream();  // waits for the stream's work (the allocator frees its blocks elsewhere afterwards)
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Makes `stream` current for this thread for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t stream) : prev_(CurrentStream()) { SetCurrentStream(stream); }
  ~StreamGuard() { SetCurrentStream(prev_); }

 private:
  cudaStream_t prev_;
};

}  // namespace kiln::cuda

#define KILN_CUDA_CHECK(call) ::kiln::cuda::Check((call), #call, __FILE__, __LINE__)
