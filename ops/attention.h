// The scaled_dot_product_attention row of the registry: its shape inference, the backend choice
// under the thread's SdpaBackendGuard, the math form composed of kiln ops, and the kernels.
//
// Operands: q, k, v and an optional mask (a 4th input); attributes scale (always resolved: the
// API puts 1/sqrt(E) there when the caller gave none), is_causal, enable_gqa. The API and its
// torch semantics are documented in ops/ops.h. What runs:
//
//   guard  | CPU                                    | CUDA
//   auto   | cpu::ScaledDotProductAttention (double) | flash if it supports the inputs, else math
//   math   | MathForm on kiln's CPU kernels          | MathForm on kiln's CUDA kernels
//   flash  | error (kUnimplemented), naming why      | flash, or an error naming why not
//
// When the profiler records, the kernel opens a range "sdpa backend: <backend> (<reason>)" under
// the op's own, so the op table shows what ran and why.
#pragma once

#include "ops/op_def.h"
#include "ops/ops.h"

namespace kiln::attention {

// infer for the row: q [..., L, E], k [..., S, E], v [..., S, Ev] -> q's dtype [..., L, Ev].
absl::StatusOr<TensorType> Infer(absl::Span<const TensorType> in, const OpAttrs& a);

// The backend these (already inferred) operands run under the current guard, and why. Throws
// kiln::Error (kUnimplemented) when the guard demands flash and flash cannot run them.
SdpaBackendChoice Choose(absl::Span<const Tensor> in, const OpAttrs& a);

// softmax(q·kᵀ·scale + mask)·v composed of kiln ops (k/v heads repeated for grouped queries;
// fully masked rows zeroed as torch's _safe_softmax does); on the operands' device.
Tensor MathForm(absl::Span<const Tensor> in, const OpAttrs& a);

// The row's KernelFns.
void CpuKernel(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void CudaKernel(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);

}  // namespace kiln::attention
