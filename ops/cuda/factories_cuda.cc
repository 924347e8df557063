// The factories' device fills (see factories_cuda.h).
#include "ops/cuda/factories_cuda.h"

#include "ops/cuda/elem_type.h"
#include "ops/cuda/fill_kernels.h"
#include "ops/cuda/random_kernels.h"
#include "runtime/cuda_api.h"

namespace kiln::cuda_ops {

void FillBytes(const Tensor& out, uint64_t pattern) {
  const size_t element = DTypeSize(out.dtype());
  if (pattern == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, element * static_cast<size_t>(out.numel()),
                                    cuda::CurrentStream()));
    return;
  }
  KILN_CUDA_CHECK(cuda_kernels::FillPattern(out.data_ptr(), out.numel(), static_cast<int>(element),
                                            pattern, cuda::CurrentStream()));
}

void FillArange(const Tensor& out, double start, double step) {
  KILN_CUDA_CHECK(cuda_kernels::FillArange(out.data_ptr(), out.numel(), out.dtype(), start, step,
                                           cuda::CurrentStream()));
}

void FillRandom(const Tensor& out, philox::Key key, uint64_t base, bool normal) {
  const cuda_kernels::ElemType t = *cuda_kernels::ElemTypeOf(out.dtype());
  KILN_CUDA_CHECK(cuda_kernels::FillRandom(out.data_ptr(), out.numel(), t, key, base, normal,
                                           cuda::CurrentStream()));
}

}  // namespace kiln::cuda_ops
