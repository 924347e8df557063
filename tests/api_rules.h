// The rules of kiln's public API, written down apart from its Infer functions, for the API
// fuzzer (tests/api_fuzz_test.cc): which calls are valid. Each rule is the documented one
// (ops/ops.h, runtime/tensor.h, torch's semantics): numpy broadcasting, dims in [-rank, rank)
// (a 0-d tensor takes -1 and 0), torch's type promotion and casting rule, the in-place rules,
// reshape/view/expand sizes, result sizes that fit int64. Shapes are tiny in the fuzzer, so some
// rules are checked element by element (view, overlap) rather than by a formula.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/shape.h"
#include "runtime/tensor.h"

namespace kiln::rules {

using Wide = __int128;  // products of int64 sizes without overflow (saturated at 2^64)

inline constexpr Wide kInt64Max = INT64_MAX;

// Dim d names a dim of a tensor of rank `rank`.
inline bool DimOk(int64_t d, int64_t rank) {
  const int64_t n = std::max<int64_t>(rank, 1);
  return d >= -n && d < n;
}

// permute's dims: one per dim of a tensor of rank `rank`, each naming a dim, none twice.
inline bool IsPermutation(const Shape& dims, int64_t rank) {
  if (static_cast<int64_t>(dims.size()) != rank) return false;
  std::vector<bool> seen(rank, false);
  for (int64_t d : dims) {
    if (!DimOk(d, rank) || seen[d < 0 ? d + rank : d]) return false;
    seen[d < 0 ? d + rank : d] = true;
  }
  return true;
}

// A reduction's dims: each names a dim, none twice (a 0-d tensor's one "dim", 0 or -1, may
// repeat: kiln's rule).
inline bool ReductionDimsOk(const Shape& dims, int64_t rank) {
  std::vector<bool> seen(std::max<int64_t>(rank, 1), false);
  for (int64_t d : dims) {
    if (!DimOk(d, rank)) return false;
    const int64_t w = d < 0 ? d + std::max<int64_t>(rank, 1) : d;
    if (seen[w]) return false;  // a 0-d tensor's one dim too (torch's dim_list_to_bitset)
    seen[w] = true;
  }
  return true;
}

// numpy broadcasting: dims aligned from the right, each pair equal or one of them 1.
inline std::optional<Shape> Broadcast(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[out.size() - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

// A tensor of this shape and dtype can exist: no negative dim, and its element count and bytes
// fit int64 (a zero dim makes it empty whatever the others are).
inline bool Sized(const Shape& s, DType t) {
  Wide n = 1;
  bool zero = false;
  for (int64_t d : s) {
    if (d < 0) return false;
    zero = zero || d == 0;
    n = std::min<Wide>(n * d, Wide{1} << 64);
  }
  return zero || n * DTypeSize(t) <= kInt64Max;
}

// The element count of a Sized shape.
inline int64_t Count(const Shape& s) {
  if (std::find(s.begin(), s.end(), 0) != s.end()) return 0;
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// torch's promotion: bool < integers < floating types; the wider integer; float32 over the half
// types, and float16 with bfloat16 gives float32.
inline DType Promote(DType a, DType b) {
  auto category = [](DType t) { return t == DType::kBool ? 0 : IsFloatingPoint(t) ? 2 : 1; };
  if (a == b) return a;
  if (category(a) != category(b)) return category(a) > category(b) ? a : b;
  return category(a) == 1 ? DType::kInt64 : DType::kFloat32;
}

// torch's result type of two tensors: one with dims outranks a zero-dim one of its category; a
// zero-dim one of a higher category decides (c10's combine_categories).
inline DType ResultType(const Tensor& a, const Tensor& b) {
  if ((a.dim() == 0) == (b.dim() == 0)) return Promote(a.dtype(), b.dtype());
  const DType dims = a.dim() == 0 ? b.dtype() : a.dtype();
  const DType zero = a.dim() == 0 ? a.dtype() : b.dtype();
  if (IsFloatingPoint(dims)) return dims;
  if (dims == DType::kBool || IsFloatingPoint(zero)) return Promote(dims, zero);
  return dims;
}

// torch's canCast: no floating value into an integer or bool, no number into a bool.
inline bool CanCast(DType from, DType to) {
  if (IsFloatingPoint(from) && !IsFloatingPoint(to)) return false;
  return from == DType::kBool || to != DType::kBool;
}

// The result dtype of tensor (op) scalar for add/sub/mul (ops/infer.cc ScalarArith), with a
// floating scalar (a C++ double, Python's float): floating tensors keep their dtype, integer and
// bool ones compute in float32.
inline std::optional<DType> ScalarArith(DType t, double) {
  return IsFloatingPoint(t) ? t : DType::kFloat32;
}

// A scalar can be stored in dtype t (torch: "value cannot be converted ... without overflow"):
// integer dtypes need a finite value whose truncation fits; floating dtypes NaN, the infinities
// and finite values up to their largest; bool any.
inline bool FitsValue(double v, DType t) {
  if (t == DType::kInt32) return std::isfinite(v) && std::trunc(v) >= -0x1p31 && v < 0x1p31;
  if (t == DType::kInt64) return std::isfinite(v) && v >= -0x1p63 && v < 0x1p63;
  if (!std::isfinite(v)) return true;  // NaN and the infinities fit every floating dtype
  if (t == DType::kFloat16) return std::fabs(v) <= 65504;
  if (t == DType::kBFloat16) return std::fabs(v) <= 3.3895313892515355e38;
  if (t == DType::kFloat32) return std::fabs(v) <= 3.4028234663852886e38;
  return true;
}

// The (|stride|, size) of the dims with more than one element, by stride.
inline std::vector<std::pair<int64_t, int64_t>> SortedDims(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.shape()[i] > 1) dims.emplace_back(std::abs(t.strides()[i]), t.shape()[i]);
  }
  std::sort(dims.begin(), dims.end());
  return dims;
}

// An in-place op may write self (runtime/tensor.h): no element reachable by two indices, proven
// by strides that nest (sorted, each beyond the span of the smaller ones); a layout that does not
// nest counts as overlapping. An empty tensor has nothing to write twice.
inline bool Writable(const Tensor& self) {
  if (self.numel() == 0) return true;
  Wide span = 0;
  for (const auto& [stride, size] : SortedDims(self)) {
    if (stride <= span) return false;
    span += Wide{stride} * (size - 1);
  }
  return true;
}

// A permutation of a contiguous layout (torch's is_non_overlapping_and_dense).
inline bool Dense(const Tensor& t) {
  Wide expected = 1;
  for (const auto& [stride, size] : SortedDims(t)) {
    if (stride != expected || expected > kInt64Max) return false;
    expected *= size;
  }
  return true;
}

// An input that an in-place op on self may not read (torch's assert_no_partial_overlap): both
// dense, sharing some elements, but not the same elements in the same layout. Other overlaps
// are read through a copy; meta tensors have no memory to share.
inline bool PartialOverlap(const Tensor& self, const Tensor& other) {
  if (self.storage() != other.storage() || self.numel() == 0 || other.numel() == 0) return false;
  if (self.device().is_meta()) return false;
  if (self.offset() == other.offset() && self.shape() == other.shape() &&
      self.strides() == other.strides()) {
    return false;
  }
  if (!Dense(self) || !Dense(other)) return false;
  return self.offset() < other.offset() + other.numel() &&
         other.offset() < self.offset() + self.numel();
}

// The shape reshape(x, sizes) gives a tensor of `numel` elements: one -1 is inferred, other sizes
// are >= 0, and the sizes hold exactly numel elements (a zero size leaves nothing to infer).
inline std::optional<Shape> ReshapeTarget(const Shape& sizes, int64_t numel) {
  Shape out = sizes;
  int64_t infer_at = -1;
  Wide known = 1;
  bool zero = false;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1 && infer_at < 0) {
      infer_at = static_cast<int64_t>(i);
    } else if (out[i] < 0) {
      return std::nullopt;
    } else {
      zero = zero || out[i] == 0;
      known = std::min<Wide>(known * out[i], Wide{1} << 64);
    }
  }
  if (zero) return numel == 0 && infer_at < 0 ? std::optional<Shape>(out) : std::nullopt;
  if (known > kInt64Max) return std::nullopt;
  if (infer_at < 0) return known == numel ? std::optional<Shape>(out) : std::nullopt;
  if (numel % static_cast<int64_t>(known) != 0) return std::nullopt;
  out[infer_at] = numel / static_cast<int64_t>(known);
  return out;
}

// The storage offset of x's element number k in row-major order.
inline int64_t OffsetOf(const Tensor& x, int64_t k) {
  int64_t at = x.offset();
  for (int64_t d = x.dim() - 1; d >= 0; --d) {
    at += (k % x.shape()[d]) * x.strides()[d];
    k /= x.shape()[d];
  }
  return at;
}

// view(x, shape) keeps x's memory: some strides for `shape` place its elements, in row-major
// order, where x's are (torch's rule for view). Checked element by element: each dim's stride is
// what one step along it moves, and every element must agree.
inline bool Viewable(const Tensor& x, const Shape& shape) {
  if (x.numel() == 0 || x.is_contiguous()) return true;
  const int64_t n = x.numel(), base = OffsetOf(x, 0);
  Shape strides(shape.size(), 0);
  int64_t step = 1;  // the row-major distance of one step along dim d
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (shape[d] > 1) strides[d] = OffsetOf(x, step) - base;
    step *= shape[d];
  }
  for (int64_t k = 0; k < n; ++k) {
    int64_t at = base, rest = k;
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      at += (rest % shape[d]) * strides[d];
      rest /= shape[d];
    }
    if (at != OffsetOf(x, k)) return false;
  }
  return true;
}

// expand(x, sizes): at least x's rank; each of x's dims kept (-1 or its size) or, if 1, grown;
// new leading dims given explicitly (>= 0).
inline std::optional<Shape> ExpandTarget(const Shape& x, const Shape& sizes) {
  if (sizes.size() < x.size()) return std::nullopt;
  Shape out = sizes;
  const size_t lead = sizes.size() - x.size();
  for (size_t i = 0; i < out.size(); ++i) {
    const bool own = i >= lead;
    const int64_t have = own ? x[i - lead] : 1;
    if (out[i] == -1 && own) out[i] = have;
    if (out[i] < 0 || (have != 1 && have != out[i])) return std::nullopt;
  }
  return out;
}

// torch.matmul's shape: 1-D operands promoted (and the dim dropped again), inner dims equal,
// batch dims broadcast.
inline std::optional<Shape> MatmulShape(Shape a, Shape b) {
  if (a.empty() || b.empty()) return std::nullopt;
  const bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), 1);
  if (b_vec) b.push_back(1);
  if (a.back() != b[b.size() - 2]) return std::nullopt;
  std::optional<Shape> out =
      Broadcast(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2));
  if (!out) return std::nullopt;
  if (!a_vec) out->push_back(a[a.size() - 2]);
  if (!b_vec) out->push_back(b.back());
  return out;
}

// x.as_strided(sizes, strides, offset): one stride per size, sizes and offset >= 0, and (unless
// empty) every element inside x's storage, with no index arithmetic beyond int64. Meta storage
// has no end to check.
inline bool AsStridedOk(const Tensor& x, const Shape& sizes, const Shape& strides, int64_t offset) {
  if (sizes.size() != strides.size() || offset < 0 || !Sized(sizes, DType::kBool)) return false;
  if (std::find(sizes.begin(), sizes.end(), 0) != sizes.end()) return true;
  Wide lo = offset, hi = offset;
  for (size_t d = 0; d < sizes.size(); ++d) {
    const Wide reach = Wide{sizes[d] - 1} * strides[d];
    if (reach > kInt64Max || reach < INT64_MIN) return false;
    (reach < 0 ? lo : hi) += reach;
  }
  if (hi > kInt64Max || lo < 0) return false;
  if (x.storage() == nullptr || x.storage()->device().is_meta()) return true;
  return hi < static_cast<Wide>(x.storage()->nbytes() / x.element_size());
}

// arange(start, end, step): a non-zero step, finite bounds, and ceil((end - start) / step)
// elements (none when negative) that fit a tensor of dtype t. On meta the values are not
// stored, so they need not fit t.
inline bool ArangeOk(double start, double end, double step, DType t) {
  if (step == 0 || !std::isfinite(start) || !std::isfinite(end) || !std::isfinite(step)) {
    return false;
  }
  if (end != start && (end > start) != (step > 0)) return false;  // torch: inconsistent sign
  const double count = std::ceil((end - start) / step);
  if (!std::isfinite(count) || count >= 0x1p63) return false;
  return Sized({count > 0 ? static_cast<int64_t>(count) : 0}, t);
}

}  // namespace kiln::rules
