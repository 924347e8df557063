// CPU reference kernels along one dim: argmax, topk and cumsum. Values compare in their own type
// (int64 exactly, floats as double); NaN counts as the largest value, as in torch; ties go to the
// lowest index. topk sorts each row stably, so its order is fully determined: the CUDA kernel
// reproduces it.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/typed_elementwise.h"

namespace kiln::cpu {
namespace {

// A row's values in a comparable form: exact int64 for integer dtypes, double for floats.
struct Key {
  bool is_int;
  int64_t i;
  double f;
};

Key ReadKey(const Tensor& x, int64_t off) {
  if (!IsFloatingPoint(x.dtype())) return {true, ReadInt(x.dtype(), x.data_ptr(), off), 0};
  return {false, 0, LoaderFor(x.dtype())(x.data_ptr(), off)};
}

// a ranks above b (NaN above everything).
bool Greater(const Key& a, const Key& b) {
  if (a.is_int) return a.i > b.i;
  if (std::isnan(a.f)) return !std::isnan(b.f);
  return !std::isnan(b.f) && a.f > b.f;
}

// Calls fn(in_offset, out_offset) for every row of x along dim d; out has the row's dim kept
// (any size) at the same position.
template <typename F>
void ForEachRowOf(const Tensor& x, const Tensor& out, int64_t d, F&& fn) {
  Shape outer = x.shape();
  Strides s_in = x.strides(), s_out = out.strides();
  outer.erase(outer.begin() + d);
  s_in.erase(s_in.begin() + d);
  s_out.erase(s_out.begin() + d);
  const Strides strides[] = {s_in, s_out};
  ForEachElement(outer, strides, [&](const int64_t* off) { fn(off[0], off[1]); });
}

// `out` (a reduction's result without keepdim) viewed with a size-1 dim re-inserted at d.
Tensor KeepDim(const Tensor& out, int64_t d) {
  Shape shape = out.shape();
  Strides strides = out.strides();
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, 0);
  return out.as_strided(shape, strides, out.offset());
}

}  // namespace

void ArgMax(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const Tensor& x = in[0];
  int64_t* dst = out.data<int64_t>();
  if (a.dims.empty() || x.dim() == 0) {  // the flattened input, in row-major order
    Key best{};
    int64_t flat = 0, best_at = -1;
    const Strides strides[] = {x.strides()};
    ForEachElement(x.shape(), strides, [&](const int64_t* off) {
      const Key k = ReadKey(x, off[0]);
      if (best_at < 0 || Greater(k, best)) best = k, best_at = flat;
      ++flat;
    });
    dst[0] = best_at;
    return;
  }
  const int64_t d = a.dims[0] < 0 ? a.dims[0] + x.dim() : a.dims[0];
  const Tensor out_kept = a.keepdim ? out : KeepDim(out, d);
  const int64_t n = x.size(d), stride = x.stride(d);
  ForEachRowOf(x, out_kept, d, [&](int64_t in_off, int64_t out_off) {
    Key best = ReadKey(x, in_off);
    int64_t best_at = 0;
    for (int64_t i = 1; i < n; ++i) {
      const Key k = ReadKey(x, in_off + i * stride);
      if (Greater(k, best)) best = k, best_at = i;
    }
    dst[out_off] = best_at;
  });
}

void TopK(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const Tensor& x = in[0];
  int64_t* dst = out.data<int64_t>();
  if (x.dim() == 0) {
    if (a.k == 1) dst[0] = 0;
    return;
  }
  const int64_t d = a.dim < 0 ? a.dim + x.dim() : a.dim;
  const int64_t n = x.size(d), stride = x.stride(d), out_stride = out.stride(d);
  std::vector<Key> keys(n);
  std::vector<int64_t> order(n);
  ForEachRowOf(x, out, d, [&](int64_t in_off, int64_t out_off) {
    for (int64_t i = 0; i < n; ++i) keys[i] = ReadKey(x, in_off + i * stride);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
      return a.largest ? Greater(keys[p], keys[q]) : Greater(keys[q], keys[p]);
    });
    for (int64_t j = 0; j < a.k; ++j) dst[out_off + j * out_stride] = order[j];
  });
}

void Cumsum(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const Tensor& x = in[0];
  if (x.numel() == 0) return;
  const Tensor xs = x.dim() == 0 ? x.as_strided({1}, {1}, x.offset()) : x;
  const Tensor os = out.dim() == 0 ? out.as_strided({1}, {1}, out.offset()) : out;
  const int64_t d = a.dim < 0 ? a.dim + xs.dim() : a.dim;
  const int64_t n = xs.size(d), stride = xs.stride(d), out_stride = os.stride(d);
  const bool ints = !IsFloatingPoint(out.dtype());
  const LoadFn load = LoaderFor(x.dtype());
  const StoreFn store = StorerFor(out.dtype());
  ForEachRowOf(xs, os, d, [&](int64_t in_off, int64_t out_off) {
    if (ints) {
      uint64_t sum = 0;  // wraps like torch's int64
      for (int64_t i = 0; i < n; ++i) {
        sum += static_cast<uint64_t>(ReadInt(x.dtype(), x.data_ptr(), in_off + i * stride));
        WriteInt(out.dtype(), out.data_ptr(), out_off + i * out_stride, static_cast<int64_t>(sum));
      }
      return;
    }
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      sum += load(x.data_ptr(), in_off + i * stride);
      store(out.data_ptr(), out_off + i * out_stride, sum);
    }
  });
}

}  // namespace kiln::cpu
