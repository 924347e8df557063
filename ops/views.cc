// View ops (see views.h).
#include "ops/views.h"

#include <algorithm>

#include "ops/dispatch.h"

namespace kiln::views {
namespace {
int64_t Wrap(int64_t d, int64_t rank) { return d < 0 ? d + rank : d; }
}  // namespace

Tensor Transpose(const Tensor& in, const TensorType& out, const OpAttrs& a) {
  Strides s = in.strides();
  if (in.dim() > 0) std::swap(s[Wrap(a.dim, in.dim())], s[Wrap(a.dim2, in.dim())]);
  return in.as_strided(out.shape, s, in.offset());
}

Tensor Permute(const Tensor& in, const TensorType& out, const OpAttrs& a) {
  Strides s(in.dim());
  for (int64_t i = 0; i < in.dim(); ++i) s[i] = in.strides()[Wrap(a.dims[i], in.dim())];
  return in.as_strided(out.shape, s, in.offset());
}

std::optional<Strides> ViewStrides(const Tensor& in, IntList shape) {
  if (in.numel() == 0 || in.dim() == 0) return ContiguousStrides(shape);
  // Walk chunks of the old shape that are contiguous among themselves; each chunk must map
  // onto a run of new dims with the same element count.
  Strides out(shape.size());
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = in.strides().back(), tensor_numel = 1, view_numel = 1;
  for (int64_t d = in.dim() - 1; d >= 0; --d) {
    tensor_numel *= in.shape()[d];
    const bool chunk_end = d == 0 || (in.shape()[d - 1] != 1 &&
                                      in.strides()[d - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_end) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
      out[view_d] = view_numel * chunk_base_stride;
      view_numel *= shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (d > 0) {
      chunk_base_stride = in.strides()[d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

Tensor Reshape(const Tensor& in, const TensorType& out, const OpAttrs&) {
  if (auto s = ViewStrides(in, out.shape)) return in.as_strided(out.shape, *s, in.offset());
  const Tensor copy = Dispatch(OpId::kContiguous, {in});
  return copy.as_strided(out.shape, ContiguousStrides(out.shape), copy.offset());
}

Tensor Expand(const Tensor& in, const TensorType& out, const OpAttrs&) {
  const int64_t rank = out.rank(), lead = rank - in.dim();
  Strides s(rank, 0);
  for (int64_t i = 0; i < in.dim(); ++i) {
    s[lead + i] = in.shape()[i] == out.shape[lead + i] ? in.strides()[i] : 0;
  }
  return in.as_strided(out.shape, s, in.offset());
}

Tensor Slice(const Tensor& in, const TensorType& out, const OpAttrs& a) {
  // No elements: any layout will do, and the strides of the other dims may be huge (saturated).
  if (NumElements(out.shape) == 0) return in.as_strided(out.shape, in.strides(), in.offset());
  const int64_t d = Wrap(a.dim, in.dim()), n = in.size(d);
  const int64_t start = a.start < 0 ? (a.start < -n ? 0 : a.start + n) : std::min(a.start, n);
  Strides s = in.strides();
  // A dim of one element never moves by its stride: keep the input's rather than multiply a huge
  // step into an overflow.
  if (out.shape[d] > 1) s[d] *= a.step;
  return in.as_strided(out.shape, s, in.offset() + start * in.strides()[d]);
}

Tensor Unsqueeze(const Tensor& in, const TensorType& out, const OpAttrs& a) {
  const int64_t d = Wrap(a.dim, in.dim() + 1);
  Strides s = in.strides();
  int64_t outer = 1;  // the stride of the new size-1 dim is never used; avoid an overflow
  if (d < in.dim() && __builtin_mul_overflow(in.strides()[d], in.shape()[d], &outer)) outer = 1;
  s.insert(s.begin() + d, d < in.dim() ? outer : 1);
  return in.as_strided(out.shape, s, in.offset());
}

Tensor Squeeze(const Tensor& in, const TensorType& out, const OpAttrs& a) {
  Strides s;
  const int64_t only = a.all_dims || in.dim() == 0 ? -1 : Wrap(a.dim, in.dim());
  for (int64_t i = 0; i < in.dim(); ++i) {
    const bool drop = in.shape()[i] == 1 && (only < 0 || only == i);
    if (!drop) s.push_back(in.strides()[i]);
  }
  return in.as_strided(out.shape, s, in.offset());
}

}  // namespace kiln::views
