// The helpers every composite file shares (composite_ops.cc, composite_math.cc, loss_ops.cc):
// argument checks whose errors name the composite, its error context, and computing half
// inputs in float32. Internal to ops/; not part of kiln's API.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/dispatch.h"  // CheckDefined
#include "ops/infer.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln::composite {

inline std::string Shapes(const Tensor& x) {
  return x.defined() ? x.shape_string() : std::string("an undefined tensor");
}

// `dim` wrapped into [0, rank) (WrapDim: rank 0 counts as 1, as in torch), or the error naming
// `fn`.
inline int64_t Wrapped(const char* fn, const Tensor& x, int64_t dim) {
  const absl::StatusOr<int64_t> w = WrapDim(dim, x.dim());
  KILN_CHECK(w.ok(), fn, ": ", w.status().message(), ", got ", Shapes(x));
  return *w;
}

// The product of `sizes` (0 when one is 0, whatever the others), or the error naming `fn` when
// it passes int64's range.
inline int64_t Product(const char* fn, IntList sizes) {
  if (std::find(sizes.begin(), sizes.end(), 0) != sizes.end()) return 0;
  int64_t product = 1;
  for (int64_t s : sizes) {
    KILN_CHECK(!__builtin_mul_overflow(product, s, &product), fn, ": the sizes ",
               ShapeString(sizes), " multiply past int64's range");
  }
  return product;
}

// f() with errors prefixed by `op` (the composite's name, not its parts').
template <typename F>
decltype(auto) Named(const char* op, F&& f) {
  return WithErrorContext([op] { return op; }, std::forward<F>(f));
}

// f(x) for a floating x (other dtypes are the error naming `op`), computed in float32 for the
// half types and rounded once, as torch's kernels compute them; f's errors name `op`.
template <typename F>
Tensor InFloat32(const char* op, const Tensor& x, F&& f) {
  CheckDefined(op, x);
  KILN_CHECK(IsFloatingPoint(x.dtype()), op, ": needs a floating tensor (as torch), got ",
             DTypeName(x.dtype()), Shapes(x));
  if (x.dtype() != DType::kFloat32) {
    return cast(Named(op, [&] { return f(cast(x, DType::kFloat32)); }), x.dtype());
  }
  return Named(op, [&] { return f(x); });
}

// beta input + alpha product (addmm, baddbmm): input must broadcast to the product's shape;
// beta = 0 ignores input, NaN too, as torch.
inline Tensor ScaledSum(const Tensor& input, Tensor product, Scalar beta, Scalar alpha) {
  KILN_CHECK(input.dtype() == product.dtype(), "input ", DTypeName(input.dtype()),
             " and the matrices' product ", DTypeName(product.dtype()),
             " must have the same dtype (as torch)");
  const absl::StatusOr<Shape> s = BroadcastShapes(input.shape(), product.shape());
  KILN_CHECK(s.ok() && *s == product.shape(), "input ", input.shape_string(),
             " does not broadcast to the product's ", product.shape_string());
  if (alpha.to_double() != 1) product = mul(product, alpha);
  if (beta.to_double() == 0) return product;
  return add(product, beta.to_double() == 1 ? input : mul(input, beta));
}

// The dtype torch's elementwise ops give `operands` together (torch's result_type): the tensors
// with dims promoted together, the zero-dim ones together, then the two joined as
// infer::ResultType joins a pair (a zero-dim tensor decides only from a higher category).
inline DType CommonType(const std::vector<Tensor>& operands) {
  std::optional<DType> dims, zero_dim;
  for (const Tensor& x : operands) {
    std::optional<DType>& group = x.dim() > 0 ? dims : zero_dim;
    group = group ? PromoteTypes(*group, x.dtype()) : x.dtype();
  }
  if (!dims || !zero_dim) return dims ? *dims : zero_dim.value();
  const Device device = operands.at(0).device();
  return infer::ResultType(TensorType{Shape{1}, *dims, device},
                           TensorType{Shape{}, *zero_dim, device});
}

// f(operands) for operands whose common dtype is `t`: computed in float32 and rounded once to t
// when t is a half type (as torch's kernels compute them), else as they are; errors name `op`.
template <typename F>
Tensor PromotedInFloat32(const char* op, DType t, std::vector<Tensor> operands, F&& f) {
  const bool half = t == DType::kBFloat16 || t == DType::kFloat16;
  if (half) {
    for (Tensor& x : operands) x = cast(x, DType::kFloat32);
  }
  Tensor out = Named(op, [&] { return f(operands); });
  return half ? cast(out, t) : out;
}

// Which dims a reduction over `dims` takes (infer::ReducedMask), or the error naming `fn`.
inline std::vector<bool> Reduced(const char* fn, const Tensor& x, IntList dims) {
  absl::StatusOr<std::vector<bool>> mask = infer::ReducedMask(dims, x.dim());
  KILN_CHECK(mask.ok(), fn, ": ", mask.status().message(), ", got ", Shapes(x));
  return *std::move(mask);
}

}  // namespace kiln::composite
