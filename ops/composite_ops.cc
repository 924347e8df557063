// Composites with torch's names and semantics (see ops.h): flatten, unflatten, narrow,
// repeat_interleave, repeat, min, logsumexp, var, std, norm, leaky_relu, softplus, sort/argsort,
// flip, roll, one_hot, outer, the activations elu ... glu, normalize,
// cosine_similarity, addmm, the logical ops and mask operators, argmin,
// isnan/isinf/isfinite, any/all and the *_like factories, each
// written with the registry's ops, so eager runs those ops' kernels and a trace records them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/composite_helpers.h"
#include "ops/factories.h"
#include "ops/infer.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {
using namespace composite;  // NOLINT: the helpers of every composite file

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  CheckDefined("flatten", x);
  if (x.dim() == 0) return reshape(x, {1});
  const int64_t s = Wrapped("flatten", x, start_dim), e = Wrapped("flatten", x, end_dim);
  KILN_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim, " in ",
             Shapes(x));
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  shape.push_back(Product("flatten", Shape(x.shape().begin() + s, x.shape().begin() + e + 1)));
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor unflatten(const Tensor& x, int64_t dim, IntList sizes) {
  CheckDefined("unflatten", x);
  KILN_CHECK(x.dim() >= 1, "unflatten: needs a tensor of rank >= 1, got ", Shapes(x));
  const int64_t d = Wrapped("unflatten", x, dim);
  KILN_CHECK(!sizes.empty(), "unflatten: sizes must not be empty");
  int64_t inferred = -1;
  Shape given;  // the sizes but the -1
  for (size_t i = 0; i < sizes.size(); ++i) {
    KILN_CHECK(sizes[i] >= -1, "unflatten: size ", sizes[i], " is negative");
    if (sizes[i] == -1) {
      KILN_CHECK(inferred < 0, "unflatten: only one size may be -1");
      inferred = static_cast<int64_t>(i);
    } else {
      given.push_back(sizes[i]);
    }
  }
  const int64_t known = Product("unflatten", given);
  Shape split(sizes.begin(), sizes.end());
  if (inferred >= 0) {
    KILN_CHECK(known > 0 && x.size(d) % known == 0, "unflatten: dim ", d, " of ", Shapes(x), " (",
               x.size(d), ") does not split into sizes with product ", known, " and a -1");
    split[inferred] = x.size(d) / known;
  }
  KILN_CHECK(inferred >= 0 || known == x.size(d), "unflatten: sizes multiply to ", known,
             ", not to dim ", d, " of ", Shapes(x), " (", x.size(d), ")");
  Shape shape(x.shape().begin(), x.shape().begin() + d);
  shape.insert(shape.end(), split.begin(), split.end());
  shape.insert(shape.end(), x.shape().begin() + d + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  CheckDefined("narrow", x);
  KILN_CHECK(x.dim() >= 1, "narrow: needs a tensor of rank >= 1, got ", Shapes(x));
  const int64_t d = Wrapped("narrow", x, dim), size = x.size(d);
  const int64_t s = start < 0 ? start + size : start;
  KILN_CHECK(s >= 0 && s <= size && length >= 0 && length <= size - s, "narrow: start ", start,
             " and length ", length, " do not fit dim ", d, " of ", Shapes(x), " (", size, ")");
  return slice(x, d, s, s + length);
}

namespace {

// `result`, or a copy of it where it is a view of x (repeats of 1 over a contiguous x, a flip
// or roll that moved nothing): torch's repeat, repeat_interleave, flip and roll always return
// new memory.
Tensor NewMemory(const Tensor& x, const Tensor& result) {
  return result.shares_storage(x) ? clone(result) : result;
}

}  // namespace

Tensor repeat_interleave(const Tensor& x, int64_t repeats, int64_t dim) {
  CheckDefined("repeat_interleave", x);
  KILN_CHECK(repeats >= 0, "repeat_interleave: repeats must be non-negative, got ", repeats);
  if (x.dim() == 0) return repeat_interleave(reshape(x, {1}), repeats, 0);
  const int64_t d = Wrapped("repeat_interleave", x, dim);
  Shape wide = x.shape();
  wide.insert(wide.begin() + d + 1, repeats);
  Shape out = x.shape();
  out[d] = Product("repeat_interleave", {out[d], repeats});
  Product("repeat_interleave", out);  // the result's element count fits too
  return NewMemory(x, reshape(expand(unsqueeze(x, d + 1), wide), out));
}

Tensor repeat_interleave(const Tensor& x, int64_t repeats) {
  CheckDefined("repeat_interleave", x);
  return repeat_interleave(flatten(x), repeats, 0);
}

Tensor repeat(const Tensor& x, IntList repeats) {
  CheckDefined("repeat", x);
  KILN_CHECK(static_cast<int64_t>(repeats.size()) >= x.dim(), "repeat: ", repeats.size(),
             " repeats for ", Shapes(x), ": give at least one per dim");
  const size_t lead = repeats.size() - static_cast<size_t>(x.dim());
  Shape pairs, wide, out;  // x as [1, x0, 1, x1, ...], expanded to [r0, x0, r1, x1, ...]
  for (size_t i = 0; i < repeats.size(); ++i) {
    KILN_CHECK(repeats[i] >= 0, "repeat: repeats must be non-negative, got ", repeats[i]);
    const int64_t size = i < lead ? 1 : x.size(static_cast<int64_t>(i - lead));
    pairs.insert(pairs.end(), {1, size});
    wide.insert(wide.end(), {repeats[i], size});
    out.push_back(Product("repeat", {repeats[i], size}));
  }
  Product("repeat", out);  // the result's element count fits too
  return NewMemory(x, reshape(expand(reshape(x, pairs), wide), out));
}

// Throws naming `fn` unless some dim `dims` reduces has size 0 (min and max have no identity).
void CheckNonEmptyReduction(const char* fn, const Tensor& x, IntList dims) {
  const std::vector<bool> reduced = Reduced(fn, x, dims);
  for (int64_t d = 0; d < x.dim(); ++d) {
    KILN_CHECK(!reduced[d] || x.size(d) != 0, fn, ": cannot reduce over dim ", d, " of size 0 of ",
               Shapes(x), ": ", fn, " has no identity (torch: expected ", "reduction dim ", d,
               " to have non-zero size)");
  }
}

Tensor min(const Tensor& x, IntList dims, bool keepdim) {
  CheckDefined("min", x);
  CheckNonEmptyReduction("min", x, dims);  // checked here: the work below is done by max
  // Floating: -max(-x), exact, NaN propagating as max does.
  if (IsFloatingPoint(x.dtype())) return neg(max(neg(x), dims, keepdim));
  if (x.dtype() == DType::kBool)
    return cast(min(cast(x, DType::kInt32), dims, keepdim), DType::kBool);
  // Integers (negation would wrap at the dtype's minimum): the reduced dims moved last and joined,
  // then the smallest by topk.
  const std::vector<bool> reduced = Reduced("min", x, dims);
  Shape order, kept_shape, keep_shape;
  int64_t n = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    keep_shape.push_back(reduced[d] ? 1 : x.size(d));
    if (!reduced[d]) order.push_back(d), kept_shape.push_back(x.size(d));
  }
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (reduced[d]) order.push_back(d), n *= x.size(d);
  }
  KILN_CHECK(n > 0, "min: a reduction over no elements (", Shapes(x), ") has no minimum");
  Shape rows = kept_shape;
  rows.push_back(n);
  const Tensor smallest = topk(reshape(permute(x, order), rows), 1, -1, /*largest=*/false).values;
  return reshape(smallest, keepdim ? keep_shape : kept_shape);
}

Tensor logsumexp(const Tensor& x, IntList dims, bool keepdim) {
  CheckDefined("logsumexp", x);
  if (!IsFloatingPoint(x.dtype())) {  // integers and bools promote to float32, as in torch
    return logsumexp(cast(x, DType::kFloat32), dims, keepdim);
  }
  Reduced("logsumexp", x, dims);  // dims checked here: the work below is done by max and sum
  return InFloat32("logsumexp", x, [&](const Tensor& v) {
    // No elements to reduce: the sums of no exponentials are 0, their logs -inf (as torch), and
    // no maximum exists to shift by.
    if (v.numel() == 0) return log(sum(exp(v), dims, keepdim));
    const Tensor m = max(v, dims, /*keepdim=*/true);
    // An infinite row maximum shifts by 0 instead (-inf - -inf would be NaN).
    const Tensor shift = masked_fill(m, eq(abs(m), std::numeric_limits<double>::infinity()), 0.0);
    const Tensor out = add(log(sum(exp(sub(v, shift)), dims, /*keepdim=*/true)), shift);
    if (keepdim) return out;
    return dims.empty() ? reshape(out, {}) : sum(out, dims, /*keepdim=*/false);  // drops the 1s
  });
}

Tensor var(const Tensor& x, IntList dims, int64_t correction, bool keepdim) {
  CheckDefined("var", x);
  KILN_CHECK(correction >= 0, "var: correction must be non-negative, got ", correction);
  const std::vector<bool> reduced = Reduced("var", x, dims);
  Shape taken;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (reduced[d]) taken.push_back(x.size(d));
  }
  const int64_t n = Product("var", taken);
  return InFloat32("var", x, [&](const Tensor& v) {
    const Tensor centred = sub(v, mean(v, dims, /*keepdim=*/true));
    const Tensor squares = sum(mul(centred, centred), dims, keepdim);
    return div(squares, static_cast<double>(std::max<int64_t>(n - correction, 0)));
  });
}

Tensor std(const Tensor& x, IntList dims, int64_t correction, bool keepdim) {
  return InFloat32("std", x,
                   [&](const Tensor& v) { return sqrt(var(v, dims, correction, keepdim)); });
}

Tensor norm(const Tensor& x, double p, IntList dims, bool keepdim) {
  CheckDefined("norm", x);
  KILN_CHECK(!std::isnan(p), "norm: the order p is NaN");
  const std::vector<bool> reduced = Reduced("norm", x, dims);
  for (int64_t d = 0; d < x.dim(); ++d) {
    KILN_CHECK(!(p < 0 && reduced[d] && x.size(d) == 0), "norm: the ", p, "-norm of no elements ",
               "has no value (a negative order has no identity), got ", Shapes(x), " over dim ", d);
  }
  return InFloat32("norm", x, [&](const Tensor& v) {
    const Tensor a = abs(v);
    if (std::isinf(p)) return p > 0 ? max(a, dims, keepdim) : min(a, dims, keepdim);
    if (p == 0) return sum(cast(ne(v, 0.0), DType::kFloat32), dims, keepdim);
    if (p == 1) return sum(a, dims, keepdim);
    if (p == 2) return sqrt(sum(mul(v, v), dims, keepdim));
    return pow(sum(pow(a, p), dims, keepdim), 1.0 / p);
  });
}

Tensor softplus(const Tensor& x, double beta, double threshold) {
  return InFloat32("softplus", x, [&](const Tensor& v) {
    const Tensor bv = mul(v, beta);
    return where(gt(bv, threshold), v, div(log1p(exp(bv)), beta));
  });
}

ValuesIndices sort(const Tensor& x, int64_t dim, bool descending) {
  CheckDefined("sort", x);
  const int64_t d = Wrapped("sort", x, dim);
  if (x.dtype() == DType::kBool) {  // topk orders numbers: false < true as 0 < 1
    ValuesIndices r = sort(cast(x, DType::kInt32), dim, descending);
    return {cast(r.values, DType::kBool), std::move(r.indices)};
  }
  const int64_t n = x.dim() == 0 ? 1 : x.size(d);
  return Named("sort", [&] { return topk(x, n, d, descending); });
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  return sort(x, dim, descending).indices;
}

Tensor flip(const Tensor& x, IntList dims) {
  CheckDefined("flip", x);
  if (dims.empty()) return clone(x);
  const std::vector<bool> flipped = Reduced("flip", x, dims);  // each dim once, in range
  return Named("flip", [&] {
    Tensor y = x;
    for (int64_t d = 0; d < x.dim(); ++d) {
      if (!flipped[d] || x.size(d) <= 1) continue;
      const int64_t n = x.size(d);
      y = index_select(y, d, arange(n - 1, -1, -1, DType::kInt64, x.device()));
    }
    return NewMemory(x, y);
  });
}

Tensor roll(const Tensor& x, IntList shifts, IntList dims) {
  CheckDefined("roll", x);
  if (dims.empty()) {
    KILN_CHECK(shifts.size() == 1, "roll: without dims, one shift (of the flattened tensor), got ",
               shifts.size(), " for ", Shapes(x));
    return reshape(roll(flatten(x), shifts, {0}), x.shape());
  }
  KILN_CHECK(shifts.size() == dims.size(), "roll: shifts and dims must have the same length, got ",
             shifts.size(), " and ", dims.size(), " for ", Shapes(x));
  std::vector<int64_t> wrapped;  // checked before the parts run, so the error names roll once
  for (int64_t d : dims) wrapped.push_back(Wrapped("roll", x, d));
  return Named("roll", [&] {
    Tensor y = x;
    for (size_t i = 0; i < dims.size(); ++i) {
      const int64_t d = wrapped[i];
      const int64_t n = x.dim() == 0 ? 1 : x.size(d);
      if (n == 0 || x.dim() == 0) continue;
      const int64_t s = ((shifts[i] % n) + n) % n;  // into [0, n)
      if (s != 0) y = cat({slice(y, d, n - s, n), slice(y, d, 0, n - s)}, d);
    }
    return NewMemory(x, y);
  });
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  CheckDefined("one_hot", indices);
  KILN_CHECK(indices.dtype() == DType::kInt64 || indices.dtype() == DType::kInt32,
             "one_hot: indices must be int64 or int32, got ", DTypeName(indices.dtype()),
             Shapes(indices));
  KILN_CHECK(num_classes >= -1, "one_hot: num_classes must be -1 (inferred) or >= 0, got ",
             num_classes);
  if (num_classes == -1) {
    KILN_CHECK(indices.numel() > 0, "one_hot: cannot infer num_classes from no indices ",
               Shapes(indices));
    num_classes = item<int64_t>(max(cast(indices, DType::kInt64))) + 1;
  }
  return Named("one_hot", [&] {
    // The indices through a lookup of 0 .. C-1, which checks their range (eagerly or at the end
    // of a compiled call) and gives them back unchanged.
    const Tensor classes = arange(num_classes, DType::kInt64, indices.device());
    const Tensor flat = reshape(indices, {indices.numel()});
    const Tensor checked = reshape(index_select(classes, 0, flat), indices.shape());
    return cast(eq(unsqueeze(checked, -1), classes), DType::kInt64);
  });
}

Tensor elu(const Tensor& x, double alpha) {
  return InFloat32("elu", x,
                   [&](const Tensor& v) { return where(gt(v, 0.0), v, mul(expm1(v), alpha)); });
}

Tensor hardtanh(const Tensor& x, double min_val, double max_val) {
  KILN_CHECK(min_val <= max_val, "hardtanh: min_val ", min_val, " is above max_val ", max_val);
  return InFloat32("hardtanh", x, [&](const Tensor& v) { return clamp(v, min_val, max_val); });
}

Tensor relu6(const Tensor& x) {
  return InFloat32("relu6", x, [](const Tensor& v) { return clamp(v, 0.0, 6.0); });
}

Tensor hardsigmoid(const Tensor& x) {
  return InFloat32("hardsigmoid", x,
                   [](const Tensor& v) { return div(clamp(add(v, 3.0), 0.0, 6.0), 6.0); });
}

Tensor hardswish(const Tensor& x) {
  return InFloat32("hardswish", x,
                   [](const Tensor& v) { return div(mul(v, clamp(add(v, 3.0), 0.0, 6.0)), 6.0); });
}

Tensor mish(const Tensor& x) {
  return InFloat32("mish", x, [](const Tensor& v) { return mul(v, tanh(softplus(v))); });
}

Tensor logsigmoid(const Tensor& x) {
  return InFloat32("logsigmoid", x, [](const Tensor& v) { return neg(softplus(neg(v))); });
}

Tensor glu(const Tensor& x, int64_t dim) {
  CheckDefined("glu", x);
  KILN_CHECK(x.dim() > 0, "glu: needs a tensor with dims, got ", Shapes(x));
  const int64_t d = Wrapped("glu", x, dim);
  KILN_CHECK(x.size(d) % 2 == 0, "glu: dim ", dim, " must have an even size to halve, got ",
             Shapes(x));
  return InFloat32("glu", x, [&](const Tensor& v) {
    const int64_t h = v.size(d) / 2;
    return mul(slice(v, d, 0, h), sigmoid(slice(v, d, h, 2 * h)));
  });
}

Tensor normalize(const Tensor& x, double p, int64_t dim, double eps) {
  CheckDefined("normalize", x);
  const int64_t d = Wrapped("normalize", x, dim);
  return Named("normalize",
               [&] { return div(x, clamp_min(norm(x, p, {d}, /*keepdim=*/true), eps)); });
}

Tensor cosine_similarity(const Tensor& a, const Tensor& b, int64_t dim, double eps) {
  CheckDefined("cosine_similarity", a);
  CheckDefined("cosine_similarity", b);
  const absl::StatusOr<Shape> shape = BroadcastShapes(a.shape(), b.shape());
  KILN_CHECK(shape.ok(), "cosine_similarity: the shapes ", a.shape_string(), " and ",
             b.shape_string(), " do not broadcast");
  const int64_t d = Wrapped("cosine_similarity", a.dim() >= b.dim() ? a : b, dim);
  return Named("cosine_similarity", [&] {
    const Tensor x = broadcast_to(a, *shape), y = broadcast_to(b, *shape);
    const Tensor nx = clamp_min(norm(x, 2, {d}, true), eps);
    const Tensor ny = clamp_min(norm(y, 2, {d}, true), eps);
    return sum(mul(div(x, nx), div(y, ny)), {d});
  });
}

Tensor addmm(const Tensor& input, const Tensor& a, const Tensor& b, Scalar beta, Scalar alpha) {
  CheckDefined("addmm", input);
  CheckDefined("addmm", a);
  CheckDefined("addmm", b);
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "addmm: a and b must be 2-D, got ", a.shape_string(),
             " and ", b.shape_string());
  return Named("addmm", [&] { return ScaledSum(input, matmul(a, b), beta, alpha); });
}

Tensor outer(const Tensor& a, const Tensor& b) {
  CheckDefined("outer", a);
  CheckDefined("outer", b);
  KILN_CHECK(a.dim() == 1 && b.dim() == 1, "outer: needs two 1-D tensors, got ", a.shape_string(),
             " and ", b.shape_string());
  return Named("outer", [&] { return mul(unsqueeze(a, 1), unsqueeze(b, 0)); });
}

Tensor leaky_relu(const Tensor& x, double negative_slope) {
  CheckDefined("leaky_relu", x);
  KILN_CHECK(IsFloatingPoint(x.dtype()), "leaky_relu: the input must be a floating-point tensor ",
             "(as in torch), got ", DTypeName(x.dtype()));
  return where(gt(x, 0.0), x, mul(x, negative_slope));
}

namespace {

// x != 0 (NaN is true), the truth value torch's logical ops read.
Tensor Truth(const Tensor& x) { return x.dtype() == DType::kBool ? x : ne(x, 0); }

void CheckBoolOperands(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    CheckDefined(op, *t);
    KILN_CHECK(t->dtype() == DType::kBool, op, ": kiln's bitwise operators take bool tensors ",
               "(masks), got ", DTypeName(t->dtype()), "; use the logical_* ops for truth values");
  }
}

}  // namespace

Tensor logical_not(const Tensor& x) {
  CheckDefined("logical_not", x);
  return eq(x, 0);  // (bool: true where false; NaN != 0, so not NaN is false)
}
Tensor logical_and(const Tensor& a, const Tensor& b) {
  CheckDefined("logical_and", a);
  CheckDefined("logical_and", b);
  return Named("logical_and", [&] { return mul(Truth(a), Truth(b)); });  // bool * bool: and
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  CheckDefined("logical_or", a);
  CheckDefined("logical_or", b);
  return Named("logical_or", [&] { return add(Truth(a), Truth(b)); });  // bool + bool: or
}
Tensor logical_xor(const Tensor& a, const Tensor& b) {
  CheckDefined("logical_xor", a);
  CheckDefined("logical_xor", b);
  return Named("logical_xor", [&] { return ne(Truth(a), Truth(b)); });
}
Tensor operator~(const Tensor& x) {
  CheckBoolOperands("bitwise_not", {&x});
  return logical_not(x);
}
Tensor operator&(const Tensor& a, const Tensor& b) {
  CheckBoolOperands("bitwise_and", {&a, &b});
  return Named("bitwise_and", [&] { return mul(a, b); });
}
Tensor operator|(const Tensor& a, const Tensor& b) {
  CheckBoolOperands("bitwise_or", {&a, &b});
  return Named("bitwise_or", [&] { return add(a, b); });
}
Tensor operator^(const Tensor& a, const Tensor& b) {
  CheckBoolOperands("bitwise_xor", {&a, &b});
  return Named("bitwise_xor", [&] { return ne(a, b); });
}

Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  CheckDefined("argmin", x);
  // argmax of an order-reversing map: -x for floats (NaN stays NaN, argmax's maximum), -1 - x
  // for integers (exact over all of int64, where -x wraps at its minimum).
  return Named("argmin", [&] {
    if (IsFloatingPoint(x.dtype())) return argmax(neg(x), dim, keepdim);
    const Tensor ints = x.dtype() == DType::kBool ? cast(x, DType::kInt64) : x;
    return argmax(-1 - ints, dim, keepdim);
  });
}

Tensor isnan(const Tensor& x) {
  CheckDefined("isnan", x);
  return ne(x, x);
}
Tensor isinf(const Tensor& x) {
  CheckDefined("isinf", x);
  if (!IsFloatingPoint(x.dtype())) return zeros(x.shape(), DType::kBool, x.device());
  return eq(abs(x), INFINITY);
}
Tensor isfinite(const Tensor& x) {
  CheckDefined("isfinite", x);
  if (!IsFloatingPoint(x.dtype())) return ones(x.shape(), DType::kBool, x.device());
  return lt(abs(x), INFINITY);  // (NaN < inf is false)
}

Tensor any(const Tensor& x, IntList dims, bool keepdim) {
  CheckDefined("any", x);
  return Named("any", [&] { return gt(sum(Truth(x), dims, keepdim), 0); });
}
Tensor all(const Tensor& x, IntList dims, bool keepdim) {
  CheckDefined("all", x);
  return Named("all", [&] { return eq(sum(logical_not(x), dims, keepdim), 0); });
}

Tensor zeros_like(const Tensor& x) {
  CheckDefined("zeros_like", x);
  return zeros(x.shape(), x.dtype(), x.device());
}

Tensor ones_like(const Tensor& x) {
  CheckDefined("ones_like", x);
  return ones(x.shape(), x.dtype(), x.device());
}

Tensor full_like(const Tensor& x, Scalar value) {
  CheckDefined("full_like", x);
  return full(x.shape(), value, x.dtype(), x.device());
}

Tensor empty_like(const Tensor& x) {
  CheckDefined("empty_like", x);
  return empty(x.shape(), x.dtype(), x.device());
}

}  // namespace kiln
