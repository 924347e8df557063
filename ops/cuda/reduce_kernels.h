// CUDA launchers for row reductions and normalisations over raw device pointers: layer_norm and
// rms_norm, sum/mean/max of the inner dim, and the triangular masks (softmax and log_softmax are
// the softmax family's: codegen/families/softmax/fused_softmax_cuda.h). They know nothing of kiln
// tensors (ops/cuda/reduce_cuda.cc adapts those) and take contiguous buffers only. Each launcher
// checks its arguments, launches on `stream` and returns the launch's error (cudaGetLastError); an
// empty problem launches nothing and returns cudaSuccess.
//
//   // y[r, :] = layer_norm(x[r, :]) for a contiguous bf16 [rows, n] tensor, no weight or bias
//   cudaError_t err = RowNorm(x, nullptr, nullptr, y, rows, n, 1e-5, /*rms=*/false,
//                             ElemType::kBF16, ElemType::kBF16, stream);
//
// Semantics are those of the CPU reference kernels (ops/cpu/reduce.cc, ops/cpu/elementwise.cc):
// float32 math (double for the sums of RowReduce and the row means of layer_norm), max propagates
// NaN.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "elem_type.h"  // not "ops/cuda/...": reduce_kernels.cu also builds with plain nvcc -c

namespace kiln::cuda_kernels {

// LayerNorm (rms == false) or RMSNorm (rms == true) over the last dim of contiguous [rows, n]
// buffers: y = (x - mean) / sqrt(var + eps) * weight + bias, with mean = 0 for RMSNorm.
// weight and bias ([n] each, of type weight_t: t or kF32) may be null. y may equal x.
// dependent_launch: a programmatic dependent launch (runtime/cuda.h LaunchDependent).
cudaError_t RowNorm(const void* x, const void* weight, const void* bias, void* y, int64_t rows,
                    int64_t n, double eps, bool rms, ElemType t, ElemType weight_t,
                    cudaStream_t stream, bool dependent_launch = false);

// Reduction ops of RowReduce.
inline constexpr int kReduceSum = 0;
inline constexpr int kReduceMean = 1;
inline constexpr int kReduceMax = 2;
inline constexpr int kReduceProd = 3;

// y[o] = op(x[o, 0 .. inner)) for a contiguous [outer, inner] x. in_t must equal out_t, a floating
// type or kI64 (which supports sum, max and prod). Float sums and products accumulate in double,
// int64 ones in int64 (wrapping). An empty row (inner == 0) gives 0 for sum, 1 for prod, NaN for
// mean and -inf (int64: INT64_MIN) for max. Few long rows are split across blocks, with partials in
// a scratch buffer from cudaMallocAsync on `stream`.
cudaError_t RowReduce(const void* x, void* y, int64_t outer, int64_t inner, int op, ElemType in_t,
                      ElemType out_t, cudaStream_t stream);

// Triangular mask over the last two dims of a contiguous [batch, rows, cols] tensor: y keeps the
// element (bit copy) where col - row >= diagonal (upper) or col - row <= diagonal (lower), else
// zero bits. elem_size is 1, 2, 4 or 8 bytes. y may equal x.
cudaError_t Triangular(const void* x, void* y, int64_t batch, int64_t rows, int64_t cols,
                       int64_t diagonal, bool upper, int elem_size, cudaStream_t stream);

}  // namespace kiln::cuda_kernels
