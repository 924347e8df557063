// DType sizes, names, promotion, and half-precision conversions.
#include "runtime/dtype.h"

#include <cmath>
#include <limits>

namespace kiln {
namespace {

struct DTypeInfo {
  int64_t size;
  const char* name;
  bool is_float;
  int rank;  // promotion order: bool < int32 < int64 < half types < float32
};

constexpr DTypeInfo kInfo[] = {
    {4, "float32", true, 4}, {2, "float16", true, 3}, {2, "bfloat16", true, 3},
    {1, "bool", false, 0},   {4, "int32", false, 1},  {8, "int64", false, 2},
};
static_assert(sizeof(kInfo) / sizeof(kInfo[0]) == kNumDTypes);

const DTypeInfo& Info(DType t) { return kInfo[static_cast<int>(t)]; }

template <typename T>
double LoadAs(const void* base, int64_t i) {
  return static_cast<double>(static_cast<const T*>(base)[i]);
}
double LoadBool(const void* base, int64_t i) {
  return static_cast<const uint8_t*>(base)[i] ? 1 : 0;
}
double LoadHalf(const void* base, int64_t i) {
  return HalfToFloat(static_cast<const uint16_t*>(base)[i]);
}
double LoadBF16(const void* base, int64_t i) {
  return BFloat16ToFloat(static_cast<const uint16_t*>(base)[i]);
}

void StoreF32(void* base, int64_t i, double v) {
  static_cast<float*>(base)[i] = static_cast<float>(v);
}
void StoreHalf(void* base, int64_t i, double v) {
  static_cast<uint16_t*>(base)[i] = FloatToHalf(static_cast<float>(v));
}
void StoreBF16(void* base, int64_t i, double v) {
  static_cast<uint16_t*>(base)[i] = FloatToBFloat16(static_cast<float>(v));
}
void StoreBool(void* base, int64_t i, double v) { static_cast<uint8_t*>(base)[i] = v != 0; }
template <typename T>
void StoreInt(void* base, int64_t i, double v) {
  // Float to int conversion truncates toward zero like torch; NaN, inf and values outside int64
  // become 0 to stay defined, and int32 keeps the low 32 bits of the int64.
  static_cast<T*>(base)[i] = static_cast<T>(DoubleToInt64(v));
}

template <typename T>
int64_t IntLoadAs(const void* base, int64_t i) {
  return static_cast<int64_t>(static_cast<const T*>(base)[i]);
}
int64_t IntLoadBool(const void* base, int64_t i) {
  return static_cast<const uint8_t*>(base)[i] != 0;
}
template <LoadFn kLoad>
int64_t IntLoadFloat(const void* base, int64_t i) {
  return DoubleToInt64(kLoad(base, i));
}
template <typename T>
void IntStoreAs(void* base, int64_t i, int64_t v) {
  static_cast<T*>(base)[i] = static_cast<T>(v);  // modular since C++20: int32 wraps like torch
}
void IntStoreBool(void* base, int64_t i, int64_t v) { static_cast<uint8_t*>(base)[i] = v != 0; }
template <StoreFn kStore>
void IntStoreFloat(void* base, int64_t i, int64_t v) {
  kStore(base, i, static_cast<double>(v));
}

constexpr LoadFn kLoaders[] = {LoadAs<float>, LoadHalf,        LoadBF16,
                               LoadBool,      LoadAs<int32_t>, LoadAs<int64_t>};
constexpr StoreFn kStorers[] = {StoreF32,  StoreHalf,         StoreBF16,
                                StoreBool, StoreInt<int32_t>, StoreInt<int64_t>};
constexpr IntLoadFn kIntLoaders[] = {IntLoadFloat<LoadAs<float>>, IntLoadFloat<LoadHalf>,
                                     IntLoadFloat<LoadBF16>,      IntLoadBool,
                                     IntLoadAs<int32_t>,          IntLoadAs<int64_t>};
constexpr IntStoreFn kIntStorers[] = {IntStoreFloat<StoreF32>,  IntStoreFloat<StoreHalf>,
                                      IntStoreFloat<StoreBF16>, IntStoreBool,
                                      IntStoreAs<int32_t>,      IntStoreAs<int64_t>};
static_assert(sizeof(kLoaders) / sizeof(kLoaders[0]) == kNumDTypes);
static_assert(sizeof(kIntLoaders) / sizeof(kIntLoaders[0]) == kNumDTypes);
static_assert(sizeof(kIntStorers) / sizeof(kIntStorers[0]) == kNumDTypes);
static_assert(sizeof(kStorers) / sizeof(kStorers[0]) == kNumDTypes);

}  // namespace

int64_t DTypeSize(DType t) { return Info(t).size; }
const char* DTypeName(DType t) { return Info(t).name; }
bool IsFloatingPoint(DType t) { return Info(t).is_float; }

DType PromoteTypes(DType a, DType b) {
  if (a == b) return a;
  const int ra = Info(a).rank, rb = Info(b).rank;
  if (ra == rb) return DType::kFloat32;  // float16 with bfloat16
  return ra > rb ? a : b;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;           // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;          // rounds to inf (>= 65520)
  if (abs < 0x38800000u) {                                // subnormal or zero in half
    const float scaled = BitsToFloat(abs) * 16777216.0f;  // 2^24: exact, rint rounds to even
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even at bit 13
  return sign | static_cast<uint16_t>((r - 0x38000000u) >> 13);
}

LoadFn LoaderFor(DType t) { return kLoaders[static_cast<int>(t)]; }
StoreFn StorerFor(DType t) { return kStorers[static_cast<int>(t)]; }
double RoundToDType(DType t, double v) {
  uint64_t scratch = 0;  // room for any element
  StorerFor(t)(&scratch, 0, v);
  return LoaderFor(t)(&scratch, 0);
}
IntLoadFn IntLoaderFor(DType t) { return kIntLoaders[static_cast<int>(t)]; }
IntStoreFn IntStorerFor(DType t) { return kIntStorers[static_cast<int>(t)]; }

double MaxFinite(DType t) {
  switch (t) {
    case DType::kFloat16:
      return 65504.0;
    case DType::kBFloat16:
      return 0x1.fep127;  // 3.3895e38
    case DType::kFloat32:
      return 0x1.fffffep127;  // 3.4028e38
    default:
      return std::numeric_limits<double>::max();
  }
}

bool FitsDType(double v, DType t) {
  // A floating dtype takes NaN, the infinities and finite values up to its largest (c10's
  // overflows<To>: 65504.5 does not fit float16 although it would round to 65504).
  switch (t) {
    case DType::kInt32:
      return v > -0x1p31 - 1 && v < 0x1p31;
    case DType::kInt64:
      return v >= -0x1p63 && v < 0x1p63;  // NaN fails both
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat32:
      return !std::isfinite(v) || std::fabs(v) <= MaxFinite(t);
    default:
      return true;  // bool: any value (nonzero is true)
  }
}

int64_t DoubleToInt64(double v) {
  // [-2^63, 2^63): every double in it converts exactly after truncation.
  if (!(v >= -0x1p63 && v < 0x1p63)) return 0;
  return static_cast<int64_t>(v);
}

}  // namespace kiln
