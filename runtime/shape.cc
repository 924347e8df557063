// Shape helpers: counts, strides, broadcasting, dim wrapping, printing.
#include "runtime/shape.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"

namespace kiln {

int64_t NumElements(IntList shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return ValueOrThrow(CheckedNumElements(shape));
  }
  return n;
}

absl::StatusOr<int64_t> CheckedNumElements(IntList shape) {
  int64_t n = 1;
  bool overflow = false, zero = false;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has a negative dimension"));
    }
    zero |= d == 0;
    overflow |= __builtin_mul_overflow(n, d, &n);
  }
  if (zero) return 0;
  if (overflow) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ShapeString(shape), " has more elements than fit in int64 (2^63 - 1)"));
  }
  return n;
}

Strides ContiguousStrides(IntList shape) {
  Strides strides(shape.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    if (__builtin_mul_overflow(s, std::max<int64_t>(shape[i], 1), &s)) s = INT64_MAX;
  }
  return strides;
}

std::string ShapeString(IntList shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<Shape> BroadcastShapes(IntList a, IntList b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) {
      return absl::InvalidArgumentError(absl::StrCat("shapes ", ShapeString(a), " and ",
                                                     ShapeString(b), " cannot be broadcast: dim ",
                                                     i, " is ", da, " vs ", db));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

StridedSpan SpanOf(IntList shape, IntList strides) {
  StridedSpan r{1, 0};
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return {0, 0};
    const int64_t reach = (shape[d] - 1) * strides[d];
    r.span += reach < 0 ? -reach : reach;
    if (reach < 0) r.offset -= reach;
  }
  return r;
}

absl::StatusOr<int64_t> WrapDim(int64_t dim, int64_t rank) {
  const int64_t lo = rank == 0 ? -1 : -rank, hi = rank == 0 ? 0 : rank - 1;
  if (dim < lo || dim > hi) {
    return absl::InvalidArgumentError(absl::StrCat("dim ", dim,
                                                   " is out of range for a tensor of rank ", rank,
                                                   " (expected ", lo, "..", hi, ")"));
  }
  return dim < 0 ? dim + std::max<int64_t>(rank, 1) : dim;
}

std::string TensorType::str() const {
  return absl::StrCat(DTypeName(dtype), ShapeString(shape), "@", device.str());
}

std::string Describe(const TensorType& t) {
  return absl::StrCat(DTypeName(t.dtype), ShapeString(t.shape), " on ", t.device.str());
}

}  // namespace kiln
