// CUDA fill kernels of the factories (full, zeros, ones, arange): the values are written on the
// device, so a factory never stages its tensor in host memory (a huge request fails with the
// allocator's out-of-memory error before anything else is allocated) and can run inside a CUDA
// graph capture.
//
//   uint64_t pattern = 0;  StorerFor(dtype)(&pattern, 0, value);  // the element's bytes
//   KILN_CUDA_CHECK(FillPattern(ptr, n, DTypeSize(dtype), pattern, stream));
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/dtype.h"

namespace kiln::cuda_kernels {

// out[i] = the `element_bytes` (1, 2, 4 or 8) low bytes of `pattern`, for i in [0, n) of a
// contiguous buffer. Returns the launch's error; n == 0 launches nothing.
cudaError_t FillPattern(void* out, int64_t n, int element_bytes, uint64_t pattern,
                        cudaStream_t stream);
// out[i] = start + i * step, computed in double (no fused multiply-add) and stored in `dtype` as
// the CPU's StorerFor stores it (halves through float, integers truncated, bool as != 0).
cudaError_t FillArange(void* out, int64_t n, DType dtype, double start, double step,
                       cudaStream_t stream);

}  // namespace kiln::cuda_kernels
