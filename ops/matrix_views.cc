// The matrix views of matmul operands (see matrix_views.h).
#include "ops/matrix_views.h"

#include <utility>

#include "runtime/status.h"

namespace kiln {

Tensor SwapLast2(const Tensor& t) {
  if (t.dim() < 2) {
    throw Error(absl::InternalError("matmul: cannot transpose a tensor with fewer than 2 dims"));
  }
  Shape s = t.shape();
  Strides st = t.strides();
  std::swap(s[s.size() - 1], s[s.size() - 2]);
  std::swap(st[st.size() - 1], st[st.size() - 2]);
  return t.as_strided(s, st, t.offset());
}

Tensor AsMatrix(const Tensor& t, bool is_lhs) {
  if (t.dim() != 1) return t;
  if (is_lhs) return t.as_strided({1, t.size(0)}, {0, t.stride(0)}, t.offset());
  return t.as_strided({t.size(0), 1}, {t.stride(0), 0}, t.offset());
}

}  // namespace kiln
