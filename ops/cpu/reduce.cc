// CPU kernels for reductions (sum, mean, max, prod along dims) and row-wise normalisations
// (softmax, log_softmax, layer_norm, rms_norm), all accumulating in double.
#include <climits>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"

namespace kiln::cpu {
namespace {

// Calls fn(out_offset, reduce) for each output element, where reduce(visit) calls visit(value)
// for every input element folded into it.
template <typename Load = LoadFn, typename F>
void ForEachReduction(const Tensor& in, const Tensor& out, const OpAttrs& a, F&& fn,
                      Load load = nullptr) {
  const int64_t rank = in.dim();
  std::vector<bool> reduced(rank, a.dims.empty());
  for (int64_t d : a.dims) {
    if (rank > 0) reduced[d < 0 ? d + rank : d] = true;  // a 0-d tensor reduces over nothing
  }
  Shape kept_shape, red_shape;
  Strides kept_in, red_in;
  for (int64_t i = 0; i < rank; ++i) {
    (reduced[i] ? red_shape : kept_shape).push_back(in.shape()[i]);
    (reduced[i] ? red_in : kept_in).push_back(in.strides()[i]);
  }
  if (load == nullptr) {
    if constexpr (std::is_same_v<Load, LoadFn>) load = LoaderFor(in.dtype());
    if constexpr (std::is_same_v<Load, IntLoadFn>) load = IntLoaderFor(in.dtype());
  }
  const void* src = in.data_ptr();
  const Strides outer[] = {ContiguousStrides(kept_shape), kept_in};
  const Strides inner[] = {red_in};
  ForEachElement(kept_shape, outer, [&](const int64_t* off) {
    const int64_t base = off[1];
    auto reduce = [&](auto&& visit) {
      ForEachElement(red_shape, inner, [&](const int64_t* o) { visit(load(src, base + o[0])); });
    };
    fn(off[0], reduce);
  });
}

// Calls fn(in_offset, out_offset) for every row along `dim`; the row has n elements at the
// given strides.
template <typename F>
void ForEachRow(const Tensor& in, const Tensor& out, int64_t dim, F&& fn) {
  Shape outer = in.shape();
  Strides s_in = in.strides(), s_out = out.strides();
  outer.erase(outer.begin() + dim);
  s_in.erase(s_in.begin() + dim);
  s_out.erase(s_out.begin() + dim);
  const Strides strides[] = {s_in, s_out};
  ForEachElement(outer, strides, [&](const int64_t* off) { fn(off[0], off[1]); });
}

int64_t Wrap(int64_t d, int64_t rank) { return d < 0 ? d + rank : d; }

}  // namespace

void Sum(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  if (!IsFloatingPoint(in[0].dtype())) {  // integers and bools sum exactly in int64 (wrapping)
    const IntStoreFn store = IntStorerFor(out.dtype());
    ForEachReduction<IntLoadFn>(in[0], out, a, [&](int64_t o, auto&& reduce) {
      uint64_t acc = 0;
      reduce([&](int64_t v) { acc += static_cast<uint64_t>(v); });
      store(out.data_ptr(), o, static_cast<int64_t>(acc));
    });
    return;
  }
  const StoreFn store = StorerFor(out.dtype());
  ForEachReduction(in[0], out, a, [&](int64_t o, auto&& reduce) {
    double acc = 0;
    reduce([&](double v) { acc += v; });
    store(out.data_ptr(), o, acc);
  });
}

void Mean(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const StoreFn store = StorerFor(out.dtype());
  ForEachReduction(in[0], out, a, [&](int64_t o, auto&& reduce) {
    double acc = 0, n = 0;
    reduce([&](double v) { acc += v, n += 1; });
    store(out.data_ptr(), o, n > 0 ? acc / n : std::numeric_limits<double>::quiet_NaN());
  });
}

void Max(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  // Infer refuses empty reductions (max has no identity), so every output sees an element.
  if (!IsFloatingPoint(in[0].dtype())) {  // exact int64 comparisons
    const IntStoreFn store = IntStorerFor(out.dtype());
    ForEachReduction<IntLoadFn>(in[0], out, a, [&](int64_t o, auto&& reduce) {
      int64_t acc = INT64_MIN;
      reduce([&](int64_t v) { acc = std::max(acc, v); });
      store(out.data_ptr(), o, acc);
    });
    return;
  }
  const StoreFn store = StorerFor(out.dtype());
  ForEachReduction(in[0], out, a, [&](int64_t o, auto&& reduce) {
    double acc = -std::numeric_limits<double>::infinity();
    reduce([&](double v) { acc = (std::isnan(v) || v > acc) ? v : acc; });  // NaN propagates
    store(out.data_ptr(), o, acc);
  });
}

void Prod(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  if (!IsFloatingPoint(in[0].dtype())) {  // integers and bools multiply exactly in int64 (wrapping)
    const IntStoreFn store = IntStorerFor(out.dtype());
    ForEachReduction<IntLoadFn>(in[0], out, a, [&](int64_t o, auto&& reduce) {
      uint64_t acc = 1;
      reduce([&](int64_t v) { acc *= static_cast<uint64_t>(v); });
      store(out.data_ptr(), o, static_cast<int64_t>(acc));
    });
    return;
  }
  const StoreFn store = StorerFor(out.dtype());
  ForEachReduction(in[0], out, a, [&](int64_t o, auto&& reduce) {
    double acc = 1;
    reduce([&](double v) { acc *= v; });
    store(out.data_ptr(), o, acc);
  });
}

namespace {

void SoftmaxImpl(const Tensor& x, const Tensor& out, int64_t dim, bool log) {
  dim = Wrap(dim, x.dim());
  if (x.dim() == 0) {
    StorerFor(out.dtype())(out.data_ptr(), 0, log ? 0.0 : 1.0);
    return;
  }
  const int64_t n = x.size(dim), si = x.stride(dim), so = out.stride(dim);
  const LoadFn load = LoaderFor(x.dtype());
  const StoreFn store = StorerFor(out.dtype());
  std::vector<double> row(n);
  ForEachRow(x, out, dim, [&](int64_t in_off, int64_t out_off) {
    double mx = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, row[i] = load(x.data_ptr(), in_off + i * si));
    if (std::isinf(mx) && mx < 0) mx = 0;  // an all -inf row gives NaN (0/0), like torch
    // A +inf max: +inf elements leave the sum, which becomes +inf, so they give NaN (inf/inf)
    // and finite ones 0 (log_softmax: -inf), like torch: softmax([inf, 1, 2]) = [nan, 0, 0].
    const bool inf_max = std::isinf(mx) && mx > 0;
    for (int64_t i = 0; i < n; ++i) sum += inf_max && row[i] == mx ? 0 : std::exp(row[i] - mx);
    if (inf_max) sum += mx;  // NaN (a NaN element) stays NaN
    for (int64_t i = 0; i < n; ++i) {
      const double v = log ? row[i] - mx - std::log(sum) : std::exp(row[i] - mx) / sum;
      store(out.data_ptr(), out_off + i * so, v);
    }
  });
}

void NormImpl(absl::Span<const Tensor> in, const Tensor& out, double eps, bool rms, bool has_bias) {
  const Tensor& x = in[0];
  const int64_t dim = x.dim() - 1, n = x.size(dim), si = x.stride(dim), so = out.stride(dim);
  const LoadFn load = LoaderFor(x.dtype());
  const StoreFn store = StorerFor(out.dtype());
  const bool has_weight = in.size() > 1;
  std::vector<double> row(n);
  ForEachRow(x, out, dim, [&](int64_t in_off, int64_t out_off) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += row[i] = load(x.data_ptr(), in_off + i * si);
    mean = rms || n == 0 ? 0 : mean / n;
    for (int64_t i = 0; i < n; ++i) var += (row[i] - mean) * (row[i] - mean);
    const double inv = 1.0 / std::sqrt(var / std::max<int64_t>(n, 1) + eps);
    for (int64_t i = 0; i < n; ++i) {
      double v = (row[i] - mean) * inv;
      if (has_weight) v *= LoaderFor(in[1].dtype())(in[1].data_ptr(), i * in[1].stride(0));
      if (has_bias) v += LoaderFor(in[2].dtype())(in[2].data_ptr(), i * in[2].stride(0));
      store(out.data_ptr(), out_off + i * so, v);
    }
  });
}

}  // namespace

void Softmax(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  SoftmaxImpl(in[0], out, a.dim, /*log=*/false);
}

void LogSoftmax(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  SoftmaxImpl(in[0], out, a.dim, /*log=*/true);
}

void LayerNorm(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  NormImpl(in, out, a.eps, /*rms=*/false, /*has_bias=*/in.size() > 2);
}

void RmsNorm(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  NormImpl(in, out, a.eps, /*rms=*/true, /*has_bias=*/false);
}

}  // namespace kiln::cpu
