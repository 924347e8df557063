// CUDA kernels for the elementwise rows of the registry, generated from each row's CUDA
// expression and compiled with NVRTC on first use (then cached in memory and on disk, see
// runtime/nvrtc.h). Three kernel variants per expression:
//   _contig    16-byte vectorised loads/stores, operands contiguous and of the output's shape;
//   _rows      operands collapsed to [rows, cols] with unit inner stride (or broadcast along the
//              row) and any row stride, still vectorised: slices of a merged GEMM output, a
//              bias or a mask broadcast over leading dims;
//   _strided   any strides/broadcasts, div/mod per element (64- and 32-bit index variants),
//              compiled only when first needed.
// The same renderer serves the contiguous() copy (expression "$0").
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ops/op_def.h"

namespace kiln::cuda_ops {

// KernelFn for every elementwise row (and kContiguous): out = expr(inputs), any strides.
void Elementwise(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                 const OpAttrs& a);
void Copy(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);

// An elementwise expression over at most this many inputs ($0..$2, float operands, `$scalar`;
// long long operands and scalar when every operand and the output are integer or bool).
inline constexpr int kMaxElementwiseInputs = 3;

struct ElementwiseKernels {
  cudaKernel_t contig = nullptr, rows = nullptr;
  int vec = 1;      // elements per thread in the vectorised kernels
  struct General {  // the strided kernels, compiled on first use
    std::once_flag once;
    std::string source, base;
    cudaKernel_t strided = nullptr, strided32 = nullptr;
  };
  std::shared_ptr<General> general;
};
// Compiles (or fetches from the caches) the kernels of `expr`; throws kiln::Error with the NVRTC
// log on failure. The fusion codegen passes a whole fused expression tree here.
ElementwiseKernels CompileElementwiseKernels(const std::string& kernel_base,
                                             const std::string& expr,
                                             const std::vector<DType>& in_types, DType out_type);
// Launches on the current stream: out = expr(in) for any strides/broadcasts of the inputs.
// `scalar` is $scalar of a float kernel, `iscalar` of an integer one (every operand and the output
// integer or bool: the kernel computes in long long, like the CPU integer path).
void LaunchElementwise(const ElementwiseKernels& k, absl::Span<const Tensor> in, const Tensor& out,
                       float scalar = 0, int64_t iscalar = 0);

// The CUDA source for one elementwise expression over operands of the given dtypes (exposed so
// tests can compile every variant with NVRTC without a GPU, and for the compiler's dumps).
enum ElementwiseVariants { kFastVariants = 1, kGeneralVariants = 2, kAllVariants = 3 };
std::string RenderElementwiseSource(const std::string& kernel_base, const std::string& expr,
                                    const std::vector<DType>& in_types, DType out_type,
                                    ElementwiseVariants variants = kAllVariants);

// Pieces of every generated source, shared with the fused softmax kernels
// (ops/cuda/fused_softmax_cuda.h): the device prelude (storage types, bf16/f16 conversions, math
// helpers), and per dtype the C type of an element in memory and the expressions converting an
// element `v` to the float compute type and back.
const char* KernelPrelude();
std::string StorageType(DType t);
std::string LoadExpr(DType t, const std::string& v);
std::string StoreExpr(DType t, const std::string& v);

}  // namespace kiln::cuda_ops
