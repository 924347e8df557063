// Strided, broadcasting iteration for the CPU kernels.
//
// ForEachElement walks every index of `shape` in row-major order and hands the callback the
// element offset of each operand (index · strides), for any number of operands. Broadcast operands
// use stride 0 in the dims they repeat (see BroadcastStrides). The innermost dim is a tight loop.
//
//   Strides s[] = {out.strides(), BroadcastStrides(a, out.shape())};
//   ForEachElement(out.shape(), s, [&](const int64_t* off) { ... off[0] ... off[1] ... });
#pragma once

#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "runtime/tensor.h"

namespace kiln::cpu {

// Strides of `t` viewed as `shape` under numpy broadcasting (0 where t repeats).
inline Strides BroadcastStrides(const Tensor& t, IntList shape) {
  Strides s(shape.size(), 0);
  const int64_t lead = static_cast<int64_t>(shape.size()) - t.dim();
  for (int64_t i = 0; i < t.dim(); ++i) {
    s[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  }
  return s;
}

template <typename F>
void ForEachElement(IntList shape, absl::Span<const Strides> strides, F&& fn) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int n = static_cast<int>(strides.size());
  if (NumElements(shape) == 0) return;
  absl::InlinedVector<int64_t, 9> off(n, 0);
  if (rank == 0) {
    fn(off.data());
    return;
  }
  Shape index(rank, 0);
  const int64_t inner = shape[rank - 1];
  absl::InlinedVector<int64_t, 9> inner_stride(n, 0);
  for (int k = 0; k < n; ++k) inner_stride[k] = strides[k][rank - 1];
  while (true) {
    absl::InlinedVector<int64_t, 9> cur = off;
    for (int64_t i = 0; i < inner; ++i) {
      fn(cur.data());
      for (int k = 0; k < n; ++k) cur[k] += inner_stride[k];
    }
    // Advance the outer index (dims rank-2 .. 0), updating offsets incrementally.
    int64_t d = rank - 2;
    for (; d >= 0; --d) {
      for (int k = 0; k < n; ++k) off[k] += strides[k][d];
      if (++index[d] < shape[d]) break;
      for (int k = 0; k < n; ++k) off[k] -= strides[k][d] * shape[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace kiln::cpu
