// CUDA fill kernel of kiln's random factories (rand, randn): Philox4x32-10 samples computed on
// the device with the same code as the CPU path (runtime/philox.h), so a Generator gives the same
// tensor on either device.
//
//   uint64_t base = gen.Reserve((n + 3) / 4);
//   KILN_CUDA_CHECK(FillRandom(ptr, n, ElemType::kBF16, gen.key(), base, /*normal=*/true, s));
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cuda/elem_type.h"
#include "runtime/philox.h"

namespace kiln::cuda_kernels {

// out[i] = sample i of the draw that starts at Philox block `base` of `key` (uniform in [0, 1), or
// standard normal), for a contiguous buffer of n elements of a floating type. One thread per
// Philox block (four samples). Returns the launch's error; n == 0 launches nothing.
cudaError_t FillRandom(void* out, int64_t n, ElemType t, philox::Key key, uint64_t base,
                       bool normal, cudaStream_t stream);

}  // namespace kiln::cuda_kernels
