// TMA tensor maps (Hopper's tensor memory accelerator): the 128-byte descriptor a kernel's
// `cp.async.bulk.tensor` reads to copy a box of a 2-D global tensor into shared memory.
//
// Encoded on the host by the driver's cuTensorMapEncodeTiled, reached through the runtime
// (cudaGetDriverEntryPointByVersion) so that kiln links no driver library. A map holds the global
// address, shape and strides: it is encoded anew for each operand (a captured CUDA graph keeps
// the kernel parameters it was captured with, the map among them). Kernels take it by value as a
// `const __grid_constant__` parameter.
//
//   KILN_ASSIGN_OR_RETURN(cuda::TensorMap map,
//                         cuda::EncodeTensorMap2D({.base = a.data_ptr(), .element_bytes = 2,
//                                                  .rows = m, .cols = k, .row_stride = k,
//                                                  .box_rows = 128, .box_cols = 64}));
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace kiln::cuda {

// CUDA's CUtensorMap, by size and alignment (its fields are opaque).
struct alignas(128) TensorMap {
  uint64_t opaque[16];
};

// A row-major 2-D tensor of `rows` x `cols` elements of `element_bytes` (2: bf16/f16 as raw 16-bit
// data, 4: float32), rows `row_stride` elements apart, copied in boxes of box_rows x box_cols.
// Elements outside the tensor read as zeros. `swizzle_128b`: shared memory rows of 128 bytes with
// the 128-byte swizzle wgmma's descriptors expect (box_cols * element_bytes must then be 128).
struct TensorMap2D {
  const void* base = nullptr;
  int element_bytes = 2;
  int64_t rows = 0, cols = 0, row_stride = 0;
  int box_rows = 0, box_cols = 0;
  bool swizzle_128b = true;
};

// The map, or an error naming the rule broken: base 16-byte aligned, row stride a multiple of 16
// bytes, 1 <= box sides <= 256, rows and cols in 1..2^32 (the driver's limits).
absl::StatusOr<TensorMap> EncodeTensorMap2D(const TensorMap2D& t);

// A [batch, heads, rows, cols] tensor of 2-byte elements with any element strides (cols
// contiguous), copied in boxes of box_rows x box_cols of one (batch, head): attention's q, k and
// v, [B, H, T, D] or a [B, T, H, D] tensor viewed as one, read in place. A kernel addresses a box
// by (col, row, head, batch). Strides of size-1 dims do not matter.
struct TensorMap4D {
  const void* base = nullptr;
  int64_t batch = 1, heads = 1, rows = 0, cols = 0;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
  int box_rows = 0, box_cols = 0;  // box_cols * 2 == 128: the 128-byte swizzle
};
// The map, or an error naming the rule broken: EncodeTensorMap2D's, for every stride of a dim
// larger than 1.
absl::StatusOr<TensorMap> EncodeTensorMap4D(const TensorMap4D& t);

}  // namespace kiln::cuda
