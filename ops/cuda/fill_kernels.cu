// The factories' fill kernels (see fill_kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cuda/fill_kernels.h"
#include "ops/cuda/float_convert.cuh"

namespace kiln::cuda_kernels {
namespace {

constexpr int kThreads = 256;

int GridFor(int64_t n) {
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65536));
}

template <typename T>
__global__ void FillPatternKernel(T* out, int64_t n, T value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = value;
  }
}

template <typename T>
cudaError_t LaunchPattern(void* out, int64_t n, uint64_t pattern, cudaStream_t stream) {
  FillPatternKernel<T>
      <<<GridFor(n), kThreads, 0, stream>>>(static_cast<T*>(out), n, static_cast<T>(pattern));
  return cudaGetLastError();
}

// The CPU's double -> int64 conversion (runtime/dtype.h DoubleToInt64): truncation, with NaN,
// infinities and values outside int64 giving 0.
__device__ int64_t ToInt64(double v) {
  return (v >= -0x1p63 && v < 0x1p63) ? static_cast<int64_t>(v) : 0;
}

template <typename T>
__device__ void Store(T* out, int64_t i, double v) {
  if constexpr (std::is_same_v<T, bool>) {
    reinterpret_cast<uint8_t*>(out)[i] = v != 0;
  } else if constexpr (std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>) {
    out[i] = static_cast<T>(ToInt64(v));
  } else {
    out[i] = FromFloat<T>(__double2float_rn(v));
  }
}

template <typename T>
__global__ void FillArangeKernel(T* out, int64_t n, double start, double step) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Store(out, i, __dadd_rn(start, __dmul_rn(static_cast<double>(i), step)));
  }
}

template <typename T>
cudaError_t LaunchArange(void* out, int64_t n, double start, double step, cudaStream_t stream) {
  FillArangeKernel<T><<<GridFor(n), kThreads, 0, stream>>>(static_cast<T*>(out), n, start, step);
  return cudaGetLastError();
}

}  // namespace

cudaError_t FillPattern(void* out, int64_t n, int element_bytes, uint64_t pattern,
                        cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  switch (element_bytes) {
    case 1:
      return LaunchPattern<uint8_t>(out, n, pattern, stream);
    case 2:
      return LaunchPattern<uint16_t>(out, n, pattern, stream);
    case 4:
      return LaunchPattern<uint32_t>(out, n, pattern, stream);
    case 8:
      return LaunchPattern<uint64_t>(out, n, pattern, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t FillArange(void* out, int64_t n, DType dtype, double start, double step,
                       cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat32:
      return LaunchArange<float>(out, n, start, step, stream);
    case DType::kFloat16:
      return LaunchArange<__half>(out, n, start, step, stream);
    case DType::kBFloat16:
      return LaunchArange<__nv_bfloat16>(out, n, start, step, stream);
    case DType::kBool:
      return LaunchArange<bool>(out, n, start, step, stream);
    case DType::kInt32:
      return LaunchArange<int32_t>(out, n, start, step, stream);
    case DType::kInt64:
      return LaunchArange<int64_t>(out, n, start, step, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kiln::cuda_kernels
