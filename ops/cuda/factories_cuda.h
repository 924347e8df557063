// The factories' device fills on CUDA (ops/factories.cc calls them for CUDA tensors): each
// writes a whole contiguous tensor on the current stream, never staged on the host.
//
//   if constexpr (kWithCuda) {
//     if (out.device().is_cuda()) return cuda_ops::FillBytes(out, pattern);
//   }
#pragma once

#include <cstdint>

#include "runtime/philox.h"
#include "runtime/tensor.h"

namespace kiln::cuda_ops {

// Every element's bytes become the low DTypeSize bytes of `pattern` (a memset when zero).
void FillBytes(const Tensor& out, uint64_t pattern);
// out[i] = start + i * step, computed in double on the device and converted to out's dtype.
void FillArange(const Tensor& out, double start, double step);
// Philox draws from counter `base` under `key`: the same numbers as the host loop
// (runtime/philox.h), uniform or normal. `out` is floating point.
void FillRandom(const Tensor& out, philox::Key key, uint64_t base, bool normal);

}  // namespace kiln::cuda_ops
