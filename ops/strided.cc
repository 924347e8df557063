// Strided-window kernels (see strided.h).
#include "ops/strided.h"

namespace kiln::strided {
namespace {

// dst = src with the copy kernel of dst's device (any strides on both sides).
void CopyInto(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  const OpDef& copy = GetOpDef(OpId::kContiguous);
  (dst.device().is_cuda() ? copy.cuda : copy.cpu)(copy, {src}, dst, {});
}

// `t` itself when contiguous, else a contiguous copy: windows are of the contiguous layout.
Tensor Contiguous(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = Tensor::Empty(t.type());
  CopyInto(c, t);
  return c;
}

}  // namespace

void AsStrided(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const Tensor base = Contiguous(in[0]);
  CopyInto(out, base.as_strided(a.dims, a.strides, base.offset() + a.offset));
}

void AsStridedScatter(const OpDef&, absl::Span<const Tensor> in, const Tensor& out,
                      const OpAttrs& a) {
  CopyInto(out, in[0]);  // out is a fresh contiguous tensor of the base's type
  CopyInto(out.as_strided(a.dims, a.strides, out.offset() + a.offset), in[1]);
}

}  // namespace kiln::strided
