// More composites with torch's names and semantics (see ops.h): square, lerp, addcmul, addcdiv,
// logaddexp, hypot, bmm, baddbmm, the activations selu ... softmin, count_nonzero, movedim,
// tile, nan_to_num, eye, linspace and dropout, written with the registry's ops (eager runs their
// kernels, a trace records them).
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/composite_helpers.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {
using namespace composite;  // NOLINT: the helpers of every composite file

namespace {

// Throws naming `fn` unless every tensor is defined and floating.
void CheckFloating(const char* fn, std::initializer_list<const Tensor*> xs) {
  for (const Tensor* x : xs) {
    CheckDefined(fn, *x);
    KILN_CHECK(IsFloatingPoint(x->dtype()), fn, ": needs floating tensors (as torch), got ",
               Describe(x->type()));
  }
}

}  // namespace

Tensor square(const Tensor& x) {
  CheckDefined("square", x);
  const Tensor v = x.dtype() == DType::kBool ? cast(x, DType::kInt64) : x;  // as torch.square
  return Named("square", [&] { return mul(v, v); });
}

Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight) {
  CheckFloating("lerp", {&start, &end, &weight});
  // torch's form: start + w (end - start) for |w| < 0.5, end - (end - start)(1 - w) otherwise,
  // so that w = 1 gives end exactly.
  return Named("lerp", [&] {
    const Tensor diff = sub(end, start);
    return where(lt(abs(weight), 0.5), add(start, mul(weight, diff)),
                 sub(end, mul(diff, (1.0 - weight))));
  });
}

Tensor lerp(const Tensor& start, const Tensor& end, Scalar weight) {
  CheckFloating("lerp", {&start, &end});
  const double w = weight.to_double();
  return Named("lerp", [&] {
    const Tensor diff = sub(end, start);
    return std::abs(w) < 0.5 ? add(start, mul(diff, w)) : sub(end, mul(diff, 1.0 - w));
  });
}

Tensor addcmul(const Tensor& input, const Tensor& t1, const Tensor& t2, Scalar value) {
  CheckDefined("addcmul", input);
  CheckDefined("addcmul", t1);
  CheckDefined("addcmul", t2);
  return Named("addcmul", [&] {
    const Tensor product = mul(t1, t2);
    return add(input, value.to_double() == 1 ? product : mul(product, value));
  });
}

Tensor addcdiv(const Tensor& input, const Tensor& t1, const Tensor& t2, Scalar value) {
  CheckDefined("addcdiv", input);
  CheckDefined("addcdiv", t1);
  CheckDefined("addcdiv", t2);
  KILN_CHECK(IsFloatingPoint(t1.dtype()) || IsFloatingPoint(t2.dtype()),
             "addcdiv: integer division is not supported (as in torch), got ", Describe(t1.type()),
             " / ", Describe(t2.type()));
  return Named("addcdiv", [&] {
    const Tensor quotient = div(t1, t2);
    return add(input, value.to_double() == 1 ? quotient : mul(quotient, value));
  });
}

Tensor logaddexp(const Tensor& a, const Tensor& b) {
  CheckFloating("logaddexp", {&a, &b});
  // max + log1p(exp(-|a - b|)); equal operands give a + log 2 exactly, so that two -inf give
  // -inf and two +inf give +inf (their difference is NaN).
  return Named("logaddexp", [&] {
    return where(eq(a, b), add(a, std::log(2.0)),
                 add(maximum(a, b), log1p(exp(neg(abs(sub(a, b)))))));
  });
}

Tensor hypot(const Tensor& a, const Tensor& b) {
  CheckFloating("hypot", {&a, &b});
  // m sqrt(1 + (n / m)^2) with m = max(|a|, |b|), so squares never overflow; an infinite operand
  // gives +inf even beside a NaN, as C's hypot.
  return Named("hypot", [&] {
    const Tensor x = abs(a), y = abs(b);
    const Tensor m = maximum(x, y), n = minimum(x, y);
    const Tensor r = div(n, m);
    const Tensor finite = where(eq(m, 0.0), zeros_like(m), mul(m, sqrt(add(mul(r, r), 1.0))));
    return where(logical_or(isinf(a), isinf(b)), full_like(m, INFINITY), finite);
  });
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  CheckDefined("bmm", a);
  CheckDefined("bmm", b);
  KILN_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: a and b must be 3-D, got ", Shapes(a), " and ",
             Shapes(b));
  KILN_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), "bmm: a ", Shapes(a), " and b ",
             Shapes(b), " must be [B, n, k] and [B, k, m]");
  return Named("bmm", [&] { return matmul(a, b); });
}

Tensor baddbmm(const Tensor& input, const Tensor& a, const Tensor& b, Scalar beta, Scalar alpha) {
  CheckDefined("baddbmm", input);
  return Named("baddbmm", [&] {
    Tensor out = bmm(a, b);
    const absl::StatusOr<Shape> s = BroadcastShapes(input.shape(), out.shape());
    KILN_CHECK(s.ok() && *s == out.shape(), "input ", input.shape_string(),
               " does not broadcast to the product's ", out.shape_string());
    if (alpha.to_double() != 1) out = mul(out, alpha);
    if (beta.to_double() == 0) return out;  // input is ignored, NaN too (as torch)
    return add(out, beta.to_double() == 1 ? input : mul(input, beta));
  });
}

Tensor selu(const Tensor& x) {
  constexpr double kAlpha = 1.6732632423543772848170429916717;
  constexpr double kScale = 1.0507009873554804934193349852946;
  return InFloat32("selu", x, [](const Tensor& v) {
    return mul(where(gt(v, 0.0), v, mul(expm1(v), kAlpha)), kScale);
  });
}

Tensor celu(const Tensor& x, double alpha) {
  KILN_CHECK(alpha != 0, "celu: alpha must not be 0 (as in torch)");
  return InFloat32("celu", x, [alpha](const Tensor& v) {
    return where(gt(v, 0.0), v, mul(expm1(div(v, alpha)), alpha));
  });
}

Tensor softsign(const Tensor& x) {
  return InFloat32("softsign", x, [](const Tensor& v) { return div(v, add(abs(v), 1.0)); });
}

Tensor tanhshrink(const Tensor& x) {
  return InFloat32("tanhshrink", x, [](const Tensor& v) { return sub(v, tanh(v)); });
}

Tensor threshold(const Tensor& x, double threshold, double value) {
  CheckDefined("threshold", x);
  return Named("threshold", [&] { return where(gt(x, threshold), x, full_like(x, value)); });
}

Tensor softmin(const Tensor& x, int64_t dim) {
  CheckDefined("softmin", x);
  return Named("softmin", [&] { return softmax(neg(x), dim); });
}

Tensor count_nonzero(const Tensor& x, IntList dims) {
  CheckDefined("count_nonzero", x);
  return Named("count_nonzero", [&] { return sum(ne(x, 0), dims); });
}

Tensor movedim(const Tensor& x, IntList source, IntList destination) {
  CheckDefined("movedim", x);
  KILN_CHECK(source.size() == destination.size(), "movedim: ", source.size(), " source dims but ",
             destination.size(), " destinations");
  const int64_t rank = x.dim();
  std::vector<int64_t> order(rank, -1);
  std::vector<bool> moved(rank, false), taken(rank, false);
  for (size_t i = 0; i < source.size(); ++i) {
    const int64_t s = Wrapped("movedim", x, source[i]), d = Wrapped("movedim", x, destination[i]);
    KILN_CHECK(!moved[s], "movedim: source dim ", source[i], " repeats");
    KILN_CHECK(!taken[d], "movedim: destination dim ", destination[i], " repeats");
    moved[s] = taken[d] = true;
    order[d] = s;
  }
  // The dims not moved keep their order in the places left.
  int64_t next = 0;
  for (int64_t d = 0; d < rank; ++d) {
    if (order[d] >= 0) continue;
    while (moved[next]) ++next;
    order[d] = next++;
  }
  return permute(x, order);
}

Tensor tile(const Tensor& x, IntList reps) {
  CheckDefined("tile", x);
  // Fewer reps than dims: leading 1s (torch.tile); more: repeat's new leading dims.
  Shape full(x.dim() > static_cast<int64_t>(reps.size()) ? x.dim() - reps.size() : 0, 1);
  full.insert(full.end(), reps.begin(), reps.end());
  return Named("tile", [&] { return repeat(x, full); });
}

Tensor nan_to_num(const Tensor& x, double nan, std::optional<double> posinf,
                  std::optional<double> neginf) {
  CheckDefined("nan_to_num", x);
  if (!IsFloatingPoint(x.dtype())) return clone(x);  // integers hold no NaN or inf
  const double big = MaxFinite(x.dtype());
  return Named("nan_to_num", [&] {
    const Tensor no_nan = where(isnan(x), full_like(x, nan), x);
    const Tensor up = where(eq(no_nan, INFINITY), full_like(x, posinf.value_or(big)), no_nan);
    return where(eq(up, -INFINITY), full_like(x, neginf.value_or(-big)), up);
  });
}

Tensor eye(int64_t n, std::optional<int64_t> m, DType dtype, Device device) {
  const int64_t cols = m.value_or(n);
  KILN_CHECK(n >= 0 && cols >= 0, "eye: sizes must be >= 0, got n = ", n, ", m = ", cols);
  return Named("eye", [&] {
    const Tensor rows = unsqueeze(arange(n, DType::kInt64, device), 1);
    return cast(eq(rows, unsqueeze(arange(cols, DType::kInt64, device), 0)), dtype);
  });
}

Tensor linspace(double start, double end, int64_t steps, DType dtype, Device device) {
  KILN_CHECK(steps >= 0, "linspace: steps must be >= 0, got ", steps);
  KILN_CHECK(IsFloatingPoint(dtype) || (std::isfinite(start) && std::isfinite(end)),
             "linspace: an integer dtype needs finite ends, got ", start, " and ", end);
  // torch's symmetric form: the first half counts up from start, the second down from end, so
  // that both ends are exact; one step is start.
  std::vector<double> v(static_cast<size_t>(steps), start);
  const double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0;
  for (int64_t i = 0; i < steps && steps > 1; ++i) {
    v[i] = i < steps / 2 ? start + step * static_cast<double>(i)
                         : end - step * static_cast<double>(steps - 1 - i);
  }
  return Named("linspace", [&] { return from_vector(v, {steps}, dtype, device); });
}

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  CheckDefined("dropout", x);
  KILN_CHECK(p >= 0 && p <= 1, "dropout: p must be in [0, 1], got ", p);
  KILN_CHECK(IsFloatingPoint(x.dtype()), "dropout: needs a floating tensor, got ",
             Describe(x.type()));
  if (!training || p == 0) return x;
  if (p == 1) return zeros_like(x);
  return Named("dropout", [&] {
    const Tensor keep = lt(rand(x.shape(), gen, DType::kFloat32, x.device()), 1.0 - p);
    return where(keep, div(x, 1.0 - p), zeros_like(x));
  });
}

}  // namespace kiln
