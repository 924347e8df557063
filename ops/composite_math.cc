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

namespace {

// a + sign alpha b with torch's alpha rules; `fn` names the op.
Tensor AddScaled(const char* fn, const Tensor& a, const Tensor& b, Scalar alpha, double sign) {
  CheckDefined(fn, a);
  CheckDefined(fn, b);
  const DType t = CommonType({a, b});
  KILN_CHECK(!alpha.is_bool() || t == DType::kBool, fn, ": a bool alpha (", alpha.ToString(),
             ") is only supported for a bool result (as in torch), not ", DTypeName(t));
  KILN_CHECK(IsFloatingPoint(t) || alpha.is_integer() || alpha.is_bool(), fn, ": alpha ",
             alpha.ToString(), " must be an integer for ", DTypeName(t), " operands (as in torch)");
  KILN_CHECK(sign > 0 || (a.dtype() != DType::kBool && b.dtype() != DType::kBool), fn,
             ": subtraction with a bool tensor is not supported (as in torch), got ",
             Describe(a.type()), " - ", Describe(b.type()));
  // Bools add as torch's kernel does, in bool: alpha counts as true unless it is 0.
  if (t == DType::kBool) return add(a, alpha.to_double() != 0 ? b : mul(b, false));
  if (alpha.to_double() == 1) return sign > 0 ? add(a, b) : sub(a, b);
  // Both operands in the result's dtype first (an integer b times alpha must not wrap in its
  // own type), then a + alpha b, in float32 for the half types.
  return PromotedInFloat32(fn, t, {cast(a, t), cast(b, t)}, [&](const auto& v) {
    const Tensor scaled = mul(v[1], alpha);
    return sign > 0 ? add(v[0], scaled) : sub(v[0], scaled);
  });
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  return AddScaled("add", a, b, alpha, 1);
}
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  return AddScaled("sub", a, b, alpha, -1);
}

Tensor square(const Tensor& x) {
  CheckDefined("square", x);
  const Tensor v = x.dtype() == DType::kBool ? cast(x, DType::kInt64) : x;  // as torch.square
  return Named("square", [&] { return mul(v, v); });
}

Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight) {
  CheckFloating("lerp", {&start, &end, &weight});
  KILN_CHECK(end.dtype() == start.dtype() && weight.dtype() == start.dtype(),
             "lerp: start, end and weight must have one dtype (as in torch), got ",
             DTypeName(start.dtype()), ", ", DTypeName(end.dtype()), " and ",
             DTypeName(weight.dtype()));
  // torch's form: start + w (end - start) for |w| < 0.5, end - (end - start)(1 - w) otherwise,
  // so that w = 1 gives end exactly.
  return PromotedInFloat32("lerp", start.dtype(), {start, end, weight}, [](const auto& v) {
    const Tensor diff = sub(v[1], v[0]);
    return where(lt(abs(v[2]), 0.5), add(v[0], mul(v[2], diff)), sub(v[1], mul(diff, 1.0 - v[2])));
  });
}

Tensor lerp(const Tensor& start, const Tensor& end, Scalar weight) {
  CheckFloating("lerp", {&start, &end});
  KILN_CHECK(end.dtype() == start.dtype(), "lerp: start and end must have one dtype (as in ",
             "torch), got ", DTypeName(start.dtype()), " and ", DTypeName(end.dtype()));
  const double w = weight.to_double();
  return PromotedInFloat32("lerp", start.dtype(), {start, end}, [w](const auto& v) {
    const Tensor diff = sub(v[1], v[0]);
    return std::abs(w) < 0.5 ? add(v[0], mul(diff, w)) : sub(v[1], mul(diff, 1.0 - w));
  });
}

namespace {

// addcmul's and addcdiv's checks: defined operands, and (as torch) an integral value for
// integer tensors. Returns the operands' common dtype.
DType CheckPointwiseWithValue(const char* fn, const Tensor& input, const Tensor& t1,
                              const Tensor& t2, Scalar value) {
  CheckDefined(fn, input);
  CheckDefined(fn, t1);
  CheckDefined(fn, t2);
  const DType t = CommonType({input, t1, t2});
  KILN_CHECK(IsFloatingPoint(t) || value.is_integer(), fn,
             ": for integer tensors the value must not be a floating-point number (as in torch), "
             "got ",
             value.ToString());
  return t;
}

}  // namespace

Tensor addcmul(const Tensor& input, const Tensor& t1, const Tensor& t2, Scalar value) {
  const DType t = CheckPointwiseWithValue("addcmul", input, t1, t2, value);
  // input + value t1 t2, the product taken left to right as torch's kernel.
  return PromotedInFloat32("addcmul", t, {input, t1, t2}, [&](const auto& v) {
    const Tensor scaled = value.to_double() == 1 ? v[1] : mul(v[1], value);
    return add(v[0], mul(scaled, v[2]));
  });
}

Tensor addcdiv(const Tensor& input, const Tensor& t1, const Tensor& t2, Scalar value) {
  const DType t = CheckPointwiseWithValue("addcdiv", input, t1, t2, value);
  KILN_CHECK(IsFloatingPoint(t1.dtype()) || IsFloatingPoint(t2.dtype()),
             "addcdiv: integer division is not supported (as in torch), got ", Describe(t1.type()),
             " / ", Describe(t2.type()));
  return PromotedInFloat32("addcdiv", t, {input, t1, t2}, [&](const auto& v) {
    // input + (value t1) / t2, in torch's kernel's order.
    const Tensor scaled = value.to_double() == 1 ? v[1] : mul(v[1], value);
    return add(v[0], div(scaled, v[2]));
  });
}

Tensor logaddexp(const Tensor& a, const Tensor& b) {
  CheckFloating("logaddexp", {&a, &b});
  // max + log1p(exp(-|a - b|)); equal operands give a + log 2 exactly, so that two -inf give
  // -inf and two +inf give +inf (their difference is NaN).
  return PromotedInFloat32("logaddexp", CommonType({a, b}), {a, b}, [](const auto& v) {
    return where(eq(v[0], v[1]), add(v[0], std::log(2.0)),
                 add(maximum(v[0], v[1]), log1p(exp(neg(abs(sub(v[0], v[1])))))));
  });
}

Tensor hypot(const Tensor& a, const Tensor& b) {
  CheckFloating("hypot", {&a, &b});
  // m sqrt(1 + (n / m)^2) with m = max(|a|, |b|), so squares never overflow (within 2 ulp of the
  // correctly rounded value in float32: kiln has no float64 to compute it in); an infinite
  // operand gives +inf even beside a NaN, as C's hypot.
  return PromotedInFloat32("hypot", CommonType({a, b}), {a, b}, [](const auto& v) {
    const Tensor x = abs(v[0]), y = abs(v[1]);
    const Tensor m = maximum(x, y), n = minimum(x, y);
    const Tensor r = div(n, m);
    const Tensor finite = where(eq(m, 0.0), zeros_like(m), mul(m, sqrt(add(mul(r, r), 1.0))));
    return where(logical_or(isinf(v[0]), isinf(v[1])), full_like(m, INFINITY), finite);
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
  return Named("baddbmm", [&] { return ScaledSum(input, bmm(a, b), beta, alpha); });
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

namespace {

// x itself when floating, else x as float32 (the ops torch computes on integers that way).
Tensor FloatingOrFloat32(const char* fn, const Tensor& x) {
  CheckDefined(fn, x);
  return IsFloatingPoint(x.dtype()) ? x : cast(x, DType::kFloat32);
}

}  // namespace

Tensor softsign(const Tensor& x) {
  return InFloat32("softsign", FloatingOrFloat32("softsign", x),
                   [](const Tensor& v) { return div(v, add(abs(v), 1.0)); });
}

Tensor tanhshrink(const Tensor& x) {
  return InFloat32("tanhshrink", FloatingOrFloat32("tanhshrink", x),
                   [](const Tensor& v) { return sub(v, tanh(v)); });
}

Tensor threshold(const Tensor& x, double threshold, double value) {
  CheckDefined("threshold", x);
  KILN_CHECK(x.dtype() != DType::kBool, "threshold: bool tensors are not supported (as in torch)");
  KILN_CHECK(FitsDType(threshold, x.dtype()) && FitsDType(value, x.dtype()),
             "threshold: ", threshold, " and ", value, " must convert to ", DTypeName(x.dtype()),
             " without overflow");
  // x <= threshold ? value : x, so NaN stays; an integer x compares with the threshold
  // converted to its dtype (truncated), as torch's kernel.
  const double th = IsFloatingPoint(x.dtype()) ? threshold : std::trunc(threshold);
  return Named("threshold", [&] { return where(le(x, th), full_like(x, value), x); });
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
  if (rank == 0) {  // dims 0 and -1 name the one "dim" of a 0-d tensor: nothing moves
    for (size_t i = 0; i < source.size(); ++i) {
      Wrapped("movedim", x, source[i]);
      Wrapped("movedim", x, destination[i]);
    }
    KILN_CHECK(source.size() <= 1, "movedim: a 0-d tensor has one dim, got ", source.size());
    return x;
  }
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
  const DType t = x.dtype();
  const double big = MaxFinite(t);
  // Each replacement converted to x's dtype as torch does (a value past its range: inf), and
  // each chosen from x itself, so a replacement is never replaced again.
  const auto value = [&](double v) { return full({}, RoundToDType(t, v), t, x.device()); };
  return Named("nan_to_num", [&] {
    const Tensor infinities = where(eq(x, INFINITY), value(posinf.value_or(big)),
                                    where(eq(x, -INFINITY), value(neginf.value_or(-big)), x));
    return where(isnan(x), value(nan), infinities);
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
  KILN_CHECK(dtype != DType::kBool, "linspace: bool is not a dtype it fills (as torch)");
  // The ends are converted to the dtype first, as torch converts its Scalars.
  KILN_CHECK(!IsFloatingPoint(dtype) || (FitsDType(start, dtype) && FitsDType(end, dtype)),
             "linspace: the ends ", start, " and ", end, " cannot be converted to ",
             DTypeName(dtype), " without overflow");
  KILN_CHECK(IsFloatingPoint(dtype) || (std::isfinite(start) && std::isfinite(end)),
             "linspace: an integer dtype needs finite ends, got ", start, " and ", end);
  // An integer dtype takes the ends converted to it first (truncated), as torch's kernel.
  if (!IsFloatingPoint(dtype)) start = std::trunc(start), end = std::trunc(end);
  // torch's symmetric form: the first half counts up from start, the second down from end, so
  // that both ends are exact; one step is start.
  std::vector<double> v;
  try {
    v.assign(static_cast<size_t>(steps), start);
  } catch (const std::exception&) {  // std::length_error, std::bad_alloc
    KILN_FAIL("linspace: ", steps, " steps do not fit in the host's memory");
  }
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
  if (!training || p == 0) return x;
  KILN_CHECK(IsFloatingPoint(x.dtype()), "dropout: needs a floating tensor, got ",
             Describe(x.type()));
  // x times the scaled mask (as torch), so a dropped NaN or inf gives NaN, not 0.
  if (p == 1) return Named("dropout", [&] { return mul(x, 0.0); });
  return Named("dropout", [&] {
    const Tensor keep = lt(rand(x.shape(), gen, DType::kFloat32, x.device()), 1.0 - p);
    return mul(mul(x, cast(keep, x.dtype())), 1.0 / (1.0 - p));
  });
}

}  // namespace kiln
