// Element types of kiln tensors and the scalar conversions between them.
//
// float16 and bfloat16 are stored as 16-bit patterns and computed in float32; conversions from
// float round to nearest even, as the hardware does.
//
//   DType t = DType::kBFloat16;
//   DTypeSize(t) == 2; DTypeName(t) == "bfloat16";
//   uint16_t bits = FloatToBFloat16(1.5f);  BFloat16ToFloat(bits) == 1.5f
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace kiln {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16, kBool, kInt32, kInt64 };
inline constexpr int kNumDTypes = 6;

int64_t DTypeSize(DType t);
const char* DTypeName(DType t);
bool IsFloatingPoint(DType t);
// torch's type promotion for two operands of an elementwise op (float beats int beats bool;
// float16 with bfloat16 gives float32; the wider type wins within a category).
DType PromoteTypes(DType a, DType b);

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float BFloat16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }
inline uint16_t FloatToBFloat16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

// Reads element `i` of a buffer of dtype `t` as double / writes a double into it (with the
// dtype's rounding). The CPU kernels use these through per-dtype function pointers.
using LoadFn = double (*)(const void* base, int64_t i);
using StoreFn = void (*)(void* base, int64_t i, double v);
LoadFn LoaderFor(DType t);
StoreFn StorerFor(DType t);
// `v` rounded to dtype `t` and read back (stored and loaded as above).
double RoundToDType(DType t, double v);

// The exact integer path of the same (integer and bool operands compute in int64, like torch):
// element `i` read as int64 / an int64 written with the dtype's wrap-around (int32 keeps the low
// 32 bits, bool is v != 0). Floating dtypes convert by truncation toward zero, 0 for NaN/inf
// and out-of-range values.
using IntLoadFn = int64_t (*)(const void* base, int64_t i);
using IntStoreFn = void (*)(void* base, int64_t i, int64_t v);
IntLoadFn IntLoaderFor(DType t);
IntStoreFn IntStorerFor(DType t);

// `v` as int64, truncated toward zero; 0 when it is NaN, infinite or outside int64.
int64_t DoubleToInt64(double v);
// Whether `v` converts to dtype `t` without overflow (torch's "value cannot be converted to type
// ... without overflow"): integer dtypes need a finite value whose truncation fits; floating
// dtypes take NaN, the infinities and finite values of magnitude up to their largest (float16:
// 65504); bool takes any value.
bool FitsDType(double v, DType t);
// The largest finite value of a floating dtype (float16: 65504); double's for the other dtypes.
double MaxFinite(DType t);

}  // namespace kiln
