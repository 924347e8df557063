// CUDA kernels of the indexing, joining and selection rows (KernelFn, ops/op_def.h): embedding,
// index_select, gather, index_copy, cat, argmax, topk and cumsum, over inputs of any strides.
//
// Out-of-range indices. The gather kernel writes zeros for a bad index and raises a flag in a
// small device buffer; the launcher waits for the stream (a 4-byte copy after the queued work;
// the host stops running ahead of the GPU at that op: on the H200 an eager index_copy_ of the
// GPT decode took 29 us of host time on average, the wait included, 5 us compiled) and,
// if the flag is set, copies the indices to the host and throws the same kiln::Error
// (kOutOfRange) as the CPU kernel, naming the op, the bad index and its position. index_copy
// checks its indices the same way before it writes anything. Nothing is left in a sticky CUDA
// error state.
// Deferred checks: while an IndexCheckScope is alive on the thread (a compiled plan's run, a
// CUDA-graph capture), the launchers do not wait: a bad index raises the scope's device flag (a
// gather writes zeros, index_copy skips the slice) and the owner's one ThrowIfIndexFlagged()
// per call reports it. A capture by other code with no scope raises a device-global flag, read
// by CheckCapturedIndexErrors().
//
//   Tensor e = embedding(ids, wte);   // ids on CUDA with a value >= wte.size(0): kiln::Error
#pragma once

#include <string>

#include "ops/op_def.h"

namespace kiln::cuda_ops {

void Embedding(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void IndexSelect(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                 const OpAttrs& a);
void Gather(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// self, index, source (index_copy): out = self (not copied when out is self) with source's slices
// at index along attrs.dim.
void IndexCopy(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// self, index, src (scatter / scatter_add): out = self (not copied when out is self) with src's
// elements written, or added atomically (floats, int32 and int64 only), where index points
// along attrs.dim; every index is checked before any is written.
void Scatter(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void ScatterAdd(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// Bitwise strided copies into slices of out (a converting copy where an input's dtype differs).
void Cat(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void ArgMax(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// Radix select on the GPU for k <= 1024; larger k are computed by the CPU kernel on a host copy.
void TopK(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
// A block scan per row along attrs.dim (cuda_kernels::CumsumRows); bool inputs are refused
// (cumsum() casts them to int64 first).
void Cumsum(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);

// Throws kiln::Error (kOutOfRange) if a gather-family kernel launched during a CUDA graph capture
// (and run by a replay since the last call) met an out-of-range index; clears the flag. Waits for
// the current stream.
void CheckCapturedIndexErrors();

// See "Deferred checks" above. `device_flag` is a zeroed device word that outlives every kernel
// launched (or captured) under the scope; without one, the scope makes its own on the first
// kernel that needs it (zeroed on the current stream), so a call without index kernels costs
// nothing — and while the stream is being captured by others it makes none (the kernel raises
// the device-global flag, as with no scope). Scopes nest (the innermost wins); not copyable.
class IndexCheckScope {
 public:
  IndexCheckScope();
  explicit IndexCheckScope(unsigned* device_flag);
  ~IndexCheckScope();
  IndexCheckScope(const IndexCheckScope&) = delete;
  IndexCheckScope& operator=(const IndexCheckScope&) = delete;
  // Whether a scope is alive on this thread.
  static bool Active();
  // Whether some kernel under the scope was given the flag (only then is a check needed).
  bool used() const { return used_; }
  // For the launchers: the flag (made now if the scope owns it), marking the scope used.
  unsigned* Take(Device device);
  unsigned* flag() const { return flag_; }

 private:
  Tensor owned_;
  unsigned* flag_ = nullptr;
  IndexCheckScope* outer_;
  bool used_ = false;
};

// The flag a kernel that checks its own indices raises (the decode attention's fused KV-cache
// append): the scope's (see "Deferred checks"), or the device-global one while the stream is being
// captured with no scope; nullptr otherwise (the caller then runs the checked index ops instead).
unsigned* KernelIndexFlag(Device device);

// A zeroed 4-byte device flag for the index kernels (zeroed on the current stream), e.g. for an
// IndexCheckScope that outlives a CUDA graph.
Tensor ZeroedFlag(Device device);

// Waits for the current stream; if *device_flag is set, clears it and throws kiln::Error
// (kOutOfRange) saying that `what` met an index out of range.
void ThrowIfIndexFlagged(unsigned* device_flag, const std::string& what);

}  // namespace kiln::cuda_ops
