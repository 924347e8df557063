// Storage: a reference-counted buffer of bytes on one device, obtained from that device's
// Allocator. Tensors share storages; views share one storage with different metadata.
//
// Allocators are registered per device type: the CPU allocator is built in, the CUDA caching
// allocator registers itself when the CUDA backend is linked. Meta storages hold no memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "runtime/device.h"

namespace kiln {

// Allocators are thread-safe: any thread may allocate, and any thread may free memory that
// another allocated.
class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory for `nbytes` (nullptr for 0 bytes); throws kiln::Error when out of memory.
  virtual void* Allocate(size_t nbytes, Device device) = 0;
  virtual void Free(void* ptr, size_t nbytes, Device device) = 0;
  // Accounting for memory that entered or left the allocator's books without Allocate/Free
  // (Storage::Adopt / Storage::Release).
  virtual void Adopted(void* ptr, size_t nbytes, Device device) {}
  virtual void Released(void* ptr, size_t nbytes, Device device) {}
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

  // Takes ownership of `nbytes` at `data` on `device`, which that device's allocator frees
  // (memory a CUDA graph allocates each time it is replayed).
  static std::shared_ptr<Storage> Adopt(void* data, size_t nbytes, Device device);
  // Wraps memory kiln did not allocate (from_blob, DLPack): `deleter(data)` runs when the last
  // tensor on it goes away (none: the caller keeps the memory alive and frees it). No allocator
  // is involved.
  static std::shared_ptr<Storage> FromBlob(void* data, size_t nbytes, Device device,
                                           std::function<void(void*)> deleter);
  // Gives the memory up without freeing it; the storage is empty afterwards.
  void* Release();

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  // Counts writes through the op API (in-place ops, out= calls): a compiled function that froze
  // this storage's contents into its plan sees a later write (torch's version counter).
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void BumpVersion() { version_.fetch_add(1, std::memory_order_relaxed); }
  // Set when a module replaced the tensor on this storage by another (Module::to): a compiled
  // function that captured it as a weight recompiles instead of computing with the old one.
  bool retired() const { return retired_.load(std::memory_order_relaxed); }
  void Retire() { retired_.store(true, std::memory_order_relaxed); }
  // Set on a module's parameters made without initial values (ModuleOptions::init = Init::kNone):
  // true until the first write that bumps the version (load_state_dict, an in-place op).
  bool uninitialised() const {
    return uninitialised_.load(std::memory_order_relaxed) && version() == 0;
  }
  void MarkUninitialised() { uninitialised_.store(true, std::memory_order_relaxed); }
  // The order in which storages that allocate their own memory were made (1, 2, ...; 0 for memory
  // from elsewhere: Adopt, FromBlob). The tracer tells a tensor the traced function made (its
  // in-place writes stay inside each call) from one it captured (its writes persist) by it.
  uint64_t serial() const { return serial_; }
  // The serial the next storage made will get at least.
  static uint64_t NextSerial();

 private:
  Storage(void* data, size_t nbytes, Device device, Allocator* allocator)
      : data_(data), nbytes_(nbytes), device_(device), allocator_(allocator) {}

  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
  std::atomic<uint64_t> version_{0};
  std::atomic<bool> retired_{false};
  std::atomic<bool> uninitialised_{false};
  uint64_t serial_ = 0;
  std::function<void(void*)> deleter_;  // FromBlob's; runs instead of the allocator's Free
};

}  // namespace kiln
