// Table-driven op conformance: every registry row × dtype × device against the independent
// double-precision reference in tests/reference.h, within a mainly relative tolerance
// (RelativeToleranceFor, tests/test_util.h), on fresh random inputs (never zeros), covering
// broadcasting, non-contiguous views, zero-size dims, 0-d tensors and batched matmul.
// A new op adds rows to kCases; the RegistryCoverage test fails until it does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "ops/dispatch.h"
#include "ops/distributed.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "tests/attention_reference.h"
#include "tests/reference.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

using ref::RefTensor;
using RefIn = const std::vector<RefTensor>&;
using KilnIn = const std::vector<Tensor>&;

// kInts: small integers (ties for comparisons and selection) in any dtype; kExponent: [0, 3)
// (integers 0..2 for integer dtypes); kIndex: integers in [0, bound) of the spec's own dtype;
// kDistinct: distinct ones (a random arrangement of part of 0..bound-1); kWide: magnitudes
// 2^-28 .. 2^15.9 of either sign, uniform in their exponent, and an eighth of them zero.
enum class Gen { kNormal, kPositive, kMask, kInts, kExponent, kIndex, kDistinct, kWide };
struct InputSpec {
  std::vector<int64_t> shape;
  Gen gen = Gen::kNormal;
  bool transposed = false;  // build as a transposed (non-contiguous) view of the last two dims
  int64_t bound = 0;        // kIndex
  std::optional<DType> dtype = std::nullopt;  // fixed, else the case's dtype (bool for masks)
};

struct OpCase {
  std::string name;
  OpId op;
  std::vector<InputSpec> inputs;
  std::function<Tensor(KilnIn)> run;
  std::function<RefTensor(RefIn)> ref;
  bool float_only = true;     // else also int64 inputs
  std::vector<DType> dtypes;  // when set: exactly these dtypes (instead of float_only's rule)
  // The absolute term of a half-precision result's tolerance, as a fraction of the largest
  // |reference value| (RelativeToleranceFor). A row that needs more says why.
  double half_atol_fraction = 1e-3;
  bool exact = false;  // the result is exactly defined (casts): no tolerance at all
};

InputSpec N(std::vector<int64_t> s) { return {std::move(s)}; }
InputSpec P(std::vector<int64_t> s) { return {std::move(s), Gen::kPositive}; }
InputSpec M(std::vector<int64_t> s) { return {std::move(s), Gen::kMask}; }
InputSpec T(std::vector<int64_t> s) { return {std::move(s), Gen::kNormal, true}; }

RefTensor Unary(RefIn in, double (*f)(double)) {
  return ref::Map({in[0]}, [f](const std::vector<double>& x) { return f(x[0]); });
}
double Sig(double x) { return 1 / (1 + std::exp(-x)); }
double GeluErf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double GeluTanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

RefTensor RefSoftmax(const RefTensor& x, int64_t dim, bool log) {
  return ref::Rows(x, dim, [log](const std::vector<double>& r) {
    double mx = -INFINITY, s = 0;
    for (double v : r) mx = std::max(mx, v);
    for (double v : r) s += std::exp(v - mx);
    std::vector<double> o;
    for (double v : r) o.push_back(log ? v - mx - std::log(s) : std::exp(v - mx) / s);
    return o;
  });
}

RefTensor RefNorm(RefIn in, bool rms, double eps) {
  RefTensor y = ref::Rows(in[0], -1, [&](const std::vector<double>& r) {
    double mean = 0, var = 0;
    if (!rms) {
      for (double v : r) mean += v / r.size();
    }
    for (double v : r) var += (v - mean) * (v - mean) / r.size();
    std::vector<double> o;
    for (double v : r) o.push_back((v - mean) / std::sqrt(var + eps));
    return o;
  });
  const int64_t d = in[0].shape.back();
  for (int64_t i = 0; i < y.numel(); ++i) {
    if (in.size() > 1) y.v[i] *= in[1].v[i % d];
    if (in.size() > 2) y.v[i] += in[2].v[i % d];
  }
  return y;
}

RefTensor RefSum(const RefTensor& x, std::vector<int64_t> dims, bool keep) {
  return ref::Reduce(
      x, dims, keep, 0, [](double a, double b) { return a + b; },
      [](double a, int64_t) { return a; });
}

// The window of the strided-window cases: rows 0..2, every other column from column 1, of a
// [4, 6] tensor's contiguous layout.
OpAttrs Window() {
  OpAttrs a;
  a.dims = {3, 2};
  a.strides = {6, 2};
  a.offset = 1;
  return a;
}

// Elementwise unary cases: name, op, input generator, kiln fn, reference fn.
std::vector<OpCase> UnaryCases() {
  struct U {
    const char* name;
    OpId op;
    Gen gen;
    Tensor (*run)(const Tensor&);
    double (*f)(double);
  };
  const U table[] = {
      {"neg", OpId::kNeg, Gen::kNormal, [](const Tensor& x) { return neg(x); },
       [](double x) { return -x; }},
      {"exp", OpId::kExp, Gen::kNormal, [](const Tensor& x) { return exp(x); },
       [](double x) { return std::exp(x); }},
      {"log", OpId::kLog, Gen::kPositive, [](const Tensor& x) { return log(x); },
       [](double x) { return std::log(x); }},
      {"sqrt", OpId::kSqrt, Gen::kPositive, [](const Tensor& x) { return sqrt(x); },
       [](double x) { return std::sqrt(x); }},
      {"rsqrt", OpId::kRsqrt, Gen::kPositive, [](const Tensor& x) { return rsqrt(x); },
       [](double x) { return 1 / std::sqrt(x); }},
      {"tanh", OpId::kTanh, Gen::kNormal, [](const Tensor& x) { return tanh(x); },
       [](double x) { return std::tanh(x); }},
      {"sigmoid", OpId::kSigmoid, Gen::kNormal, [](const Tensor& x) { return sigmoid(x); }, Sig},
      {"relu", OpId::kRelu, Gen::kNormal, [](const Tensor& x) { return relu(x); },
       [](double x) { return x > 0 ? x : 0; }},
      {"erf", OpId::kErf, Gen::kNormal, [](const Tensor& x) { return erf(x); },
       [](double x) { return std::erf(x); }},
      {"floor", OpId::kFloor, Gen::kNormal, [](const Tensor& x) { return floor(x * 3.0); },
       [](double x) { return std::floor(x * 3); }},
      {"ceil", OpId::kCeil, Gen::kNormal, [](const Tensor& x) { return ceil(x * 3.0); },
       [](double x) { return std::ceil(x * 3); }},
      {"round", OpId::kRound, Gen::kNormal, [](const Tensor& x) { return round(x * 3.0); },
       [](double x) { return std::nearbyint(x * 3); }},
      {"trunc", OpId::kTrunc, Gen::kNormal, [](const Tensor& x) { return trunc(x * 3.0); },
       [](double x) { return std::trunc(x * 3); }},
      {"log1p", OpId::kLog1p, Gen::kPositive, [](const Tensor& x) { return log1p(x); },
       [](double x) { return std::log1p(x); }},
      {"expm1", OpId::kExpm1, Gen::kNormal, [](const Tensor& x) { return expm1(x); },
       [](double x) { return std::expm1(x); }},
      {"tan", OpId::kTan, Gen::kNormal, [](const Tensor& x) { return tan(x * 0.5); },
       [](double x) { return std::tan(x * 0.5); }},
      {"atan", OpId::kAtan, Gen::kNormal, [](const Tensor& x) { return atan(x); },
       [](double x) { return std::atan(x); }},
      {"log2", OpId::kLog2, Gen::kPositive, [](const Tensor& x) { return log2(x); },
       [](double x) { return std::log2(x); }},
      {"log10", OpId::kLog10, Gen::kPositive, [](const Tensor& x) { return log10(x); },
       [](double x) { return std::log10(x); }},
      {"exp2", OpId::kExp2, Gen::kNormal, [](const Tensor& x) { return exp2(x); },
       [](double x) { return std::exp2(x); }},
      {"sinh", OpId::kSinh, Gen::kNormal, [](const Tensor& x) { return sinh(x); },
       [](double x) { return std::sinh(x); }},
      {"cosh", OpId::kCosh, Gen::kNormal, [](const Tensor& x) { return cosh(x); },
       [](double x) { return std::cosh(x); }},
      // The inverse functions on their domains: |x / 8| < 1 for the normal draws.
      {"asin", OpId::kAsin, Gen::kNormal, [](const Tensor& x) { return asin(x * 0.125); },
       [](double x) { return std::asin(x * 0.125); }},
      {"acos", OpId::kAcos, Gen::kNormal, [](const Tensor& x) { return acos(x * 0.125); },
       [](double x) { return std::acos(x * 0.125); }},
      {"asinh", OpId::kAsinh, Gen::kNormal, [](const Tensor& x) { return asinh(x); },
       [](double x) { return std::asinh(x); }},
      {"acosh", OpId::kAcosh, Gen::kPositive, [](const Tensor& x) { return acosh(x + 1.0); },
       [](double x) { return std::acosh(x + 1); }},
      {"atanh", OpId::kAtanh, Gen::kNormal, [](const Tensor& x) { return atanh(x * 0.125); },
       [](double x) { return std::atanh(x * 0.125); }},
      {"reciprocal", OpId::kReciprocal, Gen::kPositive,
       [](const Tensor& x) { return reciprocal(x); }, [](double x) { return 1 / x; }},
      {"sign", OpId::kSign, Gen::kNormal, [](const Tensor& x) { return sign(x); },
       [](double x) { return static_cast<double>((0 < x) - (x < 0)); }},
      {"gelu", OpId::kGelu, Gen::kNormal, [](const Tensor& x) { return gelu(x); }, GeluErf},
      {"gelu_tanh", OpId::kGelu, Gen::kNormal, [](const Tensor& x) { return gelu(x, "tanh"); },
       GeluTanh},
      {"silu", OpId::kSilu, Gen::kNormal, [](const Tensor& x) { return silu(x); },
       [](double x) { return x * Sig(x); }},
      {"add_scalar", OpId::kAddScalar, Gen::kNormal, [](const Tensor& x) { return x + 0.5; },
       [](double x) { return x + 0.5; }},
      {"sub_scalar", OpId::kSubScalar, Gen::kNormal, [](const Tensor& x) { return x - 2.0; },
       [](double x) { return x - 2; }},
      {"rsub_scalar", OpId::kRsubScalar, Gen::kNormal, [](const Tensor& x) { return 1.0 - x; },
       [](double x) { return 1 - x; }},
      {"mul_scalar", OpId::kMulScalar, Gen::kNormal, [](const Tensor& x) { return x * 1.5; },
       [](double x) { return x * 1.5; }},
      {"div_scalar", OpId::kDivScalar, Gen::kNormal, [](const Tensor& x) { return x / 4.0; },
       [](double x) { return x / 4; }},
  };
  std::vector<OpCase> out;
  for (const U& u : table) {
    for (auto [suffix, spec] : {std::pair<const char*, InputSpec>{"", {{5, 7}, u.gen}},
                                {"_strided", {{6, 3}, u.gen, true}},
                                {"_0d", {{}, u.gen}},
                                {"_empty", {{0, 4}, u.gen}}}) {
      auto f = u.f;
      auto run = u.run;
      out.push_back({absl::StrCat(u.name, suffix),
                     u.op,
                     {spec},
                     [run](KilnIn in) { return run(in[0]); },
                     [f](RefIn in) { return Unary(in, f); }});
    }
  }
  return out;
}

std::vector<OpCase> BinaryCases() {
  struct B {
    const char* name;
    OpId op;
    Tensor (*run)(const Tensor&, const Tensor&);
    double (*f)(double, double);
    Gen rhs = Gen::kNormal;
  };
  const B table[] = {
      {"add", OpId::kAdd, [](const Tensor& a, const Tensor& b) { return a + b; },
       [](double a, double b) { return a + b; }},
      {"sub", OpId::kSub, [](const Tensor& a, const Tensor& b) { return a - b; },
       [](double a, double b) { return a - b; }},
      {"mul", OpId::kMul, [](const Tensor& a, const Tensor& b) { return a * b; },
       [](double a, double b) { return a * b; }},
      {"div", OpId::kDiv, [](const Tensor& a, const Tensor& b) { return a / b; },
       [](double a, double b) { return a / b; }, Gen::kPositive},
      {"remainder", OpId::kRemainder,
       [](const Tensor& a, const Tensor& b) { return remainder(a * 4.0, b); },
       [](double a, double b) { return a * 4 - std::floor(a * 4 / b) * b; }, Gen::kPositive},
      {"fmod", OpId::kFmod, [](const Tensor& a, const Tensor& b) { return fmod(a * 4.0, b); },
       [](double a, double b) { return std::fmod(a * 4, b); }, Gen::kPositive},
      {"atan2", OpId::kAtan2, [](const Tensor& a, const Tensor& b) { return atan2(a, b); },
       [](double a, double b) { return std::atan2(a, b); }},
      {"floor_divide", OpId::kFloorDivide,
       [](const Tensor& a, const Tensor& b) { return floor_divide(a * 4.0, b); },
       [](double a, double b) { return std::floor(a * 4 / b); }, Gen::kPositive},
  };
  const std::pair<const char*, std::vector<std::vector<int64_t>>> shapes[] = {
      {"same", {{4, 5}, {4, 5}}},        {"row", {{4, 5}, {5}}}, {"col", {{4, 1}, {1, 5}}},
      {"3d", {{2, 3, 1, 4}, {3, 5, 1}}}, {"0d", {{3, 4}, {}}},   {"empty", {{0, 3}, {3}}},
  };
  std::vector<OpCase> out;
  for (const B& b : table) {
    for (const auto& [sname, s] : shapes) {
      auto f = b.f;
      auto run = b.run;
      out.push_back({absl::StrCat(b.name, "_", sname),
                     b.op,
                     {N(s[0]), {s[1], b.rhs}},
                     [run](KilnIn in) { return run(in[0], in[1]); },
                     [f](RefIn in) {
                       return ref::Map(in,
                                       [f](const std::vector<double>& x) { return f(x[0], x[1]); });
                     }});
    }
    auto f = b.f;
    auto run = b.run;
    out.push_back({absl::StrCat(b.name, "_strided"),
                   b.op,
                   {T({3, 4}), {{3, 4}, b.rhs, true}},
                   [run](KilnIn in) { return run(in[0], in[1]); },
                   [f](RefIn in) {
                     return ref::Map(in,
                                     [f](const std::vector<double>& x) { return f(x[0], x[1]); });
                   }});
  }
  return out;
}

// linear{epilogue}: what the GEMM epilogue fusion pass makes of linear + relu / tanh GELU, run
// through Dispatch (eager linear() has no epilogue); with and without bias, strided operands and
// K = 0 (the bias fill, then the activation).
void AddLinearEpilogueCases(const std::function<RefTensor(RefIn)>& lin_ref,
                            std::vector<OpCase>& c) {
  struct E {
    const char* name;
    Epilogue epilogue;
    double (*f)(double);
  };
  const E table[] = {{"relu", Epilogue::kRelu, [](double x) { return x > 0 ? x : 0; }},
                     {"gelu_tanh", Epilogue::kGeluTanh, GeluTanh}};
  const std::pair<const char*, std::vector<InputSpec>> shapes[] = {
      {"bias", {N({2, 5, 8}), N({6, 8}), N({6})}},
      {"nobias_strided", {T({4, 8}), T({3, 8})}},
      {"bias_k0", {N({3, 0}), N({4, 0}), N({4})}},
  };
  for (const E& e : table) {
    for (const auto& [shape_name, specs] : shapes) {
      const Epilogue epilogue = e.epilogue;
      auto f = e.f;
      c.push_back({absl::StrCat("linear_", shape_name, "_", e.name), OpId::kLinear, specs,
                   [epilogue](KilnIn in) {
                     OpAttrs attrs;
                     attrs.epilogue = epilogue;
                     return Dispatch(OpId::kLinear, in, attrs);
                   },
                   [lin_ref, f](RefIn in) {
                     RefTensor y = lin_ref(in);
                     for (double& v : y.v) v = f(v);
                     return y;
                   }});
    }
  }
  // epilogue=add: the residual (the output's shape, last) is added after the bias; strided
  // residuals, and K = 0 (the bias fill, then the residual).
  const std::pair<const char*, std::vector<InputSpec>> residual_shapes[] = {
      {"bias", {N({2, 5, 8}), N({6, 8}), N({6}), N({2, 5, 6})}},
      {"nobias_strided", {T({4, 8}), T({3, 8}), T({4, 3})}},
      {"bias_k0", {N({3, 0}), N({4, 0}), N({4}), N({3, 4})}},
  };
  for (const auto& [shape_name, specs] : residual_shapes) {
    c.push_back({absl::StrCat("linear_", shape_name, "_add"), OpId::kLinear, specs,
                 [](KilnIn in) {
                   OpAttrs attrs;
                   attrs.epilogue = Epilogue::kAdd;
                   return Dispatch(OpId::kLinear, in, attrs);
                 },
                 [lin_ref](RefIn in) {
                   RefTensor y = lin_ref(std::vector<RefTensor>(in.begin(), in.end() - 1));
                   for (size_t i = 0; i < y.v.size(); ++i) y.v[i] += in.back().v[i];
                   return y;
                 }});
  }
}

std::vector<OpCase> OtherCases() {
  auto where_ref = [](RefIn in) {
    return ref::Map(in, [](const std::vector<double>& x) { return x[0] != 0 ? x[1] : x[2]; });
  };
  auto fill_ref = [](RefIn in) {
    return ref::Map(in, [](const std::vector<double>& x) { return x[1] != 0 ? -3.5 : x[0]; });
  };
  auto reduce = [](std::vector<int64_t> dims, bool keep, int kind) {
    return [dims, keep, kind](RefIn in) {
      if (kind == 0) return RefSum(in[0], dims, keep);
      if (kind == 3) {
        return ref::Reduce(
            in[0], dims, keep, 1, [](double a, double b) { return a * b; },
            [](double a, int64_t) { return a; });
      }
      if (kind == 1) {
        return ref::Reduce(
            in[0], dims, keep, 0, [](double a, double b) { return a + b; },
            [](double a, int64_t n) { return a / n; });
      }
      return ref::Reduce(
          in[0], dims, keep, -INFINITY, [](double a, double b) { return std::max(a, b); },
          [](double a, int64_t) { return a; });
    };
  };
  auto cumsum_ref = [](int64_t dim) {  // running sums along `dim`, in double
    return [dim](RefIn in) {
      ref::RefTensor out = in[0];
      for (int64_t i = 0; i < out.numel(); ++i) {
        std::vector<int64_t> idx = ref::Unravel(i, out.shape);
        if (idx[dim] == 0) continue;
        --idx[dim];
        out.v[i] += out.v[ref::Ravel(idx, out.shape)];  // the element before, already summed
      }
      return out;
    };
  };
  std::vector<OpCase> c = {
      {"cumsum_last",
       OpId::kCumsum,
       {N({3, 300})},
       [](KilnIn in) { return cumsum(in[0], -1); },
       cumsum_ref(1)},
      {"cumsum_strided_dim0",
       OpId::kCumsum,
       {T({4, 5})},
       [](KilnIn in) { return cumsum(in[0], 0); },
       cumsum_ref(0)},
      {"where",
       OpId::kWhere,
       {M({4, 5}), N({4, 5}), N({5})},
       [](KilnIn in) { return where(in[0], in[1], in[2]); },
       where_ref},
      {"where_bcast_cond",
       OpId::kWhere,
       {M({5}), N({3, 5}), N({3, 1})},
       [](KilnIn in) { return where(in[0], in[1], in[2]); },
       where_ref},
      {"masked_fill",
       OpId::kMaskedFill,
       {N({4, 6}), M({4, 6})},
       [](KilnIn in) { return masked_fill(in[0], in[1], -3.5); },
       fill_ref},
      {"masked_fill_bcast",
       OpId::kMaskedFill,
       {T({2, 3, 4}), M({3, 4})},
       [](KilnIn in) { return masked_fill(in[0], in[1], -3.5); },
       fill_ref},
      {"masked_fill_inplace",
       OpId::kMaskedFill,
       {N({3, 4}), M({4})},
       [](KilnIn in) {
         Tensor x = clone(in[0]);
         masked_fill_(x, in[1], -3.5);
         return x;
       },
       fill_ref},
      {"add_inplace_strided",
       OpId::kAdd,
       {T({3, 4}), N({4})},
       [](KilnIn in) {
         Tensor x = clone(in[0]);
         Tensor v = transpose(x, 0, 1);
         add_(v, unsqueeze(in[1], 1));
         return x;
       },
       [](RefIn in) {
         return ref::Map(in, [](const std::vector<double>& x) { return x[0] + x[1]; });
       }},
      {"copy_inplace_bcast",
       OpId::kCopy,
       {T({3, 4}), N({4})},
       [](KilnIn in) {
         Tensor x = clone(in[0]);
         copy_(x, in[1]);
         return x;
       },
       [](RefIn in) { return ref::Map(in, [](const std::vector<double>& x) { return x[1]; }); },
       /*float_only=*/false},
      {"as_strided_window",
       OpId::kAsStrided,
       {T({4, 6})},
       [](KilnIn in) { return Dispatch(OpId::kAsStrided, {in[0]}, Window()); },
       [](RefIn in) {
         RefTensor out{{3, 2}, {}};
         const RefTensor x = in[0];
         for (int64_t i = 0; i < 3; ++i) {
           for (int64_t j = 0; j < 2; ++j) out.v.push_back(x.v[1 + 6 * i + 2 * j]);
         }
         return out;
       },
       /*float_only=*/false},
      {"as_strided_scatter_window",
       OpId::kAsStridedScatter,
       {T({4, 6}), N({3, 2})},
       [](KilnIn in) {
         return Dispatch(OpId::kAsStridedScatter, {in[0], in[1]}, Window());
       },
       [](RefIn in) {
         RefTensor out = in[0];
         for (int64_t i = 0; i < 3; ++i) {
           for (int64_t j = 0; j < 2; ++j) out.v[1 + 6 * i + 2 * j] = in[1].v[2 * i + j];
         }
         return out;
       },
       /*float_only=*/false},
      {"mul_inplace_scalar",
       OpId::kMulScalar,
       {N({3, 4})},
       [](KilnIn in) {
         Tensor x = clone(in[0]);
         mul_(x, 2.5);
         return x;
       },
       [](RefIn in) { return Unary(in, [](double x) { return x * 2.5; }); }},
      {"sum_all",
       OpId::kSum,
       {N({3, 4, 5})},
       [](KilnIn in) { return sum(in[0]); },
       reduce({}, false, 0),
       false},
      {"sum_dim",
       OpId::kSum,
       {N({3, 4, 5})},
       [](KilnIn in) { return sum(in[0], {1}); },
       reduce({1}, false, 0),
       false},
      {"sum_dims_keep",
       OpId::kSum,
       {T({3, 4, 5})},
       [](KilnIn in) {
         return sum(in[0], {0, -1}, true);
       },
       reduce({0, -1}, true, 0)},
      {"sum_empty",
       OpId::kSum,
       {N({0, 4})},
       [](KilnIn in) { return sum(in[0], {0}); },
       reduce({0}, false, 0)},
      {"mean_dim",
       OpId::kMean,
       {N({3, 4, 5})},
       [](KilnIn in) { return mean(in[0], {2}); },
       reduce({2}, false, 1)},
      {"mean_keep",
       OpId::kMean,
       {T({6, 5})},
       [](KilnIn in) { return mean(in[0], {0}, true); },
       reduce({0}, true, 1)},
      {"max_dim",
       OpId::kMax,
       {N({3, 4, 5})},
       [](KilnIn in) { return max(in[0], {-1}); },
       reduce({-1}, false, 2),
       false},
      {"max_all",
       OpId::kMax,
       {T({4, 7})},
       [](KilnIn in) { return max(in[0]); },
       reduce({}, false, 2)},
      {"prod_dim",
       OpId::kProd,
       {N({3, 4, 5})},
       [](KilnIn in) { return prod(in[0], {1}); },
       reduce({1}, false, 3),
       false},
      {"prod_all_strided_keep",
       OpId::kProd,
       {T({3, 4})},
       [](KilnIn in) { return prod(in[0], {}, true); },
       reduce({}, true, 3)},
      {"prod_empty",
       OpId::kProd,
       {N({0, 4})},
       [](KilnIn in) { return prod(in[0], {0}); },
       reduce({0}, false, 3)},
      {"softmax_last",
       OpId::kSoftmax,
       {N({4, 33})},
       [](KilnIn in) { return softmax(in[0], -1); },
       [](RefIn in) { return RefSoftmax(in[0], -1, false); }},
      {"softmax_dim0_strided",
       OpId::kSoftmax,
       {T({3, 5, 7})},
       [](KilnIn in) { return softmax(in[0], 0); },
       [](RefIn in) { return RefSoftmax(in[0], 0, false); }},
      {"log_softmax",
       OpId::kLogSoftmax,
       {N({2, 3, 17})},
       [](KilnIn in) { return log_softmax(in[0], -1); },
       [](RefIn in) { return RefSoftmax(in[0], -1, true); }},
      {"log_softmax_dim1",
       OpId::kLogSoftmax,
       {T({4, 6})},
       [](KilnIn in) { return log_softmax(in[0], 1); },
       [](RefIn in) { return RefSoftmax(in[0], 1, true); }},
      {"layer_norm",
       OpId::kLayerNorm,
       {N({4, 3, 16}), N({16}), N({16})},
       [](KilnIn in) { return layer_norm(in[0], in[1], in[2]); },
       [](RefIn in) { return RefNorm(in, false, 1e-5); }},
      {"layer_norm_noaffine",
       OpId::kLayerNorm,
       {T({8, 5})},
       [](KilnIn in) { return layer_norm(in[0]); },
       [](RefIn in) { return RefNorm(in, false, 1e-5); }},
      {"rms_norm",
       OpId::kRmsNorm,
       {N({4, 24}), N({24})},
       [](KilnIn in) { return rms_norm(in[0], in[1]); },
       [](RefIn in) { return RefNorm(in, true, 1e-6); }},
      {"rms_norm_noweight",
       OpId::kRmsNorm,
       {N({3, 2, 9})},
       [](KilnIn in) { return rms_norm(in[0]); },
       [](RefIn in) { return RefNorm(in, true, 1e-6); }},
  };
  // Matmul: 2-D, vectors, broadcast batches, transposed views as operands, K = 0.
  auto mm = [](RefIn in) { return ref::Matmul(in[0], in[1]); };
  auto run_mm = [](KilnIn in) { return matmul(in[0], in[1]); };
  const std::pair<const char*, std::vector<InputSpec>> mm_cases[] = {
      {"matmul_2d", {N({17, 33}), N({33, 9})}},
      {"matmul_vec_mat", {N({6}), N({6, 4})}},
      {"matmul_mat_vec", {N({5, 6}), N({6})}},
      {"matmul_dot", {N({7}), N({7})}},
      {"matmul_batched", {N({3, 4, 5}), N({3, 5, 2})}},
      {"matmul_bcast_batch", {N({2, 1, 3, 4}), N({5, 4, 6})}},
      {"matmul_transposed_a", {T({5, 8}), N({8, 3})}},
      {"matmul_transposed_b", {N({4, 6}), T({6, 7})}},
      {"matmul_batched_vec", {N({2, 3, 4}), N({4})}},
      {"matmul_k0", {N({3, 0}), N({0, 4})}},
  };
  for (const auto& [name, specs] : mm_cases) c.push_back({name, OpId::kMatmul, specs, run_mm, mm});
  auto lin_ref = [](RefIn in) {
    RefTensor y = ref::Matmul(in[0], ref::Transpose2(in[1]));
    for (int64_t i = 0; in.size() > 2 && i < y.numel(); ++i) y.v[i] += in[2].v[i % in[2].v.size()];
    return y;
  };
  c.push_back({"linear_bias",
               OpId::kLinear,
               {N({2, 5, 8}), N({6, 8}), N({6})},
               [](KilnIn in) { return linear(in[0], in[1], in[2]); },
               lin_ref});
  c.push_back({"linear_nobias_strided",
               OpId::kLinear,
               {T({4, 8}), N({3, 8})},
               [](KilnIn in) { return linear(in[0], in[1]); },
               lin_ref});
  c.push_back({"linear_vec",
               OpId::kLinear,
               {N({8}), N({3, 8}), N({3})},
               [](KilnIn in) { return linear(in[0], in[1], in[2]); },
               lin_ref});
  // Size-1 dims have any stride: x [3, 1, 1, 8] with strides [1, 1, 77, 3] is x [3, 8] (the CPU
  // kernel once took the stride of dim -2 for its rows and read past the storage).
  c.push_back({"linear_size1_dims_any_stride",
               OpId::kLinear,
               {T({3, 8}), N({4, 8}), N({4})},
               [](KilnIn in) {
                 const Tensor& x = in[0];
                 const Tensor x4 = x.as_strided(
                     {3, 1, 1, 8}, {x.stride(0), x.stride(0), 77, x.stride(1)}, x.offset());
                 return linear(x4, in[1], in[2]);
               },
               [lin_ref](RefIn in) {
                 RefTensor y = lin_ref(in);
                 y.shape = {3, 1, 1, 4};
                 return y;
               }});
  c.push_back({"linear_k0",
               OpId::kLinear,
               {N({2, 3, 0}), N({4, 0}), N({4})},
               [](KilnIn in) { return linear(in[0], in[1], in[2]); },
               lin_ref});
  AddLinearEpilogueCases(lin_ref, c);
  return c;
}

// The sdpa rows' absolute term (their comment says why): 2^-7, above the 2.9e-3 measured.
constexpr double kAttentionHalfAtolFraction = 0x1p-7;

// Casts, copies, masks and views: values must equal the (rounded) inputs rearranged.
std::vector<OpCase> LayoutCases() {
  auto identity = [](RefIn in) { return in[0]; };
  auto tri = [](bool upper, int64_t diag) {
    return [upper, diag](RefIn in) {
      RefTensor o = in[0];
      const int64_t r = o.shape[o.shape.size() - 2], cols = o.shape.back();
      for (int64_t i = 0; i < o.numel(); ++i) {
        const int64_t row = (i / cols) % r, col = i % cols;
        if (upper ? col - row < diag : col - row > diag) o.v[i] = 0;
      }
      return o;
    };
  };
  std::vector<OpCase> c = {
      {"contiguous",
       OpId::kContiguous,
       {T({5, 3})},
       [](KilnIn in) { return contiguous(in[0]); },
       identity,
       false},
      {"triu",
       OpId::kTriu,
       {N({2, 4, 5})},
       [](KilnIn in) { return triu(in[0], 1); },
       tri(true, 1),
       false},
      {"tril",
       OpId::kTril,
       {T({5, 4})},
       [](KilnIn in) { return tril(in[0], -1); },
       tri(false, -1),
       false},
      // (tests/attention_test.cc covers attention's shapes, masks and backends in depth)
      // Head dims other than 64 and 128 run the math form on CUDA, which rounds the scores and
      // the probabilities to the dtype (as eager torch does): an output is a sum of rounded
      // terms p·v, so its error follows sum(p·|v|), not the output. Measured on the CPU's math
      // backend over 151 draws of these inputs: up to 2.9e-3 x the largest |reference| (bf16).
      {"sdpa_causal",
       OpId::kScaledDotProductAttention,
       {N({2, 3, 5, 8}), N({2, 3, 7, 8}), N({2, 3, 7, 8})},
       [](KilnIn in) { return scaled_dot_product_attention(in[0], in[1], in[2], {}, true); },
       [](RefIn in) {
         return ref::Sdpa(in[0], in[1], in[2], {.causal = true, .scale = 1 / std::sqrt(8.0)});
       },
       true,
       {},
       kAttentionHalfAtolFraction},
      {"sdpa_bool_mask",
       OpId::kScaledDotProductAttention,
       {N({2, 4, 6}), T({2, 6, 6}), N({2, 6, 6}), M({4, 6})},
       [](KilnIn in) { return scaled_dot_product_attention(in[0], in[1], in[2], in[3]); },
       [](RefIn in) {
         return ref::Sdpa(in[0], in[1], in[2],
                          {.mask = &in[3], .mask_is_bool = true, .scale = 1 / std::sqrt(6.0)});
       },
       true,
       {},
       kAttentionHalfAtolFraction},
      {"transpose",
       OpId::kTranspose,
       {N({3, 4})},
       [](KilnIn in) { return contiguous(transpose(in[0], 0, 1)); },
       [](RefIn in) { return ref::Transpose2(in[0]); },
       false},
      {"permute_reshape",
       OpId::kPermute,
       {N({2, 3, 4})},
       [](KilnIn in) {
         return reshape(permute(permute(in[0], {2, 0, 1}), {1, 2, 0}), {6, 4});
       },
       [](RefIn in) {
         RefTensor o = in[0];
         o.shape = {6, 4};
         return o;
       },
       false},
      {"reshape_copy",
       OpId::kReshape,
       {T({4, 6})},
       [](KilnIn in) {
         return reshape(in[0], {2, -1});
       },
       [](RefIn in) {
         RefTensor o = in[0];
         o.shape = {2, 12};
         return o;
       },
       false},
      {"expand",
       OpId::kExpand,
       {N({3, 1})},
       [](KilnIn in) {
         return contiguous(expand(in[0], {2, 3, 4}));
       },
       [](RefIn in) {
         return ref::Map({in[0], RefTensor{{2, 3, 4}, std::vector<double>(24, 0)}},
                         [](const std::vector<double>& x) { return x[0]; });
       },
       false},
      {"slice_step",
       OpId::kSlice,
       {N({10, 3})},
       [](KilnIn in) { return contiguous(slice(in[0], 0, 1, -2, 3)); },
       [](RefIn in) {
         RefTensor o{{3, 3}, {}};
         for (int r : {1, 4, 7})
           for (int j = 0; j < 3; ++j) o.v.push_back(in[0].v[r * 3 + j]);
         return o;
       },
       false},
      {"unsqueeze_squeeze",
       OpId::kUnsqueeze,
       {N({3, 4})},
       [](KilnIn in) { return squeeze(unsqueeze(unsqueeze(in[0], 0), -1), 0); },
       [](RefIn in) {
         RefTensor o = in[0];
         o.shape = {3, 4, 1};
         return o;
       },
       false},
      {"squeeze_all",
       OpId::kSqueeze,
       {N({1, 3, 1, 2})},
       [](KilnIn in) { return squeeze(in[0]); },
       [](RefIn in) {
         RefTensor o = in[0];
         o.shape = {3, 2};
         return o;
       },
       false},
  };
  return c;
}

// x converted to dtype t, worked out apart from kiln's conversions: round to nearest even for the
// floating dtypes (float32 by the C++ conversion, bfloat16 and float16 by tests/reference.h),
// truncation toward zero for the integers, x != 0 for bool. (kiln turns NaN, infinities and
// values outside int64 into integer 0; no case here draws one.)
double RefCast(double x, DType t) {
  switch (t) {
    case DType::kFloat32:
      return static_cast<float>(x);
    case DType::kBFloat16:
      return ref::RoundToBFloat16(x);
    case DType::kFloat16:
      return ref::RoundToFloat16(x);
    case DType::kBool:
      return x != 0;
    default:
      return std::trunc(x);
  }
}

// cast to every dtype and back to float32, compared exactly, from every dtype on normal values
// and from the floating dtypes on kWide values (float16's subnormals and its rounding near 2^16,
// truncations of large values).
std::vector<OpCase> CastCases() {
  const std::vector<DType> every = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                    DType::kBool,    DType::kInt32,   DType::kInt64};
  std::vector<OpCase> c;
  for (DType to_type : every) {
    auto run = [to_type](KilnIn in) { return cast(cast(in[0], to_type), DType::kFloat32); };
    auto ref_fn = [to_type](RefIn in) {
      return ref::Map(in, [to_type](const std::vector<double>& x) {
        return RefCast(RefCast(x[0], to_type), DType::kFloat32);
      });
    };
    const std::string name = absl::StrCat("cast_to_", DTypeName(to_type));
    c.push_back({name, OpId::kCast, {N({4, 5})}, run, ref_fn, true, every});
    c.push_back({absl::StrCat(name, "_wide"), OpId::kCast, {{{6, 8}, Gen::kWide}}, run, ref_fn});
    c[c.size() - 2].exact = c.back().exact = true;
  }
  return c;
}

#include "tests/ops_conformance_cases.inc"

// The collectives over 3 thread ranks: rank r contributes in[0] · (r + 1) (r = 0, 1, 2), and the
// case reads rank 0's result.
std::vector<OpCase> CollectiveCases() {
  auto on_ranks = [](std::function<Tensor(const Tensor&, ProcessGroup&)> op) {
    return [op](KilnIn in) {
      Tensor result;
      RunThreadRanks(3, [&](ProcessGroup& pg) {
        Tensor mine = op(mul(in[0], pg.rank() + 1.0), pg);
        if (pg.rank() == 0) result = mine;
      });
      return result;
    };
  };
  auto times = [](double k) {
    return [k](RefIn in) {
      return ref::Map({in[0]}, [k](const std::vector<double>& x) { return x[0] * k; });
    };
  };
  auto gathered = [](RefIn in) {
    RefTensor out = in[0];
    out.shape[0] *= 3;
    out.v.clear();
    for (double k : {1, 2, 3}) {
      for (double x : in[0].v) out.v.push_back(x * k);
    }
    return out;
  };
  auto first_third_times_6 = [](RefIn in) {
    RefTensor out = in[0];
    out.shape[0] /= 3;
    out.v.resize(out.v.size() / 3);
    for (double& x : out.v) x *= 6;
    return out;
  };
  std::vector<OpCase> c = {
      {"all_reduce_sum",
       OpId::kAllReduce,
       {N({4, 5})},
       on_ranks([](const Tensor& x, ProcessGroup& pg) { return all_reduce(x, pg); }),
       times(6),
       false},
      {"all_reduce_max_of_positive",
       OpId::kAllReduce,
       {P({7})},
       on_ranks(
           [](const Tensor& x, ProcessGroup& pg) { return all_reduce(x, pg, ReduceOp::kMax); }),
       times(3),
       false},
      {"all_gather",
       OpId::kAllGather,
       {N({2, 5})},
       on_ranks([](const Tensor& x, ProcessGroup& pg) { return all_gather(x, pg); }),
       gathered,
       false},
      {"all_gather_transposed",
       OpId::kAllGather,
       {T({3, 4})},
       on_ranks([](const Tensor& x, ProcessGroup& pg) { return all_gather(x, pg); }),
       gathered},
      {"reduce_scatter",
       OpId::kReduceScatter,
       {N({6, 4})},
       on_ranks([](const Tensor& x, ProcessGroup& pg) { return reduce_scatter(x, pg); }),
       first_third_times_6,
       false},
      {"broadcast_from_2",
       OpId::kBroadcast,
       {N({3, 2})},
       on_ranks([](const Tensor& x, ProcessGroup& pg) { return broadcast(x, pg, 2); }),
       times(3),
       false},
  };
  return c;
}

const std::vector<OpCase>& AllCases() {
  static const auto* cases = [] {
    auto* v = new std::vector<OpCase>();
    for (auto& part :
         {UnaryCases(), BinaryCases(), OtherCases(), LayoutCases(), MathCases(), CompareCases(),
          IndexingCases(), JoinCases(), SelectionCases(), CastCases(), CollectiveCases()}) {
      v->insert(v->end(), part.begin(), part.end());
    }
    return v;
  }();
  return *cases;
}

Tensor MakeInput(const InputSpec& s, DType dtype, Device device, Generator& gen) {
  std::vector<int64_t> shape = s.shape;
  if (s.transposed) std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
  const int64_t n = NumElements(shape);
  Tensor t;
  if (s.gen == Gen::kMask) {
    std::vector<double> bits(n);
    for (double& b : bits) b = gen.Uniform() < 0.5;
    t = from_vector(bits, shape, DType::kBool);
  } else if (s.gen == Gen::kDistinct) {
    std::vector<double> pool(s.bound);
    for (int64_t i = 0; i < s.bound; ++i) pool[i] = static_cast<double>(i);
    for (int64_t i = s.bound - 1; i > 0; --i) {
      std::swap(pool[i], pool[static_cast<int64_t>(gen.Uniform() * (i + 1)) % (i + 1)]);
    }
    pool.resize(n);
    t = from_vector(pool, shape, dtype);
  } else if (s.gen == Gen::kWide) {
    std::vector<double> v(n);
    for (double& x : v) {
      const double sign = gen.Uniform() < 0.5 ? -1 : 1, exponent = gen.Uniform() * 43.9 - 28;
      x = gen.Uniform() < 0.125 ? 0 : sign * std::exp2(exponent);
    }
    t = from_vector(v, shape, dtype);
  } else if (s.gen == Gen::kInts || s.gen == Gen::kExponent || s.gen == Gen::kIndex) {
    std::vector<double> v(n);
    for (double& x : v) {
      if (s.gen == Gen::kInts) x = std::round(gen.Normal() * 2);
      if (s.gen == Gen::kExponent) x = gen.Uniform() * 3;
      if (s.gen == Gen::kIndex) x = std::floor(gen.Uniform() * s.bound);
      if (s.gen == Gen::kExponent && !IsFloatingPoint(dtype)) x = std::floor(x);
    }
    t = from_vector(v, shape, dtype);
  } else {
    t = randn(shape, gen, DType::kFloat32);
    if (s.gen == Gen::kPositive) t = exp(t * 0.5) + 0.1;
    if (!IsFloatingPoint(dtype)) t = cast(t * 10.0, dtype);
    t = cast(t, dtype);
  }
  t = to(t, device);
  return s.transposed ? transpose(t, -1, -2) : t;
}

struct Param {
  size_t case_index;
  DType dtype;
  Device device;
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << AllCases()[p.case_index].name << " " << DTypeName(p.dtype) << " on " << p.device.str();
}

class OpConformance : public ::testing::TestWithParam<Param> {};

TEST_P(OpConformance, MatchesReference) {
  const Param& p = GetParam();
  if (p.device.is_cuda()) KILN_SKIP_WITHOUT_GPU();
  const OpCase& c = AllCases()[p.case_index];
  Generator gen(1234 + p.case_index);
  std::vector<Tensor> inputs;
  std::vector<RefTensor> refs;
  for (const InputSpec& s : c.inputs) {
    const DType dtype = s.dtype ? *s.dtype : s.gen == Gen::kMask ? DType::kBool : p.dtype;
    inputs.push_back(MakeInput(s, dtype, p.device, gen));
    refs.push_back({s.shape, to_vector(inputs.back())});
  }
  const Tensor out = c.run(inputs);
  const RefTensor expected = c.ref(refs);
  ASSERT_EQ(std::vector<int64_t>(out.shape().begin(), out.shape().end()), expected.shape);
  EXPECT_EQ(out.device(), p.device);
  const Tolerance tol = c.exact
                            ? Tolerance{0, 0}
                            : RelativeToleranceFor(out.dtype(), expected.v, c.half_atol_fraction);
  ExpectClose(to_vector(out), expected.v, tol, c.name);
}

std::vector<Param> AllParams(Device device) {
  std::vector<Param> out;
  for (size_t i = 0; i < AllCases().size(); ++i) {
    if (!AllCases()[i].dtypes.empty()) {
      for (DType t : AllCases()[i].dtypes) out.push_back({i, t, device});
      continue;
    }
    for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
      out.push_back({i, t, device});
    if (!AllCases()[i].float_only) out.push_back({i, DType::kInt64, device});
  }
  return out;
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  return absl::StrCat(AllCases()[info.param.case_index].name, "_", DTypeName(info.param.dtype));
}

INSTANTIATE_TEST_SUITE_P(Cpu, OpConformance, ::testing::ValuesIn(AllParams(kCPU)), ParamName);
INSTANTIATE_TEST_SUITE_P(Cuda, OpConformance, ::testing::ValuesIn(AllParams(CUDA(0))), ParamName);

// The cast rows' reference conversions on values worked out by hand.
TEST(OpConformanceReference, CastsRoundToNearestEven) {
  // bfloat16 keeps 8 significant bits. 1 + 2^-8 lies half way between 1 and 1 + 2^-7 (the even
  // one, 1, wins), 1 + 3·2^-8 half way between 1 + 2^-7 and 1 + 2^-6 (1 + 2^-6 wins).
  EXPECT_EQ(ref::RoundToBFloat16(1 + 0x1p-8), 1.0);
  EXPECT_EQ(ref::RoundToBFloat16(1 + 3 * 0x1p-8), 1 + 0x1p-6);
  EXPECT_EQ(ref::RoundToBFloat16(1 + 0x1p-8 + 0x1p-20), 1 + 0x1p-7);  // past the tie: up
  EXPECT_EQ(ref::RoundToBFloat16(M_PI), 3.140625);                    // 0x40490FDB -> 0x4049
  EXPECT_EQ(ref::RoundToBFloat16(-0.1), -0.10009765625);              // 0xBDCCCCCD -> 0xBDCD
  EXPECT_EQ(ref::RoundToBFloat16(0x1.fep127), 0x1.fep127);            // the largest bf16
  EXPECT_EQ(ref::RoundToBFloat16(0x1.fffffep127), INFINITY);          // FLT_MAX rounds up
  EXPECT_TRUE(std::isnan(ref::RoundToBFloat16(NAN)));
  // float16 keeps 11 significant bits, down to 2^-24 (subnormals below 2^-14), up to 65504.
  EXPECT_EQ(ref::RoundToFloat16(1.0 / 3), 0.333251953125);  // 0x3555
  EXPECT_EQ(ref::RoundToFloat16(0.1), 0.0999755859375);     // 0x2E66
  EXPECT_EQ(ref::RoundToFloat16(1 + 0x1p-11), 1.0);         // a tie: to the even 1
  EXPECT_EQ(ref::RoundToFloat16(1 + 3 * 0x1p-11), 1 + 0x1p-9);
  EXPECT_EQ(ref::RoundToFloat16(6.1e-5), 1023 * 0x1p-24);  // just below 2^-14: a subnormal
  EXPECT_EQ(ref::RoundToFloat16(0x1p-24), 0x1p-24);        // the smallest subnormal
  EXPECT_EQ(ref::RoundToFloat16(3 * 0x1p-26), 0x1p-24);    // 0.75 of it rounds up
  EXPECT_EQ(ref::RoundToFloat16(0x1p-25), 0.0);            // a tie: to the even 0
  EXPECT_TRUE(std::signbit(ref::RoundToFloat16(-0x1p-26)));
  EXPECT_EQ(ref::RoundToFloat16(65519.99), 65504.0);
  EXPECT_EQ(ref::RoundToFloat16(-65520), -INFINITY);  // half way to 2^16 rounds to infinity
  EXPECT_TRUE(std::isnan(ref::RoundToFloat16(NAN)));
  // Integers truncate toward zero; bool is x != 0.
  EXPECT_EQ(RefCast(-2.7, DType::kInt64), -2);
  EXPECT_EQ(RefCast(2.7, DType::kInt32), 2);
  EXPECT_EQ(RefCast(-0.5, DType::kBool), 1);
  EXPECT_EQ(RefCast(0.0, DType::kBool), 0);
}

TEST(OpConformanceTable, CoversEveryRegistryRow) {
  std::set<OpId> covered;
  for (const OpCase& c : AllCases()) covered.insert(c.op);
  for (int i = 0; i < kNumOps; ++i) {
    EXPECT_TRUE(covered.count(static_cast<OpId>(i)))
        << "registry row '" << GetOpDef(static_cast<OpId>(i)).name << "' has no conformance case";
  }
}

}  // namespace
}  // namespace kiln
