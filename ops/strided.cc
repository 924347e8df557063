// Strided-window kernels (see strided.h).
#include "ops/strided.h"

#include "ops/gather.h"

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

// Out of place, out is a fresh contiguous tensor of the base's type: the base is copied into it,
// then src into the window. In place (out is the base: OpDef::updates_self), only the window is
// written, when the base is contiguous (the window is of that layout); a strided base is updated
// through a contiguous copy. A src sharing memory with out is copied first.
void AsStridedScatter(const OpDef&, absl::Span<const Tensor> in, const Tensor& out,
                      const OpAttrs& a) {
  const Tensor src = gather::Unaliased(in[1], out);
  const bool in_place = gather::SameView(out, in[0]);
  const bool through_copy = in_place && !out.is_contiguous();
  const Tensor dst = through_copy ? Contiguous(out) : out;
  if (!in_place) CopyInto(dst, in[0]);
  CopyInto(dst.as_strided(a.dims, a.strides, dst.offset() + a.offset), src);
  if (through_copy) CopyInto(out, dst);
}

}  // namespace kiln::strided
