// CPU allocator, the per-device allocator table, Storage, and Device parsing.
#include "runtime/storage.h"

#include <array>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/cuda.h"
#include "runtime/status.h"

namespace kiln {
namespace {

class CpuAllocator final : public Allocator {
 public:
  void* Allocate(size_t nbytes, Device) override {
    if (nbytes == 0) return nullptr;
    const size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      throw Error(absl::ResourceExhaustedError(
          absl::StrCat("cpu allocator: out of memory allocating ", nbytes, " bytes")));
    }
    return p;
  }
  void Free(void* ptr, size_t, Device) override { std::free(ptr); }
};

std::array<Allocator*, kNumDeviceTypes>& Allocators() {
  static CpuAllocator cpu;
  // The CUDA slot holds the caching allocator when a GPU is usable, else stays empty.
  static std::array<Allocator*, kNumDeviceTypes> table = {&cpu, cuda::DeviceAllocator(), nullptr};
  return table;
}

}  // namespace

std::string Device::str() const {
  switch (type) {
    case DeviceType::kCPU:
      return "cpu";
    case DeviceType::kCUDA:
      return absl::StrCat("cuda:", index);
    case DeviceType::kMeta:
      return "meta";
  }
  return "?";
}

Device ParseDevice(const std::string& s) {
  if (s == "cpu") return kCPU;
  if (s == "meta") return kMeta;
  if (s == "cuda") return CUDA(0);
  int index = 0;
  if (s.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(s.substr(5), &index) && index >= 0) {
    return CUDA(index);
  }
  throw Error(absl::InvalidArgumentError(
      absl::StrCat("unknown device '", s, "': expected cpu, cuda, cuda:N or meta")));
}

Allocator* GetAllocator(DeviceType type) {
  if (static_cast<int>(type) >= kNumDeviceTypes) {
    throw Error(
        absl::InvalidArgumentError(absl::StrCat("unknown device type ", static_cast<int>(type))));
  }
  Allocator* a = Allocators()[static_cast<int>(type)];
  if (a == nullptr) {
    throw Error(absl::FailedPreconditionError(
        absl::StrCat("no allocator for device ", Device(type).str(),
                     ": the CUDA backend is not available (no GPU, or kiln built without CUDA)")));
  }
  return a;
}

bool HasAllocator(DeviceType type) { return Allocators()[static_cast<int>(type)] != nullptr; }

void SetAllocator(DeviceType type, Allocator* allocator) {
  Allocators()[static_cast<int>(type)] = allocator;
}

namespace {
std::atomic<uint64_t> g_next_serial{1};
}  // namespace

uint64_t Storage::NextSerial() { return g_next_serial.load(std::memory_order_relaxed); }

Storage::Storage(size_t nbytes, Device device)
    : nbytes_(nbytes),
      device_(device),
      serial_(g_next_serial.fetch_add(1, std::memory_order_relaxed)) {
  if (device.is_meta()) return;
  allocator_ = GetAllocator(device.type);
  data_ = allocator_->Allocate(nbytes, device);
}

std::shared_ptr<Storage> Storage::Adopt(void* data, size_t nbytes, Device device) {
  Allocator* allocator = GetAllocator(device.type);
  allocator->Adopted(data, nbytes, device);
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, allocator));
}

std::shared_ptr<Storage> Storage::FromBlob(void* data, size_t nbytes, Device device,
                                           std::function<void(void*)> deleter) {
  auto storage = std::shared_ptr<Storage>(new Storage(data, nbytes, device, nullptr));
  storage->deleter_ = std::move(deleter);
  return storage;
}

void* Storage::Release() {
  void* data = data_;
  if (allocator_ != nullptr && data_ != nullptr) allocator_->Released(data_, nbytes_, device_);
  data_ = nullptr;
  deleter_ = nullptr;
  return data;
}

Storage::~Storage() {
  if (deleter_) {
    deleter_(data_);
  } else if (allocator_ != nullptr && data_ != nullptr) {
    allocator_->Free(data_, nbytes_, device_);
  }
}

}  // namespace kiln
