// Where a tensor lives: CPU memory, a CUDA device (with index), or Meta (shape and dtype only,
// no storage; used to trace models without running them).
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

enum class DeviceType : uint8_t { kCPU, kCUDA, kMeta };
inline constexpr int kNumDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}  // NOLINT: implicit by design
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool is_meta() const { return type == DeviceType::kMeta; }
  std::string str() const;  // "cpu", "cuda:0", "meta"
  friend bool operator==(const Device&, const Device&) = default;
};

inline constexpr Device kCPU{DeviceType::kCPU, 0};
inline constexpr Device kMeta{DeviceType::kMeta, 0};
inline constexpr Device CUDA(int index = 0) { return Device{DeviceType::kCUDA, index}; }

// Parses "cpu", "cuda", "cuda:1", "meta"; throws kiln::Error otherwise.
Device ParseDevice(const std::string& s);

}  // namespace kiln
