// Rendering the kernel IR as CUDA C++ (see kernel_render.h).
#include "ops/cuda/kernel_render.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace kiln::cuda_ops {
namespace {

// Device helpers shared by every generated kernel: storage types, conversions, math.
constexpr char kPrelude[] = R"(
// Programmatic dependent launch (runtime/cuda.h LaunchDependent): waits until every earlier
// kernel has finished and its writes are visible, then lets the next kernel on the stream start
// launching (after the wait: one kernel ahead, never a chain of waiting ones). Every generated
// kernel calls it first, before any load or store.
__device__ __forceinline__ void kiln_grid_dependency_sync() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
typedef unsigned short kiln_u16;
typedef unsigned char kiln_bool;
__device__ __forceinline__ float kiln_bf16_to_f(kiln_u16 b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ kiln_u16 kiln_f_to_bf16(float f) {
#if __CUDA_ARCH__ >= 800
  kiln_u16 h; asm("{ cvt.rn.bf16.f32 %0, %1; }" : "=h"(h) : "f"(f)); return h;
#else
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (kiln_u16)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (kiln_u16)(u >> 16);
#endif
}
__device__ __forceinline__ float kiln_f16_to_f(kiln_u16 h) {
  float f; asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ kiln_u16 kiln_f_to_f16(float f) {
  kiln_u16 h; asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f)); return h;
}
template <typename T> __device__ __forceinline__ T kiln_relu(T x) { return x > T(0) || x != x ? x : T(0); }
// floor, ceil, round (half to even: rint) and trunc for each compute type; integers unchanged.
#define KILN_ROUNDING(name, float_fn, double_fn)                                         \
  __device__ __forceinline__ float kiln_##name(float x) { return float_fn(x); }          \
  __device__ __forceinline__ double kiln_##name(double x) { return double_fn(x); }       \
  __device__ __forceinline__ long long kiln_##name(long long x) { return x; }
KILN_ROUNDING(floor, floorf, floor)
KILN_ROUNDING(ceil, ceilf, ceil)
KILN_ROUNDING(round, rintf, rint)
KILN_ROUNDING(trunc, truncf, trunc)
#undef KILN_ROUNDING
// fmod (the dividend's sign), remainder (the divisor's: Python's %) and floor division (torch's
// div_floor) for each compute type. An integer divisor of 0 gives -1 (torch's CPU kernels raise;
// its CUDA ones give what the hardware gives); INT64_MIN by -1 wraps.
#define KILN_DIVISION(T, fmod_fn, floor_fn, copysign_fn)                                  \
  __device__ __forceinline__ T kiln_fmod(T a, T b) { return fmod_fn(a, b); }             \
  __device__ __forceinline__ T kiln_remainder(T a, T b) {                                 \
    const T m = fmod_fn(a, b);                                                            \
    return m != T(0) && ((b < T(0)) != (m < T(0))) ? m + b : m;                           \
  }                                                                                       \
  __device__ __forceinline__ T kiln_floor_divide(T a, T b) {                              \
    if (b == T(0)) return a / b;                                                          \
    const T m = fmod_fn(a, b);                                                            \
    T d = (a - m) / b;                                                                    \
    if (m != T(0) && ((b < T(0)) != (m < T(0)))) d -= T(1);                               \
    if (d == T(0)) return copysign_fn(T(0), a / b);                                       \
    const T f = floor_fn(d);                                                              \
    return d - f > T(0.5) ? f + T(1) : f;                                                 \
  }
KILN_DIVISION(float, fmodf, floorf, copysignf)
KILN_DIVISION(double, fmod, floor, copysign)
#undef KILN_DIVISION
__device__ __forceinline__ long long kiln_fmod(long long a, long long b) {
  return b == 0 ? -1 : b == -1 ? 0 : a % b;
}
__device__ __forceinline__ long long kiln_remainder(long long a, long long b) {
  const long long m = kiln_fmod(a, b);
  return b != 0 && m != 0 && ((b < 0) != (m < 0)) ? m + b : m;
}
__device__ __forceinline__ long long kiln_floor_divide(long long a, long long b) {
  if (b == 0) return -1;
  if (b == -1) return (long long)(0ull - (unsigned long long)a);
  const long long q = a / b;
  return a % b != 0 && ((a < 0) != (b < 0)) ? q - 1 : q;
}
__device__ __forceinline__ float kiln_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float kiln_silu(float x) { return x / (1.f + expf(-x)); }
// GELU's tanh form as x * sigmoid(2u) (the same function: 0.5 (1 + tanh(u)) = sigmoid(2u)), one
// exponential and one fast division instead of tanhf's branches: float32-accurate to a few ulps,
// and gelu(-inf) is NaN, gelu(inf) inf, as the tanh form gives.
__device__ __forceinline__ float kiln_gelu(float x, int approx_tanh) {
  if (approx_tanh) return __fdividef(x, 1.f + __expf(-1.5957691216057308f * (x + 0.044715f * x * x * x)));
  return 0.5f * x * (1.f + erff(x * 0.7071067811865476f));
}
// N raw bytes moved as one load or store, held as 32-bit words (as 16-bit or 8-bit ones below 4
// bytes): a byte array made every select, copy and element read of a vector byte-wise (PRMT and
// LOP3 per byte: the softmax row kernel ran 1.25x slower on the H200, issue-bound).
template <int N> struct KilnWord { typedef unsigned type; };
template <> struct KilnWord<2> { typedef unsigned short type; };
template <> struct KilnWord<1> { typedef unsigned char type; };
template <int N> struct alignas(N) KilnRaw { typename KilnWord<N>::type w[N / sizeof(typename KilnWord<N>::type)]; };
// Vector loads and stores, plain or with the streaming hint (ld/st.global.cs: data touched once,
// evicted first), by the vector's byte size.
template <int N, bool kStream> __device__ __forceinline__ KilnRaw<N> kiln_ld(const KilnRaw<N>* p) {
  KilnRaw<N> r;
  if constexpr (kStream && N == 16) *(uint4*)&r = __ldcs((const uint4*)p);
  else if constexpr (kStream && N == 8) *(uint2*)&r = __ldcs((const uint2*)p);
  else if constexpr (kStream && N == 4) *(unsigned*)&r = __ldcs((const unsigned*)p);
  else r = *p;
  return r;
}
template <int N, bool kStream> __device__ __forceinline__ void kiln_st(KilnRaw<N>* p, const KilnRaw<N>& v) {
  if constexpr (kStream && N == 16) __stcs((uint4*)p, *(const uint4*)&v);
  else if constexpr (kStream && N == 8) __stcs((uint2*)p, *(const uint2*)&v);
  else if constexpr (kStream && N == 4) __stcs((unsigned*)p, *(const unsigned*)&v);
  else *p = v;
}
)";

struct TypeInfo {
  const char* storage;  // C type of an element in memory
  const char* load;     // expression turning `v` (storage) into the compute type
  const char* store;    // expression turning `v` (compute) into storage
};

TypeInfo Info(DType t) {
  switch (t) {
    case DType::kFloat32:
      return {"float", "v", "(float)(v)"};
    case DType::kFloat16:
      return {"kiln_u16", "kiln_f16_to_f(v)", "kiln_f_to_f16((float)(v))"};
    case DType::kBFloat16:
      return {"kiln_u16", "kiln_bf16_to_f(v)", "kiln_f_to_bf16((float)(v))"};
    case DType::kBool:
      return {"kiln_bool", "(v != 0 ? 1.f : 0.f)", "(kiln_bool)((v) != 0)"};
    case DType::kInt32:
      return {"int", "(long long)(v)", "(int)(v)"};
    case DType::kInt64:
      return {"long long", "v", "(long long)(v)"};
  }
  return {"float", "v", "v"};
}

bool IsIntegerValue(DType t) { return t == DType::kInt32 || t == DType::kInt64; }

// Rounds a computed value through a narrower dtype, as an explicit cast does in eager mode.
std::string RoundTo(DType t, const std::string& v) {
  switch (t) {
    case DType::kBFloat16:
      return absl::StrCat("kiln_bf16_to_f(kiln_f_to_bf16(", v, "))");
    case DType::kFloat16:
      return absl::StrCat("kiln_f16_to_f(kiln_f_to_f16(", v, "))");
    case DType::kBool:
      return absl::StrCat("((", v, ") != 0 ? 1.f : 0.f)");
    default:
      return v;
  }
}

std::string DoubleLiteral(double v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".einn") == std::string::npos) s += ".0";
  return std::isfinite(v) ? s : FloatLiteral(v);
}

// Whether instruction `in` computes in long long: integer (or bool) operands and an integer or
// bool result, with at least one integer among them.
bool ComputesInIntegers(const kir::Program& p, const kir::Instr& in) {
  bool any_int = IsIntegerValue(in.dtype);
  if (IsFloatingPoint(in.dtype)) return false;
  for (int a : in.args) {
    const DType t = p.value(a).dtype;
    if (IsFloatingPoint(t)) return false;
    any_int |= IsIntegerValue(t);
  }
  return any_int;
}

// The registry expression of op instruction `in` with its operands and attributes substituted.
std::string OpExpression(const kir::Program& p, const kir::Instr& in, const std::string& prefix) {
  const OpDef& def = GetOpDef(in.op);
  const char* want = ComputesInIntegers(p, in) ? "long long" : "float";
  const std::string_view e = def.cuda_expr;
  std::string out;
  for (size_t c = 0; c < e.size(); ++c) {
    if (e[c] != '$') {
      out.push_back(e[c]);
      continue;
    }
    const std::string_view rest = e.substr(c + 1);
    if (!rest.empty() && std::isdigit(static_cast<unsigned char>(rest[0]))) {
      size_t len = 0;
      int k = 0;
      while (len < rest.size() && std::isdigit(static_cast<unsigned char>(rest[len]))) {
        k = k * 10 + (rest[len++] - '0');
      }
      const int arg = in.args[k];
      const std::string ref = absl::StrCat(prefix, arg);
      out += ComputeType(p.value(arg).dtype) == std::string(want)
                 ? ref
                 : absl::StrCat("((", want, ")", ref, ")");
      c += len;
    } else if (rest.substr(0, 6) == "scalar") {
      // Integer instructions take an integral scalar as an integer (exact, wrapping like torch)
      // and a fractional one as a double (exact too: every double past 2^53 is integral).
      const bool integer = std::string(want) == "long long";
      const double v = in.attrs.scalar.to_double();
      const bool integral =
          p.scalar_param() ? p.scalar_integral() : IsIntegralScalar(in.attrs.scalar);
      if (!integer) {
        out += p.scalar_param() ? "scalar" : FloatLiteral(v);
      } else if (integral) {
        out += p.scalar_param() ? "iscalar" : absl::StrCat("(", ScalarAsInt64(in.attrs), "LL)");
      } else {
        out += p.scalar_param() ? "dscalar" : DoubleLiteral(v);
      }
      c += 6;
    } else if (rest.substr(0, 11) == "approximate") {
      out += in.attrs.approximate == GeluApprox::kTanh ? "1" : "0";
      c += 11;
    } else {
      out.push_back('$');
    }
  }
  if (in.op == OpId::kCast || in.dtype == DType::kBool) return RoundTo(in.dtype, out);
  return out;
}

}  // namespace

const char* KernelPrelude() { return kPrelude; }
std::string StorageType(DType t) { return Info(t).storage; }
std::string LoadExpr(DType t, const std::string& v) {
  return absl::StrReplaceAll(Info(t).load, {{"v", v}});
}
std::string StoreExpr(DType t, const std::string& v) {
  return absl::StrReplaceAll(Info(t).store, {{"v", v}});
}
const char* ComputeType(DType t) { return IsIntegerValue(t) ? "long long" : "float"; }

std::string FloatLiteral(double v) {
  if (std::isnan(v)) return "__int_as_float(0x7fc00000)";
  if (std::isinf(v)) return v > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)";
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.9gf", v);
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s.insert(s.size() - 1, ".0");
  return s;
}

std::string RenderValues(const kir::Program& p, const std::function<std::string(int)>& load,
                         const std::string& indent, const std::string& prefix) {
  std::string s;
  for (size_t v = 0; v < p.values().size(); ++v) {
    const kir::Instr& in = p.value(static_cast<int>(v));
    const std::string rhs = in.kind == kir::Instr::Kind::kLoad ? LoadExpr(in.dtype, load(in.input))
                                                               : OpExpression(p, in, prefix);
    absl::StrAppend(&s, indent, "const ", ComputeType(in.dtype), " ", prefix, v, " = ", rhs, ";\n");
  }
  return s;
}

std::string RenderStoreValue(const kir::Program& p, int o, const std::string& prefix) {
  return StoreExpr(p.output_types()[o], absl::StrCat(prefix, p.outputs()[o]));
}

std::string ValueRef(const kir::Program& p, int v, const std::string& prefix) {
  return absl::StrCat(prefix, v);
}

}  // namespace kiln::cuda_ops
