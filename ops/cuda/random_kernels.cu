// The Philox fill kernel (see random_kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "ops/cuda/float_convert.cuh"
#include "ops/cuda/random_kernels.h"

namespace kiln::cuda_kernels {
namespace {

template <typename T>
__global__ void FillRandomKernel(T* out, int64_t n, philox::Key key, uint64_t base, bool normal) {
  const int64_t blocks = (n + 3) / 4;
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const philox::Uint4 r = philox::Block(key, base + static_cast<uint64_t>(b));
    float v[4];
    if (normal) {
      const philox::Normal2 z0 = philox::BoxMuller(r.x, r.y), z1 = philox::BoxMuller(r.z, r.w);
      v[0] = z0.a, v[1] = z0.b, v[2] = z1.a, v[3] = z1.b;
    } else {
      // Exact in T (its significand's digits), so that no draw rounds up to 1.
      constexpr int kDigits = std::is_same_v<T, float> ? 24 : std::is_same_v<T, __half> ? 11 : 8;
      v[0] = philox::ToUniform(r.x, kDigits), v[1] = philox::ToUniform(r.y, kDigits);
      v[2] = philox::ToUniform(r.z, kDigits), v[3] = philox::ToUniform(r.w, kDigits);
    }
    const int64_t first = 4 * b;
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      if (first + lane < n) out[first + lane] = FromFloat<T>(v[lane]);
    }
  }
}

template <typename T>
cudaError_t Launch(void* out, int64_t n, philox::Key key, uint64_t base, bool normal,
                   cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = (n + 3) / 4;
  const int grid = static_cast<int>(std::min<int64_t>((blocks + threads - 1) / threads, 65536));
  FillRandomKernel<T><<<grid, threads, 0, stream>>>(static_cast<T*>(out), n, key, base, normal);
  return cudaGetLastError();
}

}  // namespace

cudaError_t FillRandom(void* out, int64_t n, ElemType t, philox::Key key, uint64_t base,
                       bool normal, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  switch (t) {
    case ElemType::kF32:
      return Launch<float>(out, n, key, base, normal, stream);
    case ElemType::kF16:
      return Launch<__half>(out, n, key, base, normal, stream);
    case ElemType::kBF16:
      return Launch<__nv_bfloat16>(out, n, key, base, normal, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kiln::cuda_kernels
