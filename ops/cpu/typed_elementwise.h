// CPU reference kernels of the elementwise rows that must be exact on integers (comparisons,
// minimum/maximum, clamp, abs, pow, sign, the rounding divisions): computed in the operands' common
// type as torch does, i.e. in int64_t when it is an integer or bool type (exact beyond 2^53,
// wrapping on overflow) and in double after rounding each operand to the common floating dtype
// otherwise. The generic loop in elementwise.cc goes through double and is kept for the
// floating-only rows.
//
//   // a registry row (ops/registry.cc):
//   Op(OpId::kEq, "eq", ..., cpu::TypedElementwise<cpu::EqOp>, ...)
//
// Each functor has Apply(T a, T b) for T = int64_t and T = double (b is the second operand, or
// the row's scalar for the *_scalar forms; unary rows ignore it) and says whether the result is
// bool (comparisons: the common type is then computed from the operands, not the output).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/cpu/loops.h"
#include "ops/op_def.h"

namespace kiln::cpu {

// The type elementwise operands are converted to before the op (torch's common dtype): the
// promotion of the two inputs, or of the input with the row's scalar (an integer scalar keeps
// an integer tensor's type, a floating one makes it float32; bool becomes int64).
DType CommonDType(absl::Span<const Tensor> in, const OpAttrs& a);

// Element `i` of a buffer of dtype `t`: exactly as int64_t, or as double rounded to `common`.
int64_t ReadInt(DType t, const void* base, int64_t i);
double ReadFloat(DType t, DType common, const void* base, int64_t i);
// Stores an integer result exactly (int32 wraps like torch), or a floating one with rounding.
void WriteInt(DType t, void* base, int64_t i, int64_t v);
// The row's scalar rounded to the common floating dtype (an integer common type takes the
// scalar's exact int64: Infer makes it integer only for an integer scalar).
double ScalarFloat(const Scalar& s, DType common);

template <typename Op, typename T>
void TypedLoop(absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a, DType common) {
  absl::InlinedVector<Strides, 3> strides = {out.strides()};
  for (const Tensor& t : in) strides.push_back(BroadcastStrides(t, out.shape()));
  const Tensor& x = in[0];
  const Tensor* y = in.size() > 1 ? &in[1] : nullptr;
  T scalar;
  if constexpr (std::is_same_v<T, int64_t>) {
    scalar = a.scalar.to_int64();
  } else {
    scalar = ScalarFloat(a.scalar, common);
  }
  auto read = [&](const Tensor& t, int64_t off) -> T {
    if constexpr (std::is_same_v<T, int64_t>) {
      return ReadInt(t.dtype(), t.data_ptr(), off);
    } else {
      return ReadFloat(t.dtype(), common, t.data_ptr(), off);
    }
  };
  const DType out_t = out.dtype();
  const StoreFn store = StorerFor(out_t);
  void* dst = out.data_ptr();
  ForEachElement(out.shape(), strides, [&](const int64_t* off) {
    const auto r = Op::Apply(read(x, off[1]), y != nullptr ? read(*y, off[2]) : scalar);
    if constexpr (std::is_same_v<T, int64_t>) {
      WriteInt(out_t, dst, off[0], static_cast<int64_t>(r));
    } else {
      store(dst, off[0], static_cast<double>(r));
    }
  });
}

// KernelFn of the rows above (ops/op_def.h).
template <typename Op>
void TypedElementwise(const OpDef&, absl::Span<const Tensor> in, const Tensor& out,
                      const OpAttrs& a) {
  const DType common = Op::kBoolResult ? CommonDType(in, a) : out.dtype();
  if (IsFloatingPoint(common)) {
    TypedLoop<Op, double>(in, out, a, common);
  } else {
    TypedLoop<Op, int64_t>(in, out, a, common);
  }
}

template <typename T>
bool IsNan(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(v);
  } else {
    return false;
  }
}

// Comparisons: a bool result.
#define KILN_COMPARE_OP(Name, expr)           \
  struct Name {                               \
    static constexpr bool kBoolResult = true; \
    template <typename T>                     \
    static bool Apply(T a, T b) {             \
      return expr;                            \
    }                                         \
  };
KILN_COMPARE_OP(EqOp, a == b)
KILN_COMPARE_OP(NeOp, a != b)
KILN_COMPARE_OP(LtOp, a < b)
KILN_COMPARE_OP(LeOp, a <= b)
KILN_COMPARE_OP(GtOp, a > b)
KILN_COMPARE_OP(GeOp, a >= b)
#undef KILN_COMPARE_OP

// minimum / maximum and clamp: NaN in either operand gives NaN, as torch.
struct MinimumOp {
  static constexpr bool kBoolResult = false;
  template <typename T>
  static T Apply(T a, T b) {
    return IsNan(a) || a < b ? a : b;
  }
};
struct MaximumOp {
  static constexpr bool kBoolResult = false;
  template <typename T>
  static T Apply(T a, T b) {
    return IsNan(a) || a > b ? a : b;
  }
};
// floor, ceil, round (half to even) and trunc: integers pass unchanged, as in torch.
#define KILN_ROUNDING_OP(Name, fn)                 \
  struct Name {                                    \
    static constexpr bool kBoolResult = false;     \
    template <typename T>                          \
    static T Apply(T x, T) {                       \
      if constexpr (std::is_floating_point_v<T>) { \
        return fn(x);                              \
      } else {                                     \
        return x;                                  \
      }                                            \
    }                                              \
  };
KILN_ROUNDING_OP(FloorOp, std::floor)
KILN_ROUNDING_OP(CeilOp, std::ceil)
KILN_ROUNDING_OP(RoundOp, std::nearbyint)
KILN_ROUNDING_OP(TruncOp, std::trunc)
#undef KILN_ROUNDING_OP

// clamp_min(x, lo) = max(x, lo), clamp_max(x, hi) = min(x, hi); a NaN bound gives NaN.
struct ClampMinOp {
  static constexpr bool kBoolResult = false;
  template <typename T>
  static T Apply(T x, T lo) {
    return IsNan(x) ? x : (x < lo || IsNan(lo) ? lo : x);
  }
};
struct ClampMaxOp {
  static constexpr bool kBoolResult = false;
  template <typename T>
  static T Apply(T x, T hi) {
    return IsNan(x) ? x : (x > hi || IsNan(hi) ? hi : x);
  }
};

struct AbsOp {
  static constexpr bool kBoolResult = false;
  template <typename T>
  static T Apply(T x, T) {
    if constexpr (std::is_floating_point_v<T>) {
      return std::fabs(x);
    } else {
      return x < 0 ? static_cast<T>(0 - static_cast<uint64_t>(x)) : x;  // INT64_MIN wraps
    }
  }
};

// Integer powers by squaring with wrap-around; a negative exponent gives what torch's CUDA
// kernel gives (1 for base 1, ±1 for base -1, else 0). Floating powers are std::pow.
struct PowOp {
  static constexpr bool kBoolResult = false;
  template <typename T>
  static T Apply(T base, T exp) {
    if constexpr (std::is_floating_point_v<T>) {
      return std::pow(base, exp);
    } else {
      if (exp < 0) return base == 1 ? 1 : base == -1 ? ((exp & 1) ? -1 : 1) : 0;
      uint64_t result = 1, b = static_cast<uint64_t>(base);
      for (uint64_t e = static_cast<uint64_t>(exp); e != 0; e >>= 1, b *= b) {
        if (e & 1) result *= b;
      }
      return static_cast<T>(result);
    }
  }
};

// sign: (0 < x) - (x < 0), so NaN gives 0 and -0.0 gives 0, as torch; bool passes unchanged
// (an integer common type: true stays 1).
struct SignOp {
  static constexpr bool kBoolResult = false;
  template <typename T>
  static T Apply(T x, T) {
    return static_cast<T>((T(0) < x) - (x < T(0)));
  }
};

// An integer divisor of 0: torch's CPU kernels raise ZeroDivisionError.
void ThrowIntegerDivisionByZero(const char* op);

// fmod: the dividend's sign (C's fmod, C++'s % on integers); remainder: the divisor's (Python's
// %); floor_divide: the quotient rounded down, on floats as torch's div_floor (the quotient from
// fmod's exact remainder, rounded to the nearest integer it lies within 0.5 of). Floats compute
// in float32, torch's compute type for every floating dtype kiln has (so its roundings, e.g. of
// a - fmod(a, b), are torch's); on integers INT64_MIN by -1 wraps instead of trapping.
struct FmodOp {
  static constexpr bool kBoolResult = false;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return std::fmod(static_cast<float>(a), static_cast<float>(b));
    } else {
      if (b == 0) ThrowIntegerDivisionByZero("fmod");
      return b == -1 ? 0 : a % b;
    }
  }
};
struct RemainderOp {
  static constexpr bool kBoolResult = false;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      if (b == 0) ThrowIntegerDivisionByZero("remainder");
    }
    const T m = FmodOp::Apply(a, b);
    if (m == 0 || (b < 0) == (m < 0)) return m;
    if constexpr (std::is_floating_point_v<T>) {
      return static_cast<float>(m) + static_cast<float>(b);  // in float32, as torch
    } else {
      return m + b;  // opposite signs: no overflow
    }
  }
};
struct FloorDivideOp {
  static constexpr bool kBoolResult = false;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      const float fa = static_cast<float>(a), fb = static_cast<float>(b);
      if (fb == 0) return fa / fb;
      const float m = std::fmod(fa, fb);
      float d = (fa - m) / fb;
      if (m != 0 && ((fb < 0) != (m < 0))) d -= 1;
      if (d == 0) return std::copysign(0.0f, fa / fb);
      const float f = std::floor(d);
      return d - f > 0.5f ? f + 1 : f;
    } else {
      if (b == 0) ThrowIntegerDivisionByZero("floor_divide");
      if (b == -1) return static_cast<T>(0 - static_cast<uint64_t>(a));  // INT64_MIN wraps
      const T q = a / b;
      return a % b != 0 && ((a < 0) != (b < 0)) ? q - 1 : q;
    }
  }
};

}  // namespace kiln::cpu
