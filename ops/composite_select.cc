// Selection and comparison composites with torch's names and semantics (see ops.h): nonzero,
// argwhere and masked_select (whose result size depends on the data: the mask is read on the
// host, so they run eagerly, not inside a compiled function), isclose, allclose and equal, and
// the diagonals (diagonal, diag, trace), written with the registry's ops.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/composite_helpers.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {
using namespace composite;  // NOLINT: the helpers of every composite file

Tensor nonzero(const Tensor& x) {
  CheckDefined("nonzero", x);
  CheckReadable("nonzero", x);
  // The truth values on the host, then the multi-indices of the true ones in row-major order.
  const std::vector<double> truth = Named("nonzero", [&] { return to_vector(ne(x, 0)); });
  const int64_t rank = x.dim();
  std::vector<double> rows;
  int64_t count = 0;
  for (int64_t flat = 0; flat < static_cast<int64_t>(truth.size()); ++flat) {
    if (truth[flat] == 0) continue;
    ++count;
    int64_t rest = flat;
    std::vector<double> index(rank);
    for (int64_t d = rank - 1; d >= 0; --d) {
      index[d] = static_cast<double>(rest % x.size(d));
      rest /= x.size(d);
    }
    rows.insert(rows.end(), index.begin(), index.end());
  }
  return from_vector(rows, {count, rank}, DType::kInt64, x.device());
}

Tensor argwhere(const Tensor& x) { return nonzero(x); }

Tensor masked_select(const Tensor& x, const Tensor& mask) {
  CheckDefined("masked_select", x);
  CheckDefined("masked_select", mask);
  KILN_CHECK(mask.dtype() == DType::kBool, "masked_select: the mask must be bool, got ",
             Describe(mask.type()));
  const absl::StatusOr<Shape> shape = BroadcastShapes(x.shape(), mask.shape());
  KILN_CHECK(shape.ok(), "masked_select: x ", Shapes(x), " and mask ", Shapes(mask),
             " do not broadcast");
  return Named("masked_select", [&] {
    const Tensor flat_mask = reshape(expand(mask, *shape), {-1});
    const Tensor picked = nonzero(flat_mask);  // [n, 1]
    return index_select(reshape(expand(x, *shape), {-1}), 0, reshape(picked, {-1}));
  });
}

Tensor isclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  CheckDefined("isclose", a);
  CheckDefined("isclose", b);
  KILN_CHECK(rtol >= 0 && atol >= 0, "isclose: rtol and atol must be >= 0, got rtol=", rtol,
             " atol=", atol);
  KILN_CHECK(a.dtype() == b.dtype(), "isclose: a and b must have one dtype (as in torch), got ",
             Describe(a.type()), " and ", Describe(b.type()));
  return Named("isclose", [&] {
    // torch's steps, each op in the operands' dtype (a half type rounds at each, as torch's
    // kernels do; integers give float32 tolerances; bools compute as float32): equal values
    // (infinities included) are close, NaNs too with equal_nan; otherwise a finite |a - b| <=
    // atol + |rtol b| is (a difference that overflows to inf never is).
    Tensor close = eq(a, b);
    if (equal_nan && IsFloatingPoint(a.dtype())) {
      close = logical_or(close, logical_and(isnan(a), isnan(b)));
    }
    if (rtol == 0 && atol == 0) return close;
    const bool boolean = a.dtype() == DType::kBool;
    const Tensor x = boolean ? cast(a, DType::kFloat32) : a;
    const Tensor y = boolean ? cast(b, DType::kFloat32) : b;
    const Tensor allowed = add(abs(mul(y, rtol)), atol);
    const Tensor diff = abs(sub(x, y));
    return logical_or(close, logical_and(isfinite(diff), le(diff, allowed)));
  });
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  return Named("allclose", [&] { return item<bool>(all(isclose(a, b, rtol, atol, equal_nan))); });
}

bool equal(const Tensor& a, const Tensor& b) {
  CheckDefined("equal", a);
  CheckDefined("equal", b);
  KILN_CHECK(a.dtype() == b.dtype(), "equal: a and b must have one dtype (as in torch), got ",
             DTypeName(a.dtype()), " and ", DTypeName(b.dtype()));
  if (a.shape() != b.shape()) return false;
  return Named("equal", [&] { return item<bool>(all(eq(a, b))); });
}

Tensor diagonal(const Tensor& x, int64_t offset, int64_t dim1, int64_t dim2) {
  CheckDefined("diagonal", x);
  KILN_CHECK(x.dim() >= 2, "diagonal: needs a tensor of rank >= 2, got ", Shapes(x));
  const int64_t d1 = Wrapped("diagonal", x, dim1), d2 = Wrapped("diagonal", x, dim2);
  KILN_CHECK(d1 != d2, "diagonal: dim1 and dim2 must differ, both are ", d1, " in ", Shapes(x));
  const int64_t rows = x.size(d1), cols = x.size(d2);
  // Element i of the diagonal is (i, i + offset) for offset >= 0, (i - offset, i) otherwise.
  const int64_t first_row = offset >= 0 ? 0 : -offset, first_col = offset >= 0 ? offset : 0;
  const int64_t n = std::max<int64_t>(0, std::min(rows - first_row, cols - first_col));
  return Named("diagonal", [&] {
    // The two dims last and joined (a copy), then the diagonal's flat positions picked.
    const Tensor moved = movedim(x, {d1, d2}, {x.dim() - 2, x.dim() - 1});
    Shape flat(moved.shape().begin(), moved.shape().end() - 2);
    flat.push_back(rows * cols);
    const Tensor positions =
        add(mul(arange(n, DType::kInt64, x.device()), cols + 1), first_row * cols + first_col);
    return index_select(reshape(moved, flat), -1, positions);
  });
}

Tensor diag(const Tensor& x, int64_t offset) {
  CheckDefined("diag", x);
  KILN_CHECK(x.dim() == 1 || x.dim() == 2, "diag: needs a 1-D or 2-D tensor, got ", Shapes(x));
  if (x.dim() == 2) return Named("diag", [&] { return diagonal(x, offset, 0, 1); });
  int64_t size = 0;
  const int64_t n = x.size(0);
  KILN_CHECK(offset > std::numeric_limits<int64_t>::min() &&
                 !__builtin_add_overflow(n, offset >= 0 ? offset : -offset, &size),
             "diag: offset ", offset, " makes a matrix side past int64's range");
  if (n == 0) return zeros({size, size}, x.dtype(), x.device());
  return Named("diag", [&] {
    // out[i][j] = x[k] where j - i == offset, k the row (offset >= 0) or column; else 0.
    const Tensor i = unsqueeze(arange(size, DType::kInt64, x.device()), 1);
    const Tensor j = unsqueeze(arange(size, DType::kInt64, x.device()), 0);
    const Tensor on = eq(sub(j, i), offset);
    const Tensor k = offset >= 0 ? expand(i, {size, size}) : expand(j, {size, size});
    const Tensor rows = reshape(clamp(k, Scalar(int64_t{0}), Scalar(n - 1)), {-1});
    const Tensor values = reshape(index_select(x, 0, rows), {size, size});
    return where(on, values, zeros_like(values));
  });
}

Tensor trace(const Tensor& x) {
  CheckDefined("trace", x);
  KILN_CHECK(x.dim() == 2, "trace: needs a 2-D tensor, got ", Shapes(x));
  return Named("trace", [&] { return sum(diagonal(x)); });
}

}  // namespace kiln
