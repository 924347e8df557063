// The gather family's shared half (embedding, index_select, gather, and cat's copies): building
// the IndexPlan (ops/index_plan.h) of a call, checking its indices, and running a plan on the
// CPU. The CPU kernels (ops/cpu/indexing.cc) and the CUDA ones (ops/cuda/index_cuda.cc) both
// use the plans and the check, so they agree on the element mapping and on the error message.
//
//   IndexPlan p = gather::PlanGather(def, x, dim, index, out);
//   gather::CheckIndices(def, index, p.bound, dim, {x, index});   // throws on a bad index
//   gather::RunOnCpu(p, out.data_ptr(), x.data_ptr(), index.data_ptr());
#pragma once

#include "ops/index_plan.h"
#include "ops/op_def.h"

namespace kiln::gather {

// Plans over tensors that passed the row's Infer; `out` has the inferred type (any strides).
// Throw kiln::Error (kUnimplemented) beyond kIndexPlanMaxRank output dims.
IndexPlan PlanEmbedding(const OpDef& def, const Tensor& indices, const Tensor& weight,
                        const Tensor& out);
IndexPlan PlanIndexSelect(const OpDef& def, const Tensor& x, int64_t dim, const Tensor& index,
                          const Tensor& out);
IndexPlan PlanGather(const OpDef& def, const Tensor& x, int64_t dim, const Tensor& index,
                     const Tensor& out);
// index_copy's scatter of `source` into `out` (self's type): out.select(dim, index[i]) =
// source.select(dim, i).
IndexPlan PlanIndexCopy(const OpDef& def, const Tensor& out, int64_t dim, const Tensor& index,
                        const Tensor& source);
// scatter's and scatter_add's plan over `index`'s elements: out[..index[o]..] = src[o] (or +=),
// with out's offset from o's position in every dim but `dim`, where the index picks it.
IndexPlan PlanScatter(const OpDef& def, const Tensor& out, int64_t dim, const Tensor& index,
                      const Tensor& src);
// A strided copy of `src` into `out` (same shape and dtype): cat's per-input copy.
IndexPlan PlanCopy(const OpDef& def, const Tensor& src, const Tensor& out);

// Cat's layout: calls fill(input, view) for each non-empty input with the view of `out` it fills
// along dim `dim` (negative dims count from the end; empty inputs of out's rank take no room).
template <typename F>
void ForEachCatSlice(absl::Span<const Tensor> in, const Tensor& out, int64_t dim, F&& fill) {
  const int64_t d = dim < 0 ? dim + out.dim() : dim;
  int64_t start = 0;
  for (const Tensor& t : in) {
    if (t.numel() == 0) {
      if (t.dim() == out.dim()) start += t.size(d);
      continue;
    }
    fill(t, out.as_strided(t.shape(), out.strides(), out.offset() + start * out.stride(d)));
    start += t.size(d);
  }
}

// True when a and b are the same elements (storage, offset, shape and strides): an in-place call.
bool SameView(const Tensor& a, const Tensor& b);
// `t`, or a contiguous copy of it when it shares memory with `out` (a scatter must not read what
// it writes).
Tensor Unaliased(const Tensor& t, const Tensor& out);

// Throws kiln::Error (kOutOfRange) naming the op, the first index of `index` (a CPU tensor, in
// row-major order) outside [0, bound), its position, `dim` and the operands; returns otherwise.
void CheckIndices(const OpDef& def, const Tensor& index, int64_t bound, int64_t dim,
                  absl::Span<const Tensor> operands);

// out[o] = src[...] for every output element, or for a scatter out[...] = src[o] for every source
// element (a bitwise copy of elem_size bytes). The caller has checked the indices.
void RunOnCpu(const IndexPlan& plan, void* out, const void* src, const void* index);
// A scatter plan's adds on the CPU: out[...] += src[o] in `dtype`, in the order of src's elements
// (each sum rounded to dtype, as torch's CPU kernel). The caller has checked the indices.
void ScatterAddOnCpu(const IndexPlan& plan, DType dtype, void* out, const void* src,
                     const void* index);

}  // namespace kiln::gather
