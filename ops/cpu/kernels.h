// The CPU reference kernels: the correctness oracle of kiln. They favour clarity over speed,
// compute in double (so half types are at least as accurate as float32 math), and handle any
// strides, so every backend and every compiled plan can be checked against them. The one
// exception is matmul, which runs a blocked multi-threaded float32 GEMM (ops/cpu/gemm.h) so the
// demo workloads finish in seconds.
#pragma once

#include "ops/op_def.h"

namespace kiln::cpu {

void Elementwise(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                 const OpAttrs& a);
void Sum(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Mean(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Max(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Prod(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Softmax(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void LogSoftmax(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void LayerNorm(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void RmsNorm(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Matmul(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Linear(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Copy(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Triu(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Tril(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// The math form of attention in double (ops/cpu/attention.cc); the row's CPU kernel
// (ops/attention.h) calls it.
void ScaledDotProductAttention(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                               const OpAttrs& a);
// Indexing and joining (indexing.cc): out-of-range indices throw kiln::Error (kOutOfRange).
void Embedding(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void IndexSelect(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                 const OpAttrs& a);
void Gather(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// self, index, source: out = self (skipped when out is self) with source's rows at index.
void IndexCopy(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// self, index, src (scatter / scatter_add): out = self (skipped when out is self) with src's
// elements written (added) where index points along attrs.dim.
void Scatter(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void ScatterAdd(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Cat(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// Selection (select.cc): NaN is the largest value, ties go to the lowest index.
void ArgMax(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void TopK(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// Running sums along attrs.dim: floats in double (as torch's CPU kernel), integers in int64
// (wrapping).
void Cumsum(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);

}  // namespace kiln::cpu
