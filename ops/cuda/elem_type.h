// The element types of the CUDA launchers' raw buffers (row reductions and norms, argmax and topk,
// random fills, the GEMV) and the one table from kiln's DType to them. The launchers know nothing
// of kiln tensors; their adapters (reduce_cuda.cc, index_cuda.cc, matmul_cuda.cc,
// ops/factories.cc) map a tensor's dtype with ElemTypeOf and refuse, with their own error, a
// dtype their launcher does not take.
//
//   ElemTypeOf(DType::kBFloat16) == ElemType::kBF16;  ElemTypeOf(DType::kBool) == std::nullopt
//
// The header includes nothing of kiln's (DType is only declared here), so the launchers' headers,
// and reduce_kernels.cu with them, still build with a plain `nvcc -c`.
#pragma once

#include <cstdint>
#include <optional>

namespace kiln {
enum class DType : uint8_t;  // runtime/dtype.h
}  // namespace kiln

namespace kiln::cuda_kernels {

// Each launcher says which of these it takes; it returns cudaErrorInvalidValue for another.
enum class ElemType { kF32, kF16, kBF16, kI32, kI64 };

// The element type of a buffer of dtype `t`; nullopt for bool, which no launcher takes.
std::optional<ElemType> ElemTypeOf(DType t);

}  // namespace kiln::cuda_kernels
