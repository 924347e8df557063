// Storage: a reference-counted buffer of bytes on one device, obtained from that device's
// Allocator. Tensors share storages; views share one storage with different metadata.
//
// Allocators are registered per device type: the CPU allocator is built in, the CUDA caching
// allocator registers itself when the CUDA backend is linked. Meta storages hold no memory.
#pragma once

#include <cstddef>
#include <memory>

#include "runtime/device.h"

namespace kiln {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory for `nbytes` (nullptr for 0 bytes); throws kiln::Error when out of memory.
  virtual void* Allocate(size_t nbytes, Device device) = 0;
  virtual void Free(void* ptr, size_t nbytes, Device device) = 0;
};

// The allocator for a device type; throws kiln::Error if none is registered (e.g. CUDA when the
// CUDA backend is not linked or no GPU is present).
Allocator* GetAllocator(DeviceType type);
void SetAllocator(DeviceType type, Allocator* allocator);
bool HasAllocator(DeviceType type);

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
};

}  // namespace kiln
