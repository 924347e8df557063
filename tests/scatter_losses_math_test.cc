// torch semantics of scatter / scatter_add, prod, the inverse and hyperbolic math rows, atan2,
// the loss functions (ops/loss_ops.cc), the math composites (ops/composite_math.cc) and the
// selection, closeness and diagonal ones (ops/composite_select.cc): values
// against hand-computed or C++ <cmath> references, dtypes, bad input as errors naming the op, and
// the new rows under kiln::compile equal to eager. Device-parametrised bodies run on the CPU
// here and on CUDA on the GPU machine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "codegen/compile.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/status.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

std::vector<double> Vals(const Tensor& x) { return to_vector(x); }

Tensor F32(const std::vector<double>& v, IntList shape, Device device) {
  return to(from_vector(v, shape), device);
}
Tensor I64(const std::vector<double>& v, IntList shape, Device device) {
  return to(from_vector(v, shape, DType::kInt64), device);
}

void ExpectErrorNames(const std::function<Tensor()>& f, const std::string& op,
                      const std::string& rule) {
  const std::string e = ErrorOf(f);
  EXPECT_NE(e.find(op), std::string::npos) << e;
  EXPECT_NE(e.find(rule), std::string::npos) << e;
}

// scatter / scatter_add along dim 0 and 1, a scalar value, repeated indices (which add up), an
// index smaller than src, in place, int64 exactly, and the errors: a bad index (nothing written),
// mismatched ranks and dtypes, an index larger than src.
void ScatterIsTorchs(Device device) {
  const Tensor self = to(zeros({3, 4}), device);
  const Tensor src = F32({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4}, device);
  const Tensor index = I64({0, 1, 2, 0, 2, 0, 0, 1}, {2, 4}, device);
  // dim 0: out[index[i][j]][j] = src[i][j].
  EXPECT_EQ(Vals(scatter(self, 0, index, src)),
            (std::vector<double>{1, 6, 7, 4, 0, 2, 0, 8, 5, 0, 3, 0}));
  // dim 1 with a [2, 2] index (smaller than src): out[i][index[i][j]] = src[i][j].
  const Tensor idx1 = I64({3, 0, 1, 2}, {2, 2}, device);
  EXPECT_EQ(Vals(scatter(self, 1, idx1, src)),
            (std::vector<double>{2, 0, 0, 1, 0, 5, 6, 0, 0, 0, 0, 0}));
  EXPECT_EQ(Vals(scatter(self, -1, idx1, 2.5)),
            (std::vector<double>{2.5, 0, 0, 2.5, 0, 2.5, 2.5, 0, 0, 0, 0, 0}));
  // Repeated indices accumulate under scatter_add.
  const Tensor ones_src = to(ones({2, 4}), device);
  const Tensor rep = I64({0, 0, 0, 0, 0, 0, 2, 2}, {2, 4}, device);
  EXPECT_EQ(Vals(scatter_add(self, 0, rep, ones_src)),
            (std::vector<double>{2, 2, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1}));
  // A histogram: many adds onto few bins, int64 exactly.
  const Tensor bins = to(zeros({4}, DType::kInt64), device);
  const Tensor values = to(remainder(arange(1000), 4), device);
  EXPECT_EQ(Vals(scatter_add(bins, 0, values, to(ones({1000}, DType::kInt64), device))),
            (std::vector<double>{250, 250, 250, 250}));
  // In place: self itself is written.
  Tensor inplace = to(zeros({3, 4}), device);
  scatter_add_(inplace, 0, rep, ones_src);
  scatter_(inplace, 1, idx1, src);
  EXPECT_EQ(Vals(inplace), (std::vector<double>{2, 2, 1, 1, 0, 5, 6, 0, 0, 0, 1, 1}));
  // Bad input: an index out of range names the op and leaves nothing half-written.
  const Tensor keep = to(ones({3, 4}), device);
  const std::string bad = ErrorOf([&] {
    return scatter(keep, 0, I64({0, 3}, {1, 2}, device), src);
  });
  EXPECT_NE(bad.find("scatter"), std::string::npos) << bad;
  EXPECT_EQ(Vals(keep), std::vector<double>(12, 1));
  ExpectErrorNames([&] { return scatter(self, 0, I64({0}, {1}, device), src); }, "scatter",
                   "same number of dims");
  ExpectErrorNames([&] { return scatter(self, 0, index, to(src, DType::kFloat16)); }, "scatter",
                   "dtype");
  ExpectErrorNames(
      [&] {
        return scatter_add(self, 0, I64({0, 0, 0}, {3, 1}, device), src);
      },
      "scatter_add", "larger than src");
  ExpectErrorNames([&] { return scatter(self, 0, to(index, DType::kFloat32), src); }, "scatter",
                   "int64 or int32");
  ExpectErrorNames([&] { return scatter(self, 2, index, src); }, "scatter", "dim");
  ExpectErrorNames(
      [&] {
        return scatter(to(zeros({0, 4}), device), 0, index, src);
      },
      "scatter", "is empty");
}
TEST(ScatterLossesMath, ScatterIsTorchsOnCpu) { ScatterIsTorchs(kCPU); }
TEST(ScatterLossesMathCuda, ScatterIsTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  ScatterIsTorchs(CUDA(0));
}

TEST(ScatterLossesMathCuda, ScatterAddOfHalfTypesAccumulates) {
  KILN_SKIP_WITHOUT_GPU();
  for (DType t : {DType::kBFloat16, DType::kFloat16, DType::kInt32}) {
    const Tensor out =
        scatter_add(to(zeros({2}, t), CUDA(0)), 0, to(zeros({64}, DType::kInt64), CUDA(0)),
                    to(ones({64}, t), CUDA(0)));
    EXPECT_EQ(Vals(out), (std::vector<double>{64, 0})) << DTypeName(t);
  }
  ExpectErrorNames(
      [] {
        return scatter_add(to(zeros({2}, DType::kBool), CUDA(0)), 0,
                           to(zeros({1}, DType::kInt64), CUDA(0)),
                           to(ones({1}, DType::kBool), CUDA(0)));
      },
      "scatter_add", "not supported on CUDA");
}

// prod over all and some dims, keepdim, empty reductions (1), integers exactly in int64 (wrapping
// past it), bools, and NaN/zero propagation.
void ProdIsTorchs(Device device) {
  const Tensor x = F32({1, 2, 3, 4, 5, 6}, {2, 3}, device);
  EXPECT_EQ(Vals(prod(x)), (std::vector<double>{720}));
  EXPECT_EQ(Vals(prod(x, {1})), (std::vector<double>{6, 120}));
  EXPECT_EQ(prod(x, {0}, true).shape(), (Shape{1, 3}));
  EXPECT_EQ(Vals(prod(x, {0})), (std::vector<double>{4, 10, 18}));
  EXPECT_EQ(Vals(prod(to(zeros({0, 3}), device), {0})), (std::vector<double>{1, 1, 1}));
  const Tensor big = I64({1 << 20, 1 << 20, 1 << 20, 2}, {4}, device);
  const Tensor p = prod(big);
  EXPECT_EQ(p.dtype(), DType::kInt64);
  EXPECT_EQ(item<int64_t>(p), int64_t{1} << 61);
  EXPECT_EQ(item<int64_t>(prod(I64({1 << 30, 1 << 30, 16}, {3}, device))), 0);  // wraps: 2^64
  EXPECT_EQ(prod(to(ones({3}, DType::kBool), device)).dtype(), DType::kInt64);
  EXPECT_TRUE(std::isnan(item(prod(F32({2, NAN, 0}, {3}, device)))));
  EXPECT_EQ(prod(to(x, DType::kBFloat16)).dtype(), DType::kBFloat16);
  // A long row takes the split path on CUDA (partials in a scratch buffer).
  const Tensor near_one = to(full({1 << 17}, 1.0000001), device);
  EXPECT_NEAR(item(prod(near_one)), std::pow(static_cast<double>(1.0000001f), 1 << 17), 1e-4);
}
TEST(ScatterLossesMath, ProdIsTorchsOnCpu) { ProdIsTorchs(kCPU); }
TEST(ScatterLossesMathCuda, ProdIsTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  ProdIsTorchs(CUDA(0));
}

// The inverse and hyperbolic rows and atan2 against <cmath>, their domains' NaN and inf, and
// integer inputs giving float32.
void MathRowsAreCmaths(Device device) {
  const std::vector<double> v = {-0.75, -0.25, 0, 0.5, 0.9};
  const Tensor x = F32(v, {5}, device);
  struct Row {
    const char* name;
    Tensor (*op)(const Tensor&);
    double (*f)(double);
  };
  const Row rows[] = {
      {"log2", [](const Tensor& t) { return log2(t); }, [](double e) { return std::log2(e); }},
      {"log10", [](const Tensor& t) { return log10(t); }, [](double e) { return std::log10(e); }},
      {"exp2", [](const Tensor& t) { return exp2(t); }, [](double e) { return std::exp2(e); }},
      {"sinh", [](const Tensor& t) { return sinh(t); }, [](double e) { return std::sinh(e); }},
      {"cosh", [](const Tensor& t) { return cosh(t); }, [](double e) { return std::cosh(e); }},
      {"asin", [](const Tensor& t) { return asin(t); }, [](double e) { return std::asin(e); }},
      {"acos", [](const Tensor& t) { return acos(t); }, [](double e) { return std::acos(e); }},
      {"asinh", [](const Tensor& t) { return asinh(t); }, [](double e) { return std::asinh(e); }},
      {"acosh", [](const Tensor& t) { return acosh(add(abs(t), 1.0)); },
       [](double e) { return std::acosh(std::fabs(e) + 1); }},
      {"atanh", [](const Tensor& t) { return atanh(t); }, [](double e) { return std::atanh(e); }}};
  for (const Row& r : rows) {
    std::vector<double> want;
    for (double e : v) want.push_back(r.f(static_cast<double>(static_cast<float>(e))));
    ExpectClose(Vals(r.op(x)), want, {1e-6, 1e-5}, r.name);  // log2(0) = -inf matches
  }
  EXPECT_TRUE(std::isnan(item(asin(F32({2}, {}, device)))));
  EXPECT_EQ(item(atanh(F32({1}, {}, device))), INFINITY);
  EXPECT_EQ(log2(I64({8}, {1}, device)).dtype(), DType::kFloat32);
  EXPECT_EQ(Vals(log2(I64({8}, {1}, device))), (std::vector<double>{3}));
  // atan2(y, x): every quadrant, the axes, and broadcasting.
  const Tensor y = F32({1, 1, -1, -1, 0, 1}, {6}, device),
               xs = F32({1, -1, -1, 1, -1, 0}, {6}, device);
  std::vector<double> want;
  for (int i = 0; i < 6; ++i) {
    const double yv[] = {1, 1, -1, -1, 0, 1}, xv[] = {1, -1, -1, 1, -1, 0};
    want.push_back(std::atan2(yv[i], xv[i]));
  }
  ExpectClose(Vals(atan2(y, xs)), want, {1e-6, 1e-6}, "atan2");
  EXPECT_EQ(atan2(reshape(y, {6, 1}), xs).shape(), (Shape{6, 6}));
  EXPECT_EQ(atan2(I64({1}, {1}, device), I64({1}, {1}, device)).dtype(), DType::kFloat32);
}
TEST(ScatterLossesMath, MathRowsAreCmathsOnCpu) { MathRowsAreCmaths(kCPU); }
TEST(ScatterLossesMathCuda, MathRowsAreCmaths) {
  KILN_SKIP_WITHOUT_GPU();
  MathRowsAreCmaths(CUDA(0));
}

// Each loss against its formula, each reduction, half inputs keeping their dtype, and the errors.
void LossesAreTorchs(Device device) {
  const Tensor in = F32({0.5, -1, 2, 0.25}, {2, 2}, device);
  const Tensor tg = F32({0, 1, 2.5, -0.5}, {2, 2}, device);
  const std::vector<double> d = {0.5, -2, -0.5, 0.75};
  double sq = 0, ab = 0, smooth = 0, huber = 0;
  for (double e : d) {
    sq += e * e, ab += std::fabs(e);
    smooth += std::fabs(e) < 1 ? 0.5 * e * e : std::fabs(e) - 0.5;
    huber += std::fabs(e) <= 1.5 ? 0.5 * e * e : 1.5 * (std::fabs(e) - 0.75);
  }
  const Tolerance tol{1e-6, 1e-6};
  ExpectClose(Vals(mse_loss(in, tg)), {sq / 4}, tol, "mse");
  ExpectClose(Vals(mse_loss(in, tg, "sum")), {sq}, tol, "mse sum");
  EXPECT_EQ(mse_loss(in, tg, "none").shape(), (Shape{2, 2}));
  ExpectClose(Vals(l1_loss(in, tg)), {ab / 4}, tol, "l1");
  ExpectClose(Vals(smooth_l1_loss(in, tg, "sum")), {smooth}, tol, "smooth_l1");
  ExpectClose(Vals(smooth_l1_loss(in, tg, "sum", 0)), {ab}, tol, "smooth_l1 beta 0");
  ExpectClose(Vals(huber_loss(in, tg, "sum", 1.5)), {huber}, tol, "huber");
  EXPECT_EQ(mse_loss(to(in, DType::kBFloat16), to(tg, DType::kBFloat16)).dtype(), DType::kBFloat16);
  // Broadcasting targets, as torch (which warns).
  EXPECT_EQ(mse_loss(in, F32({1}, {1}, device), "none").shape(), (Shape{2, 2}));
  // Binary cross-entropies: probabilities at 0 and 1 stay finite (logs clamped at -100).
  const Tensor p = F32({0.25, 0.5, 0, 1}, {4}, device), t = F32({1, 0, 0, 1}, {4}, device);
  const double bce = (-std::log(0.25) - std::log(0.5) + 0 + 0) / 4;
  ExpectClose(Vals(binary_cross_entropy(p, t)), {bce}, tol, "bce");
  ExpectClose(Vals(binary_cross_entropy(F32({0}, {1}, device), F32({1}, {1}, device))), {100}, tol,
              "bce clamp");
  const Tensor z = F32({-2, 0, 3, 40}, {4}, device);
  std::vector<double> want;
  const double zs[] = {-2, 0, 3, 40}, ts[] = {1, 0, 0, 1};
  for (int i = 0; i < 4; ++i) {
    const double s = 1 / (1 + std::exp(-zs[i]));
    want.push_back(ts[i] == 1 ? -std::log(s) : -std::log1p(-s));
  }
  ExpectClose(Vals(binary_cross_entropy_with_logits(z, t, "none")), want, {1e-6, 1e-5},
              "bce logits");
  const Tensor pw = F32({3}, {1}, device);
  want[0] *= 3, want[3] *= 3;  // pos_weight scales the positive terms
  ExpectClose(Vals(binary_cross_entropy_with_logits(z, t, "none", pw)), want, {1e-6, 1e-5},
              "bce pos_weight");
  // nll_loss: minus the picked log-probability, ignore_index, mean over the kept.
  const Tensor lp = F32({-1, -2, -3, -0.5, -1.5, -2.5}, {2, 3}, device);
  ExpectClose(Vals(nll_loss(lp, I64({2, 0}, {2}, device))), {(3 + 0.5) / 2}, tol, "nll");
  ExpectClose(Vals(nll_loss(lp, I64({2, -100}, {2}, device))), {3}, tol, "nll ignore");
  // kl_div: pointwise t (log t - x), 0 where t is 0; batchmean divides by the batch.
  const Tensor kx = F32({-1, -2, -0.5, -3}, {2, 2}, device),
               kt = F32({0.5, 0, 0.25, 0.25}, {2, 2}, device);
  const double kl =
      0.5 * (std::log(0.5) + 1) + 0.25 * (std::log(0.25) + 0.5) + 0.25 * (std::log(0.25) + 3);
  ExpectClose(Vals(kl_div(kx, kt, "sum")), {kl}, tol, "kl sum");
  // A NaN input shows even where the target is 0 (torch's xlogy(t, t) - t x).
  EXPECT_TRUE(std::isnan(Vals(kl_div(F32({NAN}, {1}, device), F32({0}, {1}, device), "none"))[0]));
  ExpectClose(Vals(kl_div(kx, kt, "batchmean")), {kl / 2}, tol, "kl batchmean");
  // log_target: exp(t) (t - x), NaN where t is -inf, as in torch; on positive targets the same.
  const Tensor positive = F32({0.5, 0.125, 0.25, 0.125}, {2, 2}, device);
  ExpectClose(Vals(kl_div(kx, log(positive), "sum", /*log_target=*/true)),
              Vals(kl_div(kx, positive, "sum")), tol, "kl log target");
  EXPECT_TRUE(std::isnan(item(kl_div(kx, log(kt), "sum", /*log_target=*/true))));
  // Errors.
  ExpectErrorNames([&] { return mse_loss(in, tg, "avg"); }, "mse_loss", "reduction");
  ExpectErrorNames([&] { return l1_loss(in, I64({1, 2}, {2}, device)); }, "l1_loss", "floating");
  ExpectErrorNames(
      [&] {
        return mse_loss(in, F32({1, 2, 3}, {3}, device));
      },
      "mse_loss", "broadcast");
  ExpectErrorNames(
      [&] {
        return binary_cross_entropy(p, F32({1, 0}, {2}, device));
      },
      "binary_cross_entropy", "input's shape");
  for (double outside : {1.5, -0.25, std::nan("")}) {  // torch: "between 0 and 1", NaN too
    ExpectErrorNames(
        [&] {
          return binary_cross_entropy(F32({0.5, outside}, {2}, device), F32({1, 0}, {2}, device));
        },
        "binary_cross_entropy", "between 0 and 1");
  }
  ExpectErrorNames([&] { return huber_loss(in, tg, "mean", 0); }, "huber_loss", "delta");
  ExpectErrorNames(
      [&] {
        return binary_cross_entropy_with_logits(z, t, "none", to(ones({4, 4}), device));
      },
      "binary_cross_entropy_with_logits", "pos_weight");
  ExpectErrorNames([&] { return smooth_l1_loss(in, tg, "mean", -1); }, "smooth_l1_loss", "beta");
  ExpectErrorNames([&] { return nll_loss(lp, I64({3, 0}, {2}, device)); }, "nll_loss", "index");
  ExpectErrorNames([&] { return nll_loss(lp, lp); }, "nll_loss", "class indices");
  ExpectErrorNames([&] { return kl_div(kx, kt, "batch"); }, "kl_div", "batchmean");
}
TEST(ScatterLossesMath, LossesAreTorchsOnCpu) { LossesAreTorchs(kCPU); }
TEST(ScatterLossesMathCuda, LossesAreTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  LossesAreTorchs(CUDA(0));
}

// The math composites against their formulas, with the edge values torch defines.
void CompositesAreTorchs(Device device) {
  const Tolerance tol{1e-6, 1e-6};
  const Tensor a = F32({1, -2, 0.5}, {3}, device), b = F32({3, 4, -1}, {3}, device);
  EXPECT_EQ(Vals(square(a)), (std::vector<double>{1, 4, 0.25}));
  EXPECT_EQ(square(to(ones({2}, DType::kBool), device)).dtype(), DType::kInt64);
  ExpectClose(Vals(lerp(a, b, 0.25)), {1.5, -0.5, 0.125}, tol, "lerp");
  EXPECT_EQ(Vals(lerp(a, b, 1.0)), Vals(b));  // exactly end at weight 1
  ExpectClose(Vals(lerp(a, b, F32({0, 1, 0.5}, {3}, device))), {1, 4, -0.25}, tol, "lerp t");
  ExpectClose(Vals(addcmul(a, a, b, 2)), {7, -18, -0.5}, tol, "addcmul");
  ExpectClose(Vals(addcdiv(a, a, b, 0.5)), {1 + 1.0 / 6, -2.25, 0.25}, tol, "addcdiv");
  ExpectErrorNames([&] { return addcdiv(a, I64({1}, {1}, device), I64({2}, {1}, device)); },
                   "addcdiv", "integer division");
  const Tensor inf = F32({-INFINITY, INFINITY, 1000, 0}, {4}, device);
  const Tensor other = F32({-INFINITY, INFINITY, 1000, -1000}, {4}, device);
  ExpectClose(Vals(logaddexp(inf, other)), {-INFINITY, INFINITY, 1000 + std::log(2.0), 0}, tol,
              "logaddexp");
  ExpectClose(
      Vals(hypot(F32({3, 1e30, 0, NAN}, {4}, device), F32({4, 1e30, 0, INFINITY}, {4}, device))),
      {5, std::sqrt(2.0) * 1e30, 0, INFINITY}, {1e-6, 1e-6}, "hypot");
  // bmm and baddbmm against matmul.
  Generator gen(7);
  const Tensor x = randn({2, 3, 4}, gen, DType::kFloat32, device);
  const Tensor y = randn({2, 4, 5}, gen, DType::kFloat32, device);
  ExpectClose(Vals(bmm(x, y)), Vals(matmul(x, y)), tol, "bmm");
  const Tensor bias = randn({5}, gen, DType::kFloat32, device);
  ExpectClose(Vals(baddbmm(bias, x, y, 0.5, 2)), Vals(add(mul(matmul(x, y), 2.0), mul(bias, 0.5))),
              tol, "baddbmm");
  ExpectErrorNames([&] { return bmm(x, x); }, "bmm", "[B, k, m]");
  ExpectErrorNames([&] { return bmm(reshape(x, {6, 4}), y); }, "bmm", "3-D");
  // Activations.
  const Tensor v = F32({-1, 0, 2}, {3}, device);
  const double k_alpha = 1.6732632423543772, k_scale = 1.0507009873554805;
  ExpectClose(Vals(selu(v)), {k_scale * k_alpha * std::expm1(-1.0), 0, k_scale * 2}, tol, "selu");
  ExpectClose(Vals(celu(v, 2)), {2 * std::expm1(-0.5), 0, 2}, tol, "celu");
  ExpectClose(Vals(softsign(v)), {-0.5, 0, 2.0 / 3}, tol, "softsign");
  ExpectClose(Vals(tanhshrink(v)), {-1 - std::tanh(-1.0), 0, 2 - std::tanh(2.0)}, tol,
              "tanhshrink");
  EXPECT_EQ(Vals(threshold(v, 0, -7)), (std::vector<double>{-7, -7, 2}));
  // NaN stays (x <= threshold is false); integers compare with the truncated threshold.
  EXPECT_TRUE(std::isnan(Vals(threshold(F32({NAN}, {1}, device), 1, -5))[0]));
  EXPECT_EQ(Vals(threshold(I64({-1, 0, 5}, {3}, device), -1.5, 9)), (std::vector<double>{9, 0, 5}));
  EXPECT_EQ(softsign(I64({1}, {1}, device)).dtype(), DType::kFloat32);
  ExpectErrorNames([&] { return threshold(to(I64({1}, {1}, device), DType::kInt32), 1e10, 1); },
                   "threshold", "overflow");
  ExpectClose(Vals(softmin(v, 0)), Vals(softmax(neg(v), 0)), tol, "softmin");
  ExpectErrorNames([&] { return selu(I64({1}, {1}, device)); }, "selu", "floating");
  // Counting, moving dims, tiles, NaN replacement.
  EXPECT_EQ(Vals(count_nonzero(F32({0, 1, NAN, 0, -2, 0}, {2, 3}, device), {1})),
            (std::vector<double>{2, 1}));
  const Tensor cube = to(reshape(arange(24), {2, 3, 4}), device);
  EXPECT_EQ(movedim(cube, {0}, {2}).shape(), (Shape{3, 4, 2}));
  EXPECT_EQ(movedim(cube, {2, 0}, {0, 1}).shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(Vals(movedim(cube, {-1}, {0})), Vals(permute(cube, {2, 0, 1})));
  ExpectErrorNames([&] { return movedim(cube, {0, 0}, {1, 2}); }, "movedim", "repeats");
  EXPECT_EQ(tile(F32({1, 2}, {2}, device), {2, 2}).shape(), (Shape{2, 4}));
  EXPECT_EQ(tile(cube, {2}).shape(), (Shape{2, 3, 8}));
  EXPECT_EQ(
      Vals(nan_to_num(F32({NAN, INFINITY, -INFINITY, 1}, {4}, device), 0, 9)),
      (std::vector<double>{0, 9, -static_cast<double>(std::numeric_limits<float>::max()), 1}));
  EXPECT_EQ(Vals(nan_to_num(to(F32({INFINITY}, {1}, device), DType::kFloat16))),
            (std::vector<double>{65504}));
  // Each replacement is chosen from x once (never replaced again), converted to x's dtype.
  const Tensor specials = F32({NAN, INFINITY, -INFINITY, 1}, {4}, device);
  EXPECT_EQ(Vals(nan_to_num(specials, INFINITY)),
            (std::vector<double>{INFINITY, std::numeric_limits<float>::max(),
                                 -static_cast<double>(std::numeric_limits<float>::max()), 1}));
  EXPECT_EQ(Vals(nan_to_num(specials, 0, -INFINITY))[1], -INFINITY);
  EXPECT_EQ(Vals(nan_to_num(to(F32({INFINITY}, {1}, device), DType::kFloat16), 0, 1e6)),
            (std::vector<double>{INFINITY}));
  EXPECT_EQ(movedim(to(full({}, 2.0), device), {0}, {-1}).dim(), 0);
  // Factories.
  EXPECT_EQ(Vals(eye(2, 3, DType::kFloat32, device)), (std::vector<double>{1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(Vals(linspace(0, 1, 5, DType::kFloat32, device)),
            (std::vector<double>{0, 0.25, 0.5, 0.75, 1}));
  EXPECT_EQ(linspace(2, 3, 0).numel(), 0);
  EXPECT_EQ(Vals(linspace(2, 3, 1)), (std::vector<double>{2}));
  EXPECT_EQ(Vals(linspace(0.5, 10.7, 4, DType::kInt64)), (std::vector<double>{0, 3, 6, 10}));
  // Ends past the dtype's range are refused, as torch's Scalar conversion refuses them (float16
  // stored [0, inf, inf]); bool is no dtype linspace fills.
  EXPECT_NE(
      ErrorOf([&] {
        linspace(0, 1e6, 3, DType::kFloat16, device);
      }).find("linspace: the ends 0 and 1e+06 cannot be converted to float16 without overflow"),
      std::string::npos);
  EXPECT_EQ(Vals(linspace(-65504, 65504, 3, DType::kFloat16, device)),
            (std::vector<double>{-65504, 0, 65504}));
  EXPECT_THROW(linspace(0, 1, 3, DType::kBool, device), Error);
  // Dropout: the identity when not training; scaled survivors, about 1 - p of them, when training.
  Generator drop(11);
  const Tensor big = to(ones({4000}), device);
  EXPECT_EQ(dropout(big, 0.5, /*training=*/false, drop).storage(), big.storage());
  const std::vector<double> kept = Vals(dropout(big, 0.25, /*training=*/true, drop));
  int survivors = 0;
  for (double e : kept) {
    EXPECT_TRUE(e == 0 || std::fabs(e - 1 / 0.75) < 1e-6) << e;
    survivors += e != 0;
  }
  EXPECT_NEAR(survivors / 4000.0, 0.75, 0.03);
  ExpectErrorNames([&] { return dropout(big, 1.5, true, drop); }, "dropout", "p must be");
  EXPECT_TRUE(std::isnan(item(dropout(F32({NAN}, {1}, device), 1.0, true, drop))));
  EXPECT_EQ(dropout(I64({1}, {1}, device), 0.5, /*training=*/false, drop).dtype(), DType::kInt64);
  // Half operands compute in float32 and round once (torch's kernels): one rounding, not three.
  const Tensor h1 = to(F32({19.5, 126.5}, {2}, device), DType::kBFloat16);
  const Tensor h2 = to(F32({-3.765625, -161}, {2}, device), DType::kBFloat16);
  EXPECT_EQ(Vals(hypot(h1, h2))[0], RoundToDType(DType::kBFloat16, std::hypot(19.5, -3.765625)));
  // A zero-dim float32 operand keeps the half result dtype (torch's rule) and float32 compute.
  const Tensor h3 = hypot(to(F32({3}, {1}, device), DType::kFloat16), to(full({}, 1.0), device));
  EXPECT_EQ(h3.dtype(), DType::kFloat16);
  EXPECT_EQ(Vals(h3)[0], RoundToDType(DType::kFloat16, std::hypot(3.0, 1.0)));
  EXPECT_EQ(Vals(lerp(h1, h2, -2.109375))[1],
            RoundToDType(DType::kBFloat16, 126.5 + (-2.109375) * (-161 - 126.5)));
  ExpectErrorNames([&] { return lerp(a, to(b, DType::kBFloat16), 0.5); }, "lerp", "one dtype");
  ExpectErrorNames(
      [&] {
        return addcmul(I64({1}, {1}, device), I64({2}, {1}, device), I64({3}, {1}, device), 2.5);
      },
      "addcmul", "floating-point");
  EXPECT_EQ(item<int64_t>(
                addcmul(I64({1}, {1}, device), I64({2}, {1}, device), I64({3}, {1}, device), 2)),
            13);
}
TEST(ScatterLossesMath, CompositesAreTorchsOnCpu) { CompositesAreTorchs(kCPU); }
TEST(ScatterLossesMathCuda, CompositesAreTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  CompositesAreTorchs(CUDA(0));
}

// nonzero / argwhere / masked_select (eager: the mask is read on the host; traced: an error),
// isclose / allclose / equal, and the diagonals.
void SelectionAndClosenessAreTorchs(Device device) {
  const Tensor x = F32({0, 1.5, 0, -2, 0, NAN}, {2, 3}, device);
  EXPECT_EQ(Vals(nonzero(x)), (std::vector<double>{0, 1, 1, 0, 1, 2}));
  EXPECT_EQ(nonzero(x).shape(), (Shape{3, 2}));
  EXPECT_EQ(nonzero(to(zeros({4}), device)).shape(), (Shape{0, 1}));
  EXPECT_EQ(Vals(argwhere(x)), Vals(nonzero(x)));
  EXPECT_EQ(Vals(masked_select(F32({1, 2, 3, 4, 5, 6}, {2, 3}, device),
                               gt(F32({0, 1, 0}, {3}, device), 0.5))),
            (std::vector<double>{2, 5}));
  ExpectErrorNames([&] { return masked_select(x, x); }, "masked_select", "bool");
  // isclose: tolerances, infinities, NaN only with equal_nan, one dtype.
  const Tensor a = F32({1, 1, INFINITY, -INFINITY, NAN, 100}, {6}, device);
  const Tensor b = F32({1 + 1e-7, 1.1, INFINITY, INFINITY, NAN, 100.0015}, {6}, device);
  EXPECT_EQ(Vals(isclose(a, b)), (std::vector<double>{1, 0, 1, 0, 0, 0}));
  EXPECT_EQ(Vals(isclose(a, b, 1e-5, 1e-3, /*equal_nan=*/true)),
            (std::vector<double>{1, 0, 1, 0, 1, 1}));
  EXPECT_TRUE(allclose(a, a, 1e-5, 1e-8, true));
  EXPECT_FALSE(allclose(a, b));
  // A difference that overflows is never close (as torch: isfinite(|a - b|)).
  EXPECT_EQ(Vals(isclose(F32({3e38}, {1}, device), F32({-3e38}, {1}, device), 10, 0)),
            (std::vector<double>{0}));
  EXPECT_TRUE(equal(x, x) == false);  // NaN != NaN, as torch.equal
  EXPECT_TRUE(equal(a, a) == false);
  EXPECT_TRUE(equal(to(arange(4), device), to(arange(4), device)));
  EXPECT_FALSE(equal(to(arange(4), device), to(reshape(arange(4), {2, 2}), device)));
  ExpectErrorNames([&] { return isclose(a, to(b, DType::kBFloat16)); }, "isclose", "one dtype");
  // Integers: the difference is exact (in int64), then compared.
  const double big = static_cast<double>(int64_t{1} << 30);
  EXPECT_EQ(Vals(isclose(I64({big + 1}, {1}, device), I64({big}, {1}, device), 0, 0.5)),
            (std::vector<double>{0}));
  ExpectErrorNames([&] { return Tensor(equal(a, to(a, DType::kBFloat16)) ? a : b); }, "equal",
                   "one dtype");
  ExpectErrorNames([&] { return diag(F32({1}, {1}, device), std::numeric_limits<int64_t>::max()); },
                   "diag", "offset");
  // Diagonals.
  const Tensor m = to(reshape(arange(12), {3, 4}), device);
  EXPECT_EQ(Vals(diagonal(m)), (std::vector<double>{0, 5, 10}));
  EXPECT_EQ(Vals(diagonal(m, 1)), (std::vector<double>{1, 6, 11}));
  EXPECT_EQ(Vals(diagonal(m, -1)), (std::vector<double>{4, 9}));
  EXPECT_EQ(diagonal(m, 5).numel(), 0);
  const Tensor cube = to(reshape(arange(24), {2, 3, 4}), device);
  EXPECT_EQ(Vals(diagonal(cube, 0, 1, 2)), (std::vector<double>{0, 5, 10, 12, 17, 22}));
  EXPECT_EQ(Vals(diagonal(cube, 0, 0, 2)), (std::vector<double>{0, 13, 4, 17, 8, 21}));
  EXPECT_EQ(item<int64_t>(trace(m)), 15);
  EXPECT_EQ(Vals(diag(F32({1, 2}, {2}, device))), (std::vector<double>{1, 0, 0, 2}));
  EXPECT_EQ(Vals(diag(F32({1, 2}, {2}, device), 1)),
            (std::vector<double>{0, 1, 0, 0, 0, 2, 0, 0, 0}));
  EXPECT_EQ(Vals(diag(F32({1, 2}, {2}, device), -1)),
            (std::vector<double>{0, 0, 0, 1, 0, 0, 0, 2, 0}));
  EXPECT_EQ(Vals(diag(m)), (std::vector<double>{0, 5, 10}));
  ExpectErrorNames([&] { return diagonal(m, 0, 1, -1); }, "diagonal", "must differ");
  ExpectErrorNames([&] { return trace(cube); }, "trace", "2-D");
}
TEST(ScatterLossesMath, SelectionAndClosenessAreTorchsOnCpu) {
  SelectionAndClosenessAreTorchs(kCPU);
}
TEST(ScatterLossesMathCuda, SelectionAndClosenessAreTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  SelectionAndClosenessAreTorchs(CUDA(0));
}

// select / unbind / swapaxes views, pad (crops too), meshgrid, index_add / index_fill, and the
// products mm, mv, dot with their shape and dtype errors.
void LayoutAndIndexingAreTorchs(Device device) {
  const Tensor m = to(reshape(arange(12), {3, 4}), device);
  EXPECT_EQ(Vals(select(m, 1, -1)), (std::vector<double>{3, 7, 11}));
  EXPECT_EQ(select(m, 0, 2).storage(), m.storage());  // a view
  ExpectErrorNames([&] { return select(m, 0, 3); }, "select", "out of range");
  const std::vector<Tensor> rows = unbind(m);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(Vals(rows[1]), (std::vector<double>{4, 5, 6, 7}));
  EXPECT_EQ(swapaxes(m, 0, 1).shape(), (Shape{4, 3}));
  // pad: (left, right) of the last dim first; negative sizes crop.
  const Tensor p = pad(F32({1, 2, 3}, {1, 3}, device), {1, 2}, -1);
  EXPECT_EQ(Vals(p), (std::vector<double>{-1, 1, 2, 3, -1, -1}));
  EXPECT_EQ(pad(m, {0, 0, 1, 1}).shape(), (Shape{5, 4}));
  EXPECT_EQ(Vals(pad(m, {-1, -2})), (std::vector<double>{1, 5, 9}));
  EXPECT_NE(pad(m, {0, 0}).storage(), m.storage());
  ExpectErrorNames([&] { return pad(m, {1}); }, "pad", "pairs");
  ExpectErrorNames([&] { return pad(m, {0, 0, 0, 0, 1, 1}); }, "pad", "at most one pair");
  ExpectErrorNames([&] { return pad(m, {-3, -2}); }, "pad", "negative size");
  ExpectErrorNames([&] { return pad(m, {-5, 4}); }, "pad", "crops more");  // crops first
  EXPECT_EQ(pad(m, {0, 0, -3, 1}).shape(), (Shape{1, 4}));
  // meshgrid.
  const std::vector<Tensor> ij = meshgrid({F32({1, 2}, {2}, device), F32({3, 4, 5}, {3}, device)});
  EXPECT_EQ(ij[0].shape(), (Shape{2, 3}));
  EXPECT_EQ(Vals(ij[1]), (std::vector<double>{3, 4, 5, 3, 4, 5}));
  const std::vector<Tensor> xy =
      meshgrid({F32({1, 2}, {2}, device), F32({3, 4, 5}, {3}, device)}, "xy");
  EXPECT_EQ(xy[0].shape(), (Shape{3, 2}));
  EXPECT_EQ(Vals(xy[0]), (std::vector<double>{1, 2, 1, 2, 1, 2}));
  // index_add (repeats add up) and index_fill.
  const Tensor self = to(zeros({3, 2}), device);
  const Tensor src = F32({1, 2, 3, 4, 5, 6}, {3, 2}, device);
  EXPECT_EQ(Vals(index_add(self, 0, I64({2, 0, 2}, {3}, device), src, 2)),
            (std::vector<double>{6, 8, 0, 0, 12, 16}));
  EXPECT_EQ(Vals(index_fill(self, 1, I64({1}, {1}, device), 7)),
            (std::vector<double>{0, 7, 0, 7, 0, 7}));
  ExpectErrorNames([&] { return index_add(self, 0, I64({0}, {1}, device), src); }, "index_add",
                   "entries along dim 0");
  ExpectErrorNames(
      [&] {
        return index_add(to(zeros({3, 3}), device), 0, I64({0, 2}, {2}, device),
                         to(ones({2, 2}), device));
      },
      "index_add", "must have self's shape");
  EXPECT_EQ(Vals(index_fill(self, 1, I64({-1}, {1}, device), 7)),  // negative: from the end
            (std::vector<double>{0, 7, 0, 7, 0, 7}));
  EXPECT_EQ(Vals(index_fill(self, 0, I64({}, {0}, device), 7)), Vals(self));
  ExpectErrorNames(
      [&] {
        return index_add(to(self, DType::kInt64), 0, I64({0, 1, 2}, {3}, device),
                         to(src, DType::kInt64), 0.5);
      },
      "index_add", "alpha");
  // Products.
  EXPECT_EQ(Vals(mm(F32({1, 2, 3, 4}, {2, 2}, device), F32({1, 0, 0, 1}, {2, 2}, device))),
            (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(Vals(mv(F32({1, 2, 3, 4}, {2, 2}, device), F32({1, 1}, {2}, device))),
            (std::vector<double>{3, 7}));
  EXPECT_EQ(item(dot(F32({1, 2, 3}, {3}, device), F32({4, 5, 6}, {3}, device))), 32);
  EXPECT_EQ(item<int64_t>(dot(I64({1, 2}, {2}, device), I64({3, 4}, {2}, device))), 11);
  EXPECT_EQ(
      dot(to(I64({1, 2}, {2}, device), DType::kInt32), to(I64({3, 4}, {2}, device), DType::kInt32))
          .dtype(),
      DType::kInt32);
  ExpectErrorNames(
      [&] {
        return meshgrid({F32({1}, {1}, device), I64({1}, {1}, device)})[0];
      },
      "meshgrid", "one dtype");
  ExpectErrorNames([&] { return mm(m, m); }, "mm", "[n, k] and [k, m]");
  ExpectErrorNames([&] { return dot(F32({1}, {1}, device), I64({1}, {1}, device)); }, "dot",
                   "one dtype");
}
TEST(ScatterLossesMath, LayoutAndIndexingAreTorchsOnCpu) { LayoutAndIndexingAreTorchs(kCPU); }

// The number overloads torch code uses most: where with a number, pow(number, x), div with a
// rounding mode (integers exactly), add/sub with alpha.
void NumberOverloadsAreTorchs(Device device) {
  const Tensor m = gt(F32({1, -1, 2}, {3}, device), 0.0);
  const Tensor x = to(F32({1, 2, 3}, {3}, device), DType::kBFloat16);
  EXPECT_EQ(where(m, x, 0.0).dtype(), DType::kBFloat16);
  EXPECT_EQ(Vals(where(m, x, 0.0)), (std::vector<double>{1, 0, 3}));
  EXPECT_EQ(Vals(where(m, -1, I64({4, 5, 6}, {3}, device))), (std::vector<double>{-1, 5, -1}));
  EXPECT_EQ(where(m, I64({4, 5, 6}, {3}, device), 0.5).dtype(), DType::kFloat32);
  EXPECT_EQ(Vals(pow(2, I64({0, 3, 10}, {3}, device))), (std::vector<double>{1, 8, 1024}));
  EXPECT_EQ(pow(2, I64({1}, {1}, device)).dtype(), DType::kInt64);
  EXPECT_EQ(pow(2.5, I64({1}, {1}, device)).dtype(), DType::kFloat32);
  const Tensor a = I64({7, -7, 7, -7, 6}, {5}, device), b = I64({2, 2, -2, -2, 3}, {5}, device);
  EXPECT_EQ(Vals(div(a, b, "trunc")), (std::vector<double>{3, -3, -3, 3, 2}));
  EXPECT_EQ(Vals(div(a, b, "floor")), (std::vector<double>{3, -4, -4, 3, 2}));
  EXPECT_EQ(div(a, b, "trunc").dtype(), DType::kInt64);
  EXPECT_EQ(Vals(div(F32({7, -7}, {2}, device), F32({2, 2}, {2}, device), "trunc")),
            (std::vector<double>{3, -3}));
  ExpectErrorNames([&] { return div(a, b, "round"); }, "div", "rounding_mode");
  EXPECT_EQ(Vals(add(a, b, 3)), (std::vector<double>{13, -1, 1, -13, 15}));
  EXPECT_EQ(Vals(sub(F32({1, 2}, {2}, device), F32({1, 1}, {2}, device), 0.5)),
            (std::vector<double>{0.5, 1.5}));
  ExpectErrorNames([&] { return add(a, b, 0.5); }, "add", "alpha");
  // Half quotients truncate from float32 (one rounding); an integer b is taken in the result's
  // dtype before alpha scales it; bool is refused in a subtraction.
  EXPECT_EQ(Vals(div(to(F32({512, 255}, {2}, device), DType::kBFloat16),
                     to(F32({3, 0.9921875}, {2}, device), DType::kBFloat16), "trunc")),
            (std::vector<double>{170, 256}));
  EXPECT_EQ(Vals(sub(F32({0}, {1}, device), I64({1 << 30}, {1}, device), 4)),
            (std::vector<double>{-4294967296.0}));
  EXPECT_EQ(Vals(add(to(F32({0}, {1}, device), DType::kBFloat16), I64({257}, {1}, device), 3)),
            (std::vector<double>{768}));
  ExpectErrorNames([&] { return sub(a, gt(a, 0), 2); }, "sub", "bool");
}
TEST(ScatterLossesMath, NumberOverloadsAreTorchsOnCpu) { NumberOverloadsAreTorchs(kCPU); }
TEST(ScatterLossesMathCuda, NumberOverloadsAreTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  NumberOverloadsAreTorchs(CUDA(0));
}
TEST(ScatterLossesMathCuda, LayoutAndIndexingAreTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  LayoutAndIndexingAreTorchs(CUDA(0));
}

TEST(ScatterLossesMath, DataDependentSelectionInsideATraceIsAnError) {
  const auto fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{nonzero(in[0])}; };
  const std::vector<Tensor> in = {ones({3})};
  const std::string e = ErrorOf([&] {
    compile(fn, in)(in);
    return Tensor();
  });
  EXPECT_NE(e.find("nonzero"), std::string::npos) << e;
  EXPECT_NE(e.find("while tracing"), std::string::npos) << e;
}

// The new rows traced and run by a compiled function equal eager, scatter_add's repeated indices
// included.
void CompiledEqualsEager(Device device) {
  const auto fn = [](const std::vector<Tensor>& in) {
    const Tensor s = scatter_add(in[0], 1, in[1], in[2]);
    return std::vector<Tensor>{add(s, atan2(s, in[0])), prod(asinh(s), {1}),
                               scatter(in[0], 1, in[3], in[2])};
  };
  Generator gen(5);
  const std::vector<Tensor> in = {
      randn({4, 6}, gen, DType::kFloat32, device),
      to(from_vector({0, 0, 5, 1, 2, 2, 3, 4, 0}, {3, 3}, DType::kInt64), device),
      randn({3, 3}, gen, DType::kFloat32, device),
      to(from_vector({5, 1, 0, 2, 3, 4, 0, 1, 2}, {3, 3}, DType::kInt64), device)};
  CompiledFn f = compile(fn, in);
  const std::vector<Tensor> got = f(in), want = fn(in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ExpectClose(Vals(got[i]), Vals(want[i]), {1e-5, 1e-5}, "compiled output " + std::to_string(i));
  }
}
TEST(ScatterLossesMath, CompiledEqualsEagerOnCpu) { CompiledEqualsEager(kCPU); }
TEST(ScatterLossesMathCuda, CompiledEqualsEager) {
  KILN_SKIP_WITHOUT_GPU();
  CompiledEqualsEager(CUDA(0));
}

// A zero-dim operand wider than the common dtype (float32 against bfloat16 or float16 x, int64
// against int32 x) is converted to it before the op, as torch converts every operand: comparing
// or combining it at its own width gave a silently different answer.
void ZeroDimOperandsTakeTheCommonDType(Device device) {
  for (const DType half : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor x = to(full({2}, 0.1, half), device);
    const Tensor tenth = to(full({}, 0.1), device);
    EXPECT_EQ(Vals(eq(x, tenth)), (std::vector<double>{1, 1})) << DTypeName(half);
    EXPECT_EQ(Vals(eq(tenth, x)), (std::vector<double>{1, 1})) << DTypeName(half);
    EXPECT_EQ(Vals(ne(x, tenth)), (std::vector<double>{0, 0}));
    EXPECT_EQ(Vals(lt(x, tenth)), (std::vector<double>{0, 0}));
    EXPECT_EQ(Vals(ge(x, tenth)), (std::vector<double>{1, 1}));
    EXPECT_EQ(Vals(maximum(x, tenth)), Vals(x));
    EXPECT_EQ(eq(x, tenth).dtype(), DType::kBool);
    Tensor y = clone(x);
    add_(y, neg(tenth));  // in place: the other operand converts, self stays
    EXPECT_EQ(Vals(y), (std::vector<double>{0, 0}));
  }
  const Tensor i32 = to(from_vector({1, 5, 7}, {3}, DType::kInt32), device);
  const Tensor wide = to(full({}, 4294967297.0, DType::kInt64), device);  // 2^32 + 1: 1 as int32
  EXPECT_EQ(Vals(eq(i32, wide)), (std::vector<double>{1, 0, 0}));
  EXPECT_EQ(Vals(lt(i32, to(full({}, 4294967296.0, DType::kInt64), device))),
            (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(maximum(i32, wide).dtype(), DType::kInt32);
  EXPECT_EQ(Vals(maximum(i32, wide)), (std::vector<double>{1, 5, 7}));
  EXPECT_EQ(Vals(floor_divide(i32, to(full({}, 4294967298.0, DType::kInt64), device))),
            (std::vector<double>{0, 2, 3}));
  // True division computes in float from the operands as they are: no wrap to int32 first.
  EXPECT_EQ(div(i32, wide).dtype(), DType::kFloat32);
  EXPECT_LT(Vals(div(i32, wide))[2], 1e-8);
  // The other direction is untouched: a zero-dim operand of a higher category decides.
  EXPECT_EQ(add(i32, to(full({}, 0.5), device)).dtype(), DType::kFloat32);
  EXPECT_EQ(Vals(add(i32, to(full({}, 0.5), device))), (std::vector<double>{1.5, 5.5, 7.5}));
}
// A second probe's smaller findings: linear takes a 1-D weight (torch's (in_features,)), bools
// add with any integer alpha as torch's kernel does (alpha true unless 0) and a bool alpha only
// for bools, unsqueeze's range error names the input's rank, and div's trunc mode names itself.
void SecondProbeFindingsAreTorchs(Device device) {
  const Tensor x = F32({1, 2, 3, 4, 5, 6}, {2, 3}, device);
  const Tensor w = F32({1, 0, -1}, {3}, device);
  EXPECT_EQ(linear(x, w).shape(), (Shape{2}));
  EXPECT_EQ(Vals(linear(x, w)), (std::vector<double>{-2, -2}));
  EXPECT_EQ(Vals(linear(x, w, F32({10}, {}, device))), (std::vector<double>{8, 8}));
  ExpectErrorNames([&] { return linear(x, F32({1, 2}, {2}, device)); }, "linear", "[2, 3]");

  const Tensor p = to(from_vector({1, 0, 0}, {3}, DType::kBool), device);
  const Tensor q = to(from_vector({0, 0, 1}, {3}, DType::kBool), device);
  EXPECT_EQ(add(p, q, 2).dtype(), DType::kBool);
  EXPECT_EQ(Vals(add(p, q, 2)), (std::vector<double>{1, 0, 1}));
  EXPECT_EQ(Vals(add(p, q, 0)), (std::vector<double>{1, 0, 0}));
  EXPECT_EQ(Vals(add(p, q, true)), (std::vector<double>{1, 0, 1}));
  ExpectErrorNames([&] { return add(x, x, true); }, "add", "bool alpha");

  ExpectErrorNames([&] { return unsqueeze(w, 2); }, "unsqueeze", "rank 1");
  ExpectErrorNames([&] { return div(p, q, "trunc"); }, "div", "trunc");
}
TEST(ScatterLossesMath, SecondProbeFindingsAreTorchs) { SecondProbeFindingsAreTorchs(kCPU); }
TEST(ScatterLossesMathCuda, SecondProbeFindingsAreTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  SecondProbeFindingsAreTorchs(CUDA(0));
}

TEST(ScatterLossesMath, ZeroDimOperandsTakeTheCommonDType) {
  ZeroDimOperandsTakeTheCommonDType(kCPU);
}
TEST(ScatterLossesMathCuda, ZeroDimOperandsTakeTheCommonDType) {
  KILN_SKIP_WITHOUT_GPU();
  ZeroDimOperandsTakeTheCommonDType(CUDA(0));
}

// What a hostile probe found, as torch does it: bool numbers keep bool tensors bool (and a bool
// number in a difference is refused); three operands promote as one (addcmul's zero-dim
// operands); addmm/baddbmm refuse an input of another dtype; addcdiv scales before dividing;
// isclose on halves computes its tolerance in the half dtype; the scatter family takes an empty
// index of any shape and a 0-d self, and in place refuses src or index sharing self's memory;
// index_fill's range error names the index given.
void ProbeFindingsAreTorchs(Device device) {
  const Tensor m = to(from_vector({1, 0}, {2}, DType::kBool), device);
  EXPECT_EQ(where(m, m, false).dtype(), DType::kBool);
  EXPECT_EQ(Vals(where(m, m, false)), (std::vector<double>{1, 0}));
  EXPECT_EQ(where(m, true, m).dtype(), DType::kBool);
  EXPECT_EQ(add(m, true).dtype(), DType::kBool);
  EXPECT_EQ(Vals(add(m, true)), (std::vector<double>{1, 1}));
  EXPECT_EQ(mul(m, true).dtype(), DType::kBool);
  EXPECT_EQ(Vals(mul(m, true)), (std::vector<double>{1, 0}));
  Tensor inplace = clone(m);
  add_(inplace, true);
  EXPECT_EQ(Vals(inplace), (std::vector<double>{1, 1}));
  EXPECT_EQ(add(I64({1, 2}, {2}, device), true).dtype(), DType::kInt64);
  EXPECT_EQ(Vals(add(I64({1, 2}, {2}, device), true)), (std::vector<double>{2, 3}));
  EXPECT_EQ(mul(F32({1.5}, {1}, device), true).dtype(), DType::kFloat32);
  ExpectErrorNames([&] { return sub(I64({1}, {1}, device), true); }, "sub", "bool");
  ExpectErrorNames([&] { return sub(m, false); }, "sub", "bool");
  EXPECT_EQ(Scalar(true).ToString(), "true");
  EXPECT_FALSE(Scalar(true) == Scalar(1));
  EXPECT_TRUE(Scalar(false) == Scalar(false));

  // addcmul / addcdiv: int64 [3] with zero-dim f16 and f32 operands is float32, not float16.
  const Tensor i3 = I64({1, 2, 3}, {3}, device);
  const Tensor h2 = to(full({}, 2.0, DType::kFloat16), device), f3 = to(full({}, 3.0), device);
  EXPECT_EQ(addcmul(i3, h2, f3).dtype(), DType::kFloat32);
  EXPECT_EQ(Vals(addcmul(i3, h2, f3)), (std::vector<double>{7, 8, 9}));
  EXPECT_EQ(addcdiv(i3, h2, f3).dtype(), DType::kFloat32);
  // (value t1) / t2: 10 * 3e38 overflows to inf before the division, as torch's kernel.
  EXPECT_EQ(Vals(addcdiv(F32({0}, {1}, device), F32({3e38}, {1}, device), F32({1e10}, {1}, device),
                         10))[0],
            INFINITY);

  // addmm / baddbmm: input of another dtype than the matrices is an error.
  ExpectErrorNames(
      [&] {
        return baddbmm(to(ones({1}, DType::kFloat16), device), to(ones({1, 1, 2}), device),
                       to(ones({1, 2, 1}), device));
      },
      "baddbmm", "same dtype");
  ExpectErrorNames(
      [&] {
        return addmm(to(ones({1}, DType::kFloat16), device), to(ones({1, 2}), device),
                     to(ones({2, 1}), device));
      },
      "addmm", "same dtype");

  // isclose on float16: |a - b| = 2^-10 within atol 0.00097655, which rounds to 2^-10 in f16.
  const Tensor one = to(full({1}, 1.0, DType::kFloat16), device);
  const Tensor next = to(full({1}, 1.0009765625, DType::kFloat16), device);
  EXPECT_TRUE(item<bool>(all(isclose(one, next, 0.0, 0.00097655))));
  EXPECT_FALSE(item<bool>(all(isclose(one, next, 0.0, 0.0))));
  EXPECT_TRUE(item<bool>(all(isclose(I64({5}, {1}, device), I64({6}, {1}, device), 0.2, 0.0))));

  // The scatter family: an empty index of another rank returns self; a 0-d self takes a
  // one-element index; in place, src or index being self is refused.
  const Tensor self = to(zeros({3, 4}), device);
  const Tensor empty_index = to(zeros({0}, DType::kInt64), device);
  EXPECT_EQ(Vals(scatter(self, 0, empty_index, to(ones({2, 4}), device))), Vals(self));
  EXPECT_EQ(scatter_add(self, 1, empty_index, to(ones({2, 4}), device)).shape(), self.shape());
  ExpectErrorNames(
      [&] {
        return scatter(self, 2, empty_index, to(ones({2, 4}), device));
      },
      "scatter", "dim");
  const Tensor scalar_self = to(zeros({}), device);
  const Tensor r = scatter(scalar_self, 0, I64({0}, {1}, device), to(ones({1}), device));
  EXPECT_EQ(r.dim(), 0);
  EXPECT_EQ(item(r), 1.0);
  Tensor v = F32({1, 2, 3}, {3}, device);
  ExpectErrorNames(
      [&] {
        return scatter_(v, 0, I64({2, 1, 0}, {3}, device), v);
      },
      "scatter", "same memory");
  ExpectErrorNames(
      [&] {
        return scatter_add_(v, 0, I64({2, 1, 0}, {3}, device), v);
      },
      "scatter_add", "same memory");
  ExpectErrorNames(
      [&] {
        return index_copy_(v, 0, I64({2, 1, 0}, {3}, device), v);
      },
      "index_copy", "same memory");
  EXPECT_EQ(Vals(v), (std::vector<double>{1, 2, 3}));  // nothing written
  Tensor w = F32({1, 2, 3}, {3}, device);
  add_(w, w);  // an elementwise op may read what it writes
  EXPECT_EQ(Vals(w), (std::vector<double>{2, 4, 6}));

  ExpectErrorNames([&] { return index_fill(self, 1, I64({-5}, {1}, device), 5.0); }, "index_fill",
                   "-5");
  ExpectErrorNames([&] { return binary_cross_entropy_with_logits(Tensor(), self, "mean", self); },
                   "binary_cross_entropy_with_logits", "undefined");
}
TEST(ScatterLossesMath, ProbeFindingsAreTorchsOnCpu) { ProbeFindingsAreTorchs(kCPU); }
TEST(ScatterLossesMathCuda, ProbeFindingsAreTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  ProbeFindingsAreTorchs(CUDA(0));
}

// The second probe's findings: repeat, tile and repeat_interleave return new memory even when
// every repeat is 1; arange counts and fills int64 bounds past 2^53 exactly; linspace of more
// steps than memory holds is a kiln::Error naming it.
void CopiesAndExactRangesAreTorchs(Device device) {
  const Tensor a = to(ones({1}), device);
  const Tensor r = repeat(a, {1});
  EXPECT_FALSE(r.shares_storage(a));
  const Tensor b = F32({1, 2}, {2}, device);
  const Tensor q = repeat_interleave(b, 1);
  const Tensor c = to(ones({2, 1}), device);
  const Tensor t = tile(c, {1, 1});
  add_(b, 10.0);
  add_(c, 1.0);
  EXPECT_EQ(Vals(q), (std::vector<double>{1, 2}));
  EXPECT_EQ(Vals(t), (std::vector<double>{1, 1}));
  EXPECT_FALSE(repeat_interleave(to(full({}, 3.0), device), 1).shares_storage(a));

  const int64_t big = int64_t{1} << 53;
  const Tensor ar = arange(Scalar(big + 1), Scalar(big + 3), 1, std::nullopt, device);
  ASSERT_EQ(ar.numel(), 2);
  EXPECT_EQ(item<int64_t>(select(ar, 0, 0)), big + 1);
  EXPECT_EQ(item<int64_t>(select(ar, 0, 1)), big + 2);
  const Tensor down = arange(Scalar(big + 10), Scalar(big), -3, std::nullopt, device);
  ASSERT_EQ(down.numel(), 4);  // big+10, +7, +4, +1
  EXPECT_EQ(item<int64_t>(select(down, 0, 3)), big + 1);
  ExpectErrorNames([&] { return arange(Scalar(big), Scalar(big + 5), 1, DType::kInt32, device); },
                   "arange", "int32");
  ExpectErrorNames([&] { return linspace(0, 1, int64_t{1} << 62, DType::kFloat32, device); },
                   "linspace", "steps");
  ExpectErrorNames(
      [&] {
        return expand(to(ones({3, 1}), device), {3, -2});
      },
      "expand", "-2 of dim 1 is negative");
}
TEST(ScatterLossesMath, CopiesAndExactRangesAreTorchsOnCpu) { CopiesAndExactRangesAreTorchs(kCPU); }
TEST(ScatterLossesMathCuda, CopiesAndExactRangesAreTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  CopiesAndExactRangesAreTorchs(CUDA(0));
}

// A bool number survives tracing: its IR text reads back as a bool, and the compiled function
// keeps the bool result.
void BoolNumbersCompile(Device device) {
  auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{add(in[0], true), where(in[0], in[0], false)};
  };
  const std::vector<Tensor> in = {to(from_vector({1, 0, 1}, {3}, DType::kBool), device)};
  CompiledFn f = compile(fn, in);
  const std::vector<Tensor> got = f(in);
  EXPECT_EQ(got[0].dtype(), DType::kBool);
  EXPECT_EQ(Vals(got[0]), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(Vals(got[1]), (std::vector<double>{1, 0, 1}));
}
TEST(ScatterLossesMath, BoolNumbersCompileOnCpu) { BoolNumbersCompile(kCPU); }
TEST(ScatterLossesMathCuda, BoolNumbersCompile) {
  KILN_SKIP_WITHOUT_GPU();
  BoolNumbersCompile(CUDA(0));
}

}  // namespace
}  // namespace kiln
