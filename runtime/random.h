// A seeded random generator for factories and parameter init. Explicit by design: results
// depend only on the seed and the order of draws, never on global state.
//
//   Generator gen(42);
//   Tensor x = randn({4, 4}, gen);
#pragma once

#include <cstdint>
#include <random>

namespace kiln {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : engine_(seed) {}
  double Uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(engine_); }
  double Normal() { return normal_(engine_); }
  uint64_t NextU64() { return engine_(); }

 private:
  std::mt19937_64 engine_;
  std::normal_distribution<double> normal_;
};

}  // namespace kiln
