// TMA tensor maps (see tensor_map.h): checks, then the driver's encoder reached through the
// runtime.
#include "runtime/tensor_map.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include "absl/strings/str_cat.h"
#include "runtime/cuda_api.h"
#include "runtime/status.h"

namespace kiln::cuda {
namespace {

static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) &&
                  alignof(TensorMap) >= alignof(CUtensorMap),
              "kiln's TensorMap must be CUtensorMap's size, at least its alignment");

// cuTensorMapEncodeTiled, looked up once (CUDA 12.0's ABI of it).
absl::StatusOr<PFN_cuTensorMapEncodeTiled_v12000> Encoder() {
  static const absl::StatusOr<PFN_cuTensorMapEncodeTiled_v12000> encoder =
      []() -> absl::StatusOr<PFN_cuTensorMapEncodeTiled_v12000> {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                           cudaEnableDefault, &found);
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
      cudaGetLastError();
      return absl::UnavailableError(absl::StrCat("TMA: the driver has no cuTensorMapEncodeTiled (",
                                                 cudaGetErrorString(e), ")"));
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

std::string Describe(const TensorMap2D& t) {
  return absl::StrCat("[", t.rows, ", ", t.cols, "] of ", t.element_bytes,
                      "-byte elements, row stride ", t.row_stride, ", box ", t.box_rows, "x",
                      t.box_cols, t.swizzle_128b ? ", 128-byte swizzle" : "");
}

}  // namespace

absl::StatusOr<TensorMap> EncodeTensorMap2D(const TensorMap2D& t) {
  const auto base = reinterpret_cast<uintptr_t>(t.base);
  const int64_t stride_bytes = t.row_stride * t.element_bytes;
  const char* broken = nullptr;
  if (t.element_bytes != 2 && t.element_bytes != 4)
    broken = "elements of 2 or 4 bytes";
  else if (base % 16 != 0)
    broken = "a base address aligned to 16 bytes";
  else if (t.rows < 1 || t.cols < 1 || t.rows > (int64_t{1} << 32) || t.cols > (int64_t{1} << 32))
    broken = "1..2^32 rows and columns";
  else if (t.row_stride < t.cols || stride_bytes % 16 != 0 || stride_bytes >= (int64_t{1} << 40))
    broken = "a row stride of at least cols elements, a multiple of 16 bytes";
  else if (t.box_rows < 1 || t.box_rows > 256 || t.box_cols < 1 || t.box_cols > 256)
    broken = "box sides in 1..256";
  else if (t.swizzle_128b && t.box_cols * t.element_bytes != 128)
    broken = "box rows of 128 bytes with the 128-byte swizzle";
  if (broken != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("TMA tensor map: ", Describe(t), " breaks the rule: ", broken));
  }
  KILN_ASSIGN_OR_RETURN(PFN_cuTensorMapEncodeTiled_v12000 encode, Encoder());
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(t.cols), static_cast<cuuint64_t>(t.rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(t.box_cols),
                             static_cast<cuuint32_t>(t.box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  TensorMap map{};
  const CUresult r = encode(
      reinterpret_cast<CUtensorMap*>(&map),
      t.element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
      const_cast<void*>(t.base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      t.swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled failed (CUresult ",
                                            static_cast<int>(r), ") for ", Describe(t)));
  }
  return map;
}

}  // namespace kiln::cuda
