// Tests of the runtime layer and the tensor API around it: dtype conversions (round to nearest
// even), shapes and broadcasting, views sharing storage, factories, printing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/capture_arena.h"
#include "runtime/settings.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2);
  EXPECT_EQ(DTypeSize(DType::kInt64), 8);
  EXPECT_EQ(std::string(DTypeName(DType::kFloat16)), "float16");
  EXPECT_TRUE(IsFloatingPoint(DType::kBFloat16));
  EXPECT_FALSE(IsFloatingPoint(DType::kInt32));
}

TEST(DType, Promotion) {
  EXPECT_EQ(PromoteTypes(DType::kBFloat16, DType::kFloat32), DType::kFloat32);
  EXPECT_EQ(PromoteTypes(DType::kBFloat16, DType::kFloat16), DType::kFloat32);
  EXPECT_EQ(PromoteTypes(DType::kInt64, DType::kBFloat16), DType::kBFloat16);
  EXPECT_EQ(PromoteTypes(DType::kBool, DType::kInt32), DType::kInt32);
}

TEST(DType, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3·2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
  EXPECT_TRUE(std::isinf(BFloat16ToFloat(FloatToBFloat16(INFINITY))));
}

TEST(DType, HalfRoundTripsAndRounds) {
  for (float f : {0.0f, 1.0f, -1.5f, 65504.0f, 6.103515625e-05f, 5.9604645e-08f, 0.333251953125f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(f)), f) << f;
  }
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(70000.0f))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  EXPECT_EQ(HalfToFloat(FloatToHalf(-3e-8f)), -5.9604645e-08f);  // rounds to the least subnormal
}

TEST(Shape, Broadcast) {
  EXPECT_EQ(*BroadcastShapes({3, 1, 5}, {4, 1}), (Shape{3, 4, 5}));
  EXPECT_EQ(*BroadcastShapes({}, {2}), (Shape{2}));
  EXPECT_FALSE(BroadcastShapes({3}, {4}).ok());
  EXPECT_EQ(*WrapDim(-1, 3), 2);
  EXPECT_FALSE(WrapDim(3, 3).ok());
}

TEST(Tensor, ViewsShareStorageAndLaunchNothing) {
  Tensor x = arange(0, 24, 1, DType::kFloat32);
  Tensor y = reshape(x, {2, 3, 4});
  EXPECT_TRUE(y.shares_storage(x));
  Tensor z = transpose(y, 0, 2);
  EXPECT_TRUE(z.shares_storage(x));
  EXPECT_FALSE(z.is_contiguous());
  EXPECT_EQ(z.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(to_vector(slice(z, 0, 1, 2))[0], 1.0);
  Tensor e = expand(unsqueeze(slice(x, 0, 0, 3), 0), {2, 3});
  EXPECT_TRUE(e.shares_storage(x));
  EXPECT_EQ(e.stride(0), 0);
  EXPECT_EQ(to_vector(e), (std::vector<double>{0, 1, 2, 0, 1, 2}));
  // A view writes through to its base.
  masked_fill_(slice(x, 0, 0, 2), ones({2}, DType::kBool), 7);
  EXPECT_EQ(to_vector(x)[1], 7);
}

TEST(Tensor, ReshapeCopiesOnlyWhenStridesForceIt) {
  Generator gen(1);
  Tensor x = randn({4, 6}, gen);
  EXPECT_TRUE(reshape(x, {2, 12}).shares_storage(x));
  Tensor t = transpose(x, 0, 1);
  EXPECT_FALSE(reshape(t, {24}).shares_storage(x));
  EXPECT_TRUE(reshape(t, {6, 2, 2}).shares_storage(x));  // splitting a dim is a view
  EXPECT_THROW(view(t, {24}), Error);
  EXPECT_EQ(to_vector(reshape(t, {24})), to_vector(contiguous(t)));
}

TEST(Tensor, Factories) {
  EXPECT_EQ(to_vector(arange(5)), (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(5).dtype(), DType::kInt64);
  EXPECT_EQ(to_vector(arange(1, 2, 0.25, DType::kFloat32)),
            (std::vector<double>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(to_vector(full({2}, 3.5, DType::kBFloat16)), (std::vector<double>{3.5, 3.5}));
  EXPECT_EQ(to_vector(triu(ones({3, 3}, DType::kBool), 1)),
            (std::vector<double>{0, 1, 1, 0, 0, 1, 0, 0, 0}));
  Generator g1(7), g2(7);
  EXPECT_EQ(to_vector(randn({16}, g1)), to_vector(randn({16}, g2)));  // seeded, reproducible
  Generator g3(8);
  const auto u = to_vector(rand({1000}, g3));
  for (double v : u) ASSERT_TRUE(v >= 0 && v < 1);
  EXPECT_EQ(zeros({2, 0}).numel(), 0);
}

TEST(Tensor, MetaTensorsHaveShapesButNoData) {
  Tensor m = empty({8, 3}, DType::kBFloat16, kMeta);
  EXPECT_THROW(m.data_ptr(), Error);  // no null pointer to crash on
  Tensor y = matmul(m, empty({3, 5}, DType::kBFloat16, kMeta));
  EXPECT_EQ(y.shape(), (Shape{8, 5}));
  EXPECT_TRUE(y.device().is_meta());
  EXPECT_THROW(to_vector(y), Error);
}

// data<T>() hands out a T* only where T fits the dtype, as torch's data_ptr<T>(): reading a
// bfloat16 tensor as float would give garbage.
TEST(Tensor, DataPointersAreTypedByTheDtype) {
  const Tensor f = ones({2}), b = ones({2}, DType::kBFloat16), i = ones({2}, DType::kInt32);
  EXPECT_EQ(f.data<float>()[1], 1.0f);
  EXPECT_EQ(i.data<int32_t>()[0], 1);
  EXPECT_EQ(i.data<unsigned>()[0], 1u);       // the bits, an unsigned type of the same size
  EXPECT_EQ(b.data<uint16_t>()[0], 0x3F80u);  // bfloat16's 1.0
  EXPECT_EQ(ones({1}, DType::kBool).data<bool>()[0], true);
  EXPECT_EQ(ones({1}, DType::kInt64).data<uint64_t>()[0], 1u);
  for (const auto& [what, read] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"bfloat16 elements; T must be its type (float, int64_t, int32_t, bool) or an unsigned "
            "type of 2 bytes to read the bits, got a 4-byte type of another kind",
            [&] { b.data<float>(); }},
           {"float32 elements", [&] { f.data<int64_t>(); }},
           {"got a 8-byte type of another kind", [&] { f.data<double>(); }},
           {"got a 2-byte unsigned type", [&] { f.data<uint16_t>(); }},
           {"int32 elements", [&] { i.data<float>(); }}}) {
    try {
      read();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("data<T>(): "), std::string::npos) << e.what();
    }
  }
}

TEST(Tensor, PrintsLikeTorch) {
  EXPECT_EQ(ToString(from_vector({1, 2.5, -3, 4}, {2, 2})),
            "tensor([[1.0000, 2.5000],\n        [-3.0000, 4.0000]], dtype=float32, device=cpu)");
  EXPECT_EQ(ToString(ones({2}, DType::kBool)), "tensor([True, True], dtype=bool, device=cpu)");
  const std::string big = ToString(arange(2000));
  EXPECT_NE(big.find("0, 1, 2, ..., 1997, 1998, 1999"), std::string::npos) << big;
  EXPECT_NE(big.find("size=[2000]"), std::string::npos);
  EXPECT_EQ(ToString(from_vector({5}, {})), "tensor(5.0000, dtype=float32, device=cpu)");
}

TEST(Device, ParsesAndRejects) {
  EXPECT_EQ(ParseDevice("cuda:1"), CUDA(1));
  EXPECT_EQ(ParseDevice("cpu"), kCPU);
  EXPECT_THROW(ParseDevice("tpu"), Error);
}

TEST(Settings, OneParserAcceptsBooleanWordsAndRejectsTheRest) {
  for (const char* on : {"1", "on", "ON", "true", "Yes"}) {
    ScopedEnv e("KILN_CUDA_GRAPHS", on);
    EXPECT_TRUE(EnvBool("KILN_CUDA_GRAPHS")) << on;
  }
  for (const char* off : {"0", "off", "False", "no"}) {
    ScopedEnv e("KILN_COMPILE", off);
    EXPECT_FALSE(EnvBool("KILN_COMPILE")) << off;
  }
  {
    ScopedEnv e("KILN_COMPILE", "maybe");
    try {
      EnvBool("KILN_COMPILE");
      ADD_FAILURE() << "KILN_COMPILE=maybe was accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("KILN_COMPILE='maybe': expected 1/0, on/off"),
                std::string::npos)
          << err.what();
    }
  }
  {
    ScopedEnv e("KILN_DEBUG", "yes");
    EXPECT_EQ(EnvLevel("KILN_DEBUG"), 1);
  }
  {
    ScopedEnv e("KILN_DEBUG", "2");
    EXPECT_EQ(EnvLevel("KILN_DEBUG"), 2);
  }
  for (const char* bad : {"5", "-1", "loud", "1.5"}) {
    ScopedEnv e("KILN_DEBUG", bad);
    EXPECT_THROW(EnvLevel("KILN_DEBUG"), Error) << bad;
  }
  {
    ScopedEnv e("KILN_GEMV", "OFF");
    EXPECT_EQ(EnvChoice("KILN_GEMV"), "off");
  }
  {
    ScopedEnv e("KILN_GEMV", "sometimes");
    EXPECT_THROW(EnvChoice("KILN_GEMV"), Error);
  }
  {
    ScopedEnv e("KILN_DISABLED_FAMILIES", " softmax,pointwise ,, ");
    EXPECT_EQ(EnvNames("KILN_DISABLED_FAMILIES"),
              (std::vector<std::string>{"softmax", "pointwise"}));
  }
  EXPECT_THROW(EnvBool("KILN_NOT_A_SETTING"), Error);
  EXPECT_THROW(EnvBool("KILN_DEBUG"), Error);  // a level, read as a boolean: a kiln bug
}

TEST(Settings, UnsetMeansTheTablesDefault) {
  for (const Setting& s : Settings()) {
    if (std::getenv(s.name) != nullptr) continue;  // set by whoever runs the test
    switch (s.kind) {
      case Setting::Kind::kBool:
        EXPECT_EQ(EnvBool(s.name), std::string(s.fallback) == "on") << s.name;
        break;
      case Setting::Kind::kLevel:
        EXPECT_EQ(EnvLevel(s.name), std::atoi(s.fallback)) << s.name;
        break;
      case Setting::Kind::kChoice:
        EXPECT_EQ(EnvChoice(s.name), s.fallback) << s.name;
        break;
      case Setting::Kind::kPath:
        EXPECT_EQ(EnvPath(s.name), "") << s.name;
        break;
      case Setting::Kind::kNames:
        EXPECT_TRUE(EnvNames(s.name).empty()) << s.name;
        break;
    }
  }
}

// README.md shows the settings table exactly as the library has it.
TEST(Settings, ReadmeHoldsTheTable) {
  std::ifstream in(KILN_README_PATH);
  ASSERT_TRUE(in) << "cannot read " << KILN_README_PATH;
  std::stringstream readme;
  readme << in.rdbuf();
  EXPECT_NE(readme.str().find(SettingsTable()), std::string::npos)
      << "README.md's settings table differs from runtime/settings.cc; it should read:\n"
      << SettingsTable();
}

// The capture arena's books (runtime/capture_arena.h): first fit, neighbours merged on free,
// the high water a second capture would need, ranges past the capacity reported as not fitting.
TEST(OffsetAllocator, FirstFitReusesAndMergesFreedRanges) {
  cuda::OffsetAllocator books(4096);
  const size_t a = books.Allocate(100), b = books.Allocate(256), c = books.Allocate(1);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 256u);  // rounded up to the 256-byte alignment
  EXPECT_EQ(c, 512u);
  EXPECT_EQ(books.live_bytes(), 768u);
  books.Free(a);
  EXPECT_EQ(books.Allocate(200), 0u);  // the first range that fits: a's
  books.Free(0);
  books.Free(b);                        // merges with the free range before it
  EXPECT_EQ(books.Allocate(512), 0u);   // a + b as one range
  EXPECT_EQ(books.high_water(), 768u);  // nothing ever went past c
  books.Free(c);
  EXPECT_EQ(books.Allocate(1024), 512u);  // the end moved back to c's start when c was freed
  EXPECT_EQ(books.high_water(), 1536u);
}

TEST(OffsetAllocator, RangesPastTheCapacityAreBookedButDoNotFit) {
  cuda::OffsetAllocator books(1024);
  const size_t a = books.Allocate(1024);
  EXPECT_TRUE(books.Fits(a));
  const size_t b = books.Allocate(512);
  EXPECT_EQ(b, 1024u);
  EXPECT_FALSE(books.Fits(b));
  EXPECT_EQ(books.high_water(), 1536u);
  books.Free(a);
  books.Free(b);
  books.Free(b);  // twice: ignored
  EXPECT_EQ(books.live_bytes(), 0u);
  EXPECT_TRUE(books.Fits(books.Allocate(1024)));
}

TEST(Status, MacrosPropagate) {
  auto inner = [](bool ok) -> absl::StatusOr<int> {
    if (!ok) return absl::InvalidArgumentError("bad");
    return 3;
  };
  auto outer = [&](bool ok) -> absl::StatusOr<int> {
    KILN_ASSIGN_OR_RETURN(int v, inner(ok));
    KILN_RETURN_IF_ERROR(absl::OkStatus());
    return v + 1;
  };
  EXPECT_EQ(*outer(true), 4);
  EXPECT_EQ(outer(false).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
