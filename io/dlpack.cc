// DLPack export and import (see dlpack.h).
#include "io/dlpack.h"

#include <dlpack/dlpack.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "io/from_blob.h"
#include "runtime/status.h"

namespace kiln {
namespace {

// kDLBool of DLPack >= 0.8 (Debian 12's header is 0.6, which has no bool code).
constexpr uint8_t kDLBoolCode = 6;

// What the DLManagedTensor of to_dlpack points to: the tensor (keeping its storage alive) and
// the shape and strides arrays.
struct ExportContext {
  Tensor tensor;
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
};

DLDataType ToDLDataType(DType t) {
  switch (t) {
    case DType::kFloat32:
      return {kDLFloat, 32, 1};
    case DType::kFloat16:
      return {kDLFloat, 16, 1};
    case DType::kBFloat16:
      return {kDLBfloat, 16, 1};
    case DType::kInt32:
      return {kDLInt, 32, 1};
    case DType::kInt64:
      return {kDLInt, 64, 1};
    case DType::kBool:
      return {kDLBoolCode, 8, 1};
  }
  return {kDLOpaqueHandle, 0, 1};
}

std::optional<DType> FromDLDataType(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  const std::pair<DLDataType, DType> table[] = {
      {{kDLFloat, 32, 1}, DType::kFloat32},   {{kDLFloat, 16, 1}, DType::kFloat16},
      {{kDLBfloat, 16, 1}, DType::kBFloat16}, {{kDLInt, 32, 1}, DType::kInt32},
      {{kDLInt, 64, 1}, DType::kInt64},       {{kDLBoolCode, 8, 1}, DType::kBool}};
  for (const auto& [dl, dtype] : table) {
    if (dl.code == t.code && dl.bits == t.bits) return dtype;
  }
  return std::nullopt;
}

std::optional<Device> FromDLDevice(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      return kCPU;
    case kDLCUDA:
    case kDLCUDAManaged:
      return CUDA(d.device_id);
    default:
      return std::nullopt;
  }
}

void DeleteExport(DLManagedTensor* self) { delete static_cast<ExportContext*>(self->manager_ctx); }

}  // namespace

DLManagedTensor* to_dlpack(const Tensor& t) {
  KILN_CHECK(t.defined(), "to_dlpack: the tensor is undefined");
  KILN_CHECK(!t.device().is_meta() && (t.numel() == 0 || t.data_ptr() != nullptr),
             "to_dlpack: ", Describe(t.type()), " holds no memory to share");
  auto ctx = std::make_unique<ExportContext>();
  ctx->tensor = t;
  ctx->shape.assign(t.shape().begin(), t.shape().end());
  ctx->strides.assign(t.strides().begin(), t.strides().end());
  DLTensor& dl = ctx->managed.dl_tensor;
  dl.data = t.storage() != nullptr ? t.storage()->data() : nullptr;
  dl.byte_offset = dl.data != nullptr ? static_cast<uint64_t>(t.offset() * t.element_size()) : 0;
  dl.device = t.device().is_cuda() ? DLDevice{kDLCUDA, t.device().index} : DLDevice{kDLCPU, 0};
  dl.ndim = static_cast<int>(t.dim());
  dl.dtype = ToDLDataType(t.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = DeleteExport;
  return &ctx.release()->managed;
}

Tensor from_dlpack(DLManagedTensor* managed) {
  KILN_CHECK(managed != nullptr, "from_dlpack: null DLManagedTensor");
  const DLTensor& dl = managed->dl_tensor;
  const std::optional<DType> dtype = FromDLDataType(dl.dtype);
  KILN_CHECK(dtype.has_value(), "from_dlpack: unsupported dtype (code ", int{dl.dtype.code}, ", ",
             int{dl.dtype.bits}, " bits, ", dl.dtype.lanes, " lanes); kiln takes float ",
             "32/16, bfloat 16, int 32/64 and bool, one lane");
  const std::optional<Device> device = FromDLDevice(dl.device);
  KILN_CHECK(device.has_value(), "from_dlpack: unsupported device type ",
             static_cast<int>(dl.device.device_type), " (kiln takes kDLCPU, kDLCUDA, ",
             "kDLCUDAHost, kDLCUDAManaged)");
  KILN_CHECK(dl.ndim >= 0 && (dl.ndim == 0 || dl.shape != nullptr), "from_dlpack: invalid ndim ",
             dl.ndim, " or null shape");
  const Shape shape(dl.shape, dl.shape + dl.ndim);
  const Strides strides =
      dl.strides != nullptr ? Strides(dl.strides, dl.strides + dl.ndim) : ContiguousStrides(shape);
  const int64_t elem = DTypeSize(*dtype);
  // The first element is at data + byte_offset (checked for range before any pointer
  // arithmetic, and for alignment by from_blob). The storage starts at `data` when the offset is
  // whole elements (kept as the tensor's offset), else at the first element.
  const uint64_t byte_offset = dl.data != nullptr ? dl.byte_offset : 0;
  KILN_CHECK(byte_offset <= static_cast<uint64_t>(INT64_MAX) &&
                 byte_offset <= UINTPTR_MAX - reinterpret_cast<uintptr_t>(dl.data),
             "from_dlpack: byte_offset ", byte_offset, " is out of range");
  const bool whole = byte_offset % static_cast<uint64_t>(elem) == 0;
  const int64_t offset = whole ? static_cast<int64_t>(byte_offset) / elem : 0;
  char* base = static_cast<char*>(dl.data) + (whole ? 0 : byte_offset);
  KILN_CHECK(reinterpret_cast<uintptr_t>(base + offset * elem) % static_cast<uintptr_t>(elem) == 0,
             "from_dlpack: data + byte_offset ", byte_offset, " is not aligned to the ", elem,
             " bytes of a ", DTypeName(*dtype), " element");
  // Validates sizes, strides, alignment and the pointer's device; throws before taking ownership.
  Tensor view = WithErrorContext(
      [] { return std::string("from_dlpack"); },
      [&] { return from_blob(base + offset * elem, shape, strides, *dtype, *device); });
  int64_t total = 0;
  KILN_CHECK(!__builtin_add_overflow(offset, view.storage()->nbytes() / elem, &total),
             "from_dlpack: byte_offset ", byte_offset, " and the view's extent overflow");
  auto deleter = [managed](void*) {
    if (managed->deleter != nullptr) managed->deleter(managed);
  };
  return from_blob(base, {total}, *dtype, *device, deleter).as_strided(shape, strides, offset);
}

}  // namespace kiln
