// torch's semantics where kiln was silently wrong (issue #13), on the CPU and (same code, skipped
// without a GPU) on CUDA:
//   - integer ops compute exactly in integers with two's-complement wrap-around (int64 above
//     2^53, int32 * 3e9, int64 sums), copies and masks keep int64 values;
//   - in-place ops raise for self that overlaps itself or partially overlaps an input, and follow
//     torch's casting rule (add_(bool, 1.0) raises);
//   - max/amax over an empty dim raises (no identity);
//   - softmax with +inf gives [nan, 0, ...] like torch;
//   - layer_norm / rms_norm with a bfloat16 input and float32 parameters follow torch 2.11;
//   - arange infers its dtype, zero-dim tensors do not promote within their category, fill
//     values beyond a floating dtype's range raise, logsumexp over an empty dim is -inf.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/compile.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "ops/tensor_parallel.h"
#include "runtime/status.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;

int64_t Wrap(uint64_t v) { return static_cast<int64_t>(v); }

class Semantics : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().is_cuda()) KILN_SKIP_WITHOUT_GPU();
  }
  Device dev() const { return GetParam(); }

  // A tensor holding exactly `values` (no trip through double).
  Tensor IntTensor(const Ints& values, DType dtype = DType::kInt64, Shape shape = {}) {
    if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
    Tensor host = empty(shape, dtype);
    const IntStoreFn store = IntStorerFor(dtype);
    for (size_t i = 0; i < values.size(); ++i) store(host.data_ptr(), i, values[i]);
    return to(host, dev());
  }
  Tensor Floats(const std::vector<double>& values, DType dtype = DType::kFloat32) {
    return from_vector(values, {static_cast<int64_t>(values.size())}, dtype, dev());
  }
};

// The exact values of a tensor of any integer dtype, row-major.
Ints ReadInts(const Tensor& t) {
  const Tensor host = contiguous(to(t, kCPU));
  Ints out(host.numel());
  const IntLoadFn load = IntLoaderFor(host.dtype());
  for (size_t i = 0; i < out.size(); ++i) out[i] = load(host.data_ptr(), i);
  return out;
}

void ExpectError(const std::function<void()>& call, const std::vector<std::string>& words,
                 const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << ": no error was raised";
  } catch (const Error& e) {
    for (const std::string& w : words) {
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << what << ": message does not mention '" << w << "': " << e.what();
    }
  }
}

std::string DeviceName(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cuda() ? "Cuda" : "Cpu";
}

// ---- Integers. -----------------------------------------------------------------------------

constexpr int64_t k53 = int64_t{1} << 53;

TEST_P(Semantics, Int64ArithmeticIsExactAndWraps) {
  const Tensor x = IntTensor({k53 + 1, INT64_MAX - 1, INT64_MAX, INT64_MIN, -7});
  EXPECT_EQ(ReadInts(x + 1), (Ints{k53 + 2, INT64_MAX, INT64_MIN, INT64_MIN + 1, -6}));
  EXPECT_EQ(ReadInts(x + IntTensor({1})), (Ints{k53 + 2, INT64_MAX, INT64_MIN, INT64_MIN + 1, -6}));
  EXPECT_EQ(ReadInts(x - 1), (Ints{k53, INT64_MAX - 2, INT64_MAX - 1, INT64_MAX, -8}));
  EXPECT_EQ(ReadInts(3 - x),
            (Ints{3 - k53 - 1, Wrap(3 - uint64_t(INT64_MAX - 1)), Wrap(3 - uint64_t(INT64_MAX)),
                  Wrap(3 - uint64_t(INT64_MIN)), 10}));
  EXPECT_EQ(ReadInts(x * 2), (Ints{2 * k53 + 2, -4, -2, 0, -14}));
  EXPECT_EQ(ReadInts(x * x), (Ints{Wrap(uint64_t(k53 + 1) * uint64_t(k53 + 1)), 4, 1, 0, 49}));
  EXPECT_EQ(ReadInts(neg(x)), (Ints{-k53 - 1, -(INT64_MAX - 1), -INT64_MAX, INT64_MIN, 7}));
  EXPECT_EQ(ReadInts(relu(x)), (Ints{k53 + 1, INT64_MAX - 1, INT64_MAX, 0, 0}));
  EXPECT_EQ((x + 1).dtype(), DType::kInt64);
  EXPECT_EQ((x + 1.0).dtype(), DType::kFloat32);  // a floating scalar makes it float, as torch
  EXPECT_EQ((x + 0.5).dtype(), DType::kFloat32);
}

TEST_P(Semantics, Int32WrapsLikeTorch) {
  Tensor x = IntTensor({3, -7, 100000, INT32_MAX}, DType::kInt32);
  mul_(x, int64_t{3000000000});  // torch: x.mul_(3000000000) wraps in int32
  Ints want;
  for (int64_t v : {3, -7, 100000, INT32_MAX}) {
    want.push_back(static_cast<int32_t>(static_cast<uint32_t>(uint64_t(v) * 3000000000ull)));
  }
  EXPECT_EQ(ReadInts(x), want);
  EXPECT_EQ(x.dtype(), DType::kInt32);
  const Tensor m = IntTensor({INT32_MAX, INT32_MIN}, DType::kInt32);
  EXPECT_EQ(ReadInts(m + IntTensor({1, -1}, DType::kInt32)), (Ints{INT32_MIN, INT32_MAX}));
  EXPECT_EQ(ReadInts(m + IntTensor({1, -1})),
            (Ints{int64_t{INT32_MAX} + 1, int64_t{INT32_MIN} - 1}));
  Tensor y = IntTensor({INT32_MAX}, DType::kInt32);
  add_(y, IntTensor({int64_t{1} << 40}));  // int64 result written into int32: low 32 bits
  EXPECT_EQ(ReadInts(y), (Ints{INT32_MAX}));
}

TEST_P(Semantics, IntegerSumsAndMaxAreExact) {
  const Tensor x = IntTensor({k53 + 1, 1, -3}, DType::kInt64);
  EXPECT_EQ(ReadInts(sum(x)), (Ints{k53 - 1}));
  EXPECT_EQ(ReadInts(max(x)), (Ints{k53 + 1}));
  const Tensor big = IntTensor({int64_t{1} << 62, int64_t{1} << 62, 1});
  EXPECT_EQ(ReadInts(sum(big)), (Ints{INT64_MIN + 1}));  // wraps like torch
  const Tensor m = IntTensor({k53 + 1, k53, 5, k53 + 3, -1, 0}, DType::kInt64, {2, 3});
  EXPECT_EQ(ReadInts(sum(m, {1})), (Ints{2 * k53 + 6, k53 + 2}));
  EXPECT_EQ(ReadInts(max(m, {0})), (Ints{k53 + 3, k53, 5}));
  const Tensor i32 = IntTensor({INT32_MAX, INT32_MAX, -5}, DType::kInt32);
  EXPECT_EQ(sum(i32).dtype(), DType::kInt64);
  EXPECT_EQ(ReadInts(sum(i32)), (Ints{2 * int64_t{INT32_MAX} - 5}));
  EXPECT_EQ(ReadInts(max(i32)), (Ints{INT32_MAX}));
  EXPECT_EQ(max(i32).dtype(), DType::kInt32);
  const Tensor b = IntTensor({0, 1, 1}, DType::kBool);
  EXPECT_EQ(ReadInts(sum(b)), (Ints{2}));
  EXPECT_EQ(ReadInts(max(b)), (Ints{1}));
}

TEST_P(Semantics, CopiesCastsAndMasksKeepInt64Values) {
  const Tensor x = IntTensor({k53 + 1, -k53 - 3, INT64_MAX, INT64_MIN}, DType::kInt64, {2, 2});
  EXPECT_EQ(ReadInts(clone(x)), (Ints{k53 + 1, -k53 - 3, INT64_MAX, INT64_MIN}));
  EXPECT_EQ(ReadInts(contiguous(transpose(x, 0, 1))),
            (Ints{k53 + 1, INT64_MAX, -k53 - 3, INT64_MIN}));
  EXPECT_EQ(ReadInts(triu(x)), (Ints{k53 + 1, -k53 - 3, 0, INT64_MIN}));
  EXPECT_EQ(ReadInts(tril(x)), (Ints{k53 + 1, 0, INT64_MAX, INT64_MIN}));
  EXPECT_EQ(ReadInts(cast(x, DType::kInt32)),
            (Ints{1, static_cast<int32_t>(uint32_t(uint64_t(-k53 - 3))), -1, 0}));
  EXPECT_EQ(ReadInts(cast(x, DType::kBool)), (Ints{1, 1, 1, 1}));
  const Tensor mask = IntTensor({1, 0, 0, 1}, DType::kBool, {2, 2});
  EXPECT_EQ(ReadInts(where(mask, x, IntTensor({7}))), (Ints{k53 + 1, 7, 7, INT64_MIN}));
  EXPECT_EQ(ReadInts(masked_fill(x, mask, 0x1p60)),
            (Ints{int64_t{1} << 60, -k53 - 3, INT64_MAX, int64_t{1} << 60}));
  Tensor y = clone(x);
  masked_fill_(y, mask, -5);
  EXPECT_EQ(ReadInts(y), (Ints{-5, -k53 - 3, INT64_MAX, -5}));
  // bool arithmetic: bool + bool stays bool (True), bool * 3 is int64.
  const Tensor b = IntTensor({1, 0}, DType::kBool);
  EXPECT_EQ((b + b).dtype(), DType::kBool);
  EXPECT_EQ(ReadInts(b + b), (Ints{1, 0}));
  EXPECT_EQ((b * 3).dtype(), DType::kInt64);
  EXPECT_EQ(ReadInts(b * 3), (Ints{3, 0}));
  EXPECT_EQ((b * 3.0).dtype(), DType::kFloat32);
}

TEST_P(Semantics, IntegerScalarsThatDoNotFitRaise) {
  const Tensor x = IntTensor({1, 2});
  // A floating scalar, or an unsigned one past int64, computes in float32 (as torch): no overflow.
  EXPECT_EQ(add(x, 1e19).dtype(), DType::kFloat32);
  EXPECT_EQ(add(x, uint64_t{1} << 63).dtype(), DType::kFloat32);
  ExpectError([&] { clamp_min(IntTensor({1}, DType::kInt32), int64_t{1} << 40); },
              {"clamp_min:", "int32", "overflow"}, "clamp int32 at 2^40");
  const Tensor mask = IntTensor({1, 0}, DType::kBool);
  ExpectError(
      [&] {
        masked_fill(IntTensor({1, 2}, DType::kInt32), mask, 3e9);
      },
      {"masked_fill:", "int32", "overflow"}, "masked_fill int32");
  ExpectError([&] { masked_fill(x, mask, NAN); }, {"masked_fill:", "overflow"}, "masked_fill nan");
  EXPECT_EQ(ReadInts(x + INT64_MIN), (Ints{INT64_MIN + 1, INT64_MIN + 2}));
}

// ---- In-place rules. ------------------------------------------------------------------------

TEST_P(Semantics, InPlaceCastingFollowsTorch) {
  ExpectError(
      [&] {
        add_(IntTensor({1, 0}, DType::kBool), 1);
      },
      {"add_scalar:", "in-place", "int64", "bool"}, "add_(bool, 1)");
  ExpectError(
      [&] {
        add_(IntTensor({1, 0}, DType::kBool), 1.0);
      },
      {"add_scalar:", "in-place", "float32", "bool"}, "add_(bool, 1.0)");
  ExpectError(
      [&] {
        mul_(IntTensor({1, 0}, DType::kBool), IntTensor({2, 2}));
      },
      {"mul:", "bool"}, "mul_(bool, int64)");
  ExpectError([&] { add_(IntTensor({1}), 1.5); }, {"float32", "int64"}, "add_(int64, 1.5)");
  ExpectError([&] { add_(IntTensor({1}, DType::kInt32), Floats({1})); }, {"float32", "int32"},
              "float into int");
  Tensor b = IntTensor({1, 0}, DType::kBool);
  masked_fill_(b, IntTensor({0, 1}, DType::kBool), 1);  // bool into bool: fine
  EXPECT_EQ(ReadInts(b), (Ints{1, 1}));
  Tensor h = Floats({1, 2}, DType::kBFloat16);
  add_(h, Floats({0.5, 0.25}));  // float32 result into bfloat16 self: castable
  EXPECT_EQ(to_vector(h), (std::vector<double>{1.5, 2.25}));
}

TEST_P(Semantics, InPlaceOverlapRaisesLikeTorch) {
  Generator gen(3);
  const Tensor x = to(randn({4, 4}, gen), dev());
  ExpectError([&] { add_(x, transpose(x, 0, 1)); }, {"add:", "in-place", "same memory"},
              "add_(x, x.T)");
  const Tensor flat = to(randn({9}, gen), dev());
  ExpectError([&] { add_(slice(flat, 0, 1, 9), slice(flat, 0, 0, 8)); }, {"same memory"},
              "shifted slices");
  ExpectError([&] { add_(x, slice(x, 0, 0, 1)); }, {"same memory"}, "a row of self broadcast");
  ExpectError([&] { mul_(expand(slice(x, 0, 0, 1), {4, 4}), 2.0); }, {"expanded"}, "expanded self");
  ExpectError(
      [&] {
        add_(flat.as_strided({3, 3}, {1, 1}, 0), 1.0);
      },
      {"overlapping"}, "self overlapping itself");
  // Full overlap is fine (torch too): every element reads what it then writes.
  Tensor y = clone(x);
  const std::vector<double> before = to_vector(y);
  add_(y, y);
  mul_(y, y);
  std::vector<double> want;
  for (double v : before) want.push_back((2 * v) * (2 * v));
  ExpectClose(to_vector(y), want, ToleranceFor(DType::kFloat32), "add_(y, y); mul_(y, y)");
}

TEST_P(Semantics, InPlaceOverlapTooHardToClassifyReadsACopy) {
  // x[0::2] += x[2::2]: strided views with intersecting ranges (torch cannot classify them);
  // kiln reads the input before writing, so each element gets the original neighbour.
  Generator gen(4);
  Tensor flat = to(randn({10}, gen), dev());
  const std::vector<double> v = to_vector(flat);
  add_(slice(flat, 0, 0, 8, 2), slice(flat, 0, 2, 10, 2));
  std::vector<double> want = v;
  for (int i = 0; i < 8; i += 2) want[i] = static_cast<float>(v[i] + v[i + 2]);
  ExpectClose(to_vector(flat), want, ToleranceFor(DType::kFloat32), "x[0::2] += x[2::2]");
}

TEST_P(Semantics, OutCallsReadInputsThatShareOutsMemoryBeforeWritingIt) {
  // The internal out= path (the compiled plan's steps) writes into a given tensor; when an input
  // is that tensor or a view of its memory, the result is computed apart and then copied.
  Generator gen(5);
  const Tensor a = to(randn({8, 8}, gen), dev());
  const Tensor b = to(randn({8, 8}, gen), dev());
  const std::vector<double> want_mm = to_vector(matmul(a, b));
  Tensor x = clone(a);
  DispatchOut(OpId::kMatmul, {x, b}, {}, x);  // x = x @ b: every output reads a whole row
  ExpectClose(to_vector(x), want_mm, ToleranceFor(DType::kFloat32), "matmul out= its input");
  Tensor flat = to(randn({9}, gen), dev());
  const std::vector<double> v = to_vector(flat);
  DispatchOut(OpId::kAdd, {slice(flat, 0, 0, 8), slice(flat, 0, 0, 8)}, {}, slice(flat, 0, 1, 9));
  std::vector<double> want = v;
  for (int i = 0; i < 8; ++i) want[i + 1] = static_cast<float>(v[i] + v[i]);
  ExpectClose(to_vector(flat), want, ToleranceFor(DType::kFloat32), "add out= a shifted slice");
  ExpectError(
      [&] {
        DispatchOut(OpId::kNeg, {a}, {}, expand(slice(x, 0, 0, 1), {8, 8}));
      },
      {"neg:", "out=", "overlapping"}, "expanded out=");
}

TEST_P(Semantics, ArgmaxOfLongRowsPicksTheFirstMaximum) {
  // Rows long enough for the CUDA paths of few long rows (on sm_90 a cluster of CTAs per row,
  // each over an eighth of it, meeting in rank 0's shared memory; before it many blocks per row
  // meeting in an atomicMax): the maximum is found wherever it is, the lowest index wins a tie
  // (within a CTA's share, across shares, at a share's edge), NaN beats everything.
  const int64_t n = 50257, share = (n + 7) / 8;
  for (DType t :
       {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kInt32, DType::kInt64}) {
    std::vector<double> v(4 * n);
    for (int64_t i = 0; i < 4 * n; ++i) v[i] = static_cast<double>((i * 7919) % 1000) / 10;
    v[0 * n + 50000] = 200, v[0 * n + 50001] = 200;      // tie: 50000
    v[1 * n + 3] = 300, v[1 * n + 40000] = 300;          // tie across blocks: 3
    v[2 * n + n - 1] = 250;                              // the last element
    v[3 * n + share] = 260, v[3 * n + share - 1] = 260;  // tie at a share's edge
    const bool floating = IsFloatingPoint(t);
    if (floating) v[2 * n + 17] = NAN;  // NaN is the maximum (torch)
    const Tensor x = from_vector(v, {4, n}, t, dev());
    const int64_t last = floating ? 17 : n - 1;
    EXPECT_EQ(ReadInts(argmax(x, 1)), (Ints{50000, 3, last, share - 1})) << DTypeName(t);
    EXPECT_EQ(ReadInts(argmax(slice(x, 0, 1, 2))), (Ints{3})) << DTypeName(t);  // flattened
  }
}

TEST_P(Semantics, FullFillsEveryElementOfEveryDtype) {
  // full stores the value once and doubles the filled bytes: every element, odd counts too.
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kInt64, DType::kInt32,
                  DType::kBool}) {
    const double v = t == DType::kBool ? 1 : (IsFloatingPoint(t) ? -2.5 : -7);
    for (int64_t n : {0, 1, 2, 3, 1000, 4097}) {
      const std::vector<double> got = to_vector(full({n}, v, t, dev()));
      ASSERT_EQ(got.size(), static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[i], v) << DTypeName(t) << " n=" << n << " " << i;
    }
  }
  ExpectError([&] { full({4}, 3e9, DType::kInt32, dev()); }, {"full:", "int32", "overflow"},
              "full int32 3e9");
  EXPECT_EQ(ReadInts(zeros({2, 3}, DType::kInt64, dev())), (Ints{0, 0, 0, 0, 0, 0}));
}

// ---- Reductions without identity. -----------------------------------------------------------

TEST_P(Semantics, MaxOfAnEmptyDimRaises) {
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kInt64, DType::kInt32}) {
    ExpectError([&] { max(empty({0}, t, dev())); }, {"max:", "size 0"}, "max of [0]");
    ExpectError([&] { max(empty({0, 3}, t, dev()), {0}); }, {"max:", "dim 0"}, "max over dim 0");
    ExpectError([&] { max(empty({3, 0}, t, dev()), {-1}, true); }, {"max:", "dim 1"}, "keepdim");
    EXPECT_EQ(max(empty({0, 3}, t, dev()), {1}).shape(), (Shape{0}));  // nothing reduced over 0
  }
  EXPECT_EQ(to_vector(sum(empty({0}, DType::kFloat32, dev()))), (std::vector<double>{0}));
  EXPECT_TRUE(std::isnan(to_vector(mean(empty({0}, DType::kFloat32, dev())))[0]));
  EXPECT_EQ(to_vector(max(Floats({-INFINITY}))), (std::vector<double>{-INFINITY}));
}

// torch refuses `a - b` of two bool tensors (use ^ or ne); a bool minus a number promotes.
TEST_P(Semantics, SubtractingTwoBoolsRaises) {
  const Tensor a = full({3}, 1, DType::kBool, dev()), b = full({3}, 0, DType::kBool, dev());
  ExpectError([&] { sub(a, b); }, {"sub:", "two bool tensors"}, "bool - bool");
  ExpectError([&] { a - b; }, {"sub:", "two bool tensors"}, "operator-");
  // torch refuses any difference with a bool operand, a scalar one too.
  ExpectError([&] { sub(a, 1); }, {"sub_scalar:", "bool tensor"}, "bool - 1");
  ExpectError([&] { 1.0 - a; }, {"rsub_scalar:", "bool tensor"}, "1.0 - bool");
  ExpectError([&] { sub(full({3}, 2, DType::kInt64, dev()), a); }, {"sub:", "bool tensor"},
              "int64 - bool");
  EXPECT_EQ(to_vector(ne(a, b)), (std::vector<double>{1, 1, 1}));  // the xor it points to
}

// torch.arange raises when the bounds run against the step's sign; equal bounds give [0].
TEST_P(Semantics, ArangeAgainstTheStepRaises) {
  ExpectError([&] { arange(5, 0, 1, DType::kInt64, dev()); }, {"arange:", "sign of step"}, "5..0");
  ExpectError([&] { arange(0, 5, -1, DType::kInt64, dev()); }, {"arange:", "sign of step"}, "-1");
  EXPECT_EQ(arange(3, 3, 1, DType::kInt64, dev()).shape(), (Shape{0}));
  EXPECT_EQ(to_vector(arange(5, 0, -2, DType::kInt64, dev())), (std::vector<double>{5, 3, 1}));
}

// torch.arange without a dtype infers it: int64 for whole-number arguments, float32 otherwise
// (kiln gave int64 [0, 0, 0, 0] for arange(0, 1, 0.3)).
TEST_P(Semantics, ArangeInfersItsDtypeFromTheArguments) {
  const Tensor f = arange(0, 1, 0.25, std::nullopt, dev());
  EXPECT_EQ(f.dtype(), DType::kFloat32);
  EXPECT_EQ(to_vector(f), (std::vector<double>{0, 0.25, 0.5, 0.75}));
  EXPECT_EQ(arange(0.5, 3).dtype(), DType::kFloat32);
  EXPECT_EQ(to_vector(arange(0.5, 3)), (std::vector<double>{0.5, 1.5, 2.5}));
  EXPECT_EQ(arange(0, 6, 2, std::nullopt, dev()).dtype(), DType::kInt64);
  const Tensor given = arange(0, 1, 0.3, DType::kInt64, dev());  // as torch: computed, then cast
  EXPECT_EQ(given.dtype(), DType::kInt64);
  EXPECT_EQ(to_vector(given), (std::vector<double>{0, 0, 0, 0}));
}

// torch's result type with zero-dim tensors: a tensor with dims keeps its dtype against a 0-d one
// of the same category (bf16 x * a float32 0-d scale stays bf16; int32 + int64 0-d stays int32),
// a 0-d operand of a higher category decides (int32 + float32 0-d is float32).
TEST_P(Semantics, ZeroDimTensorsDoNotPromoteWithinTheirCategory) {
  const Tensor f32_0d = from_vector({0.5}, {}, DType::kFloat32, dev());
  const Tensor i64_0d = from_vector({2}, {}, DType::kInt64, dev());
  for (DType half : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor x = Floats({1, 2, 4}, half);
    EXPECT_EQ((x * f32_0d).dtype(), half);
    EXPECT_EQ(to_vector(x * f32_0d), (std::vector<double>{0.5, 1, 2}));
    EXPECT_EQ((f32_0d + x).dtype(), half);
    EXPECT_EQ(where(full({3}, 1, DType::kBool, dev()), x, f32_0d).dtype(), half);
    EXPECT_EQ((x + i64_0d).dtype(), half);
  }
  const Tensor i32 = IntTensor({1, 2, 3}, DType::kInt32);
  EXPECT_EQ((i32 + i64_0d).dtype(), DType::kInt32);
  EXPECT_EQ(ReadInts(i32 + i64_0d), (Ints{3, 4, 5}));
  EXPECT_EQ((i32 + f32_0d).dtype(), DType::kFloat32);
  EXPECT_EQ((IntTensor({1, 0}, DType::kBool) + i64_0d).dtype(), DType::kInt64);
  EXPECT_EQ((i32 + from_vector({1.5}, {}, DType::kFloat16, dev())).dtype(), DType::kFloat16);
  // Two tensors with dims, or two 0-d ones, promote as before.
  EXPECT_EQ((Floats({1}, DType::kBFloat16) + Floats({1})).dtype(), DType::kFloat32);
  EXPECT_EQ((from_vector({1}, {}, DType::kBFloat16, dev()) + f32_0d).dtype(), DType::kFloat32);
  // In place: the result type must still cast to self (torch: "can't be cast").
  Tensor ints = IntTensor({1, 2}, DType::kInt32);
  ExpectError([&] { add_(ints, f32_0d); }, {"add"}, "int32 += float32 0-d");
}

// torch refuses a fill value beyond a floating dtype's range (65504 for float16), as it does for
// integers; NaN and the infinities fit every floating dtype.
TEST_P(Semantics, FillValuesBeyondAFloatingRangeRaise) {
  ExpectError([&] { full({2}, 70000, DType::kFloat16, dev()); }, {"full:", "float16", "overflow"},
              "70000 as float16");
  ExpectError([&] { full({2}, 1e39, DType::kBFloat16, dev()); }, {"bfloat16"}, "1e39 as bf16");
  ExpectError([&] { full({2}, -1e300, DType::kFloat32, dev()); }, {"float32"}, "-1e300 as f32");
  ExpectError(
      [&] { masked_fill(Floats({1}, DType::kFloat16), full({1}, 1, DType::kBool, dev()), -1e5); },
      {"masked_fill:", "float16"}, "masked_fill -1e5 into float16");
  EXPECT_EQ(to_vector(full({1}, 65504, DType::kFloat16, dev())), (std::vector<double>{65504}));
  EXPECT_EQ(to_vector(full({1}, -INFINITY, DType::kFloat16, dev())),
            (std::vector<double>{-INFINITY}));
  EXPECT_TRUE(std::isnan(to_vector(full({1}, NAN, DType::kBFloat16, dev()))[0]));
  // torch.tensor rounds instead: beyond the range is the infinity.
  EXPECT_EQ(to_vector(from_vector({7e4, -7e4}, {2}, DType::kFloat16, dev())),
            (std::vector<double>{INFINITY, -INFINITY}));
}

// logsumexp over an empty dim is -inf (the log of an empty sum), as torch; kiln raised naming max.
TEST_P(Semantics, LogsumexpOverAnEmptyDimIsMinusInfinity) {
  const Tensor e = empty({0, 3}, DType::kFloat32, dev());
  EXPECT_EQ(to_vector(logsumexp(e, {0})), (std::vector<double>(3, -INFINITY)));
  EXPECT_EQ(logsumexp(e, {1}).shape(), (Shape{0}));
  EXPECT_EQ(logsumexp(e, {0}, true).shape(), (Shape{1, 3}));
  EXPECT_EQ(to_vector(logsumexp(empty({0}, DType::kBFloat16, dev()), {0})),
            (std::vector<double>{-INFINITY}));
}

// ---- Softmax with infinities. ---------------------------------------------------------------

struct InfCase {
  std::vector<double> in, softmax, log_softmax;
};

TEST_P(Semantics, SoftmaxWithInfinitiesMatchesTorch) {
  const double nan = NAN, inf = INFINITY;
  const std::vector<InfCase> cases = {
      {{inf, 1, 2, 3}, {nan, 0, 0, 0}, {nan, -inf, -inf, -inf}},
      {{inf, inf, 1}, {nan, nan, 0}, {nan, nan, -inf}},
      {{1, -inf, inf}, {0, 0, nan}, {-inf, -inf, nan}},
      {{-inf, -inf}, {nan, nan}, {nan, nan}},
      {{-inf, 0}, {0, 1}, {-inf, 0}},
      {{nan, 1}, {nan, nan}, {nan, nan}},
      {{inf, nan}, {nan, nan}, {nan, nan}},
  };
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (const InfCase& c : cases) {
      const Tensor x = Floats(c.in, t);
      ExpectClose(to_vector(softmax(x, 0)), c.softmax, {0, 0}, "softmax");
      ExpectClose(to_vector(log_softmax(x, 0)), c.log_softmax, {0, 0}, "log_softmax");
    }
  }
}

TEST_P(Semantics, SoftmaxWithInfinityInLongRowsAndCompiled) {
  // Rows of every kernel shape (warp, block, loop) with one +inf; and the fused softmax of a
  // compiled function (scale prologue) gives the eager answer.
  for (int64_t n : {7, 100, 3000, 20000}) {
    std::vector<double> v(2 * n);
    for (int64_t i = 0; i < 2 * n; ++i) v[i] = std::sin(0.1 * i);
    v[n / 2] = INFINITY;  // row 0 only
    const Tensor x = from_vector(v, {2, n}, DType::kFloat32, dev());
    const std::vector<double> got = to_vector(softmax(x, -1));
    for (int64_t i = 0; i < n; ++i) {
      if (i == n / 2) {
        EXPECT_TRUE(std::isnan(got[i])) << n;
      } else {
        EXPECT_EQ(got[i], 0) << n << " at " << i;
      }
    }
    double row1 = 0;
    for (int64_t i = n; i < 2 * n; ++i) row1 += got[i];
    EXPECT_NEAR(row1, 1, 1e-4) << n;
    CompiledFn f = compile(
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax(in[0] * 2.0, -1)}; },
        {x});
    ExpectClose(to_vector(f({x})[0]), to_vector(softmax(x * 2.0, -1)), {1e-6, 1e-5},
                absl::StrCat("compiled softmax n=", n));
  }
}

// ---- Normalisation dtype rules (torch 2.11). --------------------------------------------------

// Reference: float64 math on the values, rounded once to `out`.
std::vector<double> RefNorm(const std::vector<double>& x, int64_t d, const std::vector<double>& w,
                            const std::vector<double>& b, bool rms, double eps, DType out) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / d; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mean += rms ? 0 : x[r * d + i] / d;
    for (int64_t i = 0; i < d; ++i) var += (x[r * d + i] - mean) * (x[r * d + i] - mean) / d;
    for (int64_t i = 0; i < d; ++i) {
      double v = (x[r * d + i] - mean) / std::sqrt(var + eps);
      if (!w.empty()) v *= w[i];
      if (!b.empty()) v += b[i];
      y[r * d + i] = v;
    }
  }
  return to_vector(from_vector(y, {static_cast<int64_t>(y.size())}, out));
}

TEST_P(Semantics, NormsWithHalfInputAndFloat32Parameters) {
  Generator gen(5);
  const int64_t d = 24;
  for (DType half : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor x = to(cast(randn({3, d}, gen), half), dev());
    const Tensor w = to(randn({d}, gen), dev()), b = to(randn({d}, gen), dev());
    const std::vector<double> xv = to_vector(x), wv = to_vector(w), bv = to_vector(b);
    const Tensor r = rms_norm(x, w, 1e-6);
    EXPECT_EQ(r.dtype(), half);  // torch 2.11: type_as(input)
    ExpectClose(to_vector(r), RefNorm(xv, d, wv, {}, true, 1e-6, half), ToleranceFor(half),
                "rms_norm half x, f32 w");
    const Tensor l = layer_norm(x, w, b, 1e-5);
    EXPECT_EQ(l.dtype(), half);
    ExpectClose(to_vector(l), RefNorm(xv, d, wv, bv, false, 1e-5, half), ToleranceFor(half),
                "layer_norm half x, f32 w and b");
    ExpectError([&] { layer_norm(x, w, cast(b, half)); }, {"layer_norm:", "float32"},
                "layer_norm f32 weight, half bias");
  }
  const Tensor x32 = to(randn({2, d}, gen), dev());
  const Tensor wb = to(cast(randn({d}, gen), DType::kBFloat16), dev());
  ExpectError([&] { layer_norm(x32, wb); }, {"layer_norm:", "bfloat16", "float32", "dtype"},
              "layer_norm f32 x, bf16 w");
  ExpectError([&] { layer_norm(cast(x32, DType::kBFloat16), cast(wb, DType::kFloat16)); },
              {"layer_norm:", "float16"}, "layer_norm bf16 x, f16 w");
  const Tensor r = rms_norm(x32, wb, 1e-6);  // any weight dtype; the result keeps x's
  EXPECT_EQ(r.dtype(), DType::kFloat32);
  ExpectClose(to_vector(r),
              RefNorm(to_vector(x32), d, to_vector(wb), {}, true, 1e-6, DType::kFloat32),
              {1e-5, 1e-5}, "rms_norm f32 x, bf16 w");
}

INSTANTIATE_TEST_SUITE_P(Devices, Semantics, ::testing::Values(kCPU, CUDA(0)), DeviceName);

// Sizes, starts and counts near int64's end: every sum and product is checked (an error naming
// the op, or the right pieces), never a wrapped number (meta tensors: no memory is needed).
TEST(SizeArithmetic, NearInt64sEndNothingWraps) {
  const int64_t big = LLONG_MAX;
  ExpectError(
      [&] {
        split_with_sizes(arange(5), {big, big, 7});
      },
      {"split_with_sizes:", "sum past int64's range"}, "split_with_sizes");
  const Tensor wide = expand(ones({1}, DType::kBool), {big});
  EXPECT_EQ(split(wide, big - 1).size(), 2u);
  EXPECT_EQ(chunk(wide, 2).size(), 2u);
  EXPECT_EQ(chunk(arange(5), big).size(), 5u);
  EXPECT_EQ(chunk(zeros({0}), 3).size(), 3u);  // torch: `chunks` empty pieces
  ExpectError(
      [&] {
        cat({zeros({big, 0}), zeros({big, 0}), zeros({3, 0})});
      },
      {"cat", "add up past int64's range"}, "cat");
  ExpectError([&] { narrow(arange(5), 0, 2, big); }, {"narrow:", "do not fit"}, "narrow");
  ExpectError(
      [&] {
        repeat_interleave(zeros({0, 3}), big, 1);
      },
      {"repeat_interleave:", "multiply past int64's range"}, "repeat_interleave");
  ExpectError([&] { repeat(ones({2}), {big / 2 + 1}); }, {"repeat:", "multiply past"}, "repeat");
  const Tensor z = zeros({int64_t{1} << 62, 4, 0}, DType::kFloat32, kMeta);
  EXPECT_EQ(flatten(z).shape(), (Shape{0}));
  EXPECT_EQ(unflatten(zeros({0}), 0, {int64_t{1} << 62, 4, 0}).shape(),
            (Shape{int64_t{1} << 62, 4, 0}));
  ExpectError(
      [&] {
        unflatten(arange(6), 0, {9, 6148914691236517206});
      },
      {"unflatten:", "multiply past"}, "unflatten");
  ExpectError(
      [&] {
        expand(ones({3}), {-1, 3});
      },
      {"expand", "-1 is not allowed in a leading"}, "expand -1");
  ExpectError([&] { PaddedRowsOf(10, 0, 0); }, {"PaddedRowsOf:", "world of 0"}, "PaddedRowsOf");
}

// to_vector<T> is exact for int64 and refuses what T cannot hold (no float-to-int UB).
TEST(SizeArithmetic, ToVectorOfIntegersIsExactAndChecked) {
  const std::vector<int64_t> v = {(int64_t{1} << 53) + 1, LLONG_MIN + 1, LLONG_MAX};
  const Tensor t = from_vector(std::vector<double>(3, 0), {3}, DType::kInt64);
  std::memcpy(t.data_ptr(), v.data(), sizeof(int64_t) * 3);
  EXPECT_EQ(to_vector<int64_t>(t), v);
  ExpectError([&] { to_vector<int32_t>(t); }, {"to_vector:", "outside the range"}, "int32");
  ExpectError([&] { to_vector<int32_t>(from_vector({NAN}, {1})); }, {"to_vector:", "nan"}, "nan");
  EXPECT_EQ(to_vector<int32_t>(from_vector({-2.7, 3.9}, {2})), (std::vector<int32_t>{-2, 3}));
}

}  // namespace
}  // namespace kiln
