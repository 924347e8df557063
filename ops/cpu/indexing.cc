// CPU reference kernels of the gather family (embedding, index_select, gather) and cat: indices
// are checked first (a clear kiln::Error naming the bad index), then the plan of ops/gather.h
// copies elements bit for bit, so int64 values of any size survive.
#include "ops/cpu/kernels.h"
#include "ops/gather.h"

namespace kiln::cpu {

void Embedding(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs&) {
  const Tensor &indices = in[0], &weight = in[1];
  gather::CheckIndices(def, indices, weight.size(0), 0, in);
  gather::RunOnCpu(gather::PlanEmbedding(def, indices, weight, out), out.data_ptr(),
                   weight.data_ptr(), indices.data_ptr());
}

void IndexSelect(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                 const OpAttrs& a) {
  const IndexPlan plan = gather::PlanIndexSelect(def, in[0], a.dim, in[1], out);
  gather::CheckIndices(def, in[1], plan.bound, a.dim, in);
  gather::RunOnCpu(plan, out.data_ptr(), in[0].data_ptr(), in[1].data_ptr());
}

void Gather(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const IndexPlan plan = gather::PlanGather(def, in[0], a.dim, in[1], out);
  gather::CheckIndices(def, in[1], plan.bound, a.dim, in);
  gather::RunOnCpu(plan, out.data_ptr(), in[0].data_ptr(), in[1].data_ptr());
}

void IndexCopy(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const Tensor& self = in[0];
  const Tensor index = gather::Unaliased(in[1], out), source = gather::Unaliased(in[2], out);
  const int64_t d = a.dim < 0 ? a.dim + self.dim() : a.dim;
  // An empty source writes nothing and its indices are not read (as on CUDA, and in torch,
  // whose kernel checks each index as it copies).
  if (source.numel() > 0) gather::CheckIndices(def, index, self.size(d), d, in);
  if (!gather::SameView(out, self)) {
    gather::RunOnCpu(gather::PlanCopy(def, self, out), out.data_ptr(), self.data_ptr(), nullptr);
  }
  if (source.numel() == 0) return;
  gather::RunOnCpu(gather::PlanIndexCopy(def, out, d, index, source), out.data_ptr(),
                   source.data_ptr(), index.data_ptr());
}

namespace {

// out = self (unless out is self), then apply(plan, index, src) on out; every index is checked
// first, so a bad one leaves out untouched.
template <typename Apply>
void ScatterImpl(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a,
                 Apply&& apply) {
  const Tensor& self = in[0];
  const Tensor index = gather::Unaliased(in[1], out), src = gather::Unaliased(in[2], out);
  const int64_t d = self.dim() == 0 ? 0 : (a.dim < 0 ? a.dim + self.dim() : a.dim);
  const IndexPlan plan = gather::PlanScatter(def, out, d, index, src);
  if (index.numel() > 0) gather::CheckIndices(def, index, plan.bound, d, in);
  if (!gather::SameView(out, self)) {
    gather::RunOnCpu(gather::PlanCopy(def, self, out), out.data_ptr(), self.data_ptr(), nullptr);
  }
  if (index.numel() > 0) apply(plan, index, src);
}

}  // namespace

void Scatter(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  ScatterImpl(def, in, out, a, [&](const IndexPlan& plan, const Tensor& index, const Tensor& src) {
    gather::RunOnCpu(plan, out.data_ptr(), src.data_ptr(), index.data_ptr());
  });
}

void ScatterAdd(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                const OpAttrs& a) {
  ScatterImpl(def, in, out, a, [&](const IndexPlan& plan, const Tensor& index, const Tensor& src) {
    gather::ScatterAddOnCpu(plan, out.dtype(), out.data_ptr(), src.data_ptr(), index.data_ptr());
  });
}

void Cat(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  gather::ForEachCatSlice(in, out, a.dim, [&](const Tensor& t, const Tensor& slice) {
    if (t.dtype() == out.dtype()) {
      gather::RunOnCpu(gather::PlanCopy(def, t, slice), slice.data_ptr(), t.data_ptr(), nullptr);
    } else {
      Copy(def, {t}, slice, a);  // a converting copy (through double)
    }
  });
}

}  // namespace kiln::cpu
