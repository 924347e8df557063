// Helpers of the io/ tests: tensors of random bit patterns, their bytes, temporary paths, and
// file images of safetensors written byte by byte.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ops/ops.h"
#include "runtime/tensor.h"

namespace kiln {

// A CPU tensor whose bytes are random (any bit pattern: NaN payloads, subnormals), or 0/1 for
// bool; the same for the same seed.
inline Tensor RandomBits(IntList shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::Empty(shape, dtype, kCPU);
  std::mt19937 rng(seed);
  auto* bytes = static_cast<uint8_t*>(t.data_ptr());
  const int64_t n = t.numel() * t.element_size();
  for (int64_t i = 0; i < n; ++i) {
    bytes[i] = static_cast<uint8_t>(dtype == DType::kBool ? rng() % 2 : rng());
  }
  return t;
}

// The tensor's elements as bytes, in row-major order, from any device and layout.
inline std::string Bytes(const Tensor& t) {
  const Tensor host = contiguous(to(t, kCPU));
  return std::string(static_cast<const char*>(host.data_ptr()),
                     static_cast<size_t>(host.numel() * host.element_size()));
}

// A file's bytes ("" when it cannot be read), and `text` written over a file.
inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}
inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Whether this process has NVRTC mapped (/proc/self/maps), for the tests of its lazy loading.
inline bool NvrtcMapped() {
  return ReadText("/proc/self/maps").find("libnvrtc") != std::string::npos;
}

// A path in the test's temporary directory, unique to this process.
inline std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/kiln_", ::getpid(), "_", name);
}

// A safetensors file image: the 8-byte length of `header` (taken as is, no padding), the
// header, then `data`.
inline std::string FileImage(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

}  // namespace kiln
