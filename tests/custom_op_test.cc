// Custom ops (ops/custom_op.h): registration refusals, one rule each; the CPU reference eagerly,
// through its strided inputs, under the profiler and in threads; traced into a compiled function
// as an opaque node that fusion stops at (IR CHECK lines, the explain line), its text parsed
// back. On a GPU: the kernel from source, from a CUBIN image and from a kernel package, checked
// against the CPU reference and named by CUPTI; inside a compiled model (kernel count) and its
// CUDA graph; launches that do not match the kernel refused with both sides named.
#include "ops/custom_op.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/compile.h"
#include "io/kernel_package.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "profiler/profiler.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "tests/filecheck.h"
#include "tests/io_test_util.h"
#include "tests/kernel_test_util.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

// y = 2·x² over float32, the kernel under test.
constexpr const char* kSquareSource = R"(
extern "C" __global__ void kiln_test_scaled_square(const float* x, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i] * x[i];
}
)";

absl::StatusOr<TensorType> SameFloat32(absl::Span<const TensorType> in) {
  if (in[0].dtype != DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat("expects float32, got ", DTypeName(in[0].dtype)));
  }
  return in[0];
}

CustomLaunch SquareLaunch(absl::Span<const Tensor> in, const Tensor& out) {
  CustomLaunch l;
  l.grid[0] = static_cast<unsigned>((out.numel() + 255) / 256);
  l.block[0] = 256;
  l.args.Add(in[0]).Add(out).Add<long long>(out.numel());
  return l;
}

void SquareCpu(absl::Span<const Tensor> in, const Tensor& out) {
  EXPECT_TRUE(in[0].is_contiguous());
  const float* x = in[0].data<float>();
  float* y = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) y[i] = 2.0f * x[i] * x[i];
}

CustomOpSpec SquareSpec(const std::string& name) {
  CustomOpSpec s;
  s.name = name;
  s.entry = "kiln_test_scaled_square";
  s.source = kSquareSource;
  s.infer = SameFloat32;
  s.launch = SquareLaunch;
  s.cpu = SquareCpu;
  return s;
}

// Registered once per process (tests may repeat in one process).
CustomOp Registered(CustomOpSpec spec) {
  if (std::optional<CustomOp> op = FindCustomOp(spec.name)) return *op;
  return RegisterCustomOp(std::move(spec));
}

CustomOp Square() { return Registered(SquareSpec("scaled_square")); }

// 2·x·x in float, as the kernel computes it (2·x is exact: one rounding).
std::vector<double> SquareOf(const Tensor& x) {
  std::vector<double> v = to_vector(x);
  for (double& e : v) e = 2.0f * static_cast<float>(e) * static_cast<float>(e);
  return v;
}

TEST(CustomOp, RefusesABadSpecNamingTheRule) {
  auto with = [](auto edit) {
    CustomOpSpec s = SquareSpec("valid_name");
    edit(s);
    return s;
  };
  ExpectThrowsWith([&] { RegisterCustomOp(with([](CustomOpSpec& s) { s.name = "2x"; })); },
                   "'2x' is not an identifier");
  ExpectThrowsWith([&] { RegisterCustomOp(with([](CustomOpSpec& s) { s.name = "a-b"; })); },
                   "'a-b' is not an identifier");
  ExpectThrowsWith(
      [&] { RegisterCustomOp(with([](CustomOpSpec& s) { s.name = std::string(65, 'a'); })); },
      "at most 64 characters");
  for (const char* taken : {"add", "softmax", "constant", "fusion"}) {
    ExpectThrowsWith([&] { RegisterCustomOp(with([&](CustomOpSpec& s) { s.name = taken; })); },
                     absl::StrCat("custom op '", taken, "'"), "the name is taken");
  }
  Square();
  ExpectThrowsWith([&] { RegisterCustomOp(SquareSpec("scaled_square")); }, "the name is taken");
  ExpectThrowsWith([&] { RegisterCustomOp(with([](CustomOpSpec& s) { s.num_inputs = 0; })); },
                   "num_inputs is 0 (1..8)");
  ExpectThrowsWith([&] { RegisterCustomOp(with([](CustomOpSpec& s) { s.num_inputs = 9; })); },
                   "num_inputs is 9 (1..8)");
  ExpectThrowsWith([&] { RegisterCustomOp(with([](CustomOpSpec& s) { s.image = "x"; })); },
                   "exactly one of source, image and kernel (got 2)");
  ExpectThrowsWith([&] { RegisterCustomOp(with([](CustomOpSpec& s) { s.source.clear(); })); },
                   "exactly one of source, image and kernel (got 0)");
  ExpectThrowsWith([&] { RegisterCustomOp(with([](CustomOpSpec& s) { s.entry.clear(); })); },
                   "no entry");
  ExpectThrowsWith([&] { RegisterCustomOp(with([](CustomOpSpec& s) { s.infer = nullptr; })); },
                   "no infer function");
  ExpectThrowsWith([&] { RegisterCustomOp(with([](CustomOpSpec& s) { s.launch = nullptr; })); },
                   "no launch function");
  EXPECT_FALSE(FindCustomOp("valid_name").has_value());  // nothing refused was registered
}

TEST(CustomOp, RunsItsCpuReferenceLikeAnyOp) {
  const CustomOp op = Square();
  EXPECT_STREQ(op.name(), "scaled_square");
  EXPECT_EQ(FindCustomOp("scaled_square")->id(), op.id());
  EXPECT_EQ(FindOpDef("scaled_square"), &GetOpDef(op.id()));
  EXPECT_EQ(GetOpDef(op.id()).kind, FusionKind::kOpaque);
  const Tensor x = reshape(arange(-6, 6, 1, DType::kFloat32), {3, 4});
  EXPECT_EQ(to_vector(op({x})), SquareOf(x));
  // A strided operand reaches the kernel contiguous (SquareCpu checks), read in its logical order.
  const Tensor xt = transpose(x, 0, 1);
  EXPECT_EQ(to_vector(op({xt})), SquareOf(xt));
  EXPECT_EQ(op({xt}).shape(), (Shape{4, 3}));
  // Bad calls name the op and the rule.
  ExpectThrowsWith([&] { op({to(x, DType::kFloat16)}); }, "scaled_square: expects float32",
                   "float16[3, 4]");
  ExpectThrowsWith([&] { op({x, x}); }, "scaled_square", "expected 1 inputs, got 2");
  ExpectThrowsWith([&] { op({Tensor()}); }, "scaled_square", "undefined");
}

TEST(CustomOp, WithoutACpuKernelSaysToRunItOnCuda) {
  CustomOpSpec s = SquareSpec("square_gpu_only");
  s.cpu = nullptr;
  const CustomOp op = Registered(std::move(s));
  ExpectThrowsWith([&] { op({ones({4})}); }, "custom op 'square_gpu_only'",
                   "no CPU kernel was registered", "run it on CUDA tensors");
}

TEST(CustomOp, AnErrorOfTheUsersFunctionNamesTheOp) {
  CustomOpSpec s = SquareSpec("square_cpu_throws");
  s.cpu = [](absl::Span<const Tensor>, const Tensor&) { KILN_FAIL("unsupported layout"); };
  const CustomOp op = Registered(std::move(s));
  ExpectThrowsWith([&] { op({ones({4})}); }, "custom op 'square_cpu_throws'",
                   "its cpu function failed: unsupported layout");
  CustomOpSpec t = SquareSpec("square_infer_throws");
  t.infer = [](absl::Span<const TensorType>) -> absl::StatusOr<TensorType> {
    KILN_FAIL("rank 3 only");
  };
  const CustomOp bad = Registered(std::move(t));
  ExpectThrowsWith([&] { bad({ones({4})}); }, "square_infer_throws: rank 3 only", "float32[4]");
}

TEST(CustomOp, TheProfilerNamesItsRange) {
  const CustomOp op = Square();
  profiler::ProfilerOptions o;
  o.device = false;
  o.active = 1;
  profiler::Profiler p(std::move(o));
  p.Start();
  op({ones({8})});
  p.Step();
  const profiler::ProfileResult r = p.Stop();
  int named = 0;
  for (const profiler::HostEvent& e : r.host) named += std::string(e.name) == "scaled_square";
  EXPECT_EQ(named, 1);
}

TEST(CustomOp, ThreadsRegisterAndCallAtOnce) {
  constexpr int kThreads = 6;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &ok] {
      const CustomOp op = Registered(SquareSpec(absl::StrCat("square_thread_", t)));
      const Tensor x = full({16}, t, DType::kFloat32);
      bool same = true;
      for (int i = 0; i < 50; ++i) same = same && to_vector(op({x})) == SquareOf(x);
      ok += same && FindCustomOp(absl::StrCat("square_thread_", t))->id() == op.id();
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(ok, kThreads);
}

constexpr Tolerance kFusedFloat{1e-5, 1e-5};

// x -> x·1.5 + 0.5 -> scaled_square -> gelu + 1: two fused groups around the custom op.
std::vector<Tensor> AroundSquare(const std::vector<Tensor>& in) {
  return {add(gelu(Square()({mul(in[0], 1.5) + 0.5})), 1.0)};
}

void ExpectFusionStopsAtTheCustomOp(const CompileReport& r) {
  EXPECT_TRUE(FileCheck(r.final_graph, R"(
    CHECK:     fusion
    CHECK:     %[[SQ:[0-9]+]] = scaled_square(%
    CHECK:     fusion
    CHECK-SAME: (%[[SQ]])
    CHECK-NOT: scaled_square
  )"));
  bool explained = false;
  for (const std::string& line : r.explain) {
    explained |= line.find("(scaled_square) into the group of") != std::string::npos &&
                 line.find("opaque boundary") != std::string::npos;
  }
  EXPECT_TRUE(explained) << absl::StrJoin(r.explain, "\n");
}

TEST(CustomOp, CompiledItIsAnOpaqueNodeFusionStopsAt) {
  const Tensor x = reshape(arange(-8, 8, 0.25, DType::kFloat32), {8, 8});
  const CompiledFn f = compile(AroundSquare, {x}, {.mode = CompileOptions::Mode::kCompiled});
  // The fused groups compute in float without rounding between ops: close to eager, not equal.
  ExpectClose(to_vector(f({x})[0]), to_vector(AroundSquare({x})[0]), kFusedFloat, "compiled");
  const CompileReport& r = f.report({x});
  EXPECT_TRUE(FileCheck(r.traced_graph, "CHECK: scaled_square(%"));
  ExpectFusionStopsAtTheCustomOp(r);
  // The IR text names it and parses back (the registry finds custom ops by name).
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(r.traced_graph);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(ir::PrintGraph(*g), r.traced_graph);
  EXPECT_FALSE(ir::ParseGraph("graph(%0: f32[4]) {\n  %1 = scaled_square(%0) {dim=1}\n"
                              "  return %1\n}\n")
                   .ok());
}

// ---- On a GPU ----------------------------------------------------------------------------

Tensor RandomCuda(IntList shape, uint64_t seed) {
  Generator gen(seed);
  return to(randn(shape, gen), CUDA(0));
}

TEST(CustomOpOnGpu, KernelFromSourceMatchesTheCpuReference) {
  KILN_SKIP_WITHOUT_GPU();
  const CustomOp op = Square();
  for (int64_t n : {1, 255, 256, 1000, 100003}) {
    const Tensor x = RandomCuda({n}, n);
    EXPECT_EQ(to_vector(op({x})), SquareOf(x)) << n;
  }
  const Tensor x = RandomCuda({64, 48}, 7);
  EXPECT_EQ(to_vector(op({transpose(x, 0, 1)})), SquareOf(transpose(x, 0, 1)));
  const std::vector<std::string> names = KernelNames([&] { op({x}); });
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0], "kiln_test_scaled_square");
}

TEST(CustomOpOnGpu, KernelFromAnImageOrAPackage) {
  KILN_SKIP_WITHOUT_GPU();
  const cuda::DeviceProps& p = cuda::Props();
  const std::string arch = absl::StrCat("sm_", p.major, p.minor);
  CustomOpSpec from_image = SquareSpec("square_from_cubin");
  from_image.source.clear();
  from_image.image = ValueOrThrow(cuda::CompileSource(kSquareSource, "square", arch, true));
  const Tensor x = RandomCuda({3000}, 3);
  EXPECT_EQ(to_vector(Registered(std::move(from_image))({x})), SquareOf(x));

  const std::string dir = TempPath("custom_op_pkg");
  std::filesystem::remove_all(dir);
  BuildKernelPackage(dir, "squares", "2.0.1",
                     {{"square", "kiln_test_scaled_square", kSquareSource, {8, 8, 8}}}, {arch});
  static const KernelPackage pkg = KernelPackage::Load(dir, "2");  // kernels outlive the op
  CustomOpSpec from_package = SquareSpec("square_from_package");
  ExpectThrowsWith([&] { pkg.RegisterOp("square", from_package); },
                   "the op 'square_from_package' takes the package's kernel 'square'");
  from_package.source.clear();
  from_package.entry.clear();
  std::optional<CustomOp> packaged = FindCustomOp("square_from_package");
  if (!packaged) packaged = pkg.RegisterOp("square", std::move(from_package));
  EXPECT_EQ(to_vector((*packaged)({x})), SquareOf(x));
}

TEST(CustomOpOnGpu, ALaunchThatDoesNotFitTheKernelIsRefused) {
  KILN_SKIP_WITHOUT_GPU();
  CustomOpSpec two_args = SquareSpec("square_two_args");
  two_args.launch = [](absl::Span<const Tensor> in, const Tensor& out) {
    CustomLaunch l = SquareLaunch(in, out);
    l.args = KernelArgs().Add(in[0]).Add(out);
    return l;
  };
  CustomOpSpec int_count = SquareSpec("square_int_count");
  int_count.launch = [](absl::Span<const Tensor> in, const Tensor& out) {
    CustomLaunch l = SquareLaunch(in, out);
    l.args = KernelArgs().Add(in[0]).Add(out).Add<int>(static_cast<int>(out.numel()));
    return l;
  };
  CustomOpSpec big_block = SquareSpec("square_big_block");
  big_block.launch = [](absl::Span<const Tensor> in, const Tensor& out) {
    CustomLaunch l = SquareLaunch(in, out);
    l.block = {64, 32, 1};
    return l;
  };
  CustomOpSpec no_entry = SquareSpec("square_no_entry");
  no_entry.entry = "not_there";
  const Tensor x = RandomCuda({100}, 1);
  ExpectThrowsWith([&] { Registered(std::move(two_args))({x}); }, "custom op 'square_two_args'",
                   "passes 2 arguments (8, 8 bytes)",
                   "'kiln_test_scaled_square' takes 3 (8, 8, 8 bytes)");
  ExpectThrowsWith([&] { Registered(std::move(int_count))({x}); }, "(8, 8, 4 bytes)");
  ExpectThrowsWith([&] { Registered(std::move(big_block))({x}); }, "2048 threads (at most 1024)");
  ExpectThrowsWith([&] { Registered(std::move(no_entry))({x}); }, "custom op 'square_no_entry'",
                   "loading kernel 'not_there'");
  EXPECT_EQ(to_vector(Square()({x})), SquareOf(x));  // nothing was left broken
}

TEST(CustomOpOnGpu, RunsInACompiledModelAndItsCudaGraph) {
  KILN_SKIP_WITHOUT_GPU();
  const Tensor x = RandomCuda({64, 96}, 11);
  const std::vector<double> eager = to_vector(AroundSquare({x})[0]);
  CompileOptions o{.mode = CompileOptions::Mode::kCompiled};
  const CompiledFn f = compile(AroundSquare, {x}, o);
  ExpectClose(to_vector(f({x})[0]), eager, kFusedFloat, "compiled");
  const CompileReport& r = f.report({x});
  ExpectFusionStopsAtTheCustomOp(r);
  EXPECT_EQ(r.kernels_per_step, 3);  // fused, the custom kernel, fused
  const std::vector<std::string> names = KernelNames([&] { f({x}); });
  EXPECT_EQ(names.size(), 3u);
  EXPECT_EQ(std::count(names.begin(), names.end(), "kiln_test_scaled_square"), 1);

  o.cuda_graphs = true;
  const CompiledFn g = compile(AroundSquare, {x}, o);
  for (int call = 0; call < 3; ++call) {
    ExpectClose(to_vector(g({x})[0]), eager, kFusedFloat, absl::StrCat("graph call ", call));
  }
  EXPECT_EQ(g.report({x}).cuda_graph.rfind("on: ", 0), 0u) << g.report({x}).cuda_graph;
  const Tensor y = RandomCuda({64, 96}, 12);  // the graph reads new inputs
  ExpectClose(to_vector(g({y})[0]), to_vector(AroundSquare({y})[0]), kFusedFloat, "new input");
}

}  // namespace
}  // namespace kiln
