// Tensor handle: construction, metadata queries, raw views and byte copies between devices.
#include "runtime/tensor.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "runtime/cuda.h"
#include "runtime/status.h"

namespace kiln {
namespace {

int64_t WrapOrThrow(int64_t d, int64_t rank) { return ValueOrThrow(WrapDim(d, rank)); }

// A dim of the tensor's own shape: a 0-dim tensor has none (ops may still take dim 0 or -1 of
// it, as torch's; size() and stride() cannot, as torch's IndexError).
int64_t ExistingDim(const char* what, int64_t d, int64_t rank) {
  if (rank == 0) {
    throw Error(absl::InvalidArgumentError(
        absl::StrCat("Tensor::", what, "(", d, "): a 0-dim tensor has no dimensions to take the ",
                     what, " of")));
  }
  return WrapOrThrow(d, rank);
}

// Why a tensor with elements has no memory to read, for the error message.
std::string NoDataReason(const Tensor& t) {
  if (t.device().is_meta()) return "a meta tensor has a shape and a dtype but no data";
  if (t.is_placeholder()) {
    return "it is a placeholder standing for a value of a function being traced by "
           "kiln::compile, and data cannot be read while tracing (return the tensor from the "
           "function instead); a placeholder used after its trace escaped from the function";
  }
  return "its storage holds no memory";
}

// OK when every element of the view (shape, strides, offset) lies inside `storage` (storages
// without memory, of meta tensors and placeholders, have no upper bound to check).
absl::Status CheckViewBounds(IntList shape, IntList strides, int64_t offset, const Storage* storage,
                             DType dtype) {
  auto fail = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "as_strided: a view with shape ", ShapeString(shape), ", strides ", ShapeString(strides),
        " and offset ", offset, " of a ", DTypeName(dtype), " storage ", why));
  };
  if (shape.size() != strides.size()) return fail("needs as many strides as dims");
  if (offset < 0) return fail("has a negative offset");
  const absl::StatusOr<int64_t> numel = CheckedNumElements(shape);
  if (!numel.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("as_strided: ", numel.status().message()));
  }
  if (*numel == 0) return absl::OkStatus();
  int64_t lo = offset, hi = offset;
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(shape[d] - 1, strides[d], &reach) ||
        __builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi)) {
      return fail("reaches beyond 2^63 elements");
    }
  }
  if (lo < 0) return fail(absl::StrCat("reaches element ", lo, ", before the storage's start"));
  if (storage == nullptr || storage->device().is_meta()) return absl::OkStatus();
  const int64_t elements = static_cast<int64_t>(storage->nbytes()) / DTypeSize(dtype);
  if (hi >= elements) {
    return fail(absl::StrCat("reaches element ", hi, " of a storage of ", elements, " elements"));
  }
  return absl::OkStatus();
}

// Like torch: a tensor without elements is contiguous whatever its strides (other dims may be
// huge then); size-1 dims may have any stride.
bool IsContiguousLayout(IntList shape, IntList strides, int64_t numel) {
  if (numel == 0) return true;
  if (shape.size() != strides.size()) return false;
  int64_t expected = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= shape[i];  // at most numel
  }
  return true;
}

}  // namespace

void Tensor::ThrowUndefined() {
  throw Error(absl::InvalidArgumentError(
      "undefined tensor: Tensor() has no shape, dtype, device or data; use a tensor made by a "
      "factory (empty, zeros, from_vector, ...) or returned by an op"));
}

Tensor::Tensor(std::shared_ptr<Storage> storage, int64_t offset, Shape shape, Strides strides,
               DType dtype, Device device) {
  const int64_t numel = NumElements(shape);
  const bool contiguous = IsContiguousLayout(shape, strides, numel);
  impl_ = std::make_shared<Impl>(Impl{std::move(storage), offset, std::move(shape),
                                      std::move(strides), dtype, device, numel, contiguous});
}

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Strides strides, DType dtype,
               Device device, int64_t numel, bool contiguous)
    : impl_(std::make_shared<Impl>(Impl{std::move(storage), 0, std::move(shape), std::move(strides),
                                        dtype, device, numel, contiguous})) {}

Tensor Tensor::Empty(IntList shape, DType dtype, Device device) {
  KILN_CHECK(static_cast<int>(dtype) < kNumDTypes, "empty: unknown dtype ",
             static_cast<int>(dtype));
  for (int64_t d : shape) {
    KILN_CHECK(d >= 0, "empty: negative dimension in shape ", ShapeString(shape));
  }
  const absl::StatusOr<int64_t> numel = CheckedNumElements(shape);
  KILN_CHECK(numel.ok(), "empty: ", numel.status().message());
  int64_t bytes = 0;
  KILN_CHECK(!__builtin_mul_overflow(*numel, DTypeSize(dtype), &bytes), "empty: shape ",
             ShapeString(shape), " of ", DTypeName(dtype), " needs more than 2^63 - 1 bytes");
  const size_t nbytes = static_cast<size_t>(bytes);
  auto storage = std::make_shared<Storage>(nbytes, device);
  return Tensor(std::move(storage), Shape(shape.begin(), shape.end()), ContiguousStrides(shape),
                dtype, device, *numel, /*contiguous=*/true);
}

int64_t Tensor::size(int64_t d) const { return impl().shape[ExistingDim("size", d, dim())]; }
int64_t Tensor::stride(int64_t d) const { return impl().strides[ExistingDim("stride", d, dim())]; }

bool Tensor::has_internal_overlap() const {
  const Impl& t = impl();
  if (is_contiguous()) return false;  // the common case (empty tensors too): no sort
  absl::InlinedVector<std::pair<int64_t, int64_t>, 6> dims;  // (|stride|, size) of dims > 1
  for (int64_t i = 0; i < dim(); ++i) {
    if (t.shape[i] <= 1) continue;
    if (t.strides[i] == 0) return true;
    dims.emplace_back(t.strides[i] < 0 ? -t.strides[i] : t.strides[i], t.shape[i]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;  // the largest element distance spanned by the dims sorted so far
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) return true;
    int64_t span = 0;
    if (__builtin_mul_overflow(stride, size - 1, &span) ||
        __builtin_add_overflow(reach, span, &reach)) {
      return true;
    }
  }
  return false;
}

bool Tensor::is_non_overlapping_and_dense() const {
  const Impl& t = impl();
  absl::InlinedVector<std::pair<int64_t, int64_t>, 6> dims;  // (stride, size) of dims > 1
  for (int64_t i = 0; i < dim(); ++i) {
    if (t.shape[i] > 1) dims.emplace_back(t.strides[i], t.shape[i]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected || __builtin_mul_overflow(expected, size, &expected)) return false;
  }
  return true;
}

void* Tensor::data_ptr() const {
  const Impl& t = impl();
  if (t.numel == 0) return nullptr;  // nothing to address (the offset may be any)
  void* base = t.storage == nullptr ? nullptr : t.storage->data();
  if (base == nullptr) {
    throw Error(absl::FailedPreconditionError(
        absl::StrCat("cannot read the data of ", Describe(type()), ": ", NoDataReason(*this))));
  }
  return static_cast<char*>(base) + t.offset * DTypeSize(t.dtype);
}

void Tensor::CheckElementType(int element_type, size_t size) const {
  const DType dtype = impl().dtype;
  const bool fits = element_type == static_cast<int>(dtype) ||
                    (element_type == kBits && static_cast<int64_t>(size) == DTypeSize(dtype));
  if (fits) return;
  throw Error(absl::InvalidArgumentError(absl::StrCat(
      "data<T>(): ", Describe(type()), " holds ", DTypeName(dtype),
      " elements; T must be its type (float, int64_t, int32_t, bool) or an unsigned type of ",
      DTypeSize(dtype), " bytes to read the bits, got a ", size, "-byte ",
      element_type == kBits ? "unsigned type" : "type of another kind")));
}

Tensor Tensor::as_strided(IntList shape, IntList strides, int64_t offset) const {
  const Impl& t = impl();
  ThrowIfError(CheckViewBounds(shape, strides, offset, t.storage.get(), t.dtype));
  return Tensor(t.storage, offset, Shape(shape.begin(), shape.end()),
                Strides(strides.begin(), strides.end()), t.dtype, t.device);
}

bool Tensor::shares_storage(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}

namespace {

// The lowest and highest element index a non-empty tensor reaches in its storage.
std::pair<int64_t, int64_t> ElementExtent(const Tensor& t) {
  const StridedSpan reach = SpanOf(t.shape(), t.strides());  // bounded by as_strided
  const int64_t lo = t.offset() - reach.offset;
  return {lo, lo + reach.span - 1};
}

}  // namespace

MemOverlap GetMemOverlap(const Tensor& a, const Tensor& b) {
  if (a.defined() && a.storage() != nullptr && a.storage()->device().is_meta()) {
    return MemOverlap::kNo;  // no memory (a placeholder's storage: GetLayoutOverlap)
  }
  return GetLayoutOverlap(a, b);
}

MemOverlap GetLayoutOverlap(const Tensor& a, const Tensor& b) {
  if (!a.shares_storage(b) || a.storage() == nullptr || a.numel() == 0 || b.numel() == 0) {
    return MemOverlap::kNo;
  }
  const auto [a_lo, a_hi] = ElementExtent(a);
  const auto [b_lo, b_hi] = ElementExtent(b);
  if (a_hi < b_lo || b_hi < a_lo) return MemOverlap::kNo;
  if (a.offset() == b.offset() && a.shape() == b.shape() && a.strides() == b.strides()) {
    return MemOverlap::kFull;
  }
  if (a.is_non_overlapping_and_dense() && b.is_non_overlapping_and_dense()) {
    return MemOverlap::kPartial;
  }
  return MemOverlap::kTooHard;
}

void CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  KILN_CHECK(!dst_device.is_meta() && !src_device.is_meta(), "copy: cannot copy data from ",
             src_device.str(), " to ", dst_device.str(), ": meta tensors hold no data");
  KILN_CHECK(cuda::IsAvailable(), "copy: cannot copy from ", src_device.str(), " to ",
             dst_device.str(), ": no usable CUDA device");
  cuda::Copy(dst, dst_device, src, src_device, nbytes);
}

}  // namespace kiln
