// The composites of ops.h (flatten, unflatten, narrow, repeat_interleave, repeat, min,
// logsumexp, var, leaky_relu, *_like) on the CPU against values worked out by hand or in double
// precision: torch's semantics including the edges (0-d tensors, -1 sizes, negative starts,
// zero repeats, infinite rows, the integer minimum, correction >= N), bad arguments named, and
// compiled equal to eager (they trace as the ops they are made of).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "codegen/compile.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

Tensor Iota(IntList shape, DType dtype = DType::kFloat32) {
  return reshape(arange(0, static_cast<double>(NumElements(shape)), 1, dtype), shape);
}

TEST(CompositeOps, FlattenUnflattenNarrow) {
  const Tensor x = Iota({2, 3, 4});
  EXPECT_EQ(flatten(x).shape(), (Shape{24}));
  EXPECT_EQ(flatten(x, 1).shape(), (Shape{2, 12}));
  EXPECT_EQ(flatten(x, 0, -2).shape(), (Shape{6, 4}));
  EXPECT_EQ(flatten(full({}, 5.0)).shape(), (Shape{1}));
  EXPECT_EQ(to_vector(flatten(transpose(x, 0, 2))), to_vector(contiguous(transpose(x, 0, 2))));
  EXPECT_EQ(unflatten(x, 2, {2, 2}).shape(), (Shape{2, 3, 2, 2}));
  EXPECT_EQ(unflatten(x, -1, {-1, 2}).shape(), (Shape{2, 3, 2, 2}));
  EXPECT_EQ(to_vector(unflatten(flatten(x), 0, {2, 3, 4})), to_vector(x));
  EXPECT_EQ(to_vector(narrow(Iota({5}), 0, -3, 2)), (std::vector<double>{2, 3}));
  EXPECT_EQ(narrow(x, 1, 3, 0).shape(), (Shape{2, 0, 4}));
  ExpectThrowsWith([&] { flatten(x, 2, 1); }, "flatten: start_dim 2 comes after end_dim 1");
  ExpectThrowsWith([&] { flatten(x, 3); }, "flatten: dim 3 is out of range for a tensor of rank 3",
                   "got [2, 3, 4]");
  ExpectThrowsWith([&] { unflatten(x, 1, {2, 2}); }, "unflatten: sizes multiply to 4");
  ExpectThrowsWith([&] { unflatten(x, 1, {-1, -1}); }, "only one size may be -1");
  ExpectThrowsWith([&] { unflatten(x, 1, {-1, 2}); }, "does not split");
  ExpectThrowsWith([&] { narrow(x, 2, 3, 2); }, "narrow: start 3 and length 2 do not fit dim 2");
  ExpectThrowsWith([&] { flatten(Tensor()); }, "flatten: the input is an undefined tensor");
}

TEST(CompositeOps, RepeatInterleaveAndRepeat) {
  const Tensor x = Iota({2, 2});  // [[0, 1], [2, 3]]
  EXPECT_EQ(to_vector(repeat_interleave(x, 2, 0)), (std::vector<double>{0, 1, 0, 1, 2, 3, 2, 3}));
  EXPECT_EQ(to_vector(repeat_interleave(x, 2, -1)), (std::vector<double>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(to_vector(repeat_interleave(x, 3)),
            (std::vector<double>{0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3}));
  EXPECT_EQ(repeat_interleave(x, 0, 1).shape(), (Shape{2, 0}));
  EXPECT_EQ(to_vector(repeat(x, {2, 1})), (std::vector<double>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(to_vector(repeat(x, {1, 2})), (std::vector<double>{0, 1, 0, 1, 2, 3, 2, 3}));
  EXPECT_EQ(repeat(x, {3, 1, 2}).shape(), (Shape{3, 2, 4}));
  EXPECT_EQ(to_vector(repeat(full({}, 7.0), {3})), (std::vector<double>{7, 7, 7}));
  // Grouped-query attention's use: [B, kv_heads, T, E] -> [B, heads, T, E].
  const Tensor kv = Iota({1, 2, 3, 4});
  const Tensor wide = repeat_interleave(kv, 2, 1);
  EXPECT_EQ(wide.shape(), (Shape{1, 4, 3, 4}));
  EXPECT_EQ(to_vector(slice(wide, 1, 1, 2)), to_vector(slice(kv, 1, 0, 1)));
  ExpectThrowsWith([&] { repeat(x, {2}); }, "repeat: 1 repeats for [2, 2]");
  ExpectThrowsWith([&] { repeat_interleave(x, -1, 0); }, "repeats must be non-negative");
}

TEST(CompositeOps, MinOfFloatsIntsAndBools) {
  const Tensor x = from_vector({3, -1, 4, 1, -5, 9}, {2, 3});
  EXPECT_EQ(to_vector(min(x)), (std::vector<double>{-5}));
  EXPECT_EQ(to_vector(min(x, {1})), (std::vector<double>{-1, -5}));
  EXPECT_EQ(min(x, {0}, true).shape(), (Shape{1, 3}));
  const Tensor nan = from_vector({1, NAN, 0}, {3});
  EXPECT_TRUE(std::isnan(to_vector(min(nan))[0]));
  // int64's minimum (negation would wrap) and maximum, exactly.
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  const Tensor ints = cat({full({1}, 0.0, DType::kInt64), full({1}, 1.0, DType::kInt64)});
  Tensor extremes = clone(ints);
  extremes.data<int64_t>()[0] = lo;
  extremes.data<int64_t>()[1] = hi;
  EXPECT_EQ(to_vector<int64_t>(min(extremes)), std::vector<int64_t>{lo});
  EXPECT_EQ(to_vector<int64_t>(min(Iota({2, 3, 2}, DType::kInt64), {0, 2})),
            (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(min(Iota({2, 3, 2}, DType::kInt64), {0, 2}, true).shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(to_vector(min(from_vector({1, 0, 1}, {3}, DType::kBool))), (std::vector<double>{0}));
  ExpectThrowsWith(
      [&] {
        min(zeros({0, 2}, DType::kInt64), {0});
      },
      "min: cannot reduce over dim 0");
  ExpectThrowsWith(
      [&] {
        min(Iota({2, 2}, DType::kInt64), {1, -1});
      },
      "min: dim -1 appears twice in the dims");
  ExpectThrowsWith(
      [&] {
        sum(ones({}), {0, -1});  // a 0-d tensor's one dim named twice, as torch refuses
      },
      "sum: dim -1 appears twice in the dims");
}

TEST(CompositeOps, LogSumExpIsStable) {
  const Tensor x = from_vector({1000, 1000, -2, 0.5, -INFINITY, -INFINITY, INFINITY, 1}, {4, 2});
  const std::vector<double> got = to_vector(logsumexp(x, {1}));
  EXPECT_NEAR(got[0], 1000 + std::log(2.0), 1e-4);
  EXPECT_NEAR(got[1], std::log(std::exp(-2.0) + std::exp(0.5)), 1e-6);
  EXPECT_EQ(got[2], -INFINITY);
  EXPECT_EQ(got[3], INFINITY);
  EXPECT_EQ(logsumexp(x, {1}, true).shape(), (Shape{4, 1}));
  EXPECT_EQ(logsumexp(x, {}).shape(), Shape{});
  // Integers promote to float32, as in torch.
  EXPECT_EQ(logsumexp(Iota({2}, DType::kInt64), {0}).dtype(), DType::kFloat32);
}

TEST(CompositeOps, VarianceWithCorrection) {
  const Tensor x = from_vector({1, 2, 3, 4, 10, 20, 30, 40}, {2, 4});
  ExpectClose(to_vector(var(x, {1})), {5.0 / 3, 500.0 / 3}, {1e-6, 1e-6}, "var over dim 1");
  const std::vector<double> pop = to_vector(var(x, {1}, 0));
  EXPECT_NEAR(pop[0], 1.25, 1e-6);
  EXPECT_NEAR(to_vector(var(x))[0], 1517.5 / 7, 1e-3);  // all 8 values (mean 13.75), N - 1 = 7
  EXPECT_TRUE(std::isnan(to_vector(var(full({1}, 3.0)))[0]));  // 0 / 0, as torch
  EXPECT_EQ(var(x, {0}, 1, true).shape(), (Shape{1, 4}));
  // bf16 near 1000 (spacing 4): the mean 1002 is no bf16 value, so centring in bf16 would give
  // 16; in float32 inside, rounded once: 8.
  const Tensor b = from_vector({1000, 1004}, {2}, DType::kBFloat16);
  EXPECT_EQ(var(b).dtype(), DType::kBFloat16);
  EXPECT_EQ(to_vector(var(b))[0], 8.0);
  EXPECT_NEAR(to_vector(logsumexp(b, {0}))[0], 1004 + std::log1p(std::exp(-4.0)), 4.0);
  ExpectThrowsWith([&] { var(x, {2}); }, "var: dim 2 is out of range");
  ExpectThrowsWith([&] { var(x, {1}, -1); }, "correction must be non-negative");
}

TEST(CompositeOps, LeakyReluAndLikes) {
  const Tensor x = from_vector({-2, 0, 3, NAN}, {4});
  const std::vector<double> y = to_vector(leaky_relu(x, 0.1));
  EXPECT_NEAR(y[0], -0.2, 1e-7);
  EXPECT_EQ(y[1], 0);
  EXPECT_EQ(y[2], 3);
  EXPECT_TRUE(std::isnan(y[3]));
  const Tensor b = full({2, 3}, 1.0, DType::kBFloat16);
  EXPECT_EQ(zeros_like(b).type(), b.type());
  EXPECT_EQ(to_vector(ones_like(b)), std::vector<double>(6, 1.0));
  EXPECT_EQ(to_vector(full_like(b, 2.5)), std::vector<double>(6, 2.5));
  EXPECT_EQ(empty_like(b).type(), b.type());
}

TEST(CompositeOps, CompiledEqualsEager) {
  auto fn = [](const std::vector<Tensor>& in) {
    const Tensor& x = in[0];
    return std::vector<Tensor>{flatten(repeat_interleave(x, 2, 1), 1), logsumexp(x, {1}),
                               var(x, {0}), min(x, {1}), leaky_relu(narrow(x, 1, 1, 2))};
  };
  Generator gen(4);
  const Tensor x = randn({3, 4}, gen);
  const CompiledFn f = compile(fn, {x}, {.mode = CompileOptions::Mode::kCompiled});
  const std::vector<Tensor> got = f({x}), want = fn({x});
  for (size_t i = 0; i < got.size(); ++i) {
    ExpectClose(to_vector(got[i]), to_vector(want[i]), {1e-5, 1e-5}, "output " + std::to_string(i));
  }
}

}  // namespace
}  // namespace kiln
