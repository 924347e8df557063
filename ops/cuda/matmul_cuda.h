// CUDA kernels for the matmul and linear rows of the registry, on cuBLASLt.
//
// Row-major kiln tensors are handed to column-major cuBLASLt as Cᵀ = Bᵀ·Aᵀ. Row-major and
// transposed 2-D views are read in place (GEMM transpose flags and leading dims), uniformly
// strided batch dims (broadcast ones included) become one strided-batch GEMM, and anything else
// is made contiguous first or looped over on the host. linear's bias rides the GEMM epilogue, and
// so does its activation when attrs.epilogue is set (CUBLASLT_EPILOGUE_RELU[_BIAS] or
// GELU[_BIAS], cuBLASLt's GELU being the tanh approximation); where the heuristic has no
// algorithm with that epilogue, the GEMM runs with the bias alone and the eager relu/gelu op
// follows. Note cuBLASLt's ReLU epilogue maps NaN to 0 where the relu op keeps NaN.
// bf16/f16 accumulate in float32; float32 uses TF32 tensor cores only after SetAllowTf32(true).
//
// Per device: one cuBLASLt handle, created on first use and shared by every thread. Per distinct
// problem (the epilogue included): the descriptors and the heuristic's algorithm, cached (under a
// lock), so a repeated GEMM costs a hash lookup and one cublasLtMatmul. Everything runs on
// kiln::cuda::CurrentStream(); each GEMM takes the workspace its algorithm needs (at most 32 MiB)
// from the caching allocator on that stream and frees it there, so GEMMs may run from any thread
// on any streams at once. CUDA graph capture works once a device has run one GEMM eagerly (its
// first one creates the handle). K == 0 needs no GEMM: out is zero-filled, or for linear filled
// with bias rows (then the epilogue's activation runs as the eager op).
//
//   cuda_ops::SetAllowTf32(true);  // float32 GEMMs may round their inputs to TF32
#pragma once

#include "ops/op_def.h"

namespace kiln::cuda_ops {

// KernelFns (ops/op_def.h). Inputs and `out` are CUDA tensors of one device and dtype (float32,
// float16 or bfloat16); `out` is contiguous with the type infer::Matmul / infer::Linear gave.
// matmul: torch.matmul of in[0], in[1] (1-D operands, broadcast batch dims, attrs.transpose_a/b).
// linear: act(in[0] [..., in] @ in[1]ᵀ ([out, in]) + in[2] ([out], optional)), act from
// attrs.epilogue (none, relu, gelu_tanh).
// Failures throw kiln::Error: kInternal for cuBLAS/CUDA errors (naming the call, the status and
// the problem), kResourceExhausted for out of memory, kUnimplemented for other dtypes.
void Matmul(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Linear(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);

// Whether float32 GEMMs may use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32). Default false.
// Process-wide; affects GEMMs issued after the call.
void SetAllowTf32(bool allow);
bool AllowTf32();

}  // namespace kiln::cuda_ops
