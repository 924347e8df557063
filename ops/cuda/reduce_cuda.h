// CUDA kernels of the registry's reduction, normalisation and triangular-mask rows (KernelFn,
// ops/op_def.h). They accept inputs of any strides and write `out` (any strides), bringing the
// data into the contiguous row layouts of the launchers in ops/cuda/reduce_kernels.h (softmax and
// log_softmax: the softmax family's row kernel, codegen/families/softmax/fused_softmax_cuda.h):
// views are metadata only, and a copy is made (with the registry's CUDA copy kernel) only where the
// row being reduced is not already contiguous.
//
//   // registered in ops/registry.cc; reached through the dispatcher:
//   Tensor p = softmax(scores, -1);  // scores on CUDA -> cuda_ops::Softmax
//
// Unsupported dtypes throw kiln::Error (kUnimplemented) naming the op and the dtype; a failed
// launch throws kiln::Error naming the launcher and the CUDA error.
#pragma once

#include "ops/op_def.h"

namespace kiln::cuda_ops {

// Sum and prod (ints and bool accumulate in int64), mean (floats) and max (any dtype; int32 and
// bool via int64) over a.dims.
void Sum(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Mean(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Max(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Prod(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// softmax / log_softmax along a.dim.
void Softmax(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void LogSoftmax(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// Over the last dim; inputs are x[, weight[, bias]] (weight and bias are cast to x's dtype).
void LayerNorm(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void RmsNorm(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// Keep the upper / lower triangle (relative to a.diagonal) of the last two dims, zero the rest.
void Triu(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Tril(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);

}  // namespace kiln::cuda_ops
