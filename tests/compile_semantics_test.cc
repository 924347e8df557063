// What a compiled function means (DESIGN.md "Round 2", torch's semantics): in-place writes to
// views and to inputs are kept and applied to the caller's tensors, weights are read at call time
// (or frozen and then re-checked), outputs never share memory with weights or folded constants,
// a destroyed module is an error, and one CompiledFn serves several threads. Each case runs on the
// CPU here and on CUDA (with and without CUDA graphs) on the GPU machine.
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "codegen/compile.h"
#include "codegen/executable.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/status.h"
#include "tests/numerics_policy.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

void ExpectEqualTensors(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ExpectClose(to_vector(got), to_vector(want), {1e-5, 1e-5}, what);
}

std::vector<Tensor> Clones(const std::vector<Tensor>& in) {
  std::vector<Tensor> out;
  for (const Tensor& t : in) out.push_back(clone(t));
  return out;
}

// Runs `fn` eagerly on copies of `inputs` and compiled on other copies, three calls (the graph
// path captures after the first); outputs and the inputs afterwards (mutations) must agree.
void ExpectSameAsEager(const Fn& fn, const std::vector<Tensor>& inputs, CompileOptions o,
                       const std::string& what) {
  std::vector<Tensor> eager_in = Clones(inputs);
  const std::vector<Tensor> want = fn(eager_in);
  CompiledFn f = compile(fn, Clones(inputs), o);
  for (int call = 0; call < 3; ++call) {
    std::vector<Tensor> in = Clones(inputs);
    const std::vector<Tensor> got = f(in);
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      ExpectEqualTensors(got[i], want[i], absl::StrCat(what, ": output ", i, ", call ", call));
    }
    for (size_t i = 0; i < in.size(); ++i) {
      ExpectEqualTensors(in[i], eager_in[i], absl::StrCat(what, ": input ", i, ", call ", call));
    }
  }
}

std::vector<CompileOptions> Modes(Device device) {
  CompileOptions plain, graphs;
  graphs.cuda_graphs = true;
  if (device.is_cuda()) return {plain, graphs};
  return {plain};
}

Tensor Mask(Generator& gen, Shape shape, Device device) {
  std::vector<double> bits;
  for (int64_t i = 0; i < NumElements(shape); ++i) bits.push_back(gen.Uniform() < 0.4);
  return to(from_vector(bits, shape, DType::kBool), device);
}

// Issue #13 item 9: a write through a view of a value made in the function.
void InPlaceThroughViews(Device device) {
  Generator gen(1);
  const Tensor x = to(randn({4, 6}, gen), device), mask = Mask(gen, {4, 6}, device);
  const Fn slice_write = [](const std::vector<Tensor>& in) {
    Tensor x = clone(in[0]);
    Tensor before = slice(x, 1, 2, 5);  // a view taken before the write, read after it
    add_(slice(x, 0, 0, 1), 100.0);
    return std::vector<Tensor>{x, before * 2.0};
  };
  const Fn transposed_write = [](const std::vector<Tensor>& in) {
    Tensor x = clone(in[0]);
    Tensor t = transpose(x, 0, 1);
    mul_(slice(t, 0, 1, 3), 3.0);                 // columns 1 and 2 of x
    masked_fill_(x, in[1], -1.0);                 // then the whole tensor
    copy_(slice(x, 0, 3, 4), slice(x, 0, 0, 1));  // a row copied onto another
    return std::vector<Tensor>{x, t};
  };
  for (const CompileOptions& o : Modes(device)) {
    ExpectSameAsEager(slice_write, {x}, o, "add_ through a slice");
    ExpectSameAsEager(transposed_write, {x, mask}, o, "writes through transposed slices");
  }
}

TEST(CompileSemantics, InPlaceThroughViewsOnCpu) { InPlaceThroughViews(kCPU); }
TEST(CompileSemantics, InPlaceThroughViewsOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  InPlaceThroughViews(CUDA(0));
}

// Issue #13 item 10: the function writes its inputs (whole, and through a view); the caller's
// tensors change as they would eagerly, including strided ones.
void InputMutation(Device device) {
  Generator gen(2);
  const Tensor a = to(randn({3, 5}, gen), device), b = to(randn({3, 5}, gen), device);
  const Fn fn = [](const std::vector<Tensor>& in) {
    add_(in[0], 1.0);
    mul_(slice(in[1], 1, 0, 2), -2.0);
    return std::vector<Tensor>{in[0] * 2.0 + sum(in[1], {0}, true)};
  };
  for (const CompileOptions& o : Modes(device)) {
    ExpectSameAsEager(fn, {a, b}, o, "inputs written in place");
    // A strided (transposed) caller tensor is written through its own strides.
    std::vector<Tensor> eager_in = {clone(a), contiguous(transpose(clone(b), 0, 1))};
    eager_in[1] = transpose(eager_in[1], 0, 1);
    std::vector<Tensor> compiled_in = {clone(a), contiguous(transpose(clone(b), 0, 1))};
    compiled_in[1] = transpose(compiled_in[1], 0, 1);
    const std::vector<Tensor> want = fn(eager_in);
    CompiledFn f = compile(fn, Clones(compiled_in), o);
    ExpectEqualTensors(f(compiled_in)[0], want[0], "strided input: output");
    ExpectEqualTensors(compiled_in[1], eager_in[1], "strided input: written back");
  }
}

// A non-contiguous input is traced with its strides: reshape and contiguous() copy where eager
// copies (a write to the copy stays out of the caller's tensor), view() refuses, and a reshape
// that eager can view (a transpose of a transposed input) writes through to the caller.
void NonContiguousInputs(Device device) {
  const auto permuted = [&] {
    return permute(zeros({4, 3, 2}, DType::kFloat32, device), {2, 1, 0});
  };
  const Fn reshape_then_write = [](const std::vector<Tensor>& in) {
    Tensor y = reshape(in[0], {2, 12});
    add_(y, 1.0);
    return std::vector<Tensor>{y};
  };
  const Fn contiguous_then_write = [](const std::vector<Tensor>& in) {
    Tensor y = contiguous(in[0]);
    add_(y, 1.0);
    return std::vector<Tensor>{y * 2.0};
  };
  const Fn viewable_then_write = [](const std::vector<Tensor>& in) {
    Tensor y = reshape(transpose(in[0], 0, 1), {12});  // in[0] is a transpose: this is a view
    add_(y, 1.0);
    return std::vector<Tensor>{y};
  };
  const Fn strided_write = [](const std::vector<Tensor>& in) {
    mul_(in[0], 3.0);
    return std::vector<Tensor>{sum(in[0], {0})};
  };
  for (const CompileOptions& o : Modes(device)) {
    for (const auto& [name, fn, make] :
         std::vector<std::tuple<std::string, Fn, std::function<Tensor()>>>{
             {"reshape of a permuted input", reshape_then_write, permuted},
             {"contiguous() of a permuted input", contiguous_then_write, permuted},
             {"reshape of a transposed input's transpose", viewable_then_write,
              [&] {
                return transpose(ones({4, 3}, DType::kFloat32, device), 0, 1);
              }},
             {"a step-2 slice written in place", strided_write,
              [&] { return slice(arange(24, DType::kFloat32, device), 0, 0, 24, 2); }},
         }) {
      std::vector<Tensor> eager_in = {make()};
      const std::vector<Tensor> want = fn(eager_in);
      CompiledFn f = compile(fn, {make()}, o);
      for (int call = 0; call < 3; ++call) {
        std::vector<Tensor> in = {make()};
        const std::vector<Tensor> got = f(in);
        ExpectEqualTensors(got[0], want[0], absl::StrCat(name, ": output, call ", call));
        ExpectEqualTensors(in[0], eager_in[0], absl::StrCat(name, ": the input, call ", call));
      }
    }
    const Fn strict_view = [](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{view(in[0], {2, 12})};
    };
    EXPECT_NE(ErrorOf([&] { compile(strict_view, {permuted()}, o); }).find("view"),
              std::string::npos);
  }
}

TEST(CompileSemantics, NonContiguousInputsCopyWhereEagerCopiesOnCpu) { NonContiguousInputs(kCPU); }
TEST(CompileSemantics, NonContiguousInputsCopyWhereEagerCopiesOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  NonContiguousInputs(CUDA(0));
}

// A symbolic plan (two sizes seen) serves other sizes only where the function is that program:
// a size-1 dim squeezed, a branch on a size, a window whose start turns negative below the traced
// sizes, a branch above them — each gets eager's answer.
TEST(CompileSemantics, SymbolicPlansCheckSizesOutsideTheirTraces) {
  const Fn squeezed = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{squeeze(in[0]) * 1.0};
  };
  const Fn branch_on_one = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0].size(0) == 1 ? in[0] * 2.0 : in[0] * 3.0};
  };
  const Fn last_64 = [](const std::vector<Tensor>& in) {
    const int64_t n = in[0].size(0);
    return std::vector<Tensor>{slice(in[0], 0, std::max<int64_t>(0, n - 64), n) * 1.0};
  };
  const Fn branch_above = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0].size(0) > 200 ? in[0] * 3.0 : in[0] * 2.0};
  };
  for (const auto& [name, fn] :
       std::vector<std::pair<std::string, Fn>>{{"squeeze", squeezed},
                                               {"branch on size 1", branch_on_one},
                                               {"last 64 rows", last_64},
                                               {"branch above the traces", branch_above}}) {
    CompiledFn f = compile(fn, {ones({100, 2})});
    f({ones({120, 2})});  // a second size: the dim becomes symbolic
    for (int64_t n : {1, 40, 63, 300, 301, 100, 1}) {
      const Tensor x = ones({n, 2});
      const Tensor want = fn({x})[0];
      const Tensor got = f({x})[0];
      ExpectEqualTensors(got, want, absl::StrCat(name, " at ", n));
    }
  }
  // A growing sequence traces each new size once, and compiles no more plans.
  CompiledFn grow = compile(branch_above, {ones({100, 2})});
  for (int64_t n = 120; n < 160; ++n) grow({ones({n, 2})});
  EXPECT_EQ(grow.compilations(), 2);
}

// An output that is a view of an input (one the function writes, here) is that view at every size,
// as eagerly: the function gets a plan per size instead of a symbolic plan that returned a copy
// (a later write through the output then missed the input).
TEST(CompileSemantics, AViewOfAnInputStaysAViewAtEverySize) {
  const Fn fn = [](const std::vector<Tensor>& in) {
    const Tensor head = slice(in[0], 0, 0, 2);
    add_(in[0], 1.0);
    return std::vector<Tensor>{head};
  };
  CompiledFn f = compile(fn, {ones({4, 3})}, {.mode = CompileOptions::Mode::kCompiled});
  for (int64_t n : {4, 6, 8, 6}) {
    const Tensor x = ones({n, 3}), x_eager = ones({n, 3});
    const Tensor got = f({x})[0], want = fn({x_eager})[0];
    ExpectEqualTensors(got, want, absl::StrCat("at ", n));
    EXPECT_TRUE(got.shares_storage(x)) << "at " << n;
    add_(got, 100.0);  // reaches the input, as eagerly
    add_(want, 100.0);
    ExpectEqualTensors(x, x_eager,
                       absl::StrCat("the input after a write through the output at ", n));
  }
  EXPECT_EQ(f.compilations(), 3);
  EXPECT_NE(f.report({ones({6, 3})}).symbolic_dims.find("output 0 is a view of input 0"),
            std::string::npos)
      << f.report({ones({6, 3})}).symbolic_dims;
}

// A branch on one size, on a window of sizes or on a residue lies between sizes the plan served:
// a size the traces never showed is traced before the plan serves it (a symbolic plan served
// 9 with the branch of 4..12 before).
TEST(CompileSemantics, BranchesBetweenServedSizesTakeTheirOwnBranch) {
  const std::vector<std::pair<std::string, Fn>> fns = {
      {"n == 9",
       [](const std::vector<Tensor>& in) {
         return std::vector<Tensor>{in[0].size(0) == 9 ? in[0] * 100.0 : in[0] + 1.0};
       }},
      {"8 <= n <= 10",
       [](const std::vector<Tensor>& in) {
         const int64_t n = in[0].size(0);
         return std::vector<Tensor>{n >= 8 && n <= 10 ? in[0] * 100.0 : in[0] + 1.0};
       }},
      {"n % 3 == 0", [](const std::vector<Tensor>& in) {
         return std::vector<Tensor>{in[0].size(0) % 3 == 0 ? in[0] * 100.0 : in[0] + 1.0};
       }}};
  for (const auto& [name, fn] : fns) {
    CompiledFn f = compile(fn, {ones({4, 2})});
    for (int64_t n : {6, 30, 9, 12, 5, 8, 10, 11, 9, 15}) {
      const Tensor x = ones({n, 2});
      ExpectEqualTensors(f({x})[0], fn({x})[0], absl::StrCat(name, " at ", n));
    }
  }
}

// A user's exception at a probe size (sizes the caller never passed) only means "not
// symbolic": the caller's sizes run as eagerly.
TEST(CompileSemantics, AnExceptionAtProbeSizesDoesNotReachTheCaller) {
  const Fn limited = [](const std::vector<Tensor>& in) {
    if (in[0].size(0) > 64) throw std::invalid_argument("sequence longer than 64");
    return std::vector<Tensor>{in[0] + 1.0};
  };
  CompiledFn f = compile(limited, {ones({3})});
  for (int64_t n : {5, 2, 10}) {
    ExpectEqualTensors(f({ones({n})})[0], full({n}, 2.0), absl::StrCat("n = ", n));
  }
  EXPECT_THROW(f({ones({70})}), std::invalid_argument);  // the caller's own size: as eagerly
}

// Guards never index past an input's rank: a 0-dim input after a symbolic plan recompiles.
TEST(CompileSemantics, ARankChangeAfterASymbolicPlanRecompiles) {
  const Fn twice = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2.0}; };
  CompiledFn f = compile(twice, {ones({4, 6})});
  f({ones({8, 6})});
  ExpectEqualTensors(f({full({}, 1.5)})[0], full({}, 3.0), "0-dim");
  ExpectEqualTensors(f({ones({5})})[0], full({5}, 2.0), "1-D");
  EXPECT_NE(ErrorOf([] { full({}, 1.5).size(0); }).find("a 0-dim tensor has no dimensions"),
            std::string::npos);
}

// An in-place op whose result type is wider than self's (bf16 += f32) writes self's dtype, as
// eagerly.
TEST(CompileSemantics, InPlaceResultsAreCastToSelfsDtype) {
  const Fn accumulate = [](const std::vector<Tensor>& in) {
    add_(in[0], in[1]);
    return std::vector<Tensor>{in[0] * 1.0};
  };
  Generator gen(5);
  const Tensor t = randn({3, 4}, gen, DType::kBFloat16), u = randn({3, 4}, gen);
  std::vector<Tensor> eager_in = {clone(t), clone(u)}, compiled_in = {clone(t), clone(u)};
  const Tensor want = accumulate(eager_in)[0];
  CompiledFn f = compile(accumulate, Clones(compiled_in));
  const Tensor got = f(compiled_in)[0];
  EXPECT_EQ(got.dtype(), DType::kBFloat16);
  EXPECT_EQ(to_vector(got), to_vector(want));
  EXPECT_EQ(to_vector(compiled_in[0]), to_vector(eager_in[0]));
}

// Outputs that are an input, or views of it, share the caller's memory as eagerly, whether or
// not the function wrote the input (the returned input is the caller's tensor itself).
TEST(CompileSemantics, OutputsThatAreInputsAreTheCallersTensors) {
  const Fn write_and_return = [](const std::vector<Tensor>& in) {
    add_(in[0], 1.0);
    return std::vector<Tensor>{in[0], transpose(in[0], 0, 1), slice(in[0], 1, 1, 3), in[1]};
  };
  for (const Tensor& x : {zeros({2, 3}), transpose(zeros({3, 2}), 0, 1)}) {
    CompiledFn f = compile(write_and_return, {clone(x), ones({2})});
    for (int call = 0; call < 2; ++call) {
      std::vector<Tensor> in = {x.is_contiguous() ? zeros({2, 3}) : transpose(zeros({3, 2}), 0, 1),
                                ones({2})};
      const std::vector<Tensor> out = f(in);
      EXPECT_TRUE(out[0].is_same(in[0]));
      EXPECT_TRUE(out[3].is_same(in[1]));
      for (const Tensor& o : out) EXPECT_TRUE(o.shares_storage(o.is_same(in[1]) ? in[1] : in[0]));
      add_(out[1], 10.0);  // through the transposed view: the caller's tensor
      EXPECT_EQ(to_vector(sum(in[0]))[0], 6 * 11.0);
      EXPECT_EQ(to_vector(out[2]), std::vector<double>(4, 11.0));
    }
  }
}

// Past max_signatures plans a new signature runs eagerly (one warning, counted), as torch past
// its cache_size_limit; sizes alternating with dtypes get a symbolic plan per dtype.
TEST(CompileSemantics, PastMaxSignaturesCallsRunEagerly) {
  const Fn twice = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2.0}; };
  CompileOptions o;
  o.dynamic = CompileOptions::Dynamic::kNone;
  o.max_signatures = 2;
  CompiledFn f = compile(twice, {ones({1})}, o);
  for (int64_t n = 1; n <= 4; ++n) {
    ExpectEqualTensors(f({ones({n})})[0], full({n}, 2.0), absl::StrCat("n = ", n));
  }
  EXPECT_EQ(f.compilations(), 2);
  EXPECT_EQ(f.eager_fallbacks(), 2);
  CompiledFn g = compile(twice, {ones({1, 16})});
  for (int64_t n = 1; n <= 8; ++n) {
    const DType t = n % 2 == 0 ? DType::kBFloat16 : DType::kFloat32;
    ExpectEqualTensors(g({ones({n, 16}, t)})[0], full({n, 16}, 2.0), absl::StrCat("n = ", n));
  }
  EXPECT_LE(g.compilations(), 6);  // per dtype: the first size, then one symbolic plan (and n=1, 2)
  EXPECT_EQ(g.eager_fallbacks(), 0);
}

// A compiled function called inside another's trace is inlined into it (torch's nesting).
TEST(CompileSemantics, ACompiledFunctionInsideATraceIsInlined) {
  const Fn inner_fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0] + 1.0};
  };
  CompiledFn inner = compile(inner_fn, {ones({3})});
  const Fn outer_fn = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{inner({in[0] * 2.0})[0] * 3.0};
  };
  CompiledFn outer = compile(outer_fn, {ones({3})});
  ExpectEqualTensors(outer({ones({3})})[0], full({3}, 9.0), "nested");
}

// Two disjoint strided views of one buffer, both written: each keeps only its own writes (the
// plan writes a strided input back through its view, not its whole span), also from threads.
TEST(CompileSemantics, DisjointStridedViewsKeepTheirOwnWrites) {
  const Fn both = [](const std::vector<Tensor>& in) {
    const Tensor old = in[0] * 1.0;  // keeps the old value alive: the write is not in place
    add_(in[0], 1.0);
    add_(in[1], 10.0);
    return std::vector<Tensor>{old};
  };
  const Tensor eager_buffer = zeros({6, 8});
  both({slice(eager_buffer, 1, 0, 4), slice(eager_buffer, 1, 4, 8)});
  const Tensor buffer = zeros({6, 8});
  CompiledFn f = compile(both, {slice(zeros({6, 8}), 1, 0, 4), slice(zeros({6, 8}), 1, 4, 8)});
  f({slice(buffer, 1, 0, 4), slice(buffer, 1, 4, 8)});
  EXPECT_EQ(to_vector(buffer), to_vector(eager_buffer));  // (interleaved views: run eagerly)
  const Fn one = [](const std::vector<Tensor>& in) {
    const Tensor old = in[0] * 1.0;
    add_(in[0], 1.0);
    return std::vector<Tensor>{old};
  };
  const Tensor shared = zeros({64, 8});
  CompiledFn g = compile(one, {slice(zeros({64, 8}), 1, 0, 4)});
  std::vector<std::thread> threads;
  for (int64_t half : {0, 4}) {
    threads.emplace_back([&, half] {
      for (int call = 0; call < 50; ++call) g({slice(shared, 1, half, half + 4)});
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(to_vector(shared), std::vector<double>(64 * 8, 50.0));
}

// Symbolic plans: the order of two symbols the traces showed is a guard too, a size 1 is never
// covered by a range widened to 0, and an output that is a written input is the caller's tensor.
TEST(CompileSemantics, SymbolicPlansGuardOrdersAndSizeOne) {
  const Fn ordered = [](const std::vector<Tensor>& in) {
    const int64_t a = in[0].size(0), b = in[1].size(0);
    return std::vector<Tensor>{a > b ? sum(in[0]) + sum(in[1]) : sum(in[0]) - sum(in[1])};
  };
  CompiledFn f = compile(ordered, {ones({4}), ones({3})});
  f({ones({6}), ones({5})});
  for (auto [a, b] : std::vector<std::pair<int64_t, int64_t>>{{10, 20}, {20, 10}, {15, 15}}) {
    ExpectEqualTensors(f({ones({a}), ones({b})})[0], ordered({ones({a}), ones({b})})[0],
                       absl::StrCat("sizes ", a, ", ", b));
  }
  const Fn squeezed = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{squeeze(in[0], 0) * 1.0};
  };
  CompiledFn g = compile(squeezed, {ones({4, 3})});
  g({ones({5, 3})});
  g({ones({0, 3})});
  EXPECT_EQ(g({ones({1, 3})})[0].shape(), (Shape{3}));
  const Fn written = [](const std::vector<Tensor>& in) {
    add_(in[0], 1.0);
    return std::vector<Tensor>{in[0]};
  };
  CompiledFn h = compile(written, {ones({4, 3})});
  for (int64_t n : {4, 5, 6}) {
    const std::vector<Tensor> in = {ones({n, 3})};
    EXPECT_TRUE(h(in)[0].is_same(in[0])) << n;
  }
}

// A bool self takes no integer result (torch's casting rule), compiled as eagerly; inputs of
// negative strides are refused clearly; a call while compiling itself is an error, not a hang.
TEST(CompileSemantics, CastingRuleNegativeStridesAndReentry) {
  const Fn to_bool = [](const std::vector<Tensor>& in) {
    add_(in[0], in[1]);
    return std::vector<Tensor>{in[0]};
  };
  const std::vector<Tensor> in = {zeros({3}, DType::kBool), ones({3}, DType::kInt32)};
  EXPECT_THROW(to_bool(in), Error);
  EXPECT_NE(ErrorOf([&] { compile(to_bool, in); }).find("cannot be written into bool self"),
            std::string::npos);
  const Tensor reversed = arange(8, DType::kFloat32, kCPU).as_strided({4}, {-2}, 7);
  const Fn twice = [](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[0] * 2.0}; };
  EXPECT_NE(ErrorOf([&] { compile(twice, {reversed}); }).find("non-negative strides"),
            std::string::npos);
  std::optional<CompiledFn> self;
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  o.tensor_names = [&] {
    if (self.has_value()) (*self)({ones({2})});
    return std::vector<std::pair<std::string, Tensor>>{};
  };
  self.emplace(twice, o);
  EXPECT_NE(ErrorOf([&] { (*self)({ones({2})}); }).find("called while this thread is compiling"),
            std::string::npos);
}

// Meta inputs propagate shapes as eagerly (no plan: nothing runs).
TEST(CompileSemantics, MetaInputsPropagateShapesAsEagerly) {
  const Fn fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{matmul(in[0], transpose(in[0], 0, 1)) + 1.0};
  };
  CompiledFn f = compile(fn, {ones({2, 3})});
  const Tensor out = f({empty({4, 3}, DType::kFloat32, kMeta)})[0];
  EXPECT_TRUE(out.device().is_meta());
  EXPECT_EQ(out.shape(), (Shape{4, 4}));
}

// recompile = false: a layout change is a new signature too, refused.
TEST(CompileSemantics, WithoutRecompileALayoutChangeIsAnError) {
  const Fn twice = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2.0}; };
  CompileOptions o;
  o.recompile = false;
  CompiledFn f = compile(twice, {ones({3, 3})}, o);
  EXPECT_NE(ErrorOf([&] {
              f({transpose(ones({3, 3}), 0, 1)});
            }).find("input 0 is strides [1, 3] but the function was compiled for contiguous"),
            std::string::npos);
}

// The input count is fixed (with recompile on too): a call with fewer inputs than the function
// reads would trace it past the end of its vector; more are refused alike.
TEST(CompileSemantics, ACallWithAnotherInputCountIsAnError) {
  const Fn add = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] + in[1]}; };
  CompiledFn f = compile(add, {ones({3}), ones({3})});
  for (const std::vector<Tensor>& in :
       std::vector<std::vector<Tensor>>{{}, {ones({3})}, {ones({3}), ones({3}), ones({3})}}) {
    EXPECT_NE(ErrorOf([&] { f(in); })
                  .find(absl::StrCat("compiled function: called with ", in.size(),
                                     " inputs, compiled for 2 (the input count is fixed")),
              std::string::npos);
  }
  EXPECT_EQ(to_vector(f({ones({3}), ones({3})})[0]), (std::vector<double>{2, 2, 2}));
}

TEST(CompileSemantics, InputMutationReachesTheCallerOnCpu) { InputMutation(kCPU); }
TEST(CompileSemantics, InputMutationReachesTheCallerOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  InputMutation(CUDA(0));
}

// The lines of the plan's explain log saying that an `op` step runs in place.
int InPlaceLines(const CompiledFn& f, const std::vector<Tensor>& inputs, const std::string& op) {
  int lines = 0;
  for (const std::string& line : f.report(inputs).explain) {
    lines += line.rfind("[lowering; %N as in the final graph] in place: " + op, 0) == 0;
  }
  return lines;
}

// A KV-cache write: index_copy_ of a row into an input at a position given as a tensor. The plan
// runs it in place on the caller's cache (no copy back); where the cache's old value is read
// later, or the cache shares memory with another input, it must still match eager.
void IndexCopyIntoInputs(Device device) {
  Generator gen(5);
  const Tensor cache = to(randn({2, 3, 8, 4}, gen), device),
               row = to(randn({2, 3, 1, 4}, gen), device);
  const Tensor pos = to(from_vector({5}, {1}, DType::kInt64), device);
  const Fn write_then_read = [](const std::vector<Tensor>& in) {
    index_copy_(in[0], 2, in[2], in[1] * 2.0);
    return std::vector<Tensor>{sum(in[0], {2}) + 1.0};
  };
  const Fn old_value_read_after = [](const std::vector<Tensor>& in) {
    const Tensor before = in[0] * 1.0;  // not fused past the write: read by a later step
    index_copy_(in[0], 2, in[2], in[1]);
    return std::vector<Tensor>{sum(in[0], {2}) - sum(before, {2}) + sum(exp(before), {2})};
  };
  const Fn out_of_place = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{index_copy(in[0], 2, in[2], in[1]) + in[0]};
  };
  // The cache as its own source (its rows reversed) is refused, eagerly and when traced, as
  // torch refuses it: the rows would be read while they are written.
  const Fn reverse_rows = [](const std::vector<Tensor>& in) {
    index_copy_(in[0], 2, in[1], in[0]);
    return std::vector<Tensor>{in[0] + 1.0};
  };
  const Tensor reversed = to(from_vector({7, 6, 5, 4, 3, 2, 1, 0}, {8}, DType::kInt64), device);
  std::vector<Tensor> self_source = {clone(cache), reversed};
  ExpectThrowsWith([&] { reverse_rows(self_source); }, "same memory location");
  ExpectThrowsWith(
      [&] {
        compile(reverse_rows, {clone(cache), reversed});
      },
      "same memory location");
  for (const CompileOptions& o : Modes(device)) {
    ExpectSameAsEager(write_then_read, {cache, row, pos}, o, "index_copy_ into an input");
    ExpectSameAsEager(old_value_read_after, {cache, row, pos}, o, "old value read after");
    ExpectSameAsEager(out_of_place, {cache, row, pos}, o, "index_copy out of place");
  }
  // The plan says which writes run in place: not the one whose old value is read afterwards.
  auto in_place_lines = [&](const Fn& fn) {
    return InPlaceLines(compile(fn, {clone(cache), clone(row), clone(pos)}), {cache, row, pos},
                        "index_copy");
  };
  EXPECT_EQ(in_place_lines(write_then_read), 1);
  EXPECT_EQ(in_place_lines(old_value_read_after), 0);
  EXPECT_EQ(in_place_lines(out_of_place), 0);
  // A write in place owns no memory in the plan's budget (what sizes a CUDA graph's arena).
  const int64_t peak = compile(write_then_read, {clone(cache), clone(row), clone(pos)})
                           .report({cache, row, pos})
                           .planned_peak_bytes;
  EXPECT_LT(peak, cache.numel() * 4);
  // The same tensor passed as the cache and as the row source's base: out of place, as traced.
  const Fn aliased = [](const std::vector<Tensor>& in) {
    index_copy_(in[0], 2, in[2], in[1] + 1.0);
    return std::vector<Tensor>{in[1] * 1.0};
  };
  for (const CompileOptions& o : Modes(device)) {
    Tensor c = clone(cache);
    const Tensor eager_c = clone(cache);
    const std::vector<Tensor> want = aliased({eager_c, slice(eager_c, 2, 0, 1), pos});
    CompiledFn g = compile(aliased, {clone(cache), clone(row), clone(pos)}, o);
    // Called with the row a view of the cache: the write must not run in place over memory the
    // plan reads again (the output reads row 0, the write goes to row 5).
    const std::vector<Tensor> got = g({c, slice(c, 2, 0, 1), pos});
    ExpectEqualTensors(got[0], want[0], "aliased: output");
    ExpectEqualTensors(c, eager_c, "aliased: cache");
  }
}

TEST(CompileSemantics, IndexCopyIntoInputsOnCpu) { IndexCopyIntoInputs(kCPU); }
TEST(CompileSemantics, IndexCopyIntoInputsOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  IndexCopyIntoInputs(CUDA(0));
}

// A decode step's bookkeeping: copy_ of the next token into an input, the position advanced
// with copy_(pos, pos + 1), add_ on a float input. Each is an elementwise op whose result has the
// input's type: the plan runs it in place on the caller's tensor (no copy back), unless the
// input's old value is read by a later step; every case as eager.
void ElementwiseWritesIntoInputs(Device device) {
  Generator gen(7);
  const Tensor tokens = to(from_vector({3, 4}, {2, 1}, DType::kInt64), device);
  const Tensor pos = to(from_vector({5}, {1}, DType::kInt64), device);
  const Tensor logits = to(randn({2, 9}, gen), device), acc = to(randn({2, 9}, gen), device);
  const std::vector<Tensor> inputs = {tokens, pos, logits, acc};
  const Fn bookkeeping = [](const std::vector<Tensor>& in) {
    copy_(in[0], reshape(argmax(in[2], -1), {2, 1}));
    copy_(in[1], in[1] + 1);
    add_(in[3], in[2]);
    return std::vector<Tensor>{in[2] * 2.0};
  };
  const Fn old_value_read_after = [](const std::vector<Tensor>& in) {
    const Tensor before = in[3] * 1.0;  // fused with its users, after the write: a late read
    add_(in[3], sum(in[2], {0}));
    return std::vector<Tensor>{sum(in[3], {1}) - sum(before, {1}) + sum(exp(before), {1})};
  };
  const Fn broadcast_source = [](const std::vector<Tensor>& in) {  // [9] into [2, 9]
    copy_(in[3], sum(in[2], {0}));
    return std::vector<Tensor>{sum(in[3], {1})};  // a reduction: the copy is not fused into it
  };
  const Fn returns_the_input = [](const std::vector<Tensor>& in) {  // the output is the input
    add_(in[3], in[2]);
    return std::vector<Tensor>{in[3], sum(in[3], {1})};
  };
  for (const CompileOptions& o : Modes(device)) {
    ExpectSameAsEager(bookkeeping, inputs, o, "copy_ and add_ into inputs");
    ExpectSameAsEager(returns_the_input, inputs, o, "add_ into an input it returns");
    ExpectSameAsEager(old_value_read_after, inputs, o, "old value read after the copy_");
    ExpectSameAsEager(broadcast_source, inputs, o, "copy_ of a broadcast source");
  }
  auto in_place_lines = [&](const Fn& fn, const std::string& op) {
    return InPlaceLines(compile(fn, Clones(inputs)), inputs, op);
  };
  EXPECT_EQ(in_place_lines(bookkeeping, "copy"), 2);
  EXPECT_EQ(in_place_lines(bookkeeping, "add"), 1);
  EXPECT_EQ(compile(bookkeeping, Clones(inputs)).executable(inputs).input_copy_backs(), 0);
  EXPECT_EQ(in_place_lines(old_value_read_after, "add"), 0);
  EXPECT_EQ(in_place_lines(broadcast_source, "copy"), 1);
  // The same tensor as the token input and as the logits' base: out of place, as eager.
  for (const CompileOptions& o : Modes(device)) {
    const Fn aliased = [](const std::vector<Tensor>& in) {
      copy_(in[0], in[1] + 1);
      return std::vector<Tensor>{in[1] * 1};
    };
    const Tensor ids = to(from_vector({1, 2, 3, 4}, {4}, DType::kInt64), device);
    Tensor c = clone(ids), eager_c = clone(ids);
    const std::vector<Tensor> want = aliased({eager_c, eager_c});
    CompiledFn f = compile(aliased, {clone(ids), clone(ids)}, o);
    const std::vector<Tensor> got = f({c, c});
    ExpectEqualTensors(got[0], want[0], "aliased: output");
    ExpectEqualTensors(c, eager_c, "aliased: input");
  }
}

TEST(CompileSemantics, ElementwiseWritesIntoInputsOnCpu) { ElementwiseWritesIntoInputs(kCPU); }
TEST(CompileSemantics, ElementwiseWritesIntoInputsOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  ElementwiseWritesIntoInputs(CUDA(0));
}

// A decode step: the new keys and values written into the caches (index_copy_), then attention
// over them. The attention family fuses the three (codegen/families/attention/attention_fusion.h;
// on CUDA one decode kernel writes the rows and attends): outputs and caches as eager, for
// grouped-query heads and one or two new rows; in place on the caller's caches, or out of place
// when the old cache is read afterwards; with repeated slots the attention reads the row the cache
// keeps; a slot outside the cache is an error that writes nothing.
void KvAppendAttention(Device device) {
  Generator gen(11);
  const DType dt = device.is_cuda() ? DType::kBFloat16 : DType::kFloat32;
  auto rnd = [&](Shape shape) { return to(cast(randn(shape, gen), dt), device); };
  auto slots = [&](std::vector<double> v) {
    const int64_t n = static_cast<int64_t>(v.size());
    return to(from_vector(v, {n}, DType::kInt64), device);
  };
  // in: q [2, 4, T, 64], k and v caches [2, 2, 32, 64] (two key heads), slots [T], new k and v
  // [2, 2, T, 64], keep-mask [1, 1, T, 32].
  const Fn step = [](const std::vector<Tensor>& in) {
    index_copy_(in[1], 2, in[3], in[4]);
    index_copy_(in[2], 2, in[3], in[5]);
    return std::vector<Tensor>{
        scaled_dot_product_attention(in[0], in[1], in[2], in[6], false, std::nullopt, true)};
  };
  const Fn old_cache_read_after = [](const std::vector<Tensor>& in) {
    const Tensor before = in[1] * 1.0;  // fused into the kernel after the write: reads the input
    index_copy_(in[1], 2, in[3], in[4]);
    index_copy_(in[2], 2, in[3], in[5]);
    const Tensor o =
        scaled_dot_product_attention(in[0], in[1], in[2], in[6], false, std::nullopt, true);
    return std::vector<Tensor>{o, before * 2.0 + 1.0};
  };
  for (int64_t t : {1, 2}) {
    std::vector<double> keep;
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = 0; j < 32; ++j) keep.push_back(j <= 9 + i);
    }
    const Tensor mask = to(from_vector(keep, {1, 1, t, 32}, DType::kBool), device);
    const std::vector<Tensor> in = {
        rnd({2, 4, t, 64}),
        rnd({2, 2, 32, 64}),
        rnd({2, 2, 32, 64}),
        slots(t == 1 ? std::vector<double>{9} : std::vector<double>{9, 10}),
        rnd({2, 2, t, 64}),
        rnd({2, 2, t, 64}),
        mask};
    const std::string what = absl::StrCat("KV append, ", t, " new rows");
    for (const CompileOptions& o : Modes(device)) {
      ExpectSameAsEager(step, in, o, what);
      ExpectSameAsEager(old_cache_read_after, in, o, what + ", old cache read after");
    }
    const std::string fused = "kiln_fused_index_copy_scaled_dot_product_attention";
    EXPECT_EQ(InPlaceLines(compile(step, Clones(in)), in, fused), 2) << what;
    // The key cache's old value is read afterwards: only the value cache is written in place.
    EXPECT_EQ(InPlaceLines(compile(old_cache_read_after, Clones(in)), in, fused), 1) << what;
    EXPECT_NE(compile(step, Clones(in)).report(in).final_graph.find(fused), std::string::npos);
  }
  // Two new rows for one slot: the cache keeps one of them (which one is unspecified, as for
  // index_copy_), and the attention reads the one it keeps.
  std::vector<Tensor> in = {rnd({2, 4, 2, 64}),
                            rnd({2, 2, 32, 64}),
                            rnd({2, 2, 32, 64}),
                            slots({5, 5}),
                            rnd({2, 2, 2, 64}),
                            rnd({2, 2, 2, 64}),
                            to(full({1, 1, 2, 32}, 1.0, DType::kBool), device)};
  CompiledFn f = compile(step, Clones(in));
  const Tensor got = f(in)[0];
  const Tensor want =
      scaled_dot_product_attention(in[0], in[1], in[2], in[6], false, std::nullopt, true);
  ExpectEqualTensors(got, want, "repeated slots: the attention over the cache it left");
  // A slot past the cache: kOutOfRange, and the caches keep their values.
  const Tensor k_before = clone(in[1]), v_before = clone(in[2]);
  in[0] = rnd({2, 4, 1, 64}), in[4] = rnd({2, 2, 1, 64}), in[5] = rnd({2, 2, 1, 64});
  in[6] = to(full({1, 1, 1, 32}, 1.0, DType::kBool), device);
  for (const CompileOptions& o : Modes(device)) {
    in[3] = slots({3});
    CompiledFn g = compile(step, Clones(in), o);
    in[3] = slots({32});
    try {
      g(in);
      ADD_FAILURE() << "a slot past the cache was not reported";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), absl::StatusCode::kOutOfRange) << e.what();
    }
    ExpectEqualTensors(in[1], k_before, "bad slot: the key cache");
    ExpectEqualTensors(in[2], v_before, "bad slot: the value cache");
  }
}

// An expanded cache (one row broadcast over the slots): eager index_copy_ refuses to write it, and
// so does the compiled step (the fused node never writes an expanded operand in place).
TEST(CompileSemantics, KvAppendIntoAnExpandedCacheIsRefusedAsEagerly) {
  Generator gen(12);
  const Fn step = [](const std::vector<Tensor>& in) {
    index_copy_(in[1], 2, in[3], in[4]);
    index_copy_(in[2], 2, in[3], in[5]);
    return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2])};
  };
  const Tensor pos = from_vector({3}, {1}, DType::kInt64);
  std::vector<Tensor> in = {randn({1, 2, 1, 64}, gen), randn({1, 2, 8, 64}, gen),
                            randn({1, 2, 8, 64}, gen), pos,
                            randn({1, 2, 1, 64}, gen), randn({1, 2, 1, 64}, gen)};
  CompiledFn f = compile(step, Clones(in));
  in[1] = expand(randn({1, 2, 1, 64}, gen), {1, 2, 8, 64});
  std::vector<Tensor> e = in;
  const std::string eager = ErrorOf([&] { step(e); });
  std::vector<Tensor> x = in;
  x[1] = expand(clone(slice(in[1], 2, 0, 1)), {1, 2, 8, 64});
  const std::string compiled = ErrorOf([&] { f(x); });
  EXPECT_NE(eager, "(no error)");
  EXPECT_NE(compiled, "(no error)") << "eager: " << eager;
}

TEST(CompileSemantics, KvAppendAttentionOnCpu) { KvAppendAttention(kCPU); }
TEST(CompileSemantics, KvAppendAttentionOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  KvAppendAttention(CUDA(0));
}

// A decode step that rotates its query and new keys (RoPE as RotaryEmbedding traces it) before
// the KV append and the attention. With CompileOptions::kv_rope the rotations join the fused node
// (attention_fusion.h; on CUDA the decode kernel rotates them and the plan has no pointwise kernel
// for them): one and two new rows, tables per row [2, 1, T, 32] or one row for all [1, 1, 1, 32].
// On the CPU (float32) outputs and caches equal eager's; on CUDA (bfloat16: the kernel rounds each
// rotated value once, eager after every op) they are judged by the numerics policy against the
// same program in float32 on the CPU.
void KvAppendRotaryAttention(Device device) {
  Generator gen(13);
  const DType dt = device.is_cuda() ? DType::kBFloat16 : DType::kFloat32;
  auto rnd = [&](Shape shape) { return to(cast(randn(shape, gen), dt), device); };
  const Fn step = [](const std::vector<Tensor>& in) {
    auto rotate = [&](const Tensor& x) { return apply_rotary(x, in[7], in[8]); };
    index_copy_(in[1], 2, in[3], rotate(in[4]));
    index_copy_(in[2], 2, in[3], in[5]);
    const Tensor o =
        scaled_dot_product_attention(rotate(in[0]), in[1], in[2], in[6], false, std::nullopt, true);
    return std::vector<Tensor>{o, in[1], in[2]};
  };
  for (int64_t t : {1, 2}) {
    for (bool per_row : {true, false}) {
      std::vector<double> keep, slots;
      for (int64_t i = 0; i < t; ++i) {
        slots.push_back(9 + i);
        for (int64_t j = 0; j < 32; ++j) keep.push_back(j <= 9 + i);
      }
      const Shape table = per_row ? Shape{2, 1, t, 32} : Shape{1, 1, 1, 32};
      const std::vector<Tensor> in = {rnd({2, 4, t, 64}),
                                      rnd({2, 2, 32, 64}),
                                      rnd({2, 2, 32, 64}),
                                      to(from_vector(slots, {t}, DType::kInt64), device),
                                      rnd({2, 2, t, 64}),
                                      rnd({2, 2, t, 64}),
                                      to(from_vector(keep, {1, 1, t, 32}, DType::kBool), device),
                                      rnd(table),
                                      rnd(table)};
      const std::string what =
          absl::StrCat("rotated KV append, ", t, " new rows, tables ", ShapeString(table));
      for (CompileOptions o : Modes(device)) {
        o.kv_rope = true;
        CompiledFn f = compile(step, Clones(in), o);
        const std::string graph = f.report(in).final_graph;
        EXPECT_NE(graph.find("scaled_dot_product_attention_0("), std::string::npos) << graph;
        // Both rotations are in the fused node's body (its lines indented further than the
        // plan's own).
        int cats = 0;
        for (absl::string_view line : absl::StrSplit(graph, '\n')) {
          if (line.find(" = cat(") == absl::string_view::npos) continue;
          ++cats;
          EXPECT_FALSE(absl::StartsWith(line, "  %")) << "a rotation outside:\n" << graph;
        }
        EXPECT_EQ(cats, 2) << graph;
        if (!device.is_cuda()) {
          ExpectSameAsEager(step, in, o, what);
          continue;
        }
        std::vector<Tensor> eager_in = Clones(in), ref_in;
        for (const Tensor& x : in) {
          ref_in.push_back(IsFloatingPoint(x.dtype()) ? cast(to(x, kCPU), DType::kFloat32)
                                                      : to(x, kCPU));
        }
        const std::vector<Tensor> eager = step(eager_in), reference = step(ref_in);
        for (int call = 0; call < 3; ++call) {
          std::vector<Tensor> x = Clones(in);
          ExpectWithinPolicy(f(x), eager, reference, absl::StrCat(what, ", call ", call));
        }
      }
    }
  }
}

TEST(CompileSemantics, KvAppendRotaryAttentionOnCpu) { KvAppendRotaryAttention(kCPU); }
TEST(CompileSemantics, KvAppendRotaryAttentionOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  KvAppendRotaryAttention(CUDA(0));
}

// A write through a view of an input (a prefill filling the first rows of a KV cache) runs in
// place: the traced scatter writes the window into the input, with no copy of the whole input and
// no copy back. A source that overlaps the input in part, or a strided input, still gives the
// eager result.
void ScatterIntoInputs(Device device) {
  Generator gen(6);
  const Tensor cache = to(randn({2, 3, 8, 4}, gen), device),
               rows = to(randn({2, 3, 3, 4}, gen), device);
  const Fn write_prefix = [](const std::vector<Tensor>& in) {
    copy_(slice(in[0], 2, 0, 3), in[1]);
    return std::vector<Tensor>{sum(in[0], {2}) + 1.0};
  };
  const Fn shift_rows = [](const std::vector<Tensor>& in) {  // source: rows 1..3 of the cache
    copy_(slice(in[0], 2, 0, 3), slice(in[1], 2, 1, 4));
    return std::vector<Tensor>{in[0] * 2.0};
  };
  const Fn shift_within = [](const std::vector<Tensor>& in) {  // overlaps self in part
    copy_(slice(in[0], 2, 0, 3), slice(in[0], 2, 1, 4));
    return std::vector<Tensor>{in[0] * 2.0};
  };
  for (const CompileOptions& o : Modes(device)) {
    ExpectSameAsEager(write_prefix, {cache, rows}, o, "copy_ into a slice of an input");
    ExpectSameAsEager(shift_within, {cache}, o, "copy_ of an input's rows into its own rows");
    ExpectSameAsEager(write_prefix, {transpose(clone(transpose(cache, 1, 2)), 1, 2), rows}, o,
                      "copy_ into a slice of a strided input");
    for (const bool aliased : {false, true}) {
      Tensor c = clone(cache), eager_c = clone(cache);
      const std::vector<Tensor> want = shift_rows({eager_c, aliased ? eager_c : clone(cache)});
      CompiledFn f = compile(shift_rows, {clone(cache), clone(cache)}, o);
      const std::vector<Tensor> got = f({c, aliased ? c : clone(cache)});
      ExpectEqualTensors(got[0], want[0], absl::StrCat("shifted rows, aliased ", aliased));
      ExpectEqualTensors(c, eager_c, absl::StrCat("shifted cache, aliased ", aliased));
    }
  }
  CompiledFn f = compile(write_prefix, {clone(cache), clone(rows)});
  EXPECT_EQ(InPlaceLines(f, {cache, rows}, "as_strided_scatter"), 1);
  EXPECT_EQ(f.executable({cache, rows}).input_copy_backs(), 0) << "the scatter wrote the input";
}

TEST(CompileSemantics, ScatterIntoInputsOnCpu) { ScatterIntoInputs(kCPU); }
TEST(CompileSemantics, ScatterIntoInputsOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  ScatterIntoInputs(CUDA(0));
}

// Issue #13 item 11: weights changed after compiling are seen, frozen or not.
void WeightsChangedAfterCompile(Device device) {
  for (const bool freeze : {false, true}) {
    Generator gen(3);
    GeGLUMLP mlp(16, 32, gen, {DType::kFloat32, device});
    const Tensor x = to(randn({4, 16}, gen), device);
    CompileOptions o;
    o.freeze_weights = freeze;
    CompiledFn f = compile(mlp, x, o);
    ExpectEqualTensors(f({x})[0], mlp(x), "before the change");
    for (auto& [name, w] : mlp.named_parameters()) {
      if (name.find("gate") != std::string::npos) mul_(w, 2.0);
    }
    ExpectEqualTensors(f({x})[0], mlp(x),
                       absl::StrCat("after mul_ on the gate weight, freeze ", freeze));
    EXPECT_EQ(f.compilations(), freeze ? 2 : 1) << "a frozen plan recompiles once";
  }
}

TEST(CompileSemantics, WeightsAreReadAtCallTimeOnCpu) { WeightsChangedAfterCompile(kCPU); }
TEST(CompileSemantics, WeightsAreReadAtCallTimeOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  WeightsChangedAfterCompile(CUDA(0));
}

// Inputs that alias each other (the same tensor twice, overlapping views of one), one of them
// written in place inside the function: the plan was traced with separate inputs, so such a call
// runs eagerly (counted, one warning) and gives eager's answer; a call without aliasing stays
// compiled.
void AliasedInputs(Device device) {
  const Fn fn = [](const std::vector<Tensor>& in) {
    add_(in[0], 1.0);
    return std::vector<Tensor>{in[0] * in[1]};
  };
  for (const CompileOptions& mode : Modes(device)) {
    CompileOptions o = mode;
    o.mode = CompileOptions::Mode::kCompiled;
    CompiledFn f =
        compile(fn, {ones({3}, DType::kFloat32, device), ones({3}, DType::kFloat32, device)}, o);
    const Tensor x = to(from_vector({1, 2, 3}, {3}), device);
    const Tensor y = to(from_vector({1, 2, 3}, {3}), device);
    ExpectEqualTensors(f({x, x})[0], fn({y, y})[0], "the same tensor twice");
    ExpectEqualTensors(x, y, "the input written in place");
    EXPECT_EQ(f.eager_fallbacks(), 1);
    const Tensor base = to(from_vector({1, 2, 3, 4}, {4}), device);
    const Tensor eager_base = clone(base);
    const Tensor got = f({slice(base, 0, 0, 3), slice(base, 0, 1, 4)})[0];
    const Tensor want = fn({slice(eager_base, 0, 0, 3), slice(eager_base, 0, 1, 4)})[0];
    ExpectEqualTensors(got, want, "overlapping views");  // [2, 6, 9]
    ExpectEqualTensors(base, eager_base, "their base");
    EXPECT_EQ(f.eager_fallbacks(), 2);
    for (int call = 0; call < 2; ++call) {  // separate inputs: the plan (and the graph) again
      const Tensor a = to(from_vector({1, 2, 3}, {3}), device);
      const Tensor b = to(from_vector({4, 5, 6}, {3}), device);
      ExpectEqualTensors(f({a, b})[0], to(from_vector({8, 15, 24}, {3}), device), "separate");
    }
    EXPECT_EQ(f.eager_fallbacks(), 2);
    EXPECT_EQ(f.compilations(), 1);
  }
}

TEST(CompileSemantics, AliasedInputsGiveEagersAnswerOnCpu) { AliasedInputs(kCPU); }
TEST(CompileSemantics, AliasedInputsGiveEagersAnswerOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  AliasedInputs(CUDA(0));
}

// An input written in place that is also a weight the function reads (the caller passed the
// module's own weight): eager reads the new values, so the call runs eagerly.
TEST(CompileSemantics, WrittenInputThatIsACapturedWeightRunsEagerly) {
  const Tensor w = from_vector({1, 2, 3}, {3});
  const Fn fn = [&w](const std::vector<Tensor>& in) {
    mul_(in[0], 2.0);
    return std::vector<Tensor>{in[0] + w};
  };
  CompiledFn f = compile(fn, {ones({3})}, {.mode = CompileOptions::Mode::kCompiled});
  const Tensor got = f({w})[0];
  EXPECT_EQ(to_vector(got), (std::vector<double>{4, 8, 12}));  // eager: w doubled, then w + w
  EXPECT_EQ(to_vector(w), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(f.eager_fallbacks(), 1);
}

// A module whose parameters are replaced after compiling (Module::to swaps them for new
// tensors): the compiled function traces again and computes with the new ones, with and without
// freeze_weights, whether compiled from the module or from a function that calls it.
void ModuleChangedAfterCompile(Device device) {
  for (const bool freeze : {false, true}) {
    for (const bool lambda : {false, true}) {
      Generator g(0);
      Linear lin(4, 1, false, g, {DType::kFloat32, device});
      mul_(lin.named_parameters()[0].second, 0.0);
      add_(lin.named_parameters()[0].second, 1.001);
      const Tensor x = ones({1, 4}, DType::kFloat32, device);
      CompileOptions o;
      o.mode = CompileOptions::Mode::kCompiled;
      o.freeze_weights = freeze;
      CompiledFn f = lambda ? compile(
                                  [&lin](const std::vector<Tensor>& in) {
                                    return std::vector<Tensor>{lin(in[0])};
                                  },
                                  {x}, o)
                            : compile(lin, x, o);
      const std::string what = absl::StrCat("freeze ", freeze, ", lambda ", lambda);
      EXPECT_NEAR(to_vector(f({x})[0])[0], 4.004, 1e-5) << what;
      lin.to(DType::kBFloat16);
      lin.to(DType::kFloat32);  // the weight is now 1.0 (rounded through bf16), a new tensor
      EXPECT_NEAR(to_vector(f({x})[0])[0], 4.0, 1e-6) << what;
      ExpectEqualTensors(f({x})[0], lin(x), what);
      EXPECT_EQ(f.compilations(), 2) << what;
      EXPECT_NE(f.report({x}).recompiled_because.find("was replaced in its module"),
                std::string::npos)
          << f.report({x}).recompiled_because;
    }
  }
}

// Captured tensors are called by their names in the graphs and guard messages: a module's
// parameters by compile(Module&) itself, a function's by the names it is given (a view of a named
// tensor as "<name> (view)"), the rest keep "constN".
TEST(CompileSemantics, CapturedTensorsAreCalledByTheirNames) {
  Generator g(3);
  Linear lin(4, 2, true, g);
  const Tensor x = ones({3, 4});
  CompiledFn from_module = compile(lin, x, {.mode = CompileOptions::Mode::kCompiled});
  const std::string traced = from_module.report({x}).traced_graph;
  EXPECT_NE(traced.find("constant \"weight\" : f32[2, 4]"), std::string::npos) << traced;
  EXPECT_NE(traced.find("constant \"bias\" : f32[2]"), std::string::npos) << traced;

  const Tensor w = randn({4, 4}, g), unnamed = randn({4}, g);
  const Tensor w_row = slice(w, 0, 1, 2);  // a view taken before the trace: a constant of its own
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  o.tensor_names = [&w] { return std::vector<std::pair<std::string, Tensor>>{{"proj.w", w}}; };
  CompiledFn f = compile(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{matmul(in[0], w) + w_row + unnamed};
      },
      {x}, o);
  const std::string graph = f.report({x}).traced_graph;
  EXPECT_NE(graph.find("constant \"proj.w\" : f32[4, 4]"), std::string::npos) << graph;
  EXPECT_NE(graph.find("constant \"proj.w (view)\" : f32[1, 4]"), std::string::npos) << graph;
  EXPECT_NE(graph.find("constant \"const2\" : f32[4]"), std::string::npos) << graph;
  ExpectEqualTensors(f({x})[0], matmul(x, w) + w_row + unnamed, "named constants");

  lin.to(DType::kBFloat16);  // replaces both parameters: the guard names the first it checks
  lin.to(DType::kFloat32);
  from_module({x});
  EXPECT_NE(from_module.report({x}).recompiled_because.find("the captured tensor weight ("),
            std::string::npos)
      << from_module.report({x}).recompiled_because;
  EXPECT_NE(from_module.report({x}).traced_graph.find("constant \"weight\""), std::string::npos)
      << "the retrace names the new parameters too";
}

TEST(CompileSemantics, ModuleChangedAfterCompileRecompilesOnCpu) {
  ModuleChangedAfterCompile(kCPU);
}
TEST(CompileSemantics, ModuleChangedAfterCompileRecompilesOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  ModuleChangedAfterCompile(CUDA(0));
}

// A module moved to another device after compiling: the function's signature is the input's, so
// the moved module's weights make the next call trace again (not compute with the old copies).
TEST(CompileSemantics, ModuleMovedToAnotherDeviceRecompiles) {
  KILN_SKIP_WITHOUT_GPU();
  Generator g(1);
  Linear lin(4, 2, true, g);
  const Tensor x = ones({3, 4});
  CompiledFn f = compile(lin, x, {.mode = CompileOptions::Mode::kCompiled});
  ExpectEqualTensors(f({x})[0], lin(x), "on the CPU");
  lin.to(CUDA(0));
  const Tensor xc = to(x, CUDA(0));
  ExpectEqualTensors(f({xc})[0], lin(xc), "moved to CUDA");
  lin.to(kCPU);
  ExpectEqualTensors(f({x})[0], lin(x), "back on the CPU");
  EXPECT_EQ(f.compilations(), 3);
}

// Issue #13 item 12: an output that is a weight (or a view of one, or a folded constant) is a
// copy: writing it changes neither the weight nor later results.
void OutputsDoNotAliasConstants(Device device) {
  Generator gen(4);
  const Tensor w = to(randn({3, 4}, gen), device);
  const Tensor w_before = clone(w);
  const Fn fn = [w](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{w, transpose(w, 0, 1),
                               triu(ones({4, 4}, DType::kFloat32, w.device())), in[0] + 1.0};
  };
  const Tensor x = to(randn({2}, gen), device);
  for (const CompileOptions& o : Modes(device)) {
    CompiledFn f = compile(fn, {x}, o);
    std::vector<Tensor> first = f({x});
    for (int i = 0; i < 3; ++i) add_(first[i], 5.0);
    const std::vector<Tensor> second = f({x});
    ExpectEqualTensors(w, w_before, "the weight");
    ExpectEqualTensors(second[0], w_before, "a returned weight, after the first was written");
    ExpectEqualTensors(second[1], transpose(w_before, 0, 1), "a returned view of the weight");
    ExpectEqualTensors(second[2], triu(ones({4, 4}, DType::kFloat32, device)), "a folded mask");
  }
}

TEST(CompileSemantics, OutputsDoNotAliasConstantsOnCpu) { OutputsDoNotAliasConstants(kCPU); }
TEST(CompileSemantics, OutputsDoNotAliasConstantsOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  OutputsDoNotAliasConstants(CUDA(0));
}

// Outputs computed apart are returned apart, even when the plan finds them equal (CSE; clamp and
// hardtanh, clone and contiguous of a transposed input canonicalise to one op): a write into one
// never shows in the other, as in eager.
void EqualOutputsStayApart(Device device) {
  Generator gen(5);
  const Fn fn = [](const std::vector<Tensor>& in) {
    const Tensor xt = transpose(in[0], 0, 1);
    return std::vector<Tensor>{
        in[0] + 1.0, in[0] + 1.0,    clamp(in[0], -1.0, 1.0),      hardtanh(in[0]),
        clone(xt),   contiguous(xt), transpose(in[0] * 2.0, 0, 1), in[0] * 2.0};
  };
  const Tensor x = to(randn({3, 4}, gen), device);
  for (const CompileOptions& o : Modes(device)) {
    CompiledFn f = compile(fn, {x}, o);
    const std::vector<Tensor> want = fn({x});
    std::vector<Tensor> got = f({x});
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      for (size_t j = i + 1; j < got.size(); ++j) {
        EXPECT_FALSE(got[i].shares_storage(got[j])) << "outputs " << i << " and " << j;
      }
    }
    for (size_t i = 0; i < got.size(); i += 2) add_(got[i], 100.0);
    for (size_t i = 1; i < got.size(); i += 2) {
      ExpectEqualTensors(got[i], want[i],
                         absl::StrCat("output ", i, " after a write into ", i - 1));
    }
  }
}

// An in-place op whose input partly overlaps self (two slices of one input) raises when compiled
// as it does eagerly, and leaves the caller's tensor as it was.
TEST(CompileSemantics, PartlyOverlappingInPlaceRaisesAsEager) {
  const Fn fn = [](const std::vector<Tensor>& in) {
    add_(slice(in[0], 0, 0, 2), slice(in[0], 0, 1, 3));
    return std::vector<Tensor>{in[0] * 1.0};
  };
  const Tensor x = arange(0, 3, 1, DType::kFloat32);
  ExpectThrowsWith([&] { fn({clone(x)}); }, "refer to the same memory location");
  const Tensor y = clone(x);
  ExpectThrowsWith([&] { compile(fn, {y})({y}); }, "refer to the same memory location");
  ExpectEqualTensors(y, x, "the caller's input");
}

TEST(CompileSemantics, EqualOutputsStayApartOnCpu) { EqualOutputsStayApart(kCPU); }
TEST(CompileSemantics, EqualOutputsStayApartOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  EqualOutputsStayApart(CUDA(0));
}

// A random draw inside the function would be traced as a constant (each call the same numbers,
// where torch.compile draws anew): tracing it raises, naming the op and the way out.
TEST(CompileSemantics, RandomDrawsInsideTheFunctionRaise) {
  Generator gen(6);
  const Tensor x = randn({2, 3}, gen);
  for (bool normal : {true, false}) {
    try {
      CompiledFn f = compile(
          [&gen, normal](const std::vector<Tensor>& in) {
            const Tensor noise = normal ? randn({2, 3}, gen) : rand({2, 3}, gen);
            return std::vector<Tensor>{in[0] + noise};
          },
          {x});
      f({x});
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(normal ? "randn:" : "rand:"), std::string::npos) << m;
      EXPECT_NE(m.find("pass it as an input"), std::string::npos) << m;
    }
  }
  EXPECT_EQ(randn({2}, gen).numel(), 2);  // outside a trace the draw works as before
}

// Naive attention whose constant mask hides every key of a row stays softmax and matmuls when
// compiled (softmax gives NaN there, SDPA zeros): the row is NaN as in eager; a mask hiding no
// whole row still becomes one attention node (on the CPU).
void MaskedRowAttention(Device device) {
  Generator gen(7);
  const auto attention = [](const std::vector<double>& hidden) {
    return [hidden](const std::vector<Tensor>& in) {
      const Tensor hide = to(from_vector(hidden, {3, 4}, DType::kBool), in[0].device());
      const Tensor s = masked_fill(matmul(in[0], transpose(in[1], 0, 1)) * 0.5, hide, -INFINITY);
      return std::vector<Tensor>{matmul(softmax(s, -1), in[2])};
    };
  };
  const std::vector<Tensor> in = {to(randn({3, 8}, gen), device), to(randn({4, 8}, gen), device),
                                  to(randn({4, 8}, gen), device)};
  const Fn whole_row = attention({0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1});
  CompiledFn f = compile(whole_row, in);
  const std::vector<double> got = to_vector(f(in)[0]), want = to_vector(whole_row(in)[0]);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(std::isnan(got[i]), std::isnan(want[i])) << i;
    if (!std::isnan(want[i])) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  }
  EXPECT_TRUE(std::isnan(got[2 * 8])) << "the hidden row";
  EXPECT_NE(absl::StrJoin(f.report(in).explain, "\n").find("hides every key of a row"),
            std::string::npos);
  const Fn no_whole_row = attention({0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1});
  CompiledFn g = compile(no_whole_row, in);
  ExpectClose(to_vector(g(in)[0]), to_vector(no_whole_row(in)[0]), Tolerance{1e-5, 1e-5}, "fused");
  if (device.is_cpu()) {  // (CUDA's flash kernel takes bf16/f16 only: the softmax family fuses)
    EXPECT_NE(g.report(in).final_graph.find("scaled_dot_product_attention"), std::string::npos)
        << g.report(in).final_graph;
  }
}

TEST(CompileSemantics, MaskedRowAttentionIsNaNAsEagerOnCpu) { MaskedRowAttention(kCPU); }
TEST(CompileSemantics, MaskedRowAttentionIsNaNAsEagerOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  MaskedRowAttention(CUDA(0));
}

// An undefined output is refused at compile time, naming the output (not an op input).
TEST(CompileSemantics, AnUndefinedOutputIsRefusedByName) {
  const Fn fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0] + 1.0, Tensor()};
  };
  ExpectThrowsWith([&] { compile(fn, {ones({2})}); },
                   "output 1 of the function is an undefined Tensor");
}

// A compiled module outliving its module raises on every call.
TEST(CompileSemantics, DestroyedModuleIsAnError) {
  Generator gen(5);
  auto mlp = std::make_unique<GeGLUMLP>(8, 16, gen);
  const Tensor x = randn({2, 8}, gen);
  CompileOptions o;
  o.dynamic = CompileOptions::Dynamic::kNone;
  CompiledFn f = compile(*mlp, x, o);
  mlp.reset();
  // A new signature (it would retrace) and the one compiled (its plan holds the old weights).
  for (const Tensor& in : {randn({3, 8}, gen), x}) {
    try {
      f({in});
      FAIL() << "no error at " << in.shape_string();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has been destroyed"), std::string::npos) << e.what();
    }
  }
}

// An in-place write to a tensor the function did not receive (a weight) is refused, not lost.
// An in-place write to a tensor the function captured (not an input) lands in that tensor, as
// eagerly; with freeze_weights (the plan may fold captured tensors) it is refused, saying so.
TEST(CompileSemantics, InPlaceOnACapturedTensorLandsInIt) {
  Generator gen(6);
  const Tensor w = randn({4}, gen), w_eager = clone(w);
  const Tensor x = randn({4}, gen);
  auto make = [](const Tensor& buffer) -> Fn {
    return [buffer](const std::vector<Tensor>& in) {
      add_(buffer, 1.0);
      return std::vector<Tensor>{in[0] + buffer};
    };
  };
  CompiledFn f = compile(make(w), {x}, {.mode = CompileOptions::Mode::kCompiled});
  for (int call = 0; call < 3; ++call) {
    const Tensor want = make(w_eager)({x})[0];
    ExpectEqualTensors(f({x})[0], want, absl::StrCat("call ", call));
    ExpectEqualTensors(w, w_eager, absl::StrCat("the captured tensor after call ", call));
  }
  EXPECT_EQ(f.compilations(), 1);
  try {
    compile(make(w), {x}, {.mode = CompileOptions::Mode::kCompiled, .freeze_weights = true});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("freeze_weights"), std::string::npos) << e.what();
  }
}

// A KV cache kept by the model (captured, not an input) and written in place by each decode
// step: 100 calls compile once, and the cache holds what eager writes (plain and CUDA graphs).
void CapturedKvCache(Device device) {
  for (const CompileOptions& mode : Modes(device)) {
    Generator gen(7);
    const Tensor cache = zeros({1, 2, 8, 4}, DType::kFloat32, device);
    const Tensor eager_cache = clone(cache);
    auto step = [](const Tensor& kv) -> Fn {
      return [kv](const std::vector<Tensor>& in) {  // in: the new row [1, 2, 1, 4], pos [1]
        index_copy_(kv, 2, in[1], in[0]);
        return std::vector<Tensor>{sum(kv * 0.5, {2})};
      };
    };
    CompileOptions o = mode;
    o.mode = CompileOptions::Mode::kCompiled;
    const Tensor pos0 = to(from_vector({0}, {1}, DType::kInt64), device);
    CompiledFn f = compile(step(cache), {to(randn({1, 2, 1, 4}, gen), device), pos0}, o);
    for (int call = 0; call < 100; ++call) {
      const Tensor row = to(randn({1, 2, 1, 4}, gen), device);
      const Tensor pos = to(from_vector({double(call % 8)}, {1}, DType::kInt64), device);
      const Tensor got = f({row, pos})[0];
      const Tensor want = step(eager_cache)({row, pos})[0];
      if (call % 25 == 0 || call == 99) {
        ExpectEqualTensors(got, want, absl::StrCat("call ", call));
        ExpectEqualTensors(cache, eager_cache, absl::StrCat("cache after call ", call));
      }
    }
    EXPECT_EQ(f.compilations(), 1);
    EXPECT_EQ(f.eager_fallbacks(), 0);
  }
}

TEST(CompileSemantics, CapturedKvCacheWrittenInPlaceCompilesOnceOnCpu) { CapturedKvCache(kCPU); }
TEST(CompileSemantics, CapturedKvCacheWrittenInPlaceCompilesOnceOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  CapturedKvCache(CUDA(0));
}

// A tensor the function makes (zeros, ones, full) and then writes in place, wholly or through a
// view, read before the write too: every call starts from the factory's values, as eagerly (a
// compiled call once kept the last call's sums, and dropped writes through views).
void TensorsMadeInsideStartAfresh(Device device) {
  const Fn fn = [device](const std::vector<Tensor>& in) {
    const Tensor acc = zeros({4}, DType::kFloat32, device);
    const Tensor before = acc + 1.0;
    add_(acc, in[0]);
    const Tensor padded = ones({6}, DType::kFloat32, device);
    copy_(slice(padded, 0, 1, 5), in[0]);
    const Tensor grid = full({4, 4}, 2.0, DType::kFloat32, device);
    mul_(select(transpose(grid, 0, 1), 0, 1), in[0]);
    return std::vector<Tensor>{acc, before, padded * 1.0, grid};
  };
  for (const CompileOptions& mode : Modes(device)) {
    CompileOptions o = mode;
    o.mode = CompileOptions::Mode::kCompiled;
    Generator gen(11);
    std::optional<CompiledFn> f;
    for (int call = 0; call < 3; ++call) {
      const Tensor x = to(randn({4}, gen), device);
      if (!f) f.emplace(compile(fn, {x}, o));
      const std::vector<Tensor> got = (*f)({x}), want = fn({x});
      for (size_t k = 0; k < want.size(); ++k) {
        ExpectEqualTensors(got[k], want[k], absl::StrCat("call ", call, " output ", k));
      }
    }
    EXPECT_EQ(f->compilations(), 1);
    EXPECT_EQ(f->eager_fallbacks(), 0);
  }
}

TEST(CompileSemantics, TensorsMadeInsideStartAfreshOnCpu) { TensorsMadeInsideStartAfresh(kCPU); }
TEST(CompileSemantics, TensorsMadeInsideStartAfreshOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  TensorsMadeInsideStartAfresh(CUDA(0));
}

// Writes through views (narrow, select, a strided slice) of a captured tensor land in it, as
// eagerly: a compiled call once wrote a copy of the view and left the tensor as it was.
void WritesThroughViewsOfACapturedTensor(Device device) {
  for (const CompileOptions& mode : Modes(device)) {
    const Tensor cache = zeros({4, 2}, DType::kFloat32, device), eager_cache = clone(cache);
    auto step = [](const Tensor& c) -> Fn {
      return [c](const std::vector<Tensor>& in) {
        copy_(narrow(c, 0, 1, 1), in[0]);
        add_(select(c, 0, 2), 1.0);
        mul_(slice(c, 0, 0, 4, 3), 0.5);
        return std::vector<Tensor>{c * 1.0};
      };
    };
    CompileOptions o = mode;
    o.mode = CompileOptions::Mode::kCompiled;
    Generator gen(12);
    std::optional<CompiledFn> f;
    for (int call = 0; call < 3; ++call) {
      const Tensor row = to(randn({1, 2}, gen), device);
      if (!f) f.emplace(compile(step(cache), {row}, o));
      ExpectEqualTensors((*f)({row})[0], step(eager_cache)({row})[0], absl::StrCat("call ", call));
      ExpectEqualTensors(cache, eager_cache, absl::StrCat("the cache after call ", call));
    }
    EXPECT_EQ(f->compilations(), 1);
  }
}

TEST(CompileSemantics, WritesThroughViewsOfACapturedTensorLandInItOnCpu) {
  WritesThroughViewsOfACapturedTensor(kCPU);
}
TEST(CompileSemantics, WritesThroughViewsOfACapturedTensorLandInItOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  WritesThroughViewsOfACapturedTensor(CUDA(0));
}

// A tensor the function computes, a window of it written in place, both returned: the compiled
// call returns the window as a view of the other output, as eagerly (it returned two tensors of
// their own, so a later write through one missed the other).
void OutputsWrittenThroughEachOther(Device device) {
  const Fn fn = [](const std::vector<Tensor>& in) {
    const Tensor y = in[0] + 1.0;
    const Tensor head = slice(y, 0, 0, 2);
    mul_(head, 10.0);
    return std::vector<Tensor>{y, head, select(y, 0, 3)};
  };
  for (const CompileOptions& mode : Modes(device)) {
    CompileOptions o = mode;
    o.mode = CompileOptions::Mode::kCompiled;
    const Tensor x = to(reshape(arange(12, DType::kFloat32), {4, 3}), device);
    CompiledFn f = compile(fn, {x}, o);
    for (int call = 0; call < 2; ++call) {
      const std::vector<Tensor> got = f({x}), want = fn({x});
      for (size_t k = 0; k < want.size(); ++k) {
        ExpectEqualTensors(got[k], want[k], absl::StrCat("call ", call, " output ", k));
        EXPECT_TRUE(got[k].shares_storage(got[0])) << "output " << k;
      }
      add_(got[0], 1.0);  // reaches the windows, as eagerly
      add_(want[0], 1.0);
      ExpectEqualTensors(got[1], want[1], "the window after a write through the whole");
      ExpectEqualTensors(got[2], want[2], "the row after a write through the whole");
    }
  }
}

TEST(CompileSemantics, OutputsWrittenThroughEachOtherStayViewsOnCpu) {
  OutputsWrittenThroughEachOther(kCPU);
}
TEST(CompileSemantics, OutputsWrittenThroughEachOtherStayViewsOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  OutputsWrittenThroughEachOther(CUDA(0));
}

// A tensor the function makes, writes and keeps past the call (a lazily made buffer) is refused:
// eager's writes would persist in it, a compiled call's would not.
TEST(CompileSemantics, AWrittenTensorMadeInsideAndKeptIsRefused) {
  Tensor kept;
  const Fn fn = [&kept](const std::vector<Tensor>& in) {
    kept = zeros({4});
    add_(kept, in[0]);
    return std::vector<Tensor>{in[0] * 2.0};
  };
  try {
    compile(fn, {ones({4})}, {.mode = CompileOptions::Mode::kCompiled});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("keeps it past the call"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float32[4]"), std::string::npos) << e.what();
  }
}

// Issue #13 item 7b: one CompiledFn called from several threads with new signatures at once.
void ThreadedCalls(Device device) {
  const Fn fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{gelu(in[0] * 1.5 + 0.5, "tanh") * softmax(in[0], -1)};
  };
  CompileOptions o;
  o.dynamic = CompileOptions::Dynamic::kNone;  // every row count its own signature
  o.max_signatures = 64;
  CompiledFn f(fn, o);
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Generator gen(100 + t);
      for (int i = 0; i < 25; ++i) {
        const Tensor x = to(randn({1 + (i + t) % 6, 8}, gen), device);
        const std::vector<double> got = to_vector(f({x})[0]), want = to_vector(fn({x})[0]);
        for (size_t k = 0; k < got.size(); ++k) bad[t] += std::abs(got[k] - want[k]) > 1e-4;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
  EXPECT_LE(f.compilations(), 6);
}

TEST(CompileSemantics, ThreadsShareOneCompiledFnOnCpu) { ThreadedCalls(kCPU); }
TEST(CompileSemantics, ThreadsShareOneCompiledFnOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  ThreadedCalls(CUDA(0));
}

}  // namespace
}  // namespace kiln
