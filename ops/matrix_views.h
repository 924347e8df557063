// The matrix views matmul and linear read their operands through, shared by the CPU kernels
// (ops/cpu/matmul.cc) and the cuBLASLt ones (ops/cuda/matmul_cuda.cc): an operand with its last
// two dims swapped (how a transpose flag is read in place) and a 1-D operand as a matrix. Both
// are views: new metadata over the tensor's storage, no data moved.
//
//   // matmul(a, b){transpose_b=true} with a [K] and b [N, K]: a as [1, K], b as [K, N]
//   const Tensor lhs = AsMatrix(a, /*is_lhs=*/true);
//   const Tensor rhs = AsMatrix(SwapLast2(b), /*is_lhs=*/false);
#pragma once

#include "runtime/tensor.h"

namespace kiln {

// A view of `t` with its last two dims swapped. Throws kiln::Error(kInternal) when `t` has fewer
// than 2 dims (matmul's inference refuses a transpose flag on such an operand).
Tensor SwapLast2(const Tensor& t);

// A 1-D operand as a matrix view ([K] -> [1, K] on the left, [K, 1] on the right); any other `t`
// as it is.
Tensor AsMatrix(const Tensor& t, bool is_lhs);

}  // namespace kiln
