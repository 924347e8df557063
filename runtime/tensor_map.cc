// TMA tensor maps (see tensor_map.h): checks, then the driver's encoder reached through the
// runtime.
#include "runtime/tensor_map.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>

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

// The driver's encoder over `rank` dims (innermost first), 2-byte or 4-byte elements.
absl::StatusOr<TensorMap> Encode(int rank, const void* base, int element_bytes,
                                 const cuuint64_t* dims, const cuuint64_t* strides,
                                 const cuuint32_t* box, bool swizzle_128b,
                                 const std::string& what) {
  KILN_ASSIGN_OR_RETURN(PFN_cuTensorMapEncodeTiled_v12000 encode, Encoder());
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  TensorMap map{};
  const CUresult r =
      encode(reinterpret_cast<CUtensorMap*>(&map),
             element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
             static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled failed (CUresult ",
                                            static_cast<int>(r), ") for ", what));
  }
  return map;
}

bool StrideOk(int64_t stride_bytes) {
  return stride_bytes > 0 && stride_bytes % 16 == 0 && stride_bytes < (int64_t{1} << 40);
}

std::string Describe(const TensorMap4D& t) {
  return absl::StrCat("[", t.batch, ", ", t.heads, ", ", t.rows, ", ", t.cols,
                      "] of 2-byte elements, strides [", t.batch_stride, ", ", t.head_stride, ", ",
                      t.row_stride, ", 1], box ", t.box_rows, "x", t.box_cols,
                      ", 128-byte swizzle");
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
  else if (t.row_stride < t.cols || !StrideOk(stride_bytes))
    broken = "a row stride of at least cols elements, a multiple of 16 bytes";
  else if (t.box_rows < 1 || t.box_rows > 256 || t.box_cols < 1 || t.box_cols > 256)
    broken = "box sides in 1..256";
  else if (t.swizzle_128b && t.box_cols * t.element_bytes != 128)
    broken = "box rows of 128 bytes with the 128-byte swizzle";
  if (broken != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("TMA tensor map: ", Describe(t), " breaks the rule: ", broken));
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(t.cols), static_cast<cuuint64_t>(t.rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(t.box_cols),
                             static_cast<cuuint32_t>(t.box_rows)};
  return Encode(2, t.base, t.element_bytes, dims, strides, box, t.swizzle_128b, Describe(t));
}

absl::StatusOr<TensorMap> EncodeTensorMap4D(const TensorMap4D& t) {
  const auto base = reinterpret_cast<uintptr_t>(t.base);
  const int64_t sizes[4] = {t.cols, t.rows, t.heads, t.batch};
  // A size-1 dim's stride is never used (a one-key view may carry 0): any legal value stands in
  // for it, here the bytes of a dense head.
  const int64_t fill = t.rows * std::max(t.row_stride, t.cols) * 2;
  int64_t strides[3] = {t.row_stride * 2, t.head_stride * 2, t.batch_stride * 2};
  for (int d = 0; d < 3; ++d) {
    if (sizes[d + 1] == 1) strides[d] = (fill + 15) / 16 * 16;
  }
  const char* broken = nullptr;
  if (base % 16 != 0) {
    broken = "a base address aligned to 16 bytes";
  } else if (t.box_rows < 1 || t.box_rows > 256 || t.box_cols * 2 != 128) {
    broken = "box rows in 1..256 of 128 bytes (the 128-byte swizzle)";
  }
  for (int d = 0; d < 4 && broken == nullptr; ++d) {
    if (sizes[d] < 1 || sizes[d] > (int64_t{1} << 32)) broken = "every size in 1..2^32";
  }
  for (int d = 0; d < 3 && broken == nullptr; ++d) {
    if (!StrideOk(strides[d])) broken = "strides of multiples of 16 bytes, below 2^40 bytes";
  }
  if (broken != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("TMA tensor map: ", Describe(t), " breaks the rule: ", broken));
  }
  cuuint64_t dims[4], byte_strides[3];
  for (int d = 0; d < 4; ++d) dims[d] = static_cast<cuuint64_t>(sizes[d]);
  for (int d = 0; d < 3; ++d) byte_strides[d] = static_cast<cuuint64_t>(strides[d]);
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(t.box_cols),
                             static_cast<cuuint32_t>(t.box_rows), 1, 1};
  return Encode(4, t.base, 2, dims, byte_strides, box, true, Describe(t));
}

}  // namespace kiln::cuda
