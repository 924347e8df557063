// CUDA launchers for row reductions and normalisations over raw device pointers: softmax and
// log_softmax, layer_norm and rms_norm, sum/mean/max of the inner dim, and the triangular masks.
// They know nothing of kiln tensors (ops/cuda/reduce_cuda.cc adapts those) and take contiguous
// buffers only. Each launcher checks its arguments, launches on `stream` and returns the launch's
// error (cudaGetLastError); an empty problem launches nothing and returns cudaSuccess.
//
//   // y[r, :] = softmax(x[r, :]) for a contiguous bf16 [rows, n] tensor
//   cudaError_t err = RowSoftmax(x, y, rows, n, ElemType::kBF16, /*log=*/false, stream);
//
// Semantics are those of the CPU reference kernels (ops/cpu/reduce.cc, ops/cpu/elementwise.cc):
// float32 math (double for the sums of RowReduce, the row means of layer_norm and the log-sum-exp
// of log_softmax), a row of all -inf gives NaN in softmax and log_softmax, max propagates NaN.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "elem_type.h"  // not "ops/cuda/...": reduce_kernels.cu also builds with plain nvcc -c

namespace kiln::cuda_kernels {

// y[r, :] = softmax(x[r, :]) (log_softmax when `log`) for contiguous [rows, n] buffers of a
// floating type. y may equal x (in place). Rows of up to 16384 elements (8192 when n * size or a
// pointer is not a multiple of 16 bytes) stay in registers: read once, written once. Longer rows
// are read three times. dependent_launch: a programmatic dependent launch (runtime/cuda.h).
cudaError_t RowSoftmax(const void* x, void* y, int64_t rows, int64_t n, ElemType t, bool log,
                       cudaStream_t stream, bool dependent_launch = false);

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

// y[o] = op(x[o, 0 .. inner)) for a contiguous [outer, inner] x. in_t must equal out_t, a floating
// type or kI64 (which supports sum and max only). Float sums accumulate in double, int64 sums in
// int64. An empty row (inner == 0) gives 0 for sum, NaN for mean and -inf (int64: INT64_MIN) for
// max. Few long rows are split across blocks, with partials in a scratch buffer from
// cudaMallocAsync on `stream`.
cudaError_t RowReduce(const void* x, void* y, int64_t outer, int64_t inner, int op, ElemType in_t,
                      ElemType out_t, cudaStream_t stream);

// Triangular mask over the last two dims of a contiguous [batch, rows, cols] tensor: y keeps the
// element (bit copy) where col - row >= diagonal (upper) or col - row <= diagonal (lower), else
// zero bits. elem_size is 1, 2, 4 or 8 bytes. y may equal x.
cudaError_t Triangular(const void* x, void* y, int64_t batch, int64_t rows, int64_t cols,
                       int64_t diagonal, bool upper, int elem_size, cudaStream_t stream);

}  // namespace kiln::cuda_kernels
