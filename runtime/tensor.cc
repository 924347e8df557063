// Tensor handle: construction, metadata queries, raw views and byte copies between devices.
#include "runtime/tensor.h"

#include <cstring>

#include "runtime/cuda.h"
#include "runtime/status.h"

namespace kiln {
namespace {

int64_t WrapOrThrow(int64_t d, int64_t rank) { return ValueOrThrow(WrapDim(d, rank)); }

}  // namespace

Tensor::Tensor(std::shared_ptr<Storage> storage, int64_t offset, Shape shape, Strides strides,
               DType dtype, Device device)
    : impl_(std::make_shared<Impl>(
          Impl{std::move(storage), offset, std::move(shape), std::move(strides), dtype, device})) {}

Tensor Tensor::Empty(IntList shape, DType dtype, Device device) {
  for (int64_t d : shape) {
    KILN_CHECK(d >= 0, "empty: negative dimension in shape ", ShapeString(shape));
  }
  const size_t nbytes = static_cast<size_t>(NumElements(shape) * DTypeSize(dtype));
  auto storage = std::make_shared<Storage>(nbytes, device);
  return Tensor(std::move(storage), 0, Shape(shape.begin(), shape.end()), ContiguousStrides(shape),
                dtype, device);
}

int64_t Tensor::size(int64_t d) const { return impl_->shape[WrapOrThrow(d, dim())]; }
int64_t Tensor::stride(int64_t d) const { return impl_->strides[WrapOrThrow(d, dim())]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

bool Tensor::has_internal_overlap() const {
  for (int64_t i = 0; i < dim(); ++i) {
    if (impl_->strides[i] == 0 && impl_->shape[i] > 1) return true;
  }
  return false;
}

void* Tensor::data_ptr() const {
  if (impl_->storage == nullptr || impl_->storage->data() == nullptr) return nullptr;
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * element_size();
}

Tensor Tensor::as_strided(IntList shape, IntList strides, int64_t offset) const {
  return Tensor(impl_->storage, offset, Shape(shape.begin(), shape.end()),
                Strides(strides.begin(), strides.end()), impl_->dtype, impl_->device);
}

bool Tensor::shares_storage(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
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
