// The portable random generator: Philox4x32-10 against Random123's published known-answer
// vectors, kiln's draw layout (pinned values a change of algorithm would break), the same
// numbers for every dtype and on CUDA as on the CPU, and sane statistics.

// First on purpose: kiln's tensor ops log/cos/sin/sqrt must not hide the math philox.h calls.
#include "ops/ops.h"
//
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/factories.h"
#include "runtime/philox.h"
#include "runtime/random.h"
#include "runtime/status.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

struct Kat {
  philox::Uint4 counter;
  philox::Key key;
  philox::Uint4 expected;
};

// Random123's kat_vectors, philox4x32 with 10 rounds: counter words, key words, output words.
TEST(Philox, MatchesRandom123KnownAnswers) {
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const philox::Uint4 r = philox::Philox4x32_10(k.counter, k.key);
    EXPECT_EQ(r.x, k.expected.x);
    EXPECT_EQ(r.y, k.expected.y);
    EXPECT_EQ(r.z, k.expected.z);
    EXPECT_EQ(r.w, k.expected.w);
  }
}

std::vector<float> AsFloats(const Tensor& t) {
  std::vector<float> out;
  for (double v : to_vector(t)) out.push_back(static_cast<float>(v));
  return out;
}

// Pinned by this implementation (after the known-answer test above): any change to the draw
// layout, the uniform conversion or Box-Muller changes these, and every seeded model with them.
TEST(Generator, PinnedDraws) {
  Generator gen(0);
  const std::vector<float> n = AsFloats(randn({6}, gen));
  const std::vector<float> u = AsFloats(rand({5}, gen));
  // Also computed by an independent Python transcription of the same layout.
  EXPECT_EQ(n, (std::vector<float>{0x1.fb7666p-1f, -0x1.d96d6p-1f, -0x1.3c373ep-1f, -0x1.eda364p-2f,
                                   -0x1.3aa6aep-3f, 0x1.7254dap-3f}));
  EXPECT_EQ(u, (std::vector<float>{0x1.3ea8cp-6f, 0x1.471cc8p-2f, 0x1.20a898p-3f, 0x1.1644d4p-2f,
                                   0x1.9321dep-1f}));
  EXPECT_EQ(gen.offset(), 2u + 2u);  // ceil(6 / 4) + ceil(5 / 4) blocks
}

TEST(Generator, UniformIsTheTopBitsOfTheStream) {
  Generator gen(42);
  const std::vector<float> u = AsFloats(rand({8}, gen));
  for (int i = 0; i < 8; ++i) {
    const philox::Uint4 r = philox::Block(philox::KeyOf(42), static_cast<uint64_t>(i / 4));
    EXPECT_EQ(u[i], static_cast<float>(philox::Lane(r, i % 4) >> 8) / 16777216.0f) << i;
  }
}

TEST(Generator, SeedsAndDrawsAreIndependent) {
  Generator a(7), b(7), c(8);
  const auto x = to_vector(randn({64}, a));
  EXPECT_EQ(x, to_vector(randn({64}, b)));
  EXPECT_NE(x, to_vector(randn({64}, c)));
  EXPECT_NE(x, to_vector(randn({64}, a)));  // the next draw continues the stream
  Generator copy = a;                       // a copy replays the same continuation
  EXPECT_EQ(to_vector(randn({5}, copy)), to_vector(randn({5}, a)));
}

TEST(Generator, HalfTypesRoundTheFloat32Draw) {
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    Generator g1(3), g2(3);
    const Tensor f = randn({33}, g1);
    EXPECT_EQ(to_vector(randn({33}, g2, t)), to_vector(cast(f, t))) << DTypeName(t);
  }
}

TEST(Generator, NormalStatistics) {
  Generator gen(11);
  const std::vector<double> v = to_vector(randn({200000}, gen));
  double mean = 0, var = 0, tail = 0;
  for (double x : v) mean += x / v.size();
  for (double x : v) {
    var += (x - mean) * (x - mean) / v.size();
    tail += std::fabs(x) > 3;
  }
  EXPECT_NEAR(mean, 0, 0.01);
  EXPECT_NEAR(var, 1, 0.02);
  EXPECT_NEAR(tail / v.size(), 0.0027, 0.0006);  // P(|z| > 3)
  const std::vector<double> u = to_vector(rand({200000}, gen));
  double umean = 0;
  for (double x : u) {
    ASSERT_TRUE(x >= 0 && x < 1);
    umean += x / u.size();
  }
  EXPECT_NEAR(umean, 0.5, 0.005);
}

TEST(Generator, RandRejectsIntegerDtypes) {
  Generator gen(0);
  EXPECT_THROW(randn({2}, gen, DType::kInt64), Error);
  EXPECT_THROW(rand({2}, gen, DType::kBool), Error);
}

// A half-precision uniform is drawn exact in its dtype (a multiple of 2^-8 in bfloat16, 2^-11 in
// float16, as torch's CPU draw): rounding a 24-bit draw to it gave exactly 1 for draws within
// half an ulp of 1 (2166 of 2^20 in bfloat16), so -log(1 - u) was inf.
void ExpectHalfUniformsBelowOne(Device device) {
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    Generator gen(3);
    const std::vector<double> u = to_vector(rand({1 << 20}, gen, t, device));
    const double step = t == DType::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
    double top = 0;
    for (double x : u) {
      ASSERT_TRUE(x >= 0 && x < 1) << DTypeName(t) << " drew " << x;
      ASSERT_EQ(std::fmod(x, step), 0.0) << DTypeName(t) << " drew " << x;
      top = std::max(top, x);
    }
    EXPECT_EQ(top, 1 - step) << DTypeName(t);  // the largest value is drawn too
  }
}

TEST(Generator, HalfUniformsStayBelowOne) { ExpectHalfUniformsBelowOne(kCPU); }

TEST(GeneratorCuda, HalfUniformsStayBelowOne) {
  KILN_SKIP_WITHOUT_GPU();
  ExpectHalfUniformsBelowOne(CUDA(0));
}

// The device kernel computes the CPU's numbers: uniforms bit for bit, normals to the float32
// rounding of libm's double results (runtime/philox.h), so at most a last-bit difference.
TEST(GeneratorCuda, SameNumbersAsTheCpu) {
  KILN_SKIP_WITHOUT_GPU();
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    Generator cpu(5), gpu(5);
    const int64_t n = 100003;  // not a multiple of 4
    EXPECT_EQ(to_vector(rand({n}, cpu, t)), to_vector(rand({n}, gpu, t, CUDA(0))));
    const std::vector<double> want = to_vector(randn({n}, cpu, t));
    const std::vector<double> got = to_vector(randn({n}, gpu, t, CUDA(0)));
    int exact = 0;
    for (int64_t i = 0; i < n; ++i) {
      exact += got[i] == want[i];
      ASSERT_NEAR(got[i], want[i], std::fabs(want[i]) * 1e-6 + 1e-12) << i;
    }
    EXPECT_GE(exact, n - 2) << DTypeName(t);
    EXPECT_EQ(cpu.offset(), gpu.offset());
  }
}

}  // namespace
}  // namespace kiln
