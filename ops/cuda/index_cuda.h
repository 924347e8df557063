// CUDA kernels of the indexing, joining and selection rows (KernelFn, ops/op_def.h): embedding,
// index_select, gather, cat, argmax and topk, over inputs of any strides.
//
// Out-of-range indices. The gather kernel writes zeros for a bad index and raises a flag in a
// small device buffer; the launcher waits for the stream (a 4-byte copy: the queued work plus
// ~10 us of host time, estimated, and the host stops running ahead of the GPU at that op) and,
// if the flag is set, copies the indices to the host and throws the same kiln::Error
// (kOutOfRange) as the CPU kernel, naming the op, the bad index and its position. Nothing is
// left in a sticky CUDA error state. While the stream is being captured into a CUDA graph the
// launcher cannot wait: the kernel then raises a device-global flag instead, which
// CheckCapturedIndexErrors() reads after a replay.
//
//   Tensor e = embedding(ids, wte);   // ids on CUDA with a value >= wte.size(0): kiln::Error
#pragma once

#include "ops/op_def.h"

namespace kiln::cuda_ops {

void Embedding(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void IndexSelect(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                 const OpAttrs& a);
void Gather(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// Bitwise strided copies into slices of out (a converting copy where an input's dtype differs).
void Cat(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void ArgMax(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// Radix select on the GPU for k <= 1024; larger k are computed by the CPU kernel on a host copy.
void TopK(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);

// Throws kiln::Error (kOutOfRange) if a gather-family kernel launched during a CUDA graph capture
// (and run by a replay since the last call) met an out-of-range index; clears the flag. Waits for
// the current stream.
void CheckCapturedIndexErrors();

}  // namespace kiln::cuda_ops
