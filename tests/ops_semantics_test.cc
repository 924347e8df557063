// torch semantics of the math, comparison, indexing, joining and selection ops beyond the
// conformance table: int64 values beyond 2^53 stay exact, NaN ordering, scalar rounding in
// comparisons, integer powers, views from split/chunk, item(), out-of-range indices reported as
// kiln::Error on CUDA too (and the device usable afterwards), and the elementwise rows fusing
// into one kernel under kiln::compile. Device-parametrised bodies run on the CPU here and on
// CUDA on the GPU machine.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "codegen/compile.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ops/cuda/kernel_render.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/nvrtc.h"
#include "runtime/status.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

constexpr int64_t kBig = (int64_t{1} << 53) + 1;  // not a double

// An int64 tensor holding exactly `values` (from_vector would round them through double).
Tensor Int64s(const std::vector<int64_t>& values, Device device = kCPU) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(values.size())}, DType::kInt64, kCPU);
  for (size_t i = 0; i < values.size(); ++i) t.data<int64_t>()[i] = values[i];
  return to(t, device);
}

std::vector<int64_t> AsInt64s(const Tensor& x) {
  const Tensor h = contiguous(to(x, kCPU));
  return std::vector<int64_t>(h.data<int64_t>(), h.data<int64_t>() + h.numel());
}

std::vector<double> Vals(const Tensor& x) { return to_vector(x); }

TEST(OpsSemantics, Int64BeyondDoubleIsExactOnCpu) {
  const Tensor a = Int64s({kBig, kBig - 1, -kBig}), b = Int64s({kBig - 1, kBig - 1, -kBig});
  EXPECT_EQ(Vals(eq(a, b)), (std::vector<double>{0, 1, 1}));
  EXPECT_EQ(Vals(gt(a, b)), (std::vector<double>{1, 0, 0}));
  EXPECT_EQ(AsInt64s(maximum(a, b)), (std::vector<int64_t>{kBig, kBig - 1, -kBig}));
  EXPECT_EQ(AsInt64s(minimum(a, b)), (std::vector<int64_t>{kBig - 1, kBig - 1, -kBig}));
  EXPECT_EQ(AsInt64s(abs(a)), (std::vector<int64_t>{kBig, kBig - 1, kBig}));
  EXPECT_EQ(AsInt64s(clamp(a, b, b)), AsInt64s(b));
  EXPECT_EQ(AsInt64s(pow(Int64s({3}), 39)), (std::vector<int64_t>{4052555153018976267}));
  EXPECT_EQ(item<int64_t>(slice(a, 0, 0, 1)), kBig);
}

// Copies and selection never go through double, on either device.
void Int64IndexingIsExact(Device device) {
  const Tensor a = Int64s({kBig, kBig - 1, kBig + 2, -kBig}, device);
  const Tensor w = reshape(a, {2, 2});
  EXPECT_EQ(AsInt64s(embedding(Int64s({1, 0}, device), w)),
            (std::vector<int64_t>{kBig + 2, -kBig, kBig, kBig - 1}));
  EXPECT_EQ(AsInt64s(index_select(a, 0, Int64s({2, 0}, device))),
            (std::vector<int64_t>{kBig + 2, kBig}));
  EXPECT_EQ(AsInt64s(gather(a, 0, Int64s({3, 1}, device))),
            (std::vector<int64_t>{-kBig, kBig - 1}));
  EXPECT_EQ(AsInt64s(cat({a, slice(a, 0, 1, 2)})),
            (std::vector<int64_t>{kBig, kBig - 1, kBig + 2, -kBig, kBig - 1}));
  EXPECT_EQ(item<int64_t>(argmax(a)), 2);
  const ValuesIndices top = topk(a, 3);
  EXPECT_EQ(AsInt64s(top.indices), (std::vector<int64_t>{2, 0, 1}));
  EXPECT_EQ(AsInt64s(top.values), (std::vector<int64_t>{kBig + 2, kBig, kBig - 1}));
}
TEST(OpsSemantics, Int64IndexingIsExactOnCpu) { Int64IndexingIsExact(kCPU); }
TEST(OpsSemanticsCuda, Int64IndexingIsExact) {
  KILN_SKIP_WITHOUT_GPU();
  Int64IndexingIsExact(CUDA(0));
}

// NaN: propagates through minimum/maximum/clamp, is the largest value for argmax/topk (the first
// NaN wins), compares unequal to everything; -0.0 equals +0.0 (ties go to the lower index).
void NanAndZeroOrdering(Device device) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = to(from_vector({1, nan, 3, nan, -0.0, 0.0}, {6}), device);
  const Tensor y = to(from_vector({2, 2, nan, 1, 0.0, -0.0}, {6}), device);
  const std::vector<double> mx = Vals(maximum(x, y));
  EXPECT_EQ(mx[0], 2);
  EXPECT_TRUE(std::isnan(mx[1]) && std::isnan(mx[2]) && std::isnan(mx[3]));
  EXPECT_TRUE(std::isnan(Vals(minimum(y, x))[1]));
  EXPECT_TRUE(std::isnan(Vals(clamp(x, 0.0, 2.0))[1]));
  EXPECT_TRUE(std::isnan(Vals(clamp_min(y, nan))[0]));
  EXPECT_EQ(Vals(eq(x, x)), (std::vector<double>{1, 0, 1, 0, 1, 1}));
  EXPECT_EQ(Vals(ne(x, y)), (std::vector<double>{1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(item<int64_t>(argmax(x)), 1);
  EXPECT_EQ(AsInt64s(topk(x, 4).indices), (std::vector<int64_t>{1, 3, 2, 0}));
  EXPECT_EQ(AsInt64s(topk(x, 3, 0, /*largest=*/false).indices), (std::vector<int64_t>{4, 5, 0}));
  const Tensor zeros_only = to(from_vector({-0.0, 0.0, -0.0}, {3}), device);
  EXPECT_EQ(item<int64_t>(argmax(zeros_only)), 0);
  EXPECT_EQ(AsInt64s(topk(zeros_only, 3).indices), (std::vector<int64_t>{0, 1, 2}));
}
TEST(OpsSemantics, NanAndZeroOrderingOnCpu) { NanAndZeroOrdering(kCPU); }
TEST(OpsSemanticsCuda, NanAndZeroOrdering) {
  KILN_SKIP_WITHOUT_GPU();
  NanAndZeroOrdering(CUDA(0));
}

// torch converts the Python number to the tensor's dtype first: bf16(0.1) == 0.1.
TEST(OpsSemantics, ScalarComparisonsRoundTheScalarToTheTensorDtype) {
  for (DType t : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    const Tensor x = full({2}, 0.1, t);
    EXPECT_EQ(Vals(x == 0.1), (std::vector<double>{1, 1})) << DTypeName(t);
    EXPECT_EQ(Vals(x < 0.1), (std::vector<double>{0, 0})) << DTypeName(t);
  }
  // An integer tensor against a fractional scalar compares in float32.
  EXPECT_EQ(Vals(from_vector({0, 1}, {2}, DType::kInt64) > 0.5), (std::vector<double>{0, 1}));
  EXPECT_EQ((arange(3) == 1.0).dtype(), DType::kBool);
}

// torch's integer powers (aten's powi): exact in the operands' integer type, wrapping around like
// two's complement; a negative exponent gives 1 for base 1, ±1 for base -1 and 0 for any other
// base; an integer tensor to a negative integral scalar power raises ("integers to negative
// integer powers are not allowed"), to a fractional one gives float32. Eager and compiled
// (compiled functions run these rows unfused: fusion takes no integer dtype).
struct Powers {
  std::vector<int64_t> bases, exponents, want;
};

// bases ** exponents (both `dtype`), eager and through kiln::compile, against `want`.
void ExpectPowers(const Powers& p, DType dtype, Device device) {
  const std::vector<Tensor> in = {to(cast(Int64s(p.bases), dtype), device),
                                  to(cast(Int64s(p.exponents), dtype), device)};
  const auto fn = [](const std::vector<Tensor>& x) { return std::vector<Tensor>{pow(x[0], x[1])}; };
  CompiledFn compiled = compile(fn, in);
  for (const auto& [how, out] : {std::pair{"eager", fn(in)[0]}, {"compiled", compiled(in)[0]}}) {
    EXPECT_EQ(out.dtype(), dtype) << how;
    EXPECT_EQ(AsInt64s(cast(out, DType::kInt64)), p.want) << how << " " << DTypeName(dtype);
  }
}

// x ** exponent (a scalar), eager and compiled.
void ExpectScalarPowers(const Tensor& x, int64_t exponent, const std::vector<int64_t>& want) {
  const auto fn = [exponent](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{pow(in[0], exponent)};
  };
  CompiledFn compiled = compile(fn, {x});
  for (const auto& [how, out] : {std::pair{"eager", fn({x})[0]}, {"compiled", compiled({x})[0]}}) {
    EXPECT_EQ(out.dtype(), x.dtype()) << how;
    EXPECT_EQ(AsInt64s(cast(out, DType::kInt64)), want) << how << " ** " << exponent;
  }
}

// What every device promises: results within 2^53 (the CUDA expression computes in double,
// ops/registry.cc KILN_POW_EXPR), int32 wrapping around, negative exponents of nonzero bases.
void IntegerPowersAreTorchs(Device device) {
  ExpectPowers({{3, -3, 7, 0, 0, 1, -1, -1, 2, 1, -1, -1, -2, 5},
                {3, 3, 0, 0, 5, 100, 3, 4, -1, -5, -3, -2, -1, -2},
                {27, -27, 1, 1, 0, 1, -1, 1, 0, 1, -1, 1, 0, 0}},
               DType::kInt64, device);
  // 3^20 = 3486784401 and 46341^2 = 2147488281 leave int32; 2^31 wraps to INT32_MIN.
  ExpectPowers({{3, 2, -2, 46341, 3},
                {20, 31, 31, 2, 19},
                {-808182895, INT32_MIN, INT32_MIN, -2147479015, 1162261467}},
               DType::kInt32, device);
  ExpectScalarPowers(to(Int64s({3, -2, 5}), device), 3, {27, -8, 125});
  ExpectScalarPowers(to(from_vector({3, -2, 46341}, {3}, DType::kInt32), device), 2,
                     {9, 4, -2147479015});
  const Tensor x = to(Int64s({4, 2}), device);
  EXPECT_EQ(pow(x, 0.5).dtype(), DType::kFloat32);
  ExpectClose(Vals(pow(x, 0.5)), {2, std::sqrt(2.0)}, ToleranceFor(DType::kFloat32), "** 0.5");
  EXPECT_EQ(pow(to(ones({2}, DType::kBool), device), 2).dtype(), DType::kInt64);
  EXPECT_EQ(pow(x, -1.0).dtype(), DType::kFloat32);  // a floating exponent: float math
  try {
    pow(x, -1);
    ADD_FAILURE() << "int64 ** -1 did not raise";
  } catch (const Error& e) {
    EXPECT_TRUE(absl::StartsWith(e.what(), "pow_scalar: integers to negative integer powers"))
        << e.what();
  }
}
TEST(OpsSemantics, IntegerPowersAreTorchsOnCpu) { IntegerPowersAreTorchs(kCPU); }
TEST(OpsSemanticsCuda, IntegerPowersAreTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  IntegerPowersAreTorchs(CUDA(0));
}

// The CPU computes integer powers in integers: exact beyond 2^53, wrapping past 2^63 like torch
// (3^40, 2^63, 2^64), and 0 ** negative is 0. (The CUDA expression computes in double, where
// these round or saturate: ops/registry.cc.)
TEST(OpsSemantics, IntegerPowersBeyondDoubleAreExactOnCpu) {
  ExpectPowers({{3, 3, -3, -2, 2, 2, 5, 0, 0},
                {39, 40, 39, 63, 63, 64, 27, -1, -3},
                {4052555153018976267, -6289078614652622815, -4052555153018976267, INT64_MIN,
                 INT64_MIN, 0, 7450580596923828125, 0, 0}},
               DType::kInt64, kCPU);
  ExpectScalarPowers(Int64s({3, -3, 2}), 39,
                     {4052555153018976267, -4052555153018976267, int64_t{1} << 39});
  ExpectScalarPowers(Int64s({3, 2}), 40, {-6289078614652622815, int64_t{1} << 40});
  // An int32 tensor's powers wrap in 32 bits: 3^21 = 10460353203 = 1870418611 mod 2^32.
  ExpectScalarPowers(from_vector({3}, {1}, DType::kInt32), 21, {1870418611});
}

TEST(OpsSemantics, ClampWithMinAboveMaxGivesMax) {
  EXPECT_EQ(Vals(clamp(from_vector({-1, 0.5, 3}, {3}), 2.0, 1.0)), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(Vals(clamp(arange(5), 1, 3)), (std::vector<double>{1, 1, 2, 3, 3}));
  EXPECT_EQ(clamp(arange(5), 1, 3).dtype(), DType::kInt64);
  EXPECT_EQ(clamp(arange(5), 1.0, 3.0).dtype(), DType::kFloat32);
  EXPECT_EQ(clamp_min(arange(5), 0.5).dtype(), DType::kFloat32);
}

// A scalar's kind decides promotion as Python's int and float do (int_tensor + 2 stays integer,
// int_tensor + 2.0 is float32), and an integer scalar is exact over all of int64.
void ScalarKindsPromoteLikePython(Device device) {
  const Tensor i = to(from_vector({1, 2, 3}, {3}, DType::kInt32), device);
  EXPECT_EQ(add(i, 2).dtype(), DType::kInt32);
  EXPECT_EQ((i * 2.0).dtype(), DType::kFloat32);
  EXPECT_EQ(Vals(i * 2.0), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ((2.0 - i).dtype(), DType::kFloat32);
  EXPECT_EQ(pow(i, 2).dtype(), DType::kInt32);
  EXPECT_EQ(pow(i, 2.0).dtype(), DType::kFloat32);
  EXPECT_EQ(clamp(i, 1, 2).dtype(), DType::kInt32);
  EXPECT_EQ(Vals(clamp(i, 1.5, std::nullopt)), (std::vector<double>{1.5, 2, 3}));
  const Tensor mask = to(from_vector({1, 0, 1}, {3}, DType::kBool), device);
  EXPECT_EQ(add(mask, 1).dtype(), DType::kInt64);
  EXPECT_EQ(add(mask, 1.0).dtype(), DType::kFloat32);
  EXPECT_EQ(arange(0, 3, 1, std::nullopt, device).dtype(), DType::kInt64);
  EXPECT_EQ(arange(0.0, 3.0, 1.0, std::nullopt, device).dtype(), DType::kFloat32);
  // Integers past 2^53 (no double holds kBig).
  const Tensor big = Int64s({kBig, kBig - 1}, device);
  EXPECT_EQ(Vals(eq(big, kBig)), (std::vector<double>{1, 0}));
  EXPECT_EQ(AsInt64s(add(big, int64_t{2})), (std::vector<int64_t>{kBig + 2, kBig + 1}));
  EXPECT_EQ(AsInt64s(full({2}, kBig, DType::kInt64, device)), (std::vector<int64_t>{kBig, kBig}));
  EXPECT_EQ(AsInt64s(masked_fill(big, slice(mask, 0, 0, 2), kBig + 2)),
            (std::vector<int64_t>{kBig + 2, kBig - 1}));
  // A bound the result type cannot hold is an error, not a wrapped or infinite bound.
  for (const auto& [x, bound] : {std::pair{i, Scalar(int64_t{3000000000})},
                                 std::pair{to(i, DType::kFloat16), Scalar(1e6)}}) {
    try {
      clamp_min(x, bound);
      ADD_FAILURE() << "clamp_min(" << DTypeName(x.dtype()) << ", " << bound.ToString()
                    << ") did not raise";
    } catch (const Error& e) {
      EXPECT_TRUE(absl::StrContains(e.what(), "cannot be converted to")) << e.what();
    }
  }
}
TEST(OpsSemantics, ScalarKindsPromoteLikePythonOnCpu) { ScalarKindsPromoteLikePython(kCPU); }
TEST(OpsSemanticsCuda, ScalarKindsPromoteLikePython) {
  KILN_SKIP_WITHOUT_GPU();
  ScalarKindsPromoteLikePython(CUDA(0));
}

// torch converts each operand to the result's dtype before the op and computes float32 math
// with a float scalar: an int64 operand rounds once (from the integer), x * 0.1 is x * 0.1f.
void OperandsConvertToTheResultDtypeFirst(Device device) {
  const int64_t two24 = int64_t{1} << 24;
  const Tensor n = Int64s({two24 + 1}, device);
  EXPECT_EQ(Vals(add(n, to(from_vector({-double(two24)}, {1}), device))), (std::vector<double>{0}));
  const int64_t wide = (int64_t{1} << 60) + (int64_t{1} << 36) + 1;  // float: 2^60 + 2^37
  EXPECT_EQ(Vals(cast(Int64s({wide}, device), DType::kFloat32)),
            (std::vector<double>{std::ldexp(1.0, 60) + std::ldexp(1.0, 37)}));
  std::vector<double> values;
  for (int k = 1; k <= 64; ++k) values.push_back(1.0 + k / 7.0);
  const Tensor x = to(from_vector(values, {64}), device);
  const std::vector<double> got = Vals(mul(x, 0.1));
  for (int k = 0; k < 64; ++k) {
    const float want = static_cast<float>(values[k]) * 0.1f;
    EXPECT_EQ(got[k], static_cast<double>(want)) << values[k] << " * 0.1";
  }
}
TEST(OpsSemantics, OperandsConvertToTheResultDtypeFirstOnCpu) {
  OperandsConvertToTheResultDtypeFirst(kCPU);
}
TEST(OpsSemanticsCuda, OperandsConvertToTheResultDtypeFirst) {
  KILN_SKIP_WITHOUT_GPU();
  OperandsConvertToTheResultDtypeFirst(CUDA(0));
}

TEST(OpsSemantics, BoolSubtractionAndIntegerActivationsAreErrors) {
  const Tensor mask = from_vector({1, 0}, {2}, DType::kBool);
  const Tensor ints = from_vector({1, 2}, {2}, DType::kInt64);
  const std::vector<std::pair<const char*, std::function<Tensor()>>> calls = {
      {"sub_scalar: subtraction with a bool tensor", [&] { return sub(mask, 1.0); }},
      {"rsub_scalar: subtraction with a bool tensor", [&] { return 1.0 - mask; }},
      {"sub: subtraction with a bool tensor", [&] { return sub(ints, mask); }},
      {"gelu: input must be a floating-point tensor", [&] { return gelu(ints); }},
      {"silu: input must be a floating-point tensor", [&] { return silu(ints); }},
      {"leaky_relu: the input must be a floating-point tensor", [&] { return leaky_relu(ints); }},
  };
  for (const auto& [want, call] : calls) {
    try {
      call();
      ADD_FAILURE() << want << ": no error";
    } catch (const Error& e) {
      EXPECT_TRUE(absl::StartsWith(e.what(), want)) << e.what();
    }
  }
  EXPECT_EQ(Vals(eq(mask, false)), (std::vector<double>{0, 1}));  // the way to invert a mask
}

// Truth values as torch reads them (nonzero and NaN are true), the mask operators, the element
// predicates and any/all (an empty reduction: false / true).
void LogicalOpsAndPredicates(Device device) {
  const Tensor x = to(from_vector({0, 1.5, NAN, -INFINITY, INFINITY, -2}, {6}), device);
  const Tensor i = to(from_vector({0, 3, 0, 1, 0, 7}, {6}, DType::kInt64), device);
  EXPECT_EQ(Vals(logical_not(x)), (std::vector<double>{1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(Vals(logical_and(x, i)), (std::vector<double>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(Vals(logical_or(x, i)), (std::vector<double>{0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(Vals(logical_xor(x, i)), (std::vector<double>{0, 0, 1, 0, 1, 0}));
  EXPECT_EQ(logical_and(x, i).dtype(), DType::kBool);
  EXPECT_EQ(Vals(isnan(x)), (std::vector<double>{0, 0, 1, 0, 0, 0}));
  EXPECT_EQ(Vals(isinf(x)), (std::vector<double>{0, 0, 0, 1, 1, 0}));
  EXPECT_EQ(Vals(isfinite(x)), (std::vector<double>{1, 1, 0, 0, 0, 1}));
  EXPECT_EQ(Vals(isfinite(i)), (std::vector<double>(6, 1)));
  const Tensor a = to(from_vector({1, 1, 0, 0}, {2, 2}, DType::kBool), device);
  const Tensor b = to(from_vector({1, 0}, {2}, DType::kBool), device);  // broadcasts
  EXPECT_EQ(Vals(a & b), (std::vector<double>{1, 0, 0, 0}));
  EXPECT_EQ(Vals(a | b), (std::vector<double>{1, 1, 1, 0}));
  EXPECT_EQ(Vals(a ^ b), (std::vector<double>{0, 1, 1, 0}));
  EXPECT_EQ(Vals(~a), (std::vector<double>{0, 0, 1, 1}));
  EXPECT_EQ(Vals(any(a, {1})), (std::vector<double>{1, 0}));
  EXPECT_EQ(Vals(all(a, {1})), (std::vector<double>{1, 0}));
  EXPECT_EQ(Vals(any(x)), (std::vector<double>{1}));
  EXPECT_EQ(Vals(all(x)), (std::vector<double>{0}));
  EXPECT_EQ(any(a, {0}, true).shape(), (Shape{1, 2}));
  const Tensor empty = to(zeros({0, 3}), device);
  EXPECT_EQ(Vals(any(empty, {0})), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(Vals(all(empty, {0})), (std::vector<double>{1, 1, 1}));
  EXPECT_NE(ErrorOf([&] { return i & i; }).find("bitwise_and: kiln's bitwise operators take bool"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { return logical_and(a, to(ones({3}), device)); }).find("logical_and: "),
            std::string::npos);
}
TEST(OpsSemantics, LogicalOpsAndPredicatesOnCpu) { LogicalOpsAndPredicates(kCPU); }
TEST(OpsSemanticsCuda, LogicalOpsAndPredicates) {
  KILN_SKIP_WITHOUT_GPU();
  LogicalOpsAndPredicates(CUDA(0));
}

// floor/ceil/round/trunc keep the dtype, round half to even, pass integers unchanged (exactly);
// erf promotes integers to float32.
void RoundingAndErf(Device device) {
  const Tensor x = to(from_vector({0.5, 1.5, 2.5, -0.5, -1.7, 2.2}, {6}), device);
  EXPECT_EQ(Vals(round(x)), (std::vector<double>{0, 2, 2, -0.0, -2, 2}));
  EXPECT_EQ(Vals(floor(x)), (std::vector<double>{0, 1, 2, -1, -2, 2}));
  EXPECT_EQ(Vals(ceil(x)), (std::vector<double>{1, 2, 3, -0.0, -1, 3}));
  EXPECT_EQ(Vals(trunc(x)), (std::vector<double>{0, 1, 2, -0.0, -1, 2}));
  EXPECT_EQ(floor(to(x, DType::kBFloat16)).dtype(), DType::kBFloat16);
  const Tensor big = Int64s({kBig, -kBig}, device);
  for (const Tensor& r : {floor(big), ceil(big), round(big), trunc(big)}) {
    EXPECT_EQ(r.dtype(), DType::kInt64);
    EXPECT_EQ(AsInt64s(r), (std::vector<int64_t>{kBig, -kBig}));
  }
  EXPECT_NE(ErrorOf([&] { return floor(to(ones({2}, DType::kBool), device)); }).find("floor: "),
            std::string::npos);
  const std::vector<double> e = Vals(erf(to(from_vector({0, 1, -2}, {3}, DType::kInt32), device)));
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0], 0);
  EXPECT_NEAR(e[1], std::erf(1.0), 1e-6);
  EXPECT_NEAR(e[2], std::erf(-2.0), 1e-6);
}
TEST(OpsSemantics, RoundingAndErfOnCpu) { RoundingAndErf(kCPU); }
TEST(OpsSemanticsCuda, RoundingAndErf) {
  KILN_SKIP_WITHOUT_GPU();
  RoundingAndErf(CUDA(0));
}

// remainder (Python's %), fmod (C's) and floor_divide on integers (exact past 2^53, INT64_MIN by
// -1 wrapping) and floats, their dtypes and scalar forms, division by zero, bool refused.
void DivisionRoundingIsTorchs(Device device) {
  const Tensor a = Int64s({5, -5, 5, -5}, device), b = Int64s({3, 3, -3, -3}, device);
  EXPECT_EQ(AsInt64s(remainder(a, b)), (std::vector<int64_t>{2, 1, -1, -2}));
  EXPECT_EQ(AsInt64s(fmod(a, b)), (std::vector<int64_t>{2, -2, 2, -2}));
  EXPECT_EQ(AsInt64s(floor_divide(a, b)), (std::vector<int64_t>{1, -2, -2, 1}));
  const Tensor big = Int64s({kBig, -kBig, INT64_MIN, INT64_MIN}, device);
  const Tensor by = Int64s({7, 7, -1, 2}, device);
  EXPECT_EQ(AsInt64s(remainder(big, by)), (std::vector<int64_t>{kBig % 7, 7 - kBig % 7, 0, 0}));
  EXPECT_EQ(AsInt64s(floor_divide(big, by)),
            (std::vector<int64_t>{kBig / 7, -kBig / 7 - 1, INT64_MIN, INT64_MIN / 2}));
  const Tensor x = to(from_vector({5.5, -5.5, 5.5, -5.5}, {4}), device);
  const Tensor y = to(from_vector({2, 2, -2, -2}, {4}), device);
  EXPECT_EQ(Vals(remainder(x, y)), (std::vector<double>{1.5, 0.5, -0.5, -1.5}));
  EXPECT_EQ(Vals(fmod(x, y)), (std::vector<double>{1.5, -1.5, 1.5, -1.5}));
  EXPECT_EQ(Vals(floor_divide(x, y)), (std::vector<double>{2, -3, -3, 2}));
  // Dtypes: integers stay (int32 % int32 is int32), a float scalar makes float32, bf16 stays.
  const Tensor i32 = to(from_vector({7, -7}, {2}, DType::kInt32), device);
  EXPECT_EQ(remainder(i32, i32).dtype(), DType::kInt32);
  EXPECT_EQ(Vals(remainder(i32, 3)), (std::vector<double>{1, 2}));
  EXPECT_EQ(remainder(i32, 3).dtype(), DType::kInt32);
  EXPECT_EQ(Vals(remainder(i32, 2.5)), (std::vector<double>{2, 0.5}));
  EXPECT_EQ(remainder(i32, 2.5).dtype(), DType::kFloat32);
  EXPECT_EQ(floor_divide(to(x, DType::kBFloat16), 2).dtype(), DType::kBFloat16);
  EXPECT_EQ(Vals(fmod(i32, -3)), (std::vector<double>{1, -1}));
  EXPECT_EQ(Vals(floor_divide(i32, 2)), (std::vector<double>{3, -4}));
  // A floating divisor of 0: NaN or ±inf; an integer one: an error on the CPU, -1 on CUDA.
  const Tensor zero = to(zeros({1}), device), one = to(ones({1}), device);
  EXPECT_TRUE(std::isnan(Vals(remainder(one, zero))[0]));
  EXPECT_EQ(Vals(floor_divide(one, zero))[0], INFINITY);
  const Tensor izero = Int64s({0}, device), ione = Int64s({1}, device);
  for (auto op : {+[](const Tensor&p, const Tensor&q) { return remainder(p, q); },
                  +[](const Tensor&p, const Tensor&q) { return fmod(p, q); },
                  +[](const Tensor&p, const Tensor&q) { return floor_divide(p, q); }}) {
    if (device.is_cuda()) {
      EXPECT_EQ(AsInt64s(op(ione, izero)), (std::vector<int64_t>{-1}));
    } else {
      EXPECT_NE(ErrorOf([&] { return op(ione, izero); }).find("integer division by zero"),
                std::string::npos);
    }
  }
  const Tensor mask = to(ones({2}, DType::kBool), device);
  EXPECT_NE(ErrorOf([&] { return remainder(mask, mask); }).find("remainder: "), std::string::npos);
  // Floats compute in float32 as torch does: the quotient of a - fmod(a, b) rounds there.
  const Tensor fa = to(from_vector({-22799200.0}, {1}), device);
  const Tensor fb = to(from_vector({1.43084168}, {1}), device);
  EXPECT_EQ(Vals(floor_divide(fa, fb)), (std::vector<double>{-15934117}));
  // A number on the left (torch's __rmod__), and one that does not fit the tensor's dtype.
  EXPECT_EQ(Vals(7 % i32), (std::vector<double>{0, -0.0}));
  EXPECT_EQ(Vals(Scalar(8) % i32), (std::vector<double>{1, -6}));
  EXPECT_NE(ErrorOf([&] { return remainder(i32, int64_t{1} << 40); }).find("remainder of int32"),
            std::string::npos);
}
TEST(OpsSemantics, DivisionRoundingIsTorchsOnCpu) { DivisionRoundingIsTorchs(kCPU); }
TEST(OpsSemanticsCuda, DivisionRoundingIsTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  DivisionRoundingIsTorchs(CUDA(0));
}

// sign (NaN and -0.0 give 0; integers exact; bool unchanged) and the float-valued unary rows on
// integers (float32 results).
void SignAndFloatUnaries(Device device) {
  const Tensor x = to(from_vector({-2.5, 0, 3, NAN, -0.0}, {5}), device);
  const std::vector<double> s = Vals(sign(x));
  EXPECT_EQ(s, (std::vector<double>{-1, 0, 1, 0, 0}));
  EXPECT_FALSE(std::signbit(s[4]));
  EXPECT_EQ(AsInt64s(sign(Int64s({INT64_MIN, 0, kBig}, device))), (std::vector<int64_t>{-1, 0, 1}));
  const Tensor mask = to(from_vector({1, 0}, {2}, DType::kBool), device);
  EXPECT_EQ(sign(mask).dtype(), DType::kBool);
  EXPECT_EQ(Vals(sign(mask)), (std::vector<double>{1, 0}));
  const Tensor ints = to(from_vector({0, 1, 2}, {3}, DType::kInt32), device);
  for (const Tensor& r : {log1p(ints), expm1(ints), tan(ints), atan(ints), reciprocal(ints)}) {
    EXPECT_EQ(r.dtype(), DType::kFloat32);
  }
  ExpectClose(Vals(reciprocal(ints)), {INFINITY, 1, 0.5}, {0, 0}, "reciprocal");
  ExpectClose(Vals(log1p(to(from_vector({1e-7, -0.5}, {2}), device))),
              {std::log1p(1e-7), std::log1p(-0.5)}, {1e-6, 0}, "log1p");
  ExpectClose(Vals(expm1(to(from_vector({1e-7, 2}, {2}), device))),
              {std::expm1(1e-7), std::expm1(2.0)}, {1e-6, 0}, "expm1");
}
TEST(OpsSemantics, SignAndFloatUnariesOnCpu) { SignAndFloatUnaries(kCPU); }
TEST(OpsSemanticsCuda, SignAndFloatUnaries) {
  KILN_SKIP_WITHOUT_GPU();
  SignAndFloatUnaries(CUDA(0));
}

// cumsum along either dim of a strided input, its dtypes (integers and bools give int64, exact
// past 2^53; floats keep), 0-d and empty inputs, rows longer than one block's chunk, a bad dim.
void CumsumIsTorchs(Device device) {
  const Tensor x = to(from_vector({1, 2, 3, 4, 5, 6}, {2, 3}), device);
  EXPECT_EQ(Vals(cumsum(x, 1)), (std::vector<double>{1, 3, 6, 4, 9, 15}));
  EXPECT_EQ(Vals(cumsum(x, -2)), (std::vector<double>{1, 2, 3, 5, 7, 9}));
  EXPECT_EQ(Vals(cumsum(transpose(x, 0, 1), 1)), (std::vector<double>{1, 5, 2, 7, 3, 9}));
  const Tensor big = Int64s({kBig, 1, -kBig}, device);
  EXPECT_EQ(AsInt64s(cumsum(big, 0)), (std::vector<int64_t>{kBig, kBig + 1, 1}));
  const Tensor i32 = to(from_vector({2, -1}, {2}, DType::kInt32), device);
  EXPECT_EQ(cumsum(i32, 0).dtype(), DType::kInt64);
  EXPECT_EQ(AsInt64s(cumsum(i32, 0)), (std::vector<int64_t>{2, 1}));
  const Tensor mask = to(from_vector({1, 0, 1, 1}, {4}, DType::kBool), device);
  EXPECT_EQ(AsInt64s(cumsum(mask, 0)), (std::vector<int64_t>{1, 1, 2, 3}));
  EXPECT_EQ(cumsum(to(x, DType::kBFloat16), 1).dtype(), DType::kBFloat16);
  EXPECT_EQ(Vals(cumsum(to(full({}, 2.5), device), 0)), (std::vector<double>{2.5}));
  EXPECT_EQ(cumsum(to(zeros({0, 3}), device), 0).shape(), (Shape{0, 3}));
  // 1000 ones: past one block's 256-element chunk, the carry joins the chunks.
  const std::vector<double> ramp = Vals(cumsum(to(ones({2, 1000}), device), 1));
  EXPECT_EQ(ramp[999], 1000);
  EXPECT_EQ(ramp[1000 + 256], 257);
  EXPECT_NE(ErrorOf([&] { return cumsum(x, 2); }).find("cumsum: "), std::string::npos);
}
TEST(OpsSemantics, CumsumIsTorchsOnCpu) { CumsumIsTorchs(kCPU); }
TEST(OpsSemanticsCuda, CumsumIsTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  CumsumIsTorchs(CUDA(0));
}

// The composites std, norm (every order), softplus, outer, cross_entropy and the % operator
// against the math written out in double.
void CompositeMathIsTorchs(Device device) {
  const std::vector<double> v = {3, -4, 0, 1.5, -2, 6};
  const Tensor x = to(from_vector(v, {2, 3}), device);
  double mean = 0, ss = 0;
  for (double e : v) mean += e / 6;
  for (double e : v) ss += (e - mean) * (e - mean);
  ExpectClose(Vals(std(x)), {std::sqrt(ss / 5)}, {1e-6, 1e-6}, "std");
  EXPECT_EQ(std(x, {1}, 0, true).shape(), (Shape{2, 1}));
  ExpectClose(Vals(norm(x)), {std::sqrt(9 + 16 + 2.25 + 4 + 36)}, {1e-6, 1e-6}, "norm 2");
  ExpectClose(Vals(norm(x, 1, {1})), {7, 9.5}, {1e-6, 1e-6}, "norm 1");
  ExpectClose(Vals(norm(x, INFINITY, {1})), {4, 6}, {0, 0}, "norm inf");
  ExpectClose(Vals(norm(x, -INFINITY, {1})), {0, 1.5}, {0, 0}, "norm -inf");
  ExpectClose(Vals(norm(x, 0, {1})), {2, 3}, {0, 0}, "norm 0");
  ExpectClose(Vals(norm(x, 3, {0})), {std::cbrt(27 + 3.375), std::cbrt(64 + 8), std::cbrt(216)},
              {1e-5, 1e-5}, "norm 3");
  EXPECT_EQ(norm(to(x, DType::kBFloat16)).dtype(), DType::kBFloat16);
  EXPECT_NE(ErrorOf([&] { return norm(to(x, DType::kInt64)); }).find("norm: "), std::string::npos);
  const Tensor s = softplus(to(from_vector({-1, 0, 30}, {3}), device));
  ExpectClose(Vals(s), {std::log1p(std::exp(-1.0)), std::log(2.0), 30}, {1e-6, 1e-6}, "softplus");
  // Half inputs compute in float32 (exp(12) would overflow float16) and round once.
  EXPECT_EQ(Vals(softplus(to(from_vector({12, 15}, {2}, DType::kFloat16), device))),
            (std::vector<double>{12, 15}));
  EXPECT_NE(ErrorOf([&] { return norm(to(zeros({0}), device), -1); }).find("has no value"),
            std::string::npos);
  EXPECT_EQ(
      outer(to(from_vector({1, 2}, {2}), device), to(from_vector({3, 4, 5}, {3}), device)).shape(),
      (Shape{2, 3}));
  EXPECT_NE(ErrorOf([&] { return outer(x, x); }).find("outer: needs two 1-D tensors"),
            std::string::npos);
  EXPECT_EQ(Vals(x % 4.0), (std::vector<double>{3, 0, 0, 1.5, 2, 2}));
  EXPECT_EQ(logsumexp(Int64s({0, 0}, device), {0}).dtype(), DType::kFloat32);
  // cross_entropy: rows [N, C] with one target ignored, every reduction, and a bad target.
  const Tensor logits = to(from_vector({1, 2, 3, 0, 0, 0, -1, 5, 2}, {3, 3}), device);
  const Tensor target = Int64s({2, -100, 1}, device);
  auto row_loss = [](std::vector<double> row, int t) {
    double z = 0;
    for (double e : row) z += std::exp(e);
    return std::log(z) - row[t];
  };
  const double l0 = row_loss({1, 2, 3}, 2), l2 = row_loss({-1, 5, 2}, 1);
  ExpectClose(Vals(cross_entropy(logits, target)), {(l0 + l2) / 2}, {1e-6, 1e-6}, "ce mean");
  ExpectClose(Vals(cross_entropy(logits, target, -100, "sum")), {l0 + l2}, {1e-6, 1e-6}, "sum");
  ExpectClose(Vals(cross_entropy(logits, target, -100, "none")), {l0, 0, l2}, {1e-6, 1e-6}, "none");
  EXPECT_TRUE(std::isnan(Vals(cross_entropy(logits, Int64s({-100, -100, -100}, device)))[0]));
  EXPECT_EQ(cross_entropy(to(logits, DType::kBFloat16), target).dtype(), DType::kBFloat16);
  // [N, C, d] logits with a [N, d] target: the class dim is 1.
  const Tensor spatial = cross_entropy(reshape(logits, {1, 3, 3}),
                                       reshape(Int64s({0, 1, 2}, device), {1, 3}), -100, "none");
  EXPECT_EQ(spatial.shape(), (Shape{1, 3}));
  const std::string bad = ErrorOf([&] { return cross_entropy(logits, Int64s({2, 3, 0}, device)); });
  EXPECT_NE(bad.find("cross_entropy"), std::string::npos) << bad;
  EXPECT_NE(ErrorOf([&] {
              return cross_entropy(logits, Int64s({1, 2}, device));
            }).find("the target must be [3]"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { return cross_entropy(logits, logits); }).find("class indices"),
            std::string::npos);
}
TEST(OpsSemantics, CompositeMathIsTorchsOnCpu) { CompositeMathIsTorchs(kCPU); }
TEST(OpsSemanticsCuda, CompositeMathIsTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  CompositeMathIsTorchs(CUDA(0));
}

// sort/argsort (stable, NaN largest, bool), flip, roll (with and without dims) and one_hot
// (inferred classes, range checked).
void SortFlipRollOneHot(Device device) {
  const Tensor x = to(from_vector({3, NAN, 1, 3, -2, 0}, {2, 3}), device);
  const ValuesIndices up = sort(x, 1);
  EXPECT_EQ(AsInt64s(up.indices), (std::vector<int64_t>{2, 0, 1, 1, 2, 0}));
  const std::vector<double> v = Vals(up.values);
  EXPECT_EQ(v[0], 1);
  EXPECT_TRUE(std::isnan(v[2]));
  EXPECT_EQ(AsInt64s(argsort(x, 1, true)), (std::vector<int64_t>{1, 0, 2, 0, 2, 1}));
  const Tensor ties = to(from_vector({2, 1, 2, 1}, {4}), device);
  EXPECT_EQ(AsInt64s(argsort(ties)), (std::vector<int64_t>{1, 3, 0, 2}));  // stable
  const Tensor mask = to(from_vector({1, 0, 1}, {3}, DType::kBool), device);
  EXPECT_EQ(sort(mask).values.dtype(), DType::kBool);
  EXPECT_EQ(Vals(sort(mask).values), (std::vector<double>{0, 1, 1}));
  const Tensor m = to(from_vector({1, 2, 3, 4, 5, 6}, {2, 3}), device);
  EXPECT_EQ(Vals(flip(m, {1})), (std::vector<double>{3, 2, 1, 6, 5, 4}));
  EXPECT_EQ(Vals(flip(m, {0, -1})), (std::vector<double>{6, 5, 4, 3, 2, 1}));
  EXPECT_NE(ErrorOf([&] { return flip(m, {1, 1}); }).find("flip: "), std::string::npos);
  EXPECT_EQ(Vals(roll(m, {1}, {1})), (std::vector<double>{3, 1, 2, 6, 4, 5}));
  EXPECT_EQ(Vals(roll(m, {-4}, {1})), (std::vector<double>{2, 3, 1, 5, 6, 4}));
  EXPECT_EQ(Vals(roll(m, {2})), (std::vector<double>{5, 6, 1, 2, 3, 4}));
  EXPECT_EQ(roll(m, {2}).shape(), (Shape{2, 3}));
  EXPECT_NE(ErrorOf([&] { return roll(m, {1, 2}, {0}); }).find("roll: "), std::string::npos);
  const Tensor ids = Int64s({2, 0, 1}, device);
  EXPECT_EQ(AsInt64s(one_hot(ids)), (std::vector<int64_t>{0, 0, 1, 1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(one_hot(ids, 5).shape(), (Shape{3, 5}));
  EXPECT_NE(ErrorOf([&] { return one_hot(ids, 2); }).find("one_hot"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { return one_hot(Int64s({-1}, device), 3); }).find("one_hot"),
            std::string::npos);
  // Compiled: the same values as eager, and a bad class index still an error.
  const auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{roll(flip(in[0], {1}), {1}, {0}), one_hot(in[1], 3),
                               cumsum(in[0], 1), in[0] % 4.0, argsort(in[0], 0, true)};
  };
  CompiledFn f = compile(fn, {m, ids});
  const std::vector<Tensor> got = f({m, ids}), want = fn({m, ids});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(Vals(got[i]), Vals(want[i])) << "output " << i;
  EXPECT_THROW(f({m, Int64s({0, 3, 1}, device)}), Error);
}
TEST(OpsSemantics, SortFlipRollOneHotOnCpu) { SortFlipRollOneHot(kCPU); }
TEST(OpsSemanticsCuda, SortFlipRollOneHot) {
  KILN_SKIP_WITHOUT_GPU();
  SortFlipRollOneHot(CUDA(0));
}

// The activation composites, normalize, cosine_similarity and addmm against the math in double.
void ActivationsAndNorms(Device device) {
  const std::vector<double> v = {-4, -1, -0.5, 0, 0.5, 2, 7};
  const Tensor x = to(from_vector(v, {7}), device);
  auto each = [&](double (*f)(double)) {
    std::vector<double> out;
    for (double e : v) out.push_back(f(e));
    return out;
  };
  const auto close = [](const std::vector<double>& got, const std::vector<double>& want,
                        const char* what) {
    ExpectClose(got, want, {1e-6, 1e-6}, what);
  };
  close(Vals(elu(x)), each([](double e) { return e > 0 ? e : std::expm1(e); }), "elu");
  close(Vals(hardtanh(x)), each([](double e) { return std::clamp(e, -1.0, 1.0); }), "hardtanh");
  close(Vals(relu6(x)), each([](double e) { return std::clamp(e, 0.0, 6.0); }), "relu6");
  close(Vals(hardsigmoid(x)), each([](double e) { return std::clamp(e + 3, 0.0, 6.0) / 6; }),
        "hardsigmoid");
  close(Vals(hardswish(x)), each([](double e) { return e * std::clamp(e + 3, 0.0, 6.0) / 6; }),
        "hardswish");
  close(Vals(mish(x)), each([](double e) { return e * std::tanh(std::log1p(std::exp(e))); }),
        "mish");
  close(Vals(logsigmoid(x)), each([](double e) { return -std::log1p(std::exp(-e)); }),
        "logsigmoid");
  EXPECT_EQ(mish(to(x, DType::kBFloat16)).dtype(), DType::kBFloat16);
  EXPECT_NE(ErrorOf([&] { return elu(Int64s({1}, device)); }).find("elu: "), std::string::npos);
  const Tensor g = to(from_vector({1, 2, 0, -1}, {1, 4}), device);
  close(Vals(glu(g)), {1 / (1 + std::exp(0.0)), 2 / (1 + std::exp(1.0))}, "glu");
  EXPECT_NE(ErrorOf([&] { return glu(x); }).find("even size"), std::string::npos);
  const Tensor m = to(from_vector({3, 4, 0, 0}, {2, 2}), device);
  close(Vals(normalize(m)), {0.6, 0.8, 0, 0}, "normalize");
  const Tensor a = to(from_vector({1, 0, 1, 1}, {2, 2}), device);
  const Tensor b = to(from_vector({1, 1}, {1, 2}), device);
  close(Vals(cosine_similarity(a, b)), {1 / std::sqrt(2.0), 1}, "cosine_similarity");
  const Tensor bias = to(from_vector({1, 2}, {2}), device);
  close(Vals(addmm(bias, m, a, 0.5, 2)), {2 * 7 + 0.5, 2 * 4 + 1, 0.5, 1}, "addmm");
  EXPECT_NE(ErrorOf([&] {
              return addmm(to(zeros({3, 2, 2}), device), m, a);
            }).find("does not broadcast"),
            std::string::npos);
}
TEST(OpsSemantics, ActivationsAndNormsOnCpu) { ActivationsAndNorms(kCPU); }
TEST(OpsSemanticsCuda, ActivationsAndNorms) {
  KILN_SKIP_WITHOUT_GPU();
  ActivationsAndNorms(CUDA(0));
}

// einsum against the ops it stands for: matmul, batched attention scores, outer products,
// transposes, sums, the implicit output, the ellipsis, size-1 broadcasting, three operands, and
// its errors.
void EinsumIsTorchs(Device device) {
  Generator gen(5);
  const Tensor a = randn({3, 4}, gen, DType::kFloat32, device);
  const Tensor b = randn({4, 5}, gen, DType::kFloat32, device);
  const auto same = [](const Tensor& got, const Tensor& want, const char* what) {
    EXPECT_EQ(got.shape(), want.shape()) << what;
    ExpectClose(Vals(got), Vals(want), {1e-5, 1e-5}, what);
  };
  same(einsum("ij,jk->ik", {a, b}), matmul(a, b), "matmul");
  same(einsum("ij,jk", {a, b}), matmul(a, b), "implicit");
  same(einsum("ij->ji", {a}), transpose(a, 0, 1), "transpose");
  same(einsum("ba", {a}), transpose(a, 0, 1), "implicit order");
  same(einsum("ij->", {a}), sum(a), "sum");
  same(einsum("ij->j", {a}), sum(a, {0}), "column sums");
  const Tensor u = randn({3}, gen, DType::kFloat32, device);
  const Tensor v = randn({5}, gen, DType::kFloat32, device);
  same(einsum("i,j->ij", {u, v}), outer(u, v), "outer");
  same(einsum("i,i->", {u, u}), sum(u * u), "dot");
  const Tensor q = randn({2, 3, 6, 8}, gen, DType::kFloat32, device);
  const Tensor k = randn({2, 3, 7, 8}, gen, DType::kFloat32, device);
  same(einsum("bhid,bhjd->bhij", {q, k}), matmul(q, transpose(k, -2, -1)), "scores");
  same(einsum("...id,...jd->...ij", {q, k}), matmul(q, transpose(k, -2, -1)), "ellipsis");
  same(einsum("bhid->bdhi", {q}), permute(q, {0, 3, 1, 2}), "permute");
  const Tensor row = randn({1, 4}, gen, DType::kFloat32, device);
  same(einsum("ij,ij->ij", {a, row}), a * row, "size-1 broadcast");
  same(einsum("ij,jk,k->i", {a, b, v}), matmul(matmul(a, b), v), "three operands");
  EXPECT_NE(ErrorOf([&] {
              return einsum("ii->i", {to(ones({3, 3}), device)});
            }).find("diagonal"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              return einsum("ij,jk->ik", {a, a});
            }).find("sizes must agree"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { return einsum("ij->ik", {a}); }).find("no operand has"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { return einsum("ijk->i", {a}); }).find("rank 2"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { return einsum("ij,jk->ik", {a}); }).find("for 1 tensors"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { return einsum("i1->i", {u}); }).find("subscripts are letters"),
            std::string::npos);
}
TEST(OpsSemantics, EinsumIsTorchsOnCpu) { EinsumIsTorchs(kCPU); }
TEST(OpsSemanticsCuda, EinsumIsTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  EinsumIsTorchs(CUDA(0));
}

// argmin: the first smallest, a NaN's index, exact on int64's extremes, by dim with keepdim.
void ArgminIsTorchs(Device device) {
  const Tensor x = to(from_vector({3, -1, 2, -1, 5, NAN}, {2, 3}), device);
  EXPECT_EQ(AsInt64s(argmin(x, 1)), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(argmin(x, 0, true).shape(), (Shape{1, 3}));
  EXPECT_EQ(AsInt64s(argmin(x)), (std::vector<int64_t>{5}));
  const Tensor i = Int64s({INT64_MAX, INT64_MIN, 0, INT64_MIN}, device);
  EXPECT_EQ(AsInt64s(argmin(i)), (std::vector<int64_t>{1}));
  EXPECT_EQ(AsInt64s(argmin(to(from_vector({1, 0, 0}, {3}, DType::kBool), device))),
            (std::vector<int64_t>{1}));
  EXPECT_NE(ErrorOf([&] { return argmin(to(zeros({0}), device), 0); }).find("argmin: "),
            std::string::npos);
}
TEST(OpsSemantics, ArgminIsTorchsOnCpu) { ArgminIsTorchs(kCPU); }
TEST(OpsSemanticsCuda, ArgminIsTorchs) {
  KILN_SKIP_WITHOUT_GPU();
  ArgminIsTorchs(CUDA(0));
}

TEST(OpsSemantics, SplitAndChunkAreViews) {
  const Tensor x = reshape(arange(12, DType::kFloat32), {2, 6});
  const std::vector<Tensor> parts = split(x, 4, 1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].shape(), (Shape{2, 2}));
  EXPECT_TRUE(parts[1].shares_storage(x));
  EXPECT_EQ(Vals(parts[1]), (std::vector<double>{4, 5, 10, 11}));
  // torch.chunk: ceil(6 / 4) = 2 per chunk, so 3 chunks; 5 into 3 gives 2, 2, 1.
  EXPECT_EQ(chunk(x, 4, 1).size(), 3u);
  const std::vector<Tensor> c = chunk(arange(5), 3);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[2].numel(), 1);
  const std::vector<Tensor> s = split_with_sizes(x, {1, 1}, 0);
  EXPECT_EQ(Vals(s[1]), (std::vector<double>{6, 7, 8, 9, 10, 11}));
  masked_fill_(s[0], ones({6}, DType::kBool), -1);  // writes through to x
  EXPECT_EQ(Vals(x)[0], -1);
}

TEST(OpsSemantics, CatAndStack) {
  const Tensor a = ones({2, 3}, DType::kInt32), b = zeros({1, 3});
  const Tensor c = cat({a, b, zeros({0})});  // promotes; the legacy [0] tensor is skipped
  EXPECT_EQ(c.dtype(), DType::kFloat32);
  EXPECT_EQ(c.shape(), (Shape{3, 3}));
  EXPECT_EQ(stack({a, a}, -1).shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(stack({arange(3), arange(3)}).shape(), (Shape{2, 3}));
}

TEST(OpsSemantics, MaxWithIndices) {
  const Tensor x = from_vector({1, 7, 7, 2, 0, -3}, {2, 3});
  const ValuesIndices m = max_with_indices(x, 1);
  EXPECT_EQ(Vals(m.values), (std::vector<double>{7, 2}));
  EXPECT_EQ(AsInt64s(m.indices), (std::vector<int64_t>{1, 0}));  // the first of the tied 7s
  const ValuesIndices k = max_with_indices(x, 0, /*keepdim=*/true);
  EXPECT_EQ(k.indices.shape(), (Shape{1, 3}));
  EXPECT_EQ(AsInt64s(k.indices), (std::vector<int64_t>{1, 0, 0}));
}

void ItemReadsOneElement(Device device) {
  EXPECT_EQ(item(to(full({}, 2.5, DType::kBFloat16), device)), 2.5);
  EXPECT_EQ(item<int32_t>(to(full({1, 1}, -7, DType::kInt32), device)), -7);
  EXPECT_EQ(item<bool>(to(ones({1}, DType::kBool), device)), true);
  EXPECT_EQ(item<float>(slice(to(arange(3, DType::kFloat32), device) * 0.5, 0, 1, 2)), 0.5f);
  // As libtorch's item<T>(): toward zero, and a value outside T's range is an error.
  EXPECT_EQ(item<int64_t>(to(full({}, -2.7), device)), -2);
  EXPECT_EQ(item<int32_t>(to(full({}, -2147483648.0, DType::kInt64), device)),
            std::numeric_limits<int32_t>::min());
  for (const auto& [value, dtype] : {std::pair<double, DType>{3e9, DType::kInt64},
                                     {3e9, DType::kFloat32},
                                     {-2147483649.0, DType::kInt64}}) {
    EXPECT_THROW(item<int32_t>(to(full({}, value, dtype), device)), Error) << value;
  }
  for (double big : {1e30, -1e30, 9223372036854775808.0}) {
    try {
      item<int64_t>(to(full({}, big), device));
      ADD_FAILURE() << big << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("int64 without overflow"), std::string::npos)
          << e.what();
    }
  }
}
TEST(OpsSemantics, ItemOnCpu) { ItemReadsOneElement(kCPU); }
TEST(OpsSemanticsCuda, Item) {
  KILN_SKIP_WITHOUT_GPU();
  ItemReadsOneElement(CUDA(0));
}

// The CUDA kernels report a bad index as the CPU kernel does (code, op, index, position), leave
// the output untouched by out-of-bounds reads, and leave the device usable.
TEST(OpsSemanticsCuda, OutOfRangeIndicesAreErrors) {
  KILN_SKIP_WITHOUT_GPU();
  const Tensor w = ones({5, 4});
  const Tensor bad = from_vector({1, 5, 2, -1}, {2, 2}, DType::kInt64);
  std::string cpu_message;
  try {
    embedding(bad, w);
  } catch (const Error& e) {
    cpu_message = e.what();
  }
  ASSERT_FALSE(cpu_message.empty());
  try {
    embedding(to(bad, CUDA(0)), to(w, CUDA(0)));
    FAIL() << "no error for an out-of-range index on CUDA";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ(std::string(e.what()), absl::StrReplaceAll(cpu_message, {{"on cpu", "on cuda:0"}}));
  }
  for (DType t : {DType::kInt64, DType::kInt32}) {
    const Tensor idx = to(from_vector({0, 3}, {2}, t), CUDA(0));
    EXPECT_THROW(index_select(to(w, CUDA(0)), 1, idx + 1), Error);
    EXPECT_THROW(gather(to(w, CUDA(0)), 0, reshape(idx * 2, {1, 2})), Error);
  }
  // The device still works and a good call gives the right rows.
  const Tensor good = embedding(to(from_vector({4, 0}, {2}, DType::kInt64), CUDA(0)),
                                to(reshape(arange(20, DType::kFloat32), {5, 4}), CUDA(0)));
  EXPECT_EQ(Vals(good), (std::vector<double>{16, 17, 18, 19, 0, 1, 2, 3}));
}

// index_copy_: the rows land where the index says (any dim, strided source, int32 index), a bad
// index is an error naming it and leaves self as it was, and a source that is a view of self is
// read before it is overwritten.
void IndexCopyInPlace(Device device) {
  const Tensor base = to(reshape(arange(24, DType::kFloat32), {2, 3, 4}), device);
  Tensor x = clone(base);
  const Tensor src = to(reshape(arange(6, DType::kFloat32), {3, 2}) * -1.0, device);
  index_copy_(x, 2, to(from_vector({3, 0}, {2}, DType::kInt32), device),
              expand(unsqueeze(src, 0), {2, 3, 2}));
  std::vector<double> want = Vals(base);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t r = 0; r < 3; ++r) {
      want[b * 12 + r * 4 + 3] = -(r * 2.0);
      want[b * 12 + r * 4 + 0] = -(r * 2.0 + 1);
    }
  }
  EXPECT_EQ(Vals(x), want);
  const std::vector<double> before = Vals(x);
  try {
    index_copy_(x, 1, to(from_vector({1, 3}, {2}, DType::kInt64), device),
                to(zeros({2, 2, 4}), device));
    FAIL() << "no error for index 3 of a dim of size 3";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), absl::StatusCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("index_copy: index 3 is out of range for dim 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(Vals(x), before) << "a failed index_copy_ changed self";
  // Source = a view of self: rows 0 and 1 swap.
  Tensor y = clone(base);
  index_copy_(y, 1, to(from_vector({1, 0}, {2}, DType::kInt64), device), slice(y, 1, 0, 2));
  EXPECT_EQ(Vals(slice(y, 1, 0, 1)), Vals(slice(base, 1, 1, 2)));
  EXPECT_EQ(Vals(slice(y, 1, 1, 2)), Vals(slice(base, 1, 0, 1)));
  // An empty source writes nothing and reads no index, on either device.
  EXPECT_EQ(index_copy(to(zeros({3, 0}), device), 0,
                       to(from_vector({5}, {1}, DType::kInt64), device), to(zeros({1, 0}), device))
                .shape(),
            (Shape{3, 0}));
  // Out of place leaves self alone.
  const Tensor z = index_copy(base, 0, to(from_vector({1}, {}, DType::kInt64), device),
                              to(zeros({1, 3, 4}), device));
  EXPECT_EQ(Vals(slice(z, 0, 1, 2)), std::vector<double>(12, 0.0));
  EXPECT_EQ(Vals(base), Vals(reshape(arange(24, DType::kFloat32), {2, 3, 4})));
}
TEST(OpsSemantics, IndexCopyInPlaceOnCpu) { IndexCopyInPlace(kCPU); }
TEST(OpsSemanticsCuda, IndexCopyInPlace) {
  KILN_SKIP_WITHOUT_GPU();
  IndexCopyInPlace(CUDA(0));
}

// A compiled function (and its CUDA-graph replays) reports an index out of range as an error
// after the call, once per call, instead of returning rows of zeros.
// Whole rows moved by one index value (embedding, index_select, index_copy_, cat) go as 16-, 8- or
// 4-byte words on CUDA where sizes, strides and pointers allow, else element by element: the
// same values as the CPU for rows of 16, 8, 12 and 6 bytes, weights that are strided or start
// off a 16-byte boundary, and int32 indices.
TEST(OpsSemanticsCuda, RowsMoveAsWideWordsWhereAligned) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(17);
  for (DType t : {DType::kBFloat16, DType::kFloat32}) {
    for (int64_t d : {8, 4, 6, 3}) {
      for (int64_t skip : {0, 1}) {  // a slice starting `skip` elements into its storage
        const std::string what = absl::StrCat(DTypeName(t), " rows of ", d, ", offset ", skip);
        const Tensor big = cast(randn({7, d + 2}, gen), t);
        const Tensor w = slice(
            reshape(slice(reshape(big, {7 * (d + 2)}), 0, skip, skip + 6 * (d + 2)), {6, d + 2}), 1,
            0, d);  // [6, d], row stride d + 2
        const Tensor idx = from_vector({5, 0, 3, 3, 1}, {5}, DType::kInt32);
        const Tensor wg = to(w, CUDA(0)), ig = to(idx, CUDA(0));
        EXPECT_EQ(Vals(embedding(ig, wg)), Vals(embedding(idx, w))) << what;
        EXPECT_EQ(Vals(index_select(wg, 0, ig)), Vals(index_select(w, 0, idx))) << what;
        EXPECT_EQ(Vals(cat({wg, wg}, 0)), Vals(cat({w, w}, 0))) << what;
        EXPECT_EQ(Vals(cat({wg, wg}, 1)), Vals(cat({w, w}, 1))) << what;
        Tensor cache = zeros({2, 9, d}, t), cache_g = to(cache, CUDA(0));
        const Tensor rows = from_vector({8, 2}, {2}, DType::kInt64);
        const Tensor src = reshape(slice(w, 0, 0, 4), {2, 2, d});
        index_copy_(cache, 1, rows, src);
        index_copy_(cache_g, 1, to(rows, CUDA(0)), to(src, CUDA(0)));
        EXPECT_EQ(Vals(cache_g), Vals(cache)) << what;
      }
    }
  }
}

TEST(OpsSemanticsCuda, CompiledIndexErrorsAreReported) {
  KILN_SKIP_WITHOUT_GPU();
  const Tensor w = to(reshape(arange(20, DType::kFloat32), {5, 4}), CUDA(0));
  const auto fn = [w](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{embedding(in[0], w) * 2.0};
  };
  for (const bool graphs : {false, true}) {
    CompileOptions o;
    o.mode = CompileOptions::Mode::kCompiled;
    o.cuda_graphs = graphs;
    Tensor ids = to(from_vector({1, 4}, {2}, DType::kInt64), CUDA(0));
    CompiledFn f = compile(fn, {ids}, o);
    for (int call = 0; call < 3; ++call) {  // run, capture, replay
      ids = to(from_vector({1, 4}, {2}, DType::kInt64), CUDA(0));
      EXPECT_EQ(Vals(f({ids})[0]), (std::vector<double>{8, 10, 12, 14, 32, 34, 36, 38}));
    }
    Tensor bad = to(from_vector({1, 9}, {2}, DType::kInt64), CUDA(0));
    for (int call = 0; call < 3; ++call) {
      copy_(ids, bad);  // same address: the graph replays
      try {
        f({ids});
        FAIL() << "graphs=" << graphs << " call " << call << ": no error for index 9";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), absl::StatusCode::kOutOfRange) << e.what();
      }
    }
    copy_(ids, to(from_vector({0, 2}, {2}, DType::kInt64), CUDA(0)));
    EXPECT_EQ(Vals(f({ids})[0]), (std::vector<double>{0, 2, 4, 6, 16, 18, 20, 22}))
        << "graphs=" << graphs << ": the flag was not cleared";
  }
}

// Comparisons, clamp, pow, minimum and where fuse into elementwise kernels, equal to eager.
void ElementwiseRowsFuse(Device device) {
  const auto fn = [](const std::vector<Tensor>& in) {
    const Tensor& x = in[0];
    return std::vector<Tensor>{clamp(where(x > in[1], x, pow(x, 2.0)), -0.5, 0.5),
                               cast(minimum(abs(x), in[1]) <= 0.25, DType::kFloat32)};
  };
  Generator gen(3);
  const std::vector<Tensor> in = {randn({16, 32}, gen, DType::kFloat32, device),
                                  randn({32}, gen, DType::kFloat32, device)};
  CompiledFn f = compile(fn, in);
  // One kernel per output at most (one for both where the fusion emits several outputs).
  EXPECT_LE(f.report(in).kernels_per_step, 2) << f.report(in).final_graph;
  const std::vector<Tensor> got = f(in), want = fn(in);
  for (int i = 0; i < 2; ++i) ExpectClose(Vals(got[i]), Vals(want[i]), {1e-6, 1e-6}, "fused");
}
TEST(OpsSemantics, ElementwiseRowsFuseOnCpu) { ElementwiseRowsFuse(kCPU); }

// The fused CUDA sources of the rows above (scalars as literals, operands as subexpressions)
// compile with NVRTC; no GPU needed. The PTX is read back from the compile dump (an interface
// that outlives changes of the code generator).
TEST(OpsSemantics, FusedSourcesCompileWithNvrtc) {
  KILN_SKIP_WITHOUT_NVRTC();
  const auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{
        clamp(where(in[0] > in[1], pow(in[0], in[1]), pow(abs(in[0]), 2.5)), -0.5, 0.5),
        cast(maximum(in[0], in[1]) != 3.0, DType::kFloat32)};
  };
  Generator gen(4);
  const std::vector<Tensor> in = {randn({4, 8}, gen), rand({8}, gen)};
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("kiln_ops_semantics_", getpid());
  CompileOptions options;
  options.dump_dir = dir.string();
  CompiledFn f = compile(fn, in, options);
  ExpectClose(Vals(f(in)[0]), Vals(fn(in)[0]), {1e-6, 1e-6}, "compiled");
  int compiled = 0;  // the dump holds each kernel's PTX, or NVRTC's log where it failed
  const std::filesystem::path kernels = std::filesystem::path(f.report(in).dump_dir) / "kernels";
  for (const auto& entry : std::filesystem::directory_iterator(kernels)) {
    if (entry.path().extension() != ".ptx") continue;
    std::ifstream file(entry.path());
    const std::string ptx((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    EXPECT_NE(ptx.find(".entry"), std::string::npos) << entry.path() << ":\n" << ptx;
    ++compiled;
  }
  std::filesystem::remove_all(dir);
  EXPECT_GE(compiled, 1) << f.report(in).final_graph;
}

TEST(OpsSemanticsCuda, ElementwiseRowsFuse) {
  KILN_SKIP_WITHOUT_GPU();
  ElementwiseRowsFuse(CUDA(0));
}

// topk's attributes print and parse back, and CSE keeps two topk calls with different k apart.
TEST(OpsSemantics, TopKAttributesInTheIr) {
  const auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{topk(in[0], 2, -1, false).indices, topk(in[0], 3).indices,
                               argmax(in[0], 0, true), cat({in[0], in[0]}, 1)};
  };
  const std::vector<Tensor> in = {from_vector({4, 1, 3, 2, 9, 0}, {2, 3})};
  CompiledFn f = compile(fn, in);
  const std::string text = f.report(in).final_graph;
  EXPECT_NE(text.find("{dim=-1, k=2, largest=false}"), std::string::npos) << text;
  EXPECT_NE(text.find("{dim=-1, k=3, largest=true}"), std::string::npos) << text;
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(text);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(ir::PrintGraph(*g), text);
  const std::vector<Tensor> got = f(in), want = fn(in);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(Vals(got[i]), Vals(want[i])) << i;
}

TEST(OpsSemantics, ItemOfATracedValueIsAnError) {
  const auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0] * item(sum(in[0]))};
  };
  try {
    compile(fn, {ones({2})});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("item:"), std::string::npos) << e.what();
  }
}

// The kernel-IR renderer computes integer instructions in long long: every elementwise row that
// takes integers must compile with long long operands (and a float scalar) too, and with float.
// Compiled with NVRTC with the kernels' prelude; no GPU needed. (What pow's expression computes
// there: IntegerPowersAreTorchs, above.)
TEST(OpsSemantics, IntegerCapableExpressionsCompileWithLongLongAndFloatOperands) {
  KILN_SKIP_WITHOUT_NVRTC();
  for (const std::string type : {"long long", "float"}) {
    std::string body;
    int rows = 0;
    for (OpId id :
         {OpId::kAbs,       OpId::kPowScalar, OpId::kClampMin,   OpId::kClampMax, OpId::kEqScalar,
          OpId::kLtScalar,  OpId::kPow,       OpId::kMinimum,    OpId::kMaximum,  OpId::kEq,
          OpId::kNe,        OpId::kLt,        OpId::kLe,         OpId::kGt,       OpId::kGe,
          OpId::kFloor,     OpId::kCeil,      OpId::kRound,      OpId::kTrunc,    OpId::kSign,
          OpId::kRemainder, OpId::kFmod,      OpId::kFloorDivide}) {
      const std::string expr = absl::StrReplaceAll(
          std::string(GetOpDef(id).cuda_expr), {{"$0", "a0"}, {"$1", "a1"}, {"$scalar", "scalar"}});
      absl::StrAppend(&body, "  out[", rows++, "] = (", type, ")(", expr, ");\n");
    }
    const std::string src = absl::StrCat(
        cuda_ops::KernelPrelude(), "extern \"C\" __global__ void k(", type, "* out, const ", type,
        "* in, float scalar) {\n", "  const ", type, " a0 = in[0], a1 = in[1];\n", body, "}\n");
    absl::StatusOr<std::string> ptx = cuda::CompileSource(src, "typed_rows", "compute_90", false);
    EXPECT_TRUE(ptx.ok()) << type << ": " << ptx.status().message() << "\n" << src;
  }
}

// The kernels keep no state between calls (the CUDA index flag is per launch): the same calls
// from several threads give the single-threaded answers.
void ThreadsAgree(Device device) {
  Generator gen(21);
  const Tensor w = randn({50, 16}, gen, DType::kFloat32, device);
  const Tensor ids = to(from_vector({3, 49, 0, 7, 7, 12}, {2, 3}, DType::kInt64), device);
  const auto work = [&] {
    std::vector<double> out = Vals(embedding(ids, w));
    for (double v : Vals(topk(w, 5, 0).indices)) out.push_back(v);
    for (double v : Vals(argmax(w, 1))) out.push_back(v);
    for (double v : Vals(cat({w, w * 2.0}, 1) > 0.5)) out.push_back(v);
    return out;
  };
  const std::vector<double> want = work();
  std::vector<std::vector<double>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) got[t] = work();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}
TEST(OpsSemantics, ThreadsAgreeOnCpu) { ThreadsAgree(kCPU); }
TEST(OpsSemanticsCuda, ThreadsAgree) {
  KILN_SKIP_WITHOUT_GPU();
  ThreadsAgree(CUDA(0));
}

}  // namespace
}  // namespace kiln
