// Philox4x32-10, the counter-based generator of torch's CUDA RNG (Salmon et al., "Parallel
// Random Numbers: As Easy as 1, 2, 3", SC'11; the Random123 library), and the conversions kiln
// draws its uniform and normal samples with. Header-only and usable from host and device code,
// so that the CPU factories and the CUDA fill kernel compute the same numbers.
//
// A draw is a pure function of (key, counter): no state, no library distribution whose algorithm
// differs between standard libraries (std::normal_distribution does). kiln's layout of a tensor
// draw: element i of a draw that starts at block `base` reads lane i % 4 of
// Philox(counter = {base + i / 4 as two 32-bit words, 0, 0}, key = {seed low, seed high}).
//
//   philox::Uint4 r = philox::Block(philox::KeyOf(seed), block);
//   float u = philox::ToUniform(r.x);            // [0, 1), exact: integer arithmetic only
//   philox::Normal2 z = philox::BoxMuller(r.x, r.y);   // two N(0, 1) samples
//
// Uniform samples are bit-identical on every compiler and device. Normal samples use log, sin
// and cos in double precision (sqrt is exact), whose last bit may differ between math libraries
// (glibc, CUDA's libdevice: <= 2 ulp of double); rounded to float32, as kiln stores them, they
// agree except with a probability of about 1e-8 per sample.
#pragma once

#include <math.h>  // ::sqrt, ::log, ::cos, ::sin on host and device

#include <cstdint>

#if defined(__CUDACC__)
#define KILN_PHILOX_FN __host__ __device__ __forceinline__
#else
#define KILN_PHILOX_FN inline
#endif

namespace kiln::philox {

struct Uint4 {
  uint32_t x, y, z, w;
};
struct Key {
  uint32_t lo, hi;
};

inline constexpr uint32_t kMul0 = 0xD2511F53u;  // round multipliers
inline constexpr uint32_t kMul1 = 0xCD9E8D57u;
inline constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // key schedule (golden ratio, sqrt(3) - 1)
inline constexpr uint32_t kWeyl1 = 0xBB67AE85u;

KILN_PHILOX_FN Key KeyOf(uint64_t seed) {
  return {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
}

// One Philox round: two 32x32 -> 64-bit products, their halves swapped and mixed with the key.
KILN_PHILOX_FN Uint4 Round(Uint4 c, Key k) {
  const uint64_t p0 = static_cast<uint64_t>(kMul0) * c.x;
  const uint64_t p1 = static_cast<uint64_t>(kMul1) * c.z;
  const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  return {hi1 ^ c.y ^ k.lo, lo1, hi0 ^ c.w ^ k.hi, lo0};
}

// Philox4x32 with 10 rounds: the key is bumped by the Weyl constants between rounds.
KILN_PHILOX_FN Uint4 Philox4x32_10(Uint4 counter, Key key) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key.lo += kWeyl0;
      key.hi += kWeyl1;
    }
    counter = Round(counter, key);
  }
  return counter;
}

// The four 32-bit words of block `block` of the stream of `key`.
KILN_PHILOX_FN Uint4 Block(Key key, uint64_t block) {
  return Philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u},
                       key);
}

KILN_PHILOX_FN uint32_t Lane(const Uint4& r, int lane) {
  return lane == 0 ? r.x : lane == 1 ? r.y : lane == 2 ? r.z : r.w;
}

// A uniform float in [0, 1) from the top `digits` bits (1..24): a multiple of 2^-digits, so every
// value is exact in a float type of that many significand digits (24 float32, 11 float16, 8
// bfloat16), which therefore never rounds one up to 1 (torch's CPU draw, uniform_real).
KILN_PHILOX_FN float ToUniform(uint32_t bits, int digits = 24) {
  return static_cast<float>(bits >> (32 - digits)) * (1.0f / static_cast<float>(1u << digits));
}

struct Normal2 {
  float a, b;
};

// Box-Muller on two words: u in (0, 1) from all 32 bits of `u_bits` (so the tail reaches
// ~6.7 sigma), the angle from `angle_bits`; computed in double, rounded once to float.
KILN_PHILOX_FN Normal2 BoxMuller(uint32_t u_bits, uint32_t angle_bits) {
  const double two_pow_m32 = 1.0 / 4294967296.0;
  const double u = (static_cast<double>(u_bits) + 0.5) * two_pow_m32;
  const double theta = 6.283185307179586 * (static_cast<double>(angle_bits) * two_pow_m32);
  const double r = ::sqrt(-2.0 * ::log(u));  // global: kiln::log is the tensor op
  return {static_cast<float>(r * ::cos(theta)), static_cast<float>(r * ::sin(theta))};
}

// Sample i of a normal draw starting at block `base`: lanes (x, y) give samples 0 and 1 of a
// block, lanes (z, w) samples 2 and 3.
KILN_PHILOX_FN float NormalFrom(const Uint4& r, int lane) {
  const Normal2 z = lane < 2 ? BoxMuller(r.x, r.y) : BoxMuller(r.z, r.w);
  return (lane & 1) ? z.b : z.a;
}

}  // namespace kiln::philox
