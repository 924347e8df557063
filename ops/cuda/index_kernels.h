// CUDA kernels of the indexing and selection rows over raw device pointers: the gather family's
// IndexPlan (embedding, index_select, gather, cat's copies), argmax over rows, and topk over
// rows by radix select. They know nothing of kiln tensors (ops/cuda/index_cuda.cc adapts them).
// Each launcher launches on `stream` and returns the launch's error.
//
//   unsigned* bad = ...;                 // a zeroed device word
//   RunIndexPlan(plan, n, out, weight, indices, bad, stream);
//   // after a stream sync: *bad != 0 if some index was outside [0, plan.bound)
//
// Ordering (argmax, topk): values compare as torch does, NaN above everything and -0.0 equal to
// +0.0, ties going to the lowest index; topk's result is sorted (largest first, or smallest
// first), so it equals the CPU reference's stable sort element for element.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cuda/elem_type.h"
#include "ops/index_plan.h"

namespace kiln::cuda_kernels {

// Copies elem_size bytes per output element as the plan says (n = the output's numel; a
// scatter's: the source's). An index outside [0, bound) writes zero bytes for that element (a
// scatter writes nothing) and sets *bad to 1; with
// bad == nullptr the flag is a device global instead, read by TakeGlobalIndexError (for work
// captured into a CUDA graph, where the launcher cannot wait for the kernel).
cudaError_t RunIndexPlan(const IndexPlan& plan, int64_t n, void* out, const void* src,
                         const void* index, unsigned* bad, cudaStream_t stream);
// A scatter plan's adds: out[...] += src[o] by atomicAdd in `t` (any ElemType; integers wrap),
// n = the index's numel; a bad index adds nothing and raises the flag as RunIndexPlan does.
// Repeated indices accumulate in an unspecified order (floating sums may differ in the last bits
// from run to run).
cudaError_t ScatterAddPlan(const IndexPlan& plan, int64_t n, void* out, const void* src,
                           const void* index, ElemType t, unsigned* bad, cudaStream_t stream);
// Sets *bad to 1 if some index[i * stride], i < n (int64, else int32), is outside [0, bound).
cudaError_t CheckIndexRange(const void* index, int64_t n, int64_t stride, bool is64, int64_t bound,
                            unsigned* bad, cudaStream_t stream);
// Reads and clears the device-global flag; waits for `stream`.
cudaError_t TakeGlobalIndexError(bool* seen, cudaStream_t stream);
// The device-global flag's address on the current device (for kernels compiled elsewhere that
// raise it: the decode attention's fused KV-cache append).
cudaError_t GlobalIndexErrorFlag(unsigned** flag);

// out[r] = the index of the largest value of x[r, 0..n) for a contiguous [rows, n] x, n >= 1.
// `clusters`: the device has thread-block clusters (sm_90), which few long rows then use.
cudaError_t ArgMaxRows(const void* x, int64_t* out, int64_t rows, int64_t n, ElemType t,
                       bool clusters, cudaStream_t stream);

// out[r, 0..k) = the indices of the k largest (or smallest) values of x[r, 0..n), sorted, for a
// contiguous [rows, n] x and contiguous [rows, k] out; 1 <= k <= min(n, kTopKMaxK).
inline constexpr int64_t kTopKMaxK = 1024;
cudaError_t TopKRows(const void* x, int64_t* out, int64_t rows, int64_t n, int64_t k, bool largest,
                     ElemType t, cudaStream_t stream);

// out[r, i] = x[r, 0] + ... + x[r, i] for a contiguous [rows, n] x and out: floats (f32, f16,
// bf16) summed in float32 and stored in x's type, integers (i32, i64) summed in int64 (wrapping)
// and stored as int64.
cudaError_t CumsumRows(const void* x, void* out, int64_t rows, int64_t n, ElemType t,
                       cudaStream_t stream);

}  // namespace kiln::cuda_kernels
