// The DType -> ElemType table (see elem_type.h).
#include "ops/cuda/elem_type.h"

#include "runtime/dtype.h"

namespace kiln::cuda_kernels {

std::optional<ElemType> ElemTypeOf(DType t) {
  switch (t) {
    case DType::kFloat32:
      return ElemType::kF32;
    case DType::kFloat16:
      return ElemType::kF16;
    case DType::kBFloat16:
      return ElemType::kBF16;
    case DType::kInt32:
      return ElemType::kI32;
    case DType::kInt64:
      return ElemType::kI64;
    case DType::kBool:
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace kiln::cuda_kernels
