// Tensor factories and host conversion, like torch.empty/zeros/ones/full/arange/randn/rand,
// torch.tensor(list) and .tolist(); plus torch-style printing.
//
//   Generator gen(0);
//   Tensor x = randn({64, 128}, gen, DType::kBFloat16, CUDA());
//   Tensor m = triu(ones({T, T}, DType::kBool), 1);   // causal mask
//   std::vector<double> v = to_vector(x);
//   std::cout << x;   // tensor([[...]], dtype=bfloat16, device=cuda:0)
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/random.h"
#include "runtime/scalar.h"
#include "runtime/tensor.h"

namespace kiln {

Tensor empty(IntList shape, DType dtype = DType::kFloat32, Device device = kCPU);
Tensor full(IntList shape, Scalar value, DType dtype = DType::kFloat32, Device device = kCPU);
Tensor zeros(IntList shape, DType dtype = DType::kFloat32, Device device = kCPU);
Tensor ones(IntList shape, DType dtype = DType::kFloat32, Device device = kCPU);
// [start, end) with `step`. Without a dtype, as torch.arange infers it: int64 when start, end and
// step are whole numbers, else float32 (arange(0, 1, 0.25) is [0, 0.25, 0.5, 0.75]).
Tensor arange(Scalar start, Scalar end, Scalar step = 1, std::optional<DType> dtype = std::nullopt,
              Device device = kCPU);
Tensor arange(int64_t end, DType dtype = DType::kInt64, Device device = kCPU);
// Standard normal / uniform [0, 1) samples drawn from `gen`'s Philox stream: the same numbers on
// CPU and CUDA (a CUDA draw is filled on the device), with any compiler (runtime/random.h). A
// uniform is exact in its dtype (multiples of 2^-24 in float32, 2^-11 in float16, 2^-8 in
// bfloat16, as torch's CPU draw), so none rounds up to 1. Inside a function being compiled they
// throw: traced, the numbers would be a constant.
Tensor randn(IntList shape, Generator& gen, DType dtype = DType::kFloat32, Device device = kCPU);
Tensor rand(IntList shape, Generator& gen, DType dtype = DType::kFloat32, Device device = kCPU);

// A tensor holding `values` (converted to dtype) with the given shape.
Tensor from_vector(const std::vector<double>& values, IntList shape, DType dtype = DType::kFloat32,
                   Device device = kCPU);
// All elements in row-major order, converted to double (any dtype, device or strides).
std::vector<double> to_vector(const Tensor& x);
// All elements as integers in [lo, hi]: exact for integer dtypes; floating values truncate
// toward zero; NaN or a value outside [lo, hi] is an error naming `type`.
std::vector<int64_t> to_integers(const Tensor& x, int64_t lo, int64_t hi, const char* type);
// The same converted to T: to_vector<float>(x), to_vector<int64_t>(i) (exact: int64 values past
// 2^53 do not pass through double; a value T cannot hold is an error, not a wrapped number).
template <typename T>
std::vector<T> to_vector(const Tensor& x) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    const std::vector<int64_t> values = to_integers(
        x, std::is_signed_v<T> ? static_cast<int64_t>(std::numeric_limits<T>::min()) : 0,
        static_cast<int64_t>(
            std::min<uint64_t>(std::numeric_limits<T>::max(), std::numeric_limits<int64_t>::max())),
        std::is_signed_v<T> ? "a signed integer" : "an unsigned integer");
    return std::vector<T>(values.begin(), values.end());
  } else {
    const std::vector<double> values = to_vector(x);
    std::vector<T> out;
    out.reserve(values.size());
    for (double v : values) out.push_back(static_cast<T>(v));
    return out;
  }
}

// torch-style text: values, dtype, device. Beyond 1000 elements every dim longer than 6 is
// summarised to its first and last 3 entries ("..."), like torch, and only those elements are
// read (a few small copies, however large the tensor).
std::string ToString(const Tensor& x);
std::ostream& operator<<(std::ostream& os, const Tensor& x);

// Throws kiln::Error naming `what` when x is a tracing placeholder, whose data cannot be read
// (ir/tracer.h promises this error to code that reads data while tracing).
void CheckReadable(const char* what, const Tensor& x);

}  // namespace kiln
