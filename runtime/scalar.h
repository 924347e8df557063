// A number passed to an op (torch's Scalar): a bool, an integer or a floating-point value, kept
// as the caller wrote it. Its kind decides type promotion as Python's bool, int and float do,
// and an integer stays exact over all of int64 (a double holds integers exactly only up to 2^53):
//
//   add(int_tensor, 2);    // an integer scalar: the result stays int32/int64
//   add(int_tensor, 2.0);  // a floating one: the result is float32
//   add(mask, true);       // a bool one: a bool tensor stays bool
//   eq(ids, int64_t{1} << 60);  // compared exactly
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "runtime/dtype.h"

namespace kiln {

class Scalar {
 public:
  constexpr Scalar() = default;  // the integer 0

  // A bool: the integer 0 or 1 that promotes as torch's bool (it keeps a bool tensor bool).
  constexpr Scalar(bool v)  // NOLINT(google-explicit-constructor)
      : double_(v ? 1 : 0), int_(v ? 1 : 0), bool_(true) {}
  // Any other integer type. An unsigned value past int64 becomes a floating scalar.
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  constexpr Scalar(T v) {  // NOLINT(google-explicit-constructor): numbers read as scalars
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t)) {
      if (v > static_cast<T>(std::numeric_limits<int64_t>::max())) {
        double_ = static_cast<double>(v);
        integer_ = false;
        return;
      }
    }
    int_ = static_cast<int64_t>(v);
    double_ = static_cast<double>(int_);
  }
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  constexpr Scalar(T v)  // NOLINT(google-explicit-constructor)
      : double_(static_cast<double>(v)), integer_(false) {}

  // Integers and bools (whose values are 0 and 1).
  constexpr bool is_integer() const { return integer_; }
  constexpr bool is_bool() const { return bool_; }
  // The value as a double (an integer past 2^53 rounds to the nearest double).
  constexpr double to_double() const { return double_; }
  // The value as int64: an integer exactly; a floating value truncated toward zero, 0 when it is
  // NaN, infinite or outside int64 (DoubleToInt64).
  int64_t to_int64() const { return integer_ ? int_ : DoubleToInt64(double_); }
  // Whether the value converts to dtype `t` without overflow (torch's "value cannot be converted
  // to type ... without overflow"; FitsDType for floating values).
  bool FitsIn(DType t) const {
    if (!integer_) return FitsDType(double_, t);
    if (t == DType::kInt32) {
      return int_ >= std::numeric_limits<int32_t>::min() &&
             int_ <= std::numeric_limits<int32_t>::max();
    }
    return t == DType::kInt64 || t == DType::kBool || FitsDType(double_, t);
  }
  // "3" for an integer, "3.0" / "0.5" / "1e+30" / "inf" / "nan" for a floating value, "true" /
  // "false" for a bool: the kinds never print alike (the IR text form).
  std::string ToString() const;

  // The same kind and bits (NaN equals itself, -0.0 differs from 0.0: attributes compare by
  // what they compute, not as numbers).
  friend bool operator==(const Scalar& a, const Scalar& b) {
    if (a.integer_ != b.integer_ || a.bool_ != b.bool_) return false;
    if (a.integer_) return a.int_ == b.int_;
    return std::bit_cast<uint64_t>(a.double_) == std::bit_cast<uint64_t>(b.double_);
  }

 private:
  double double_ = 0;
  int64_t int_ = 0;  // the value of an integer scalar
  bool integer_ = true;
  bool bool_ = false;
};

}  // namespace kiln
