// Tests for kiln::cpu::GemmF32 against a naive double-precision reference: every transpose
// combination, odd and tile-unaligned shapes, alpha/beta handling (including beta == 0 with a
// NaN-poisoned C), degenerate sizes, padded leading dimensions, and 1/2/3 worker threads.

#include "ops/cpu/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace kiln::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Written into the padding of C (columns n..ldc-1); GemmF32 must never touch it.
constexpr float kSentinel = 12345.0f;

struct Case {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  int64_t pad = 0;  // Extra columns added to every leading dimension.
  int threads = 1;  // Passed to SetGemmThreads; 0 leaves the current setting alone.
};

std::vector<float> RandomVector(int64_t size, std::mt19937* rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(size);
  for (float& x : v) x = dist(*rng);
  return v;
}

// A rows x cols row-major matrix with leading dimension ld; the padding holds `fill`.
std::vector<float> RandomMatrix(int64_t rows, int64_t cols, int64_t ld, float fill,
                                std::mt19937* rng) {
  std::vector<float> m(rows * ld, fill);
  const std::vector<float> values = RandomVector(rows * cols, rng);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(values.begin() + r * cols, cols, m.begin() + r * ld);
  }
  return m;
}

// Runs GemmF32 on random data for `c` and checks every element of C against a double reference.
void CheckGemm(const Case& c, bool poison_c = false) {
  std::mt19937 rng(1234 + c.m * 7 + c.n * 11 + c.k * 13);
  const int64_t a_rows = c.trans_a ? c.k : c.m, a_cols = c.trans_a ? c.m : c.k;
  const int64_t b_rows = c.trans_b ? c.n : c.k, b_cols = c.trans_b ? c.k : c.n;
  const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.n + c.pad;
  // Padding of A and B is NaN so that reading it would corrupt the result.
  const std::vector<float> a = RandomMatrix(a_rows, a_cols, lda, kNaN, &rng);
  const std::vector<float> b = RandomMatrix(b_rows, b_cols, ldb, kNaN, &rng);
  std::vector<float> c0 = RandomMatrix(c.m, c.n, ldc, kSentinel, &rng);
  if (poison_c) {
    for (int64_t i = 0; i < c.m; ++i) std::fill_n(c0.begin() + i * ldc, c.n, kNaN);
  }
  std::vector<float> out = c0;

  if (c.threads > 0) SetGemmThreads(c.threads);
  GemmF32(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta,
          out.data(), ldc);
  if (c.threads > 0) SetGemmThreads(0);

  const double tol = 1e-5 * std::sqrt(static_cast<double>(std::max<int64_t>(c.k, 1)));
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double av = c.trans_a ? a[p * lda + i] : a[i * lda + p];
        const double bv = c.trans_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += av * bv;
        magnitude += std::abs(av * bv);
      }
      double expected = c.alpha * sum;
      magnitude *= std::abs(c.alpha);
      if (c.beta != 0.0f) {
        expected += c.beta * static_cast<double>(c0[i * ldc + j]);
        magnitude += std::abs(c.beta * static_cast<double>(c0[i * ldc + j]));
      }
      const float got = out[i * ldc + j];
      ASSERT_NEAR(got, expected, tol * std::max(magnitude, 1e-3))
          << "at (" << i << ", " << j << ")";
    }
    for (int64_t j = c.n; j < ldc; ++j) {
      ASSERT_EQ(out[i * ldc + j], kSentinel)
          << "padding of C written at (" << i << ", " << j << ")";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Parameterised sweep: transposes x shapes x threads.

using Shape = std::tuple<int64_t, int64_t, int64_t>;
using SweepParam = std::tuple<bool, bool, Shape, int>;

class GemmSweepTest : public testing::TestWithParam<SweepParam> {};

TEST_P(GemmSweepTest, MatchesReference) {
  const auto& [trans_a, trans_b, shape, threads] = GetParam();
  const auto& [m, n, k] = shape;
  Case c{trans_a, trans_b, m, n, k};
  c.threads = threads;
  CheckGemm(c);
}

TEST_P(GemmSweepTest, AlphaBetaAndPaddedLeadingDims) {
  const auto& [trans_a, trans_b, shape, threads] = GetParam();
  const auto& [m, n, k] = shape;
  Case c{trans_a, trans_b, m, n, k, /*alpha=*/-1.5f, /*beta=*/0.75f, /*pad=*/5};
  c.threads = threads;
  CheckGemm(c);
}

TEST_P(GemmSweepTest, BetaZeroIgnoresNaNInC) {
  const auto& [trans_a, trans_b, shape, threads] = GetParam();
  const auto& [m, n, k] = shape;
  Case c{trans_a, trans_b, m, n, k, /*alpha=*/0.5f, /*beta=*/0.0f, /*pad=*/3};
  c.threads = threads;
  CheckGemm(c, /*poison_c=*/true);
}

std::string SweepName(const testing::TestParamInfo<SweepParam>& info) {
  const auto& [trans_a, trans_b, shape, threads] = info.param;
  const auto& [m, n, k] = shape;
  return std::string(trans_a ? "T" : "N") + (trans_b ? "T" : "N") + "_" + std::to_string(m) + "x" +
         std::to_string(n) + "x" + std::to_string(k) + "_t" + std::to_string(threads);
}

INSTANTIATE_TEST_SUITE_P(All, GemmSweepTest,
                         testing::Combine(testing::Bool(), testing::Bool(),
                                          testing::Values(Shape{1, 1, 1}, Shape{7, 13, 5},
                                                          Shape{65, 33, 129}, Shape{300, 257, 511},
                                                          Shape{6, 4100, 300}, Shape{97, 2, 70}),
                                          testing::Values(1, 2, 3)),
                         SweepName);

// ---------------------------------------------------------------------------------------------
// Degenerate sizes.

TEST(GemmTest, KZeroScalesCByBeta) {
  std::vector<float> c = {1, 2, 3, 4, 5, 6};
  GemmF32(false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 2.0f, c.data(), 3);
  EXPECT_EQ(c, (std::vector<float>{2, 4, 6, 8, 10, 12}));
}

TEST(GemmTest, KZeroWithBetaZeroClearsNaN) {
  std::vector<float> c(6, kNaN);
  GemmF32(true, true, 2, 3, 0, 1.0f, nullptr, 2, nullptr, 1, 0.0f, c.data(), 3);
  EXPECT_EQ(c, std::vector<float>(6, 0.0f));
}

TEST(GemmTest, MOrNZeroTouchesNothing) {
  std::vector<float> a(12, 1.0f), b(12, 1.0f), c(12, kSentinel);
  GemmF32(false, false, 0, 3, 4, 1.0f, a.data(), 4, b.data(), 3, 0.0f, c.data(), 3);
  GemmF32(false, false, 3, 0, 4, 1.0f, a.data(), 4, b.data(), 1, 0.0f, c.data(), 1);
  GemmF32(false, false, 0, 0, 0, 1.0f, nullptr, 1, nullptr, 1, 0.0f, nullptr, 1);
  EXPECT_EQ(c, std::vector<float>(12, kSentinel));
}

TEST(GemmTest, KZeroAndOtherEdgesViaChecker) {
  CheckGemm({false, false, 5, 9, 0, 1.0f, 0.5f, 2});
  CheckGemm({true, true, 5, 9, 0, 1.0f, 0.0f, 2}, /*poison_c=*/true);
  CheckGemm({false, true, 1, 37, 1000, 2.0f, 1.0f, 1, 2});
  CheckGemm({true, false, 37, 1, 1000, 2.0f, 1.0f, 1, 2});
}

TEST(GemmTest, SmallIntegerMatricesAreExact) {
  // [1 2 3; 4 5 6] * [1 0; 0 1; 1 1] = [4 5; 10 11].
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};
  const std::vector<float> b = {1, 0, 0, 1, 1, 1};
  std::vector<float> c(4, kNaN);
  GemmF32(false, false, 2, 2, 3, 1.0f, a.data(), 3, b.data(), 2, 0.0f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{4, 5, 10, 11}));
}

// ---------------------------------------------------------------------------------------------
// Large problems spanning several cache blocks in every dimension, and concurrent callers.

TEST(GemmTest, SpansSeveralCacheBlocks) {
  CheckGemm({false, false, 160, 4200, 600, 1.0f, 0.25f, 1, 2});
  CheckGemm({true, true, 310, 130, 530, -1.0f, 0.0f, 0, 2}, /*poison_c=*/true);
}

TEST(GemmTest, ConcurrentCallersGetCorrectResults) {
  // Each caller either gets the shared worker pool or runs its pieces inline.
  SetGemmThreads(2);
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([t] {
      for (int rep = 0; rep < 3; ++rep) {
        CheckGemm({t % 2 == 1, t >= 2, 130 + t, 120, 140, 1.0f, 0.5f, 0, /*threads=*/0});
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  SetGemmThreads(0);
}

}  // namespace
}  // namespace kiln::cpu
