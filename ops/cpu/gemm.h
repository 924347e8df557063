// Single-precision general matrix multiply (GEMM) for kiln's CPU backend.
//
// GemmF32 is a cache-blocked, register-tiled and multi-threaded implementation of the BLAS
// sgemm contract on row-major matrices. It picks an AVX2/FMA micro-kernel at run time when the
// CPU supports it and falls back to portable C++ otherwise, so callers need no special flags.

#ifndef KILN_OPS_CPU_GEMM_H_
#define KILN_OPS_CPU_GEMM_H_

#include <cstdint>

namespace kiln::cpu {

// C[m, n] = alpha * sum_k op(A)[m, k] * op(B)[k, n] + beta * C[m, n]
//
// op(A) = A if !trans_a (A is row-major M x K with leading dim lda), else A^T (A stored K x M,
// lda). op(B) likewise: B is K x N (ldb) or, with trans_b, stored N x K. C is row-major M x N with
// leading dim ldc. beta == 0 means C is not read (it may hold NaN). Any of M, N, K may be 0; with
// K == 0 (or alpha == 0) the result is beta * C, or 0 when beta == 0. Safe to call concurrently
// from several threads as long as the C regions do not overlap.
void GemmF32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
             int64_t ldc);

// Sets the number of worker threads GemmF32 may use (defaults to
// std::thread::hardware_concurrency()). Values below 1 restore the default.
void SetGemmThreads(int n);

}  // namespace kiln::cpu

#endif  // KILN_OPS_CPU_GEMM_H_
