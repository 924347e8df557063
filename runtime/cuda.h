// CUDA runtime layer of kiln: device discovery, the per-thread current stream, stream/event
// wrappers, checked calls, the caching device allocator and host<->device copies.
//
// kiln links the CUDA runtime statically and never links the driver library directly, so the
// same binary runs (CPU only) on machines without a GPU: cuda::IsAvailable() is false there and
// every CUDA tensor operation throws a kiln::Error saying so. A build without CUDA
// (runtime/build_config.h) has this header too, answering the same way (runtime/no_cuda.cc).
//
// This header needs no CUDA header: streams and events are CUDA's own handle types, declared
// here by their struct names (cudaStream_t is CUstream_st*). The backend's sources include
// runtime/cuda_api.h for CUDA's API and kiln's checked calls (KILN_CUDA_CHECK).
//
//   if (kiln::cuda::IsAvailable()) kiln::cuda::Synchronize();
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/storage.h"

struct CUstream_st;  // CUDA's stream (cudaStream_t)
struct CUevent_st;   // CUDA's event (cudaEvent_t)

namespace kiln::cuda {

using StreamHandle = ::CUstream_st*;  // the same type as cudaStream_t
using EventHandle = ::CUevent_st*;    // the same type as cudaEvent_t

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
StreamHandle CurrentStream();
void SetCurrentStream(StreamHandle stream);
void Synchronize();  // the current device
// Whether `stream` is being captured into a CUDA graph. A query that fails (the legacy stream
// while another stream captures in global mode) counts as capturing, its error cleared: nothing
// may wait for the stream or time it then either.
bool Capturing(StreamHandle stream = CurrentStream());
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

// Whether LaunchDependent (runtime/cuda_api.h) overlaps launches on `device` (KILN_PDL and
// compute capability >= 9.0).
bool DependentLaunchEnabled(int device);
// Whether a launch on `stream` of `device` now is a dependent one: enabled there, the stream not
// capturing or KILN_PDL_GRAPHS on, and not the first launch of a plan's run (ScopedPlanRun; the
// call then counts as that launch). Launchers that cannot call LaunchDependent (ops/cuda/*.cu)
// pass this on, and launch right after asking.
bool UseDependentLaunch(int device, StreamHandle stream = CurrentStream());

// A compiled plan's run on this thread (codegen/executable.cc): the byte ranges no kernel of the
// run writes (the plan's constants). The run's first kiln launch is a plain one
// (UseDependentLaunch says no once), so it starts after all earlier work on the stream ended, a
// user's write into a weight included. A later dependent launch overlaps only the kernel launched
// right before it (every kiln kernel lets its dependent start after its own wait), a kernel of
// the run, which writes none of these bytes. So a kernel of the run may load them before its
// dependency wait (ops/cuda/gemv_kernels.h preload_weights). Runs nest (a plan inside a caller's
// run), each with its own ranges and plain first launch.
struct ByteRange {
  const void* begin = nullptr;
  size_t bytes = 0;
};
class ScopedPlanRun {
 public:
  // `read_only` outlives the scope (the plan keeps it).
  explicit ScopedPlanRun(const std::vector<ByteRange>& read_only);
  ~ScopedPlanRun();
  ScopedPlanRun(const ScopedPlanRun&) = delete;
  ScopedPlanRun& operator=(const ScopedPlanRun&) = delete;

  const std::vector<ByteRange>& read_only;
  bool first_launch_pending = true;

 private:
  ScopedPlanRun* previous_;
};
// Whether [p, p + bytes) lies inside one of the current run's read-only ranges (false outside a
// run).
bool ReadOnlyDuringRun(const void* p, size_t bytes);

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
// Copies `rows` rows of `row_bytes` between device buffers whose rows start `dst_pitch` and
// `src_pitch` bytes apart (cudaMemcpy2DAsync on the current stream): a strided copy without a
// kernel (and so without a kernel compile).
void CopyRows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
              size_t rows);

// What the CUDA runtime knows of a pointer (cudaPointerGetAttributes): plain host memory (also
// any pointer it does not know), pinned host memory, device memory or managed memory, and the
// device of the last two.
struct PointerInfo {
  enum class Kind { kHost, kPinnedHost, kDevice, kManaged };
  Kind kind = Kind::kHost;
  int device = -1;
};
PointerInfo DescribePointer(const void* p);

// The caching allocator, or nullptr when no GPU is usable (Storage picks it up for kCUDA).
Allocator* DeviceAllocator();

class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void Record(StreamHandle stream);
  void Synchronize();
  float ElapsedMs(const Event& since) const;  // since -> this
  EventHandle get() const { return event_; }

 private:
  EventHandle event_ = nullptr;
};

class Stream {
 public:
  Stream();   // a new non-blocking stream
  ~Stream();  // waits for the stream's work (the allocator frees its blocks elsewhere afterwards)
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  StreamHandle get() const { return stream_; }
  void Synchronize();  // waits for the work queued on the stream

 private:
  StreamHandle stream_ = nullptr;
};

// The kernel and memset launches of `call`, counted by capturing its second run (CUDA stream
// capture in thread-local mode on a private stream; the graph is destroyed, never replayed). The
// first run, outside the capture, lets libraries plan and allocate. `error` says why nothing could
// be counted ("" when counted): the call threw, or the capture failed.
struct LaunchTally {
  int kernels = 0, memsets = 0;
  std::string error;
};
LaunchTally CountCapturedLaunches(const std::function<void()>& call);

// Resets this thread's stream capture mode to relaxed (cudaThreadExchangeStreamCaptureMode), so
// that a capture another thread runs in global mode does not refuse this thread's CUDA calls.
void RelaxCaptureModeForThisThread();

// Makes `stream` current for this thread for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(StreamHandle stream) : prev_(CurrentStream()) { SetCurrentStream(stream); }
  ~StreamGuard() { SetCurrentStream(prev_); }

 private:
  StreamHandle prev_;
};

}  // namespace kiln::cuda
