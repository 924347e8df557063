// Tensor: a shared handle to (storage, offset, shape, strides, dtype, device).
//
// Copying a Tensor copies the handle, not the data. Views (transpose, slice, expand, ...) are new
// handles over the same storage with other metadata; they are built by the ops layer
// (ops/views.h) through as_strided(). Element offsets and strides count elements, not bytes.
//
//   Tensor t = Tensor::Empty({2, 3}, DType::kFloat32, kCPU);
//   float* p = t.data<float>();
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "runtime/shape.h"
#include "runtime/status.h"  // kiln::Error, which the tensor API throws
#include "runtime/storage.h"

namespace kiln {

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor
  Tensor(std::shared_ptr<Storage> storage, int64_t offset, Shape shape, Strides strides,
         DType dtype, Device device);

  // A new contiguous tensor with uninitialised memory (none at all on Meta).
  static Tensor Empty(IntList shape, DType dtype, Device device);
  static Tensor Empty(const TensorType& type) { return Empty(type.shape, type.dtype, type.device); }

  bool defined() const { return impl_ != nullptr; }
  // Every accessor below throws kiln::Error on an undefined tensor (Tensor()).
  const Shape& shape() const { return impl().shape; }
  const Strides& strides() const { return impl().strides; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;    // negative d counts from the end
  int64_t stride(int64_t d) const;  // likewise
  int64_t numel() const { return impl().numel; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().device; }
  int64_t offset() const { return impl().offset; }
  int64_t element_size() const { return DTypeSize(impl().dtype); }
  TensorType type() const { return TensorType{impl().shape, impl().dtype, impl().device}; }
  std::string shape_string() const { return ShapeString(impl().shape); }

  bool is_contiguous() const { return impl().contiguous; }
  // True if some element may be reachable by two indices: a stride-0 dim of size > 1 (an
  // expanded view), or strides that do not nest (as_strided views like [2, 2] over strides
  // [1, 1]). Conservative: a layout it cannot prove non-overlapping counts as overlapping.
  bool has_internal_overlap() const;
  // True if some permutation of the dims makes the tensor contiguous (torch's
  // is_non_overlapping_and_dense): contiguous tensors, transposes and permutations of them.
  bool is_non_overlapping_and_dense() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  // True for a tensor on a real device (CPU, CUDA) whose storage holds no memory: a placeholder
  // standing for a value while a function is traced (ir/tracer.h). Its data cannot be read.
  bool is_placeholder() const {
    const Impl& t = impl();
    return !t.device.is_meta() && t.storage != nullptr && t.storage->device().is_meta();
  }
  // The address of element 0. Throws kiln::Error for a tensor with elements but no memory (a
  // meta tensor, a tracing placeholder) instead of handing out a null pointer; nullptr when the
  // tensor has no elements (an empty view may have any offset).
  void* data_ptr() const;
  // data_ptr() as T*, once T fits the dtype (as torch's data_ptr<T>()): float for float32,
  // int64_t, int32_t and bool for theirs; an unsigned integer type of the element's size reads
  // the bits (uint16_t for bfloat16 and float16); any other T throws kiln::Error naming both.
  template <typename T>
  T* data() const {
    CheckElementType(ElementTypeOf<T>(), sizeof(T));
    return static_cast<T*>(data_ptr());
  }

  // A view over the same storage. Throws kiln::Error when an element of the view would lie
  // outside the storage (or the view's size overflows).
  Tensor as_strided(IntList shape, IntList strides, int64_t offset) const;
  // How many handles share this tensor object (copies of this Tensor), and how many tensor
  // objects share its storage: the tracer tells tensors only it holds from the user's.
  long handle_count() const { return impl_.use_count(); }
  // True if both handles refer to the same tensor object (not merely the same storage).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  bool shares_storage(const Tensor& other) const;

 private:
  struct Impl;
  const Impl& impl() const {
    if (__builtin_expect(impl_ == nullptr, 0)) ThrowUndefined();
    return *impl_;
  }
  [[noreturn]] static void ThrowUndefined();
  // What data<T>() accepts of T: a dtype's own type, any unsigned type of the element's size
  // (kBits), or nothing (kNone).
  static constexpr int kBits = -1, kNone = -2;
  template <typename T>
  static constexpr int ElementTypeOf() {
    if constexpr (std::is_same_v<T, float>) return static_cast<int>(DType::kFloat32);
    if constexpr (std::is_same_v<T, int64_t>) return static_cast<int>(DType::kInt64);
    if constexpr (std::is_same_v<T, int32_t>) return static_cast<int>(DType::kInt32);
    if constexpr (std::is_same_v<T, bool>) return static_cast<int>(DType::kBool);
    if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T> && !std::is_same_v<T, bool>) {
      return kBits;
    }
    return kNone;
  }
  void CheckElementType(int element_type, size_t size) const;
  // For callers that already know the element count and contiguity (Empty).
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Strides strides, DType dtype, Device device,
         int64_t numel, bool contiguous);

  struct Impl {
    std::shared_ptr<Storage> storage;
    int64_t offset = 0;
    Shape shape;
    Strides strides;
    DType dtype = DType::kFloat32;
    Device device;
    // Derived once from shape and strides (an Impl never changes): the dispatcher asks for
    // both several times per op.
    int64_t numel = 0;
    bool contiguous = false;
  };
  std::shared_ptr<Impl> impl_;
};

// How the memory of two tensors overlaps (torch's MemOverlapStatus): not at all, fully (the same
// elements in the same layout), partially (both dense, some elements shared), or in a way too hard
// to tell without enumerating elements (strided views whose element ranges intersect).
enum class MemOverlap { kNo, kFull, kPartial, kTooHard };
MemOverlap GetMemOverlap(const Tensor& a, const Tensor& b);
// The same by the layouts alone, for tensors on one storage object that holds no memory (a
// trace's placeholders: views of one input share theirs); GetMemOverlap says kNo for those.
MemOverlap GetLayoutOverlap(const Tensor& a, const Tensor& b);

// Copies `nbytes` between two buffers on any devices (CUDA copies go through runtime/cuda.h).
// Throws kiln::Error if the transfer is impossible (meta tensors, no GPU).
void CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);

}  // namespace kiln
