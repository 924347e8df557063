// The public API of indexing, joining, splitting and selection (see ops.h): thin wrappers that
// fill OpAttrs and dispatch through the registry. stack, split and chunk are compositions (views
// and cat); max_with_indices and topk are two dispatches each, so that every registry row keeps
// one output.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/cuda.h"
#include "runtime/status.h"

namespace kiln {
namespace {

OpAttrs DimAttr(int64_t dim) {
  OpAttrs a;
  a.dim = dim;
  return a;
}

// torch's scatter shape rule before the registry's: an empty index changes nothing, whatever its
// shape (torch returns before checking it); a 0-d tensor counts as one of shape [1], so a 0-d
// self takes a one-element index. `run(self, index, src)` dispatches the op; `done(self)` is the
// result when nothing is scattered (a copy, or self itself in place).
template <typename Run, typename Done>
Tensor ScatterShapes(const char* op, const Tensor& self, int64_t dim, const Tensor& index,
                     const Tensor& src, Run run, Done done) {
  KILN_CHECK(self.defined() && index.defined() && src.defined(), op,
             ": self, index and src must be defined tensors");
  const absl::StatusOr<int64_t> wrapped = WrapDim(dim, self.dim());
  KILN_CHECK(wrapped.ok(), op, ": ", wrapped.status().message(), ", self ", self.shape_string());
  if (index.numel() == 0 && (index.dtype() == DType::kInt64 || index.dtype() == DType::kInt32) &&
      src.dtype() == self.dtype()) {
    return done(self);
  }
  const int64_t top = std::max({self.dim(), index.dim(), src.dim()});
  const bool zero_dim = self.dim() == 0 || index.dim() == 0 || src.dim() == 0;
  if (top == 1 && zero_dim) {
    auto one_dim = [](const Tensor& t) { return t.dim() == 0 ? reshape(t, {1}) : t; };
    return reshape(run(one_dim(self), one_dim(index), one_dim(src)), self.shape());
  }
  return run(self, index, src);
}

Tensor ScatterOp(OpId id, const char* op, const Tensor& self, int64_t dim, const Tensor& index,
                 const Tensor& src) {
  return ScatterShapes(
      op, self, dim, index, src,
      [&](const Tensor& s, const Tensor& i, const Tensor& x) {
        return Dispatch(id, {s, i, x}, DimAttr(dim));
      },
      [](const Tensor& s) { return clone(s); });
}

const Tensor& ScatterOpInPlace(OpId id, const char* op, const Tensor& self, int64_t dim,
                               const Tensor& index, const Tensor& src) {
  ScatterShapes(
      op, self, dim, index, src,
      [&](const Tensor& s, const Tensor& i, const Tensor& x) {
        return DispatchInPlace(id, {s, i, x}, DimAttr(dim));
      },
      [](const Tensor& s) { return s; });
  return self;
}

}  // namespace

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  return Dispatch(OpId::kEmbedding, {indices, weight});
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  return Dispatch(OpId::kIndexSelect, {x, index}, DimAttr(dim));
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  return Dispatch(OpId::kGather, {x, index}, DimAttr(dim));
}

Tensor index_copy(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source) {
  return Dispatch(OpId::kIndexCopy, {self, index, source}, DimAttr(dim));
}

const Tensor& index_copy_(const Tensor& self, int64_t dim, const Tensor& index,
                          const Tensor& source) {
  return DispatchInPlace(OpId::kIndexCopy, {self, index, source}, DimAttr(dim));
}

Tensor scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  return ScatterOp(OpId::kScatter, "scatter", self, dim, index, src);
}

Tensor scatter(const Tensor& self, int64_t dim, const Tensor& index, Scalar value) {
  KILN_CHECK(self.defined() && index.defined(), "scatter: self and index must be defined tensors");
  KILN_CHECK(value.FitsIn(self.dtype()), "scatter: the value ", value.ToString(),
             " cannot be converted to ", DTypeName(self.dtype()), " without overflow");
  // The value as a src of index's shape (expanded: no copy).
  const Tensor src = expand(full({}, value, self.dtype(), self.device()), index.shape());
  return scatter(self, dim, index, src);
}

Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  return ScatterOp(OpId::kScatterAdd, "scatter_add", self, dim, index, src);
}

const Tensor& scatter_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  return ScatterOpInPlace(OpId::kScatter, "scatter_", self, dim, index, src);
}

const Tensor& scatter_add_(const Tensor& self, int64_t dim, const Tensor& index,
                           const Tensor& src) {
  return ScatterOpInPlace(OpId::kScatterAdd, "scatter_add_", self, dim, index, src);
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  OpAttrs a;
  a.dim = dim;
  return Dispatch(OpId::kCat, tensors, a);
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "stack: expects a non-empty list of tensors");
  KILN_CHECK(tensors[0].defined(), "stack: tensor 0 is undefined");
  const int64_t rank = tensors[0].dim() + 1;  // the result's
  KILN_CHECK(dim >= -rank && dim < rank, "stack: dim ", dim, " is out of range for stacking ",
             tensors[0].shape_string(), " tensors (expected ", -rank, "..", rank - 1, ")");
  std::vector<Tensor> parts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    KILN_CHECK(tensors[i].defined(), "stack: tensor ", i, " is undefined");
    KILN_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: tensor ", i, " has shape ",
               tensors[i].shape_string(), " but tensor 0 has ", tensors[0].shape_string(),
               " (all must be equal)");
    parts.push_back(unsqueeze(tensors[i], dim));
  }
  return cat(parts, dim);
}

namespace {

int64_t SplitDim(const char* op, const Tensor& x, int64_t dim) {
  KILN_CHECK(x.defined(), op, ": undefined input");
  KILN_CHECK(x.dim() > 0, op, ": cannot split a 0-d tensor");
  KILN_CHECK(dim >= -x.dim() && dim < x.dim(), op, ": dim ", dim,
             " is out of range for a tensor of rank ", x.dim(), " (", x.shape_string(), ")");
  return dim < 0 ? dim + x.dim() : dim;
}

}  // namespace

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  const int64_t d = SplitDim("split", x, dim), n = x.size(d);
  KILN_CHECK(split_size > 0 || (split_size == 0 && n == 0), "split: split_size must be positive, ",
             "got ", split_size, " for dim ", dim, " of ", x.shape_string());
  std::vector<Tensor> out;
  for (int64_t start = 0; start < n || (n == 0 && out.empty());) {
    const int64_t length = std::min(split_size, n - start);  // no start + split_size overflow
    out.push_back(slice(x, d, start, start + length));
    if (split_size == 0 || length < split_size) break;
    start += length;
  }
  return out;
}

std::vector<Tensor> split_with_sizes(const Tensor& x, IntList sizes, int64_t dim) {
  const int64_t d = SplitDim("split_with_sizes", x, dim);
  int64_t total = 0;
  bool overflows = false;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0, "split_with_sizes: sizes must be non-negative, got ", ShapeString(sizes));
    overflows = overflows || __builtin_add_overflow(total, s, &total);
  }
  KILN_CHECK(!overflows && total == x.size(d), "split_with_sizes: sizes ", ShapeString(sizes),
             overflows ? " sum past int64's range" : absl::StrCat(" sum to ", total), ", but dim ",
             dim, " of ", x.shape_string(), " has size ", x.size(d));
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(slice(x, d, start, start + s));
    start += s;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  const int64_t d = SplitDim("chunk", x, dim);
  KILN_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  const int64_t n = x.size(d);
  if (n == 0) {  // torch: `chunks` empty pieces
    KILN_CHECK(chunks <= (int64_t{1} << 20), "chunk: ", chunks, " empty pieces of ",
               x.shape_string(), " are too many (at most 2^20)");
    std::vector<Tensor> out;
    for (int64_t i = 0; i < chunks; ++i) out.push_back(slice(x, d, 0, 0));
    return out;
  }
  const int64_t per_chunk = n / chunks + (n % chunks != 0);  // ceil, without n + chunks overflow
  return split(x, per_chunk, d);
}

Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  OpAttrs a;
  if (dim) a.dims = {*dim};
  a.keepdim = keepdim;
  return Dispatch(OpId::kArgMax, {x}, a);
}

ValuesIndices max_with_indices(const Tensor& x, int64_t dim, bool keepdim) {
  Tensor indices = argmax(x, dim, keepdim);  // first: its Infer rejects empty dims
  return {max(x, {dim}, keepdim), std::move(indices)};
}

ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  OpAttrs a;
  a.dim = dim;
  a.k = k;
  a.largest = largest;
  Tensor indices = Dispatch(OpId::kTopK, {x}, a);
  return {gather(x, dim, indices), std::move(indices)};
}

namespace {

// The raw bytes of x's one element, on the host.
void ReadOneElement(const Tensor& x, void* dst) {
  KILN_CHECK(x.defined(), "item: undefined tensor");
  KILN_CHECK(x.numel() == 1, "item: a tensor with ", x.numel(), " elements (", Describe(x.type()),
             ") cannot be converted to a scalar; it must have one element");
  KILN_CHECK(!x.device().is_meta(), "item: a meta tensor ", Describe(x.type()), " holds no data");
  KILN_CHECK(
      x.storage() != nullptr && !x.storage()->device().is_meta(), "item: ", Describe(x.type()),
      " is a traced value inside a compiled function: its data does ", "not exist while tracing");
  const size_t bytes = static_cast<size_t>(x.element_size());
  if (x.device().is_cuda()) {
    cuda::Copy(dst, kCPU, x.data_ptr(), x.device(), bytes);
  } else {
    std::memcpy(dst, x.data_ptr(), bytes);
  }
}

}  // namespace

template <typename T>
T item(const Tensor& x) {
  uint64_t raw = 0;
  ReadOneElement(x, &raw);
  if constexpr (std::is_integral_v<T>) {
    // As libtorch's item<T>(): a value outside T's range is an error, not a wrapped integer.
    constexpr const char* kName = std::is_same_v<T, int32_t> ? "int32" : "int64";
    if (x.dtype() == DType::kInt64) {
      const int64_t i = *reinterpret_cast<int64_t*>(&raw);
      if constexpr (!std::is_same_v<T, bool>) {
        KILN_CHECK(i >= std::numeric_limits<T>::min() && i <= std::numeric_limits<T>::max(),
                   "item: ", i, " (", Describe(x.type()), ") cannot be converted to ", kName,
                   " without overflow");
      }
      return static_cast<T>(i);
    }
    const double v = LoaderFor(x.dtype())(&raw, 0);
    KILN_CHECK(std::isfinite(v), "item: ", v, " (", Describe(x.type()),
               ") cannot be converted to an integer");
    if constexpr (std::is_same_v<T, bool>) {
      return v != 0;
    } else {
      const double lo = static_cast<double>(std::numeric_limits<T>::min());  // -2^31 or -2^63
      KILN_CHECK(v >= lo && v < -lo, "item: ", v, " (", Describe(x.type()),
                 ") cannot be converted to ", kName, " without overflow");
      return static_cast<T>(v);  // toward zero, as a C++ cast (and libtorch) does
    }
  } else {
    if (x.dtype() == DType::kInt64) return static_cast<T>(*reinterpret_cast<int64_t*>(&raw));
    return static_cast<T>(LoaderFor(x.dtype())(&raw, 0));
  }
}

template double item<double>(const Tensor&);
template float item<float>(const Tensor&);
template int64_t item<int64_t>(const Tensor&);
template int32_t item<int32_t>(const Tensor&);
template bool item<bool>(const Tensor&);

}  // namespace kiln
