// Device memory for the tensors a CUDA graph capture allocates (codegen/cuda_graph.h), taken from
// one block the graph's plan owns instead of from graph memory nodes.
//
// Why: inside a capture, cudaMallocAsync/cudaFreeAsync become MEM_ALLOC/MEM_FREE nodes between the
// kernels, and a kernel's programmatic dependent launch (runtime/cuda.h LaunchDependent) forms a
// programmatic graph edge only when its predecessor node is a kernel: with memory nodes between
// them the overlap never happens. With an arena the captured kernels follow each other directly.
//
// While a ScopedCaptureArena is alive, the caching allocator (runtime/cuda.cc) serves the calling
// thread's allocations on a capturing stream from the arena, first fit over offsets aligned to
// kArenaAlignment; a free returns the range for the next allocation, as the stream-ordered pool
// would (the graph replays the captured order, so a range is reused only after the kernels that
// read it ran; with programmatic launches, a kernel reads or writes nothing a predecessor may
// touch before its griddepcontrol.wait). An allocation that does not fit goes to the driver as
// before (a graph memory node) and counts toward needed_bytes(): the plan captures again with an
// arena of that size.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "runtime/device.h"

namespace kiln {
class Storage;
}

namespace kiln::cuda {

inline constexpr size_t kArenaAlignment = 256;  // what cudaMalloc guarantees

// First-fit allocation of byte ranges in [0, capacity), the arena's bookkeeping. Allocations that
// do not fit are still booked past `capacity` (the caller gets the offset and sees it does not
// fit), so high_water() is the size an arena needs for the same sequence of calls.
class OffsetAllocator {
 public:
  explicit OffsetAllocator(size_t capacity);
  // The offset of a new range of `bytes` (rounded up to kArenaAlignment; 0 bytes take one unit).
  size_t Allocate(size_t bytes);
  // Gives back the range at `offset` (from Allocate, not yet freed; anything else is ignored).
  void Free(size_t offset);
  bool Fits(size_t offset) const;  // the range at `offset` lies within the capacity
  size_t capacity() const { return capacity_; }
  size_t high_water() const { return high_water_; }  // end of the highest range ever booked
  size_t live_bytes() const { return live_bytes_; }

 private:
  size_t capacity_;
  size_t high_water_ = 0, live_bytes_ = 0;
  std::map<size_t, size_t> free_;  // offset -> size, coalesced, below the end of the booked space
  std::map<size_t, size_t> used_;  // offset -> size
  size_t end_ = 0;                 // everything from here on is free
};

class CaptureArena {
 public:
  // An arena of `bytes` on `device` (allocated now through the caching allocator, on the calling
  // thread's current stream: call it before the capture starts).
  CaptureArena(size_t bytes, Device device);
  ~CaptureArena();
  CaptureArena(const CaptureArena&) = delete;
  CaptureArena& operator=(const CaptureArena&) = delete;

  // A range of `nbytes` in the arena; nullptr when it does not fit (the caller allocates
  // elsewhere, and passes the pointer to Booked so that needed_bytes() counts it).
  void* Allocate(size_t nbytes);
  // Records that an allocation the arena could not hold got `elsewhere` (freed through Free too).
  void Booked(void* elsewhere, size_t nbytes);
  // Gives back a range from Allocate or Booked (the caller routes only those here).
  void Free(void* ptr);
  bool Contains(const void* ptr) const;
  size_t capacity() const { return booking_.capacity(); }
  size_t needed_bytes() const;  // the arena this capture's allocation sequence needs
  bool overflowed() const { return needed_bytes() > capacity(); }
  Device device() const { return device_; }

 private:
  Device device_;
  std::shared_ptr<Storage> block_;
  char* base_ = nullptr;
  mutable std::mutex mu_;
  OffsetAllocator booking_;
  std::map<void*, size_t> overflow_;  // pointers allocated elsewhere -> their booked offset
};

// Routes the calling thread's allocations on a capturing stream to `arena` while alive.
class ScopedCaptureArena {
 public:
  explicit ScopedCaptureArena(std::shared_ptr<CaptureArena> arena);
  ~ScopedCaptureArena();
  ScopedCaptureArena(const ScopedCaptureArena&) = delete;
  ScopedCaptureArena& operator=(const ScopedCaptureArena&) = delete;

 private:
  std::shared_ptr<CaptureArena> previous_;
};

// The arena of the innermost ScopedCaptureArena on this thread (nullptr: none).
const std::shared_ptr<CaptureArena>& CurrentCaptureArena();

}  // namespace kiln::cuda
