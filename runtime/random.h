// A seeded random generator for factories and parameter init: Philox4x32-10 (runtime/philox.h),
// the generator behind torch's CUDA RNG. Explicit by design: results depend only on the seed and
// the order of draws, never on global state, the compiler or the device.
//
//   Generator gen(42);
//   Tensor x = randn({4, 4}, gen);               // the same numbers on CPU and on CUDA
//   Tensor y = randn({4, 4}, gen, kF32, CUDA()); // the next numbers of the stream
//
// State is (seed, offset): a tensor draw of n samples takes ceil(n / 4) Philox blocks starting at
// the offset (Reserve), so a draw on CUDA fills in parallel exactly what the CPU would. The
// scalar draws (Uniform, Normal, NextU64) read the lanes of one block at a time.
// Not thread-safe: give each thread its own Generator (copies are independent replicas).
#pragma once

#include <cstdint>
#include <functional>

#include "runtime/philox.h"

namespace kiln {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}

  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }  // the next unused Philox block
  philox::Key key() const { return philox::KeyOf(seed_); }

  // Reserves `blocks` consecutive Philox blocks for a tensor draw; returns the first one.
  uint64_t Reserve(uint64_t blocks) {
    const uint64_t first = offset_;
    offset_ += blocks;
    lane_ = 4;  // later scalar draws start a fresh block
    return first;
  }

  // A uniform sample in [0, 1) with 24 random bits (a float32 value).
  double Uniform() { return philox::ToUniform(NextU32()); }
  // A standard normal sample (Box-Muller on two words, rounded to float32).
  double Normal() {
    const uint32_t u = NextU32();
    return philox::BoxMuller(u, NextU32()).a;
  }
  uint64_t NextU64() {
    const uint64_t lo = NextU32();
    return lo | (static_cast<uint64_t>(NextU32()) << 32);
  }

 private:
  uint32_t NextU32() {
    if (lane_ == 4) {
      block_ = philox::Block(key(), offset_++);
      lane_ = 0;
    }
    return philox::Lane(block_, lane_++);
  }

  uint64_t seed_;
  uint64_t offset_ = 0;
  philox::Uint4 block_{};
  int lane_ = 4;
};

// The process-wide generator that modules draw their initial weights from when ModuleOptions
// names none (torch's default generator): seeded 0 at start, reseeded by manual_seed. Draws
// happen under its lock, so modules may be built in several threads (in an unspecified order).
void manual_seed(uint64_t seed);
// Runs `fn` with the default generator, holding its lock.
void WithDefaultGenerator(const std::function<void(Generator&)>& fn);

}  // namespace kiln
