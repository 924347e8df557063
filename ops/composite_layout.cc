// Layout and indexing composites with torch's names and semantics (see ops.h): select, unbind,
// swapaxes, pad, meshgrid, index_add and index_fill, and the products mm, mv and dot, written
// with the registry's ops (views where torch returns views).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/composite_helpers.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {
using namespace composite;  // NOLINT: the helpers of every composite file

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  CheckDefined("select", x);
  KILN_CHECK(x.dim() >= 1, "select: cannot select from a 0-d tensor");
  const int64_t d = Wrapped("select", x, dim), n = x.size(d);
  KILN_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dim ", d,
             " of size ", n, " in ", Shapes(x));
  const int64_t i = index < 0 ? index + n : index;
  return Named("select", [&] { return squeeze(slice(x, d, i, i + 1), d); });
}

std::vector<Tensor> unbind(const Tensor& x, int64_t dim) {
  CheckDefined("unbind", x);
  KILN_CHECK(x.dim() >= 1, "unbind: cannot unbind a 0-d tensor");
  const int64_t d = Wrapped("unbind", x, dim);
  std::vector<Tensor> parts;
  for (int64_t i = 0; i < x.size(d); ++i) parts.push_back(select(x, d, i));
  return parts;
}

Tensor swapaxes(const Tensor& x, int64_t a, int64_t b) {
  CheckDefined("swapaxes", x);
  return Named("swapaxes", [&] { return transpose(x, a, b); });
}

Tensor pad(const Tensor& x, IntList pads, double value) {
  CheckDefined("pad", x);
  KILN_CHECK(pads.size() % 2 == 0, "pad: needs pairs of (left, right) sizes, got ", pads.size(),
             " values");
  KILN_CHECK(static_cast<int64_t>(pads.size()) / 2 <= x.dim(), "pad: ", pads.size() / 2,
             " dims of padding for ", Shapes(x), " (at most one pair a dim)");
  KILN_CHECK(FitsDType(value, x.dtype()), "pad: the value ", value, " cannot be converted to ",
             DTypeName(x.dtype()), " without overflow");
  return Named("pad", [&] {
    // Pair i pads dim rank - 1 - i (the last dim first, as torch.nn.functional.pad); a negative
    // size crops.
    Tensor out = x;
    for (size_t i = 0; i < pads.size() / 2; ++i) {
      const int64_t d = x.dim() - 1 - static_cast<int64_t>(i);
      const int64_t left = pads[2 * i], right = pads[2 * i + 1], n = out.size(d);
      // Crops (negative sizes) first, as torch narrows before it pads.
      const int64_t from = std::max<int64_t>(0, -left);
      const int64_t kept = n - from - std::max<int64_t>(0, -right);
      KILN_CHECK(kept >= 0, "padding ", left, ", ", right, " of dim ", d, " (size ", n,
                 ") crops more than it holds (a negative size)");
      out = slice(out, d, from, from + kept);
      std::vector<Tensor> parts;
      auto block = [&](int64_t size) {
        Shape s = out.shape();
        s[d] = size;
        return full(s, value, out.dtype(), out.device());
      };
      if (left > 0) parts.push_back(block(left));
      parts.push_back(out);
      if (right > 0) parts.push_back(block(right));
      if (parts.size() > 1) out = cat(parts, d);
    }
    return out.storage() == x.storage() ? clone(out) : out;  // a new tensor, as torch's pad
  });
}

std::vector<Tensor> meshgrid(const std::vector<Tensor>& tensors, std::string_view indexing) {
  KILN_CHECK(!tensors.empty(), "meshgrid: needs at least one tensor");
  KILN_CHECK(indexing == "ij" || indexing == "xy",
             "meshgrid: indexing must be \"ij\" or \"xy\", got \"", std::string(indexing), "\"");
  Shape shape;
  for (const Tensor& t : tensors) {
    CheckDefined("meshgrid", t);
    KILN_CHECK(t.dim() <= 1, "meshgrid: needs 0-d or 1-D tensors, got ", Shapes(t));
    KILN_CHECK(t.dtype() == tensors[0].dtype() && t.device() == tensors[0].device(),
               "meshgrid: the tensors must have one dtype and device (as in torch), got ",
               Describe(tensors[0].type()), " and ", Describe(t.type()));
    shape.push_back(t.numel());
  }
  // "xy": the first two outputs' dims swapped (numpy's Cartesian indexing).
  const bool xy = indexing == "xy" && tensors.size() >= 2;
  if (xy) std::swap(shape[0], shape[1]);
  std::vector<Tensor> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    size_t at = i;
    if (xy && i < 2) at = 1 - i;
    Shape view(tensors.size(), 1);
    view[at] = tensors[i].numel();
    out.push_back(Named("meshgrid", [&] { return expand(reshape(tensors[i], view), shape); }));
  }
  return out;
}

namespace {

// index (1-D, or 0-d for one slice) along `dim` expanded to `like`'s shape, whose size along dim
// is index.numel(): the scatter index of index_add and index_fill. Errors name `fn`.
Tensor IndexAlong(const char* fn, const Tensor& index, int64_t dim, const Shape& like) {
  KILN_CHECK(index.dim() <= 1, fn, ": index must be 1-D (or 0-d), got ", Shapes(index));
  Shape view(like.size(), 1);
  view[dim] = index.numel();
  return expand(reshape(index, view), like);
}

}  // namespace

Tensor index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                 Scalar alpha) {
  CheckDefined("index_add", self);
  CheckDefined("index_add", index);
  CheckDefined("index_add", source);
  const int64_t d = Wrapped("index_add", self, dim);
  KILN_CHECK(source.dtype() == self.dtype(), "index_add: source's dtype ",
             DTypeName(source.dtype()), " must equal self's ", DTypeName(self.dtype()));
  KILN_CHECK(IsFloatingPoint(self.dtype()) || alpha.is_integer(), "index_add: alpha ",
             alpha.ToString(), " must be an integer for ", DTypeName(self.dtype()),
             " tensors (as in torch)");
  bool fits = source.dim() == self.dim() && (self.dim() == 0 || source.size(d) == index.numel());
  for (int64_t i = 0; fits && i < self.dim(); ++i) fits = i == d || source.size(i) == self.size(i);
  KILN_CHECK(fits, "index_add: source ", Shapes(source), " must have self's shape ", Shapes(self),
             " but for index's ", index.numel(), " entries along dim ", d);
  return Named("index_add", [&] {
    const Tensor scaled = alpha.to_double() == 1 ? source : mul(source, alpha);
    const Tensor idx =
        self.dim() == 0 ? reshape(index, {}) : IndexAlong("index_add", index, d, source.shape());
    return scatter_add(self, d, idx, scaled);
  });
}

Tensor index_fill(const Tensor& self, int64_t dim, const Tensor& index, Scalar value) {
  CheckDefined("index_fill", self);
  CheckDefined("index_fill", index);
  const int64_t d = Wrapped("index_fill", self, dim);
  KILN_CHECK(index.dtype() == DType::kInt64 || index.dtype() == DType::kInt32,
             "index_fill: index must be int64 or int32, got ", DTypeName(index.dtype()));
  if (index.numel() == 0) return clone(self);
  return Named("index_fill", [&] {
    // Negative indices down to -n count from the end, as torch's index_fill; one below -n stays
    // as given, so the range error names the index the caller passed.
    const int64_t n = self.dim() == 0 ? 1 : self.size(d);
    const Tensor wrapped = where(logical_and(lt(index, 0), ge(index, -n)), add(index, n), index);
    if (self.dim() == 0) return scatter(self, 0, reshape(wrapped, {}), value);
    Shape like = self.shape();
    like[d] = index.numel();
    return scatter(self, d, IndexAlong("index_fill", wrapped, d, like), value);
  });
}

namespace {

// matmul(a, b) for a 2-D a and a b of rank b_rank whose first dim is a's last (mm, mv); else
// the error naming `fn` and the shapes it `needs`.
Tensor CheckedProduct(const char* fn, const Tensor& a, const Tensor& b, int64_t b_rank,
                      const char* needs) {
  CheckDefined(fn, a);
  CheckDefined(fn, b);
  KILN_CHECK(a.dim() == 2 && b.dim() == b_rank && a.size(1) == b.size(0), fn, ": needs ", needs,
             ", got ", Shapes(a), " and ", Shapes(b));
  return Named(fn, [&] { return matmul(a, b); });
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  return CheckedProduct("mm", a, b, 2, "[n, k] and [k, m]");
}

Tensor mv(const Tensor& a, const Tensor& v) {
  return CheckedProduct("mv", a, v, 1, "[n, k] and [k]");
}

Tensor dot(const Tensor& a, const Tensor& b) {
  CheckDefined("dot", a);
  CheckDefined("dot", b);
  KILN_CHECK(a.dim() == 1 && b.dim() == 1 && a.size(0) == b.size(0),
             "dot: needs two 1-D tensors of one size, got ", Shapes(a), " and ", Shapes(b));
  KILN_CHECK(a.dtype() == b.dtype(), "dot: the operands must have one dtype (as in torch), got ",
             DTypeName(a.dtype()), " and ", DTypeName(b.dtype()));
  KILN_CHECK(a.dtype() != DType::kBool, "dot: bool tensors are not supported (as in torch)");
  // Integers: the products' sum in the operands' dtype (wrapping), as torch's.
  return Named("dot", [&] {
    return IsFloatingPoint(a.dtype()) ? matmul(a, b) : cast(sum(mul(a, b)), a.dtype());
  });
}

}  // namespace kiln
