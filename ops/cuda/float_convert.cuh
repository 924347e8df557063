// Device-side conversions between kiln's floating storage types (float, __half, __nv_bfloat16)
// and the float every nvcc-built kernel computes in: ToFloat(x), FromFloat<T>(v) (round to
// nearest even). Shared by the reduction, softmax/norm and random kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace kiln::cuda_kernels {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

}  // namespace kiln::cuda_kernels
