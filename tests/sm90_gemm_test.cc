// sm90_gemm_test: the GEMM family's Hopper kernel (codegen/families/gemm/): every config compiles
// for sm_90a with NVRTC without spilling (no GPU needed), and on an sm_90 GPU the kernel's linear
// matches the CPU linear on the same values: m, n, k off the tiles (k = 768 and 3072 among them),
// every tile width, one and two consumer warpgroups (sharing tiles or ping-pong), bias or not,
// GeGLU, the epilogue programs of linear's epilogues (relu, tanh GELU, a residual), bf16 and f16,
// rows strided in memory; the operands and programs it refuses are refused with the rule named. GPU
// cases skip without an sm_90 GPU (KILN_REQUIRE_GPU=1 makes a missing GPU fail).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/compile.h"
#include "codegen/families/gemm/gemm_cuda.h"
#include "codegen/families/gemm/gemm_source.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "profiler/profiler.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "runtime/status.h"
#include "tests/kernel_test_util.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

using cuda_ops::GemmConfig;

std::vector<GemmConfig> AllConfigs() {
  std::vector<GemmConfig> all;
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    for (int bn : {128, 192, 256}) {
      for (int consumers : {1, 2}) {
        for (bool pingpong : {false, true}) {
          if (pingpong && consumers != 2) continue;
          for (bool bias : {false, true}) {
            for (bool geglu : {false, true}) {
              if (geglu && bn == 192) continue;
              GemmConfig c{.dtype = t,
                           .bn = bn,
                           .consumers = consumers,
                           .pingpong = pingpong,
                           .bias = bias,
                           .geglu = geglu};
              c.stages = std::min(8, c.MostStages());
              all.push_back(c);
            }
          }
        }
      }
    }
  }
  return all;
}

// Linear's epilogues as programs, beside AllConfigs' defaults: relu and tanh GELU after the bias,
// and a residual with or without one, over every width in both consumer forms (bf16), and the
// widest tile's residual in f16.
std::vector<GemmConfig> EpilogueConfigs() {
  std::vector<GemmConfig> all;
  auto add = [&](DType t, int bn, bool pingpong, bool bias, bool residual, Epilogue e) {
    GemmConfig c{.dtype = t, .bn = bn, .pingpong = pingpong, .bias = bias, .residual = residual};
    c.stages = std::min(8, c.MostStages());
    if (e != Epilogue::kNone) c.epilogue = cuda_ops::Sm90LinearEpilogue(c, e);
    all.push_back(c);
  };
  for (int bn : {128, 192, 256}) {
    for (bool pingpong : {false, true}) {
      add(DType::kBFloat16, bn, pingpong, true, false, Epilogue::kRelu);
      add(DType::kBFloat16, bn, pingpong, true, false, Epilogue::kGeluTanh);
      add(DType::kBFloat16, bn, pingpong, true, true, Epilogue::kNone);
    }
  }
  add(DType::kBFloat16, 256, false, false, true, Epilogue::kNone);
  add(DType::kFloat16, 256, false, true, true, Epilogue::kNone);
  add(DType::kFloat16, 128, true, false, false, Epilogue::kGeluTanh);
  return all;
}

// Every config the tests run: AllConfigs, then EpilogueConfigs.
std::vector<GemmConfig> EveryConfig() {
  std::vector<GemmConfig> all = AllConfigs(), more = EpilogueConfigs();
  all.insert(all.end(), more.begin(), more.end());
  return all;
}

TEST(GemmSource, EveryConfigCompilesForSm90aWithoutSpills) {
  KILN_SKIP_WITHOUT_NVRTC();
  for (const GemmConfig& c : EveryConfig()) {
    std::string log;
    auto cubin = CompileForReport(cuda_ops::RenderGemmSource(c), c.Name(), "sm_90a", &log);
    ASSERT_TRUE(cubin.ok()) << c.Name() << ": " << cubin.status().message().substr(0, 4000);
    EXPECT_EQ(SpillBytes(log), 0) << c.Name() << ":\n" << log;
    EXPECT_NE(log.find(c.Name()), std::string::npos) << log;
  }
}

// Kernels are cached by name: two configs with one name would launch each other's kernel.
TEST(GemmSource, EveryConfigHasItsOwnName) {
  std::set<std::string> names;
  for (const GemmConfig& c : EveryConfig()) EXPECT_TRUE(names.insert(c.Name()).second) << c.Name();
}

// The epilogue is a kernel-IR program: the default one reads the accumulators, biases and
// residual in the documented order, and it is rendered into the kernel.
TEST(GemmSource, EpilogueIsAKernelIrProgram) {
  GemmConfig geglu{.bn = 128, .bias = true, .geglu = true};
  EXPECT_EQ(cuda_ops::GemmDefaultEpilogue(geglu).ToString(),
            "%0 = load in0 : float32\n"
            "%1 = load in2 : bfloat16\n"
            "%2 = add(%0, %1) : float32\n"
            "%3 = load in1 : float32\n"
            "%4 = load in3 : bfloat16\n"
            "%5 = add(%3, %4) : float32\n"
            "%6 = gelu(%2) {approximate=tanh} : float32\n"
            "%7 = mul(%6, %5) : float32\n"
            "store out0 = %7 : bfloat16\n");
  GemmConfig res{.bn = 128, .residual = true};
  EXPECT_EQ(cuda_ops::GemmDefaultEpilogue(res).ToString(),
            "%0 = load in0 : float32\n"
            "%1 = load in1 : bfloat16\n"
            "%2 = add(%0, %1) : float32\n"
            "store out0 = %2 : bfloat16\n");
  GemmConfig relu{.bn = 128, .bias = true};
  relu.epilogue = cuda_ops::Sm90LinearEpilogue(relu, Epilogue::kRelu);
  const std::string source = cuda_ops::RenderGemmSource(relu);
  // The bias is read as stored and converted once.
  EXPECT_NE(source.find("= kiln_bf16_to_f(kiln_half(bias2[jo], e));"), std::string::npos);
  EXPECT_NE(relu.Name().find("_bias_ep"), std::string::npos) << relu.Name();
  // The default program, given explicitly, names the same kernel.
  GemmConfig explicit_default = res;
  explicit_default.epilogue = cuda_ops::GemmDefaultEpilogue(res);
  EXPECT_EQ(explicit_default.Name(), res.Name());
}

TEST(GemmSource, EpilogueProgramsNotOfTheConfigAreRefused) {
  GemmConfig c{.bn = 128, .bias = true};
  kir::Program one_input({DType::kFloat32});  // the bias is missing
  one_input.Store(one_input.Load(0), DType::kBFloat16);
  c.epilogue = one_input;
  try {
    cuda_ops::RenderGemmSource(c);
    ADD_FAILURE() << "an epilogue without the bias rendered";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must read 2 inputs"), std::string::npos) << e.what();
  }
  kir::Program f32_out({DType::kFloat32, DType::kBFloat16});
  f32_out.Store(f32_out.Load(0), DType::kFloat32);  // not the config's dtype
  c.epilogue = f32_out;
  EXPECT_THROW(cuda_ops::RenderGemmSource(c), Error);
}

TEST(GemmSource, ConfigsOutsideTheRangesAreRefused) {
  GemmConfig too_many_stages{.bn = 256, .consumers = 2, .stages = 4};
  EXPECT_THROW(cuda_ops::RenderGemmSource(too_many_stages), Error);
  GemmConfig f32{.dtype = DType::kFloat32};
  EXPECT_THROW(cuda_ops::RenderGemmSource(f32), Error);
  GemmConfig odd_width{.bn = 96};
  EXPECT_THROW(cuda_ops::RenderGemmSource(odd_width), Error);
  GemmConfig lone_pingpong{.bn = 128, .consumers = 1, .pingpong = true};
  EXPECT_THROW(cuda_ops::RenderGemmSource(lone_pingpong), Error);
}

bool HaveSm90() {
  if (!cuda::IsAvailable()) return false;
  const cuda::DeviceProps& p = cuda::Props(0);
  return p.major == 9 && p.minor == 0;
}

#define SKIP_WITHOUT_SM90()                                                          \
  do {                                                                               \
    KILN_SKIP_WITHOUT_GPU();                                                         \
    if (!HaveSm90()) GTEST_SKIP() << "the sm_90a GEMM needs compute capability 9.0"; \
  } while (0)

// The CPU linear of the same (already rounded) values, in float32.
Tensor CpuReference(const Tensor& x, const Tensor& w, const Tensor& b) {
  const Tensor xf = to(to(x, kCPU), DType::kFloat32), wf = to(to(w, kCPU), DType::kFloat32);
  return b.defined() ? linear(xf, wf, to(to(b, kCPU), DType::kFloat32)) : linear(xf, wf);
}

// `got` against `want` element by element: |got - want| <= value_ulps ulps of |want| +
// largest_ulps ulps of max |want| + largest_share of max |want| + 1e-6 (ulp: the dtype's epsilon).
void ExpectWithin(const Tensor& got, const Tensor& want, const std::string& what, double value_ulps,
                  double largest_ulps, double largest_share) {
  const std::vector<double> g = to_vector(got), r = to_vector(want);
  ASSERT_EQ(g.size(), r.size()) << what;
  const double ulp = got.dtype() == DType::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
  double largest = 0;
  for (double v : r) largest = std::max(largest, std::fabs(v));
  int bad = 0;
  for (size_t i = 0; i < g.size() && bad < 5; ++i) {
    const double tol =
        value_ulps * ulp * std::fabs(r[i]) + (largest_ulps * ulp + largest_share) * largest + 1e-6;
    if (!(std::fabs(g[i] - r[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " got " << g[i] << " want " << r[i];
      ++bad;
    }
  }
}

// The kernel's output against the float32 reference: one rounding of the output (half an ulp of
// the dtype) plus float32 sums in another order.
void ExpectMatches(const Tensor& got, const Tensor& want, const std::string& what) {
  ExpectWithin(got, want, what, 0.5, 0, 1e-4);
}

using Problem = std::tuple<int64_t, int64_t, int64_t>;  // m, n, k

class Sm90Gemm : public testing::TestWithParam<Problem> {};

TEST_P(Sm90Gemm, MatchesCpuLinear) {
  SKIP_WITHOUT_SM90();
  const auto [m, n, k] = GetParam();
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    Generator gen(m * 131 + n * 7 + k);
    const Tensor x = randn({m, k}, gen, t, CUDA(0)) * (1.0 / std::sqrt(static_cast<double>(k)));
    const Tensor w = randn({n, k}, gen, t, CUDA(0));
    const Tensor b = randn({n}, gen, t, CUDA(0));
    for (const GemmConfig& base : AllConfigs()) {
      if (base.dtype != t || base.geglu) continue;
      const Tensor bias = base.bias ? b : Tensor();
      const Tensor out = full({m, n}, -7.0, t, CUDA(0));
      cuda_ops::RunSm90Gemm(x, w, bias, out, base);
      ExpectMatches(out, CpuReference(x, w, bias),
                    absl::StrCat(base.Name(), " m=", m, " n=", n, " k=", k));
    }
  }
}

// The epilogue programs of linear's epilogues against the CPU ops on the same values (the
// residual's rows 8 elements longer than the output's).
TEST_P(Sm90Gemm, EpilogueProgramsMatchCpuOps) {
  SKIP_WITHOUT_SM90();
  const auto [m, n, k] = GetParam();
  for (const GemmConfig& c : EpilogueConfigs()) {
    const DType t = c.dtype;
    Generator gen(m * 29 + n * 3 + k + c.bn);
    const Tensor x = randn({m, k}, gen, t, CUDA(0)) * (1.0 / std::sqrt(static_cast<double>(k)));
    const Tensor w = randn({n, k}, gen, t, CUDA(0));
    const Tensor bias = c.bias ? randn({n}, gen, t, CUDA(0)) : Tensor();
    const Tensor residual =
        c.residual ? slice(randn({m, n + 8}, gen, t, CUDA(0)), 1, 8, n + 8) : Tensor();
    const Tensor out = full({m, n}, -7.0, t, CUDA(0));
    cuda_ops::RunSm90Gemm(x, w, bias, out, c, residual);
    Tensor want = CpuReference(x, w, bias);
    const std::string text = c.Epilogue().ToString();
    if (text.find("relu") != std::string::npos) want = relu(want);
    if (text.find("gelu") != std::string::npos) want = gelu(want, "tanh");
    if (c.residual) want = add(want, to(to(residual, kCPU), DType::kFloat32));
    ExpectMatches(out, want, absl::StrCat(c.Name(), " m=", m, " n=", n, " k=", k));
  }
}

// GeGLU: out [m, f] = gelu_tanh(x·gateᵀ + b_gate) * (x·upᵀ + b_up) from one kernel over the
// interleaved weight, against the float32 CPU ops on the same values.
TEST_P(Sm90Gemm, GegluMatchesCpuOps) {
  SKIP_WITHOUT_SM90();
  const auto [m, n, k] = GetParam();
  if (n % 16 != 0) GTEST_SKIP() << "GeGLU needs 2f = n a multiple of 16";
  const int64_t f = n / 2;
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    Generator gen(m * 17 + n + k * 3);
    const Tensor x = randn({m, k}, gen, t, CUDA(0)) * (1.0 / std::sqrt(static_cast<double>(k)));
    const Tensor gate = randn({f, k}, gen, t, CUDA(0)), up = randn({f, k}, gen, t, CUDA(0));
    const Tensor bg = randn({f}, gen, t, CUDA(0)), bu = randn({f}, gen, t, CUDA(0));
    const Tensor w = cuda_ops::InterleaveGeglu(gate, up);
    for (const GemmConfig& base : AllConfigs()) {
      if (base.dtype != t || !base.geglu) continue;
      const Tensor bias = base.bias ? cuda_ops::InterleaveGeglu(bg, bu) : Tensor();
      const Tensor out = full({m, f}, -7.0, t, CUDA(0));
      cuda_ops::RunSm90Gemm(x, w, bias, out, base);
      const Tensor g = CpuReference(x, gate, base.bias ? bg : Tensor());
      const Tensor u = CpuReference(x, up, base.bias ? bu : Tensor());
      ExpectMatches(out, mul(gelu(g, "tanh"), u),
                    absl::StrCat(base.Name(), " m=", m, " f=", f, " k=", k));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Sm90Gemm,
                         testing::Values(Problem{128, 256, 64}, Problem{1, 8, 8},
                                         Problem{130, 264, 72}, Problem{257, 3072, 768},
                                         Problem{64, 128, 3072}, Problem{333, 200, 136},
                                         Problem{1024, 768, 3072}, Problem{2048, 6144, 768}));

TEST(Sm90GemmOperands, StridedRowsAndColumnSlices) {
  SKIP_WITHOUT_SM90();
  Generator gen(5);
  const DType t = DType::kBFloat16;
  const Tensor wide_x = randn({300, 1024}, gen, t, CUDA(0)) * (1.0 / 16);
  const Tensor x = slice(wide_x, 1, 256, 768);  // [300, 512], rows 1024 apart
  const Tensor wide_w = randn({400, 520}, gen, t, CUDA(0));
  const Tensor w = slice(wide_w, 0, 8, 392);  // [384, 520] of a [400, 520]
  const Tensor w2 = slice(w, 1, 0, 512);      // [384, 512], rows 520 apart
  const Tensor wide_out = full({300, 400}, 3.0, t, CUDA(0));
  const Tensor out = slice(wide_out, 1, 8, 392);  // rows 400 apart
  ASSERT_TRUE(cuda_ops::Sm90GemmApplies(x, w2, Tensor(), out));
  cuda_ops::RunSm90Gemm(x, w2, Tensor(), out);
  ExpectMatches(out, CpuReference(x, w2, Tensor()), "strided");
  // Columns of the wide output outside the slice are untouched.
  const std::vector<double> left = to_vector(slice(wide_out, 1, 0, 8));
  for (double v : left) ASSERT_EQ(v, 3.0);
}

TEST(Sm90GemmOperands, RefusedOperandsSayWhy) {
  SKIP_WITHOUT_SM90();
  Generator gen(9);
  const Tensor x = randn({16, 36}, gen, DType::kBFloat16, CUDA(0));  // k = 36: not a multiple of 8
  const Tensor w = randn({16, 36}, gen, DType::kBFloat16, CUDA(0));
  const Tensor out = zeros({16, 16}, DType::kBFloat16, CUDA(0));
  EXPECT_FALSE(cuda_ops::Sm90GemmApplies(x, w, Tensor(), out));
  try {
    cuda_ops::RunSm90Gemm(x, w, Tensor(), out);
    ADD_FAILURE() << "k = 36 ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[16, 36]"), std::string::npos) << e.what();
  }
  const Tensor xf = randn({16, 32}, gen, DType::kFloat32, CUDA(0));
  const Tensor wf = randn({16, 32}, gen, DType::kFloat32, CUDA(0));
  EXPECT_FALSE(
      cuda_ops::Sm90GemmApplies(xf, wf, Tensor(), zeros({16, 16}, DType::kFloat32, CUDA(0))));
}

bool RanSm90Gemm(const std::vector<std::string>& names) {
  for (const std::string& n : names) {
    if (n.find("kiln_gemm_sm90") != std::string::npos) return true;
  }
  return false;
}

// linear() takes the kernel where KILN_GEMM says so: always (kiln), never (cublas), or as timed
// once per problem (auto, whose decision is logged).
TEST(Sm90GemmLinear, KilnGemmSettingChoosesTheKernel) {
  SKIP_WITHOUT_SM90();
  Generator gen(11);
  const DType t = DType::kBFloat16;
  const Tensor x = randn({2, 150, 768}, gen, t, CUDA(0)) * (1.0 / 32);
  const Tensor w = randn({512, 768}, gen, t, CUDA(0));
  const Tensor b = randn({512}, gen, t, CUDA(0));
  const Tensor want = CpuReference(reshape(x, {300, 768}), w, b);
  {
    ScopedEnv env("KILN_GEMM", "kiln");
    Tensor y;
    EXPECT_TRUE(RanSm90Gemm(KernelNames([&] { y = linear(x, w, b); })));
    EXPECT_EQ(y.shape(), Shape({2, 150, 512}));
    ExpectMatches(reshape(y, {300, 512}), want, "KILN_GEMM=kiln");
  }
  {
    ScopedEnv env("KILN_GEMM", "cublas");
    EXPECT_FALSE(RanSm90Gemm(KernelNames([&] { linear(x, w, b); })));
  }
  {
    ScopedEnv env("KILN_GEMM", "auto");
    const Tensor y = linear(x, w, b);
    ExpectMatches(reshape(y, {300, 512}), want, "KILN_GEMM=auto");
    EXPECT_NE(cuda_ops::Sm90GemmDecisions().find("[300x512x768 bfloat16 bias]"), std::string::npos)
        << cuda_ops::Sm90GemmDecisions();
  }
  {
    // A bias at an odd element offset (the epilogue loads pairs): cuBLASLt takes it, same answer.
    ScopedEnv env("KILN_GEMM", "kiln");
    const Tensor wide_b = randn({513}, gen, t, CUDA(0));
    const Tensor odd_b = slice(wide_b, 0, 1, 513);
    EXPECT_FALSE(
        cuda_ops::Sm90GemmApplies(reshape(x, {300, 768}), w, odd_b, empty({300, 512}, t, CUDA(0))));
    Tensor y;
    EXPECT_FALSE(RanSm90Gemm(KernelNames([&] { y = linear(x, w, odd_b); })));
    ExpectMatches(reshape(y, {300, 512}), CpuReference(reshape(x, {300, 768}), w, odd_b),
                  "odd bias");
  }
  {
    // linear's epilogues run inside the kernel: relu, tanh GELU, and a residual (C of the GEMM).
    ScopedEnv env("KILN_GEMM", "kiln");
    const Tensor x2 = reshape(x, {300, 768});
    const Tensor r = randn({300, 512}, gen, t, CUDA(0));
    for (Epilogue e : {Epilogue::kRelu, Epilogue::kGeluTanh, Epilogue::kAdd}) {
      OpAttrs attrs;
      attrs.epilogue = e;
      std::vector<Tensor> in = {x2, w, b};
      if (e == Epilogue::kAdd) in.push_back(r);
      Tensor y;
      EXPECT_TRUE(RanSm90Gemm(KernelNames([&] { y = Dispatch(OpId::kLinear, in, attrs); })))
          << EpilogueName(e);
      const Tensor plain = CpuReference(x2, w, b);
      const Tensor ref = e == Epilogue::kRelu       ? relu(plain)
                         : e == Epilogue::kGeluTanh ? gelu(plain, "tanh")
                                                    : add(plain, to(to(r, kCPU), DType::kFloat32));
      ExpectMatches(y, ref, absl::StrCat("linear epilogue ", EpilogueName(e)));
    }
  }
  {
    ScopedEnv env("KILN_GEMM", "always");
    EXPECT_THROW(linear(x, w, b), Error);  // the setting's error names its choices
  }
}

// A compiled result against the eager module's, which rounds after each op: a few ulps apart, and
// near zero (gelu(gate) * up of small products) a few ulps of the largest value.
void ExpectCloseToEager(const Tensor& got, const Tensor& eager, const std::string& what) {
  ExpectWithin(got, eager, what, 4, 2, 0);
}

// A compiled GeGLU MLP whose Hopper GEMM no cache has: compile() leaves the kernel compiling in the
// background (the report counts it) and the first calls run the fallback (cuBLASLt and the
// elementwise gelu·mul) with the same answer; a CUDA graph captured meanwhile waits for the kernel;
// after WaitForBackgroundCompiles every call runs it (KILN_BACKGROUND_COMPILE=on). Off, compile()
// compiles it itself. (Whether a cache already had the kernel depends on what ran before in this
// process and cache directory; the checks below hold either way.)
TEST(Sm90GemmBackground, FirstCallsRunTheFallbackUntilTheKernelIsCompiled) {
  SKIP_WITHOUT_SM90();
  Generator gen(31);
  for (const bool background : {true, false}) {
    ScopedEnv env("KILN_BACKGROUND_COMPILE", background ? "on" : "off");
    const DType t = background ? DType::kFloat16 : DType::kBFloat16;
    GeGLUMLP mlp(256, 512, ModuleOptions{t, CUDA(0)});
    const Tensor x = randn({300, 256}, gen, t, CUDA(0)) * 0.5;
    const Tensor want = mlp(x);
    CompileOptions frozen;
    frozen.freeze_weights = true;
    const cuda::KernelCacheStats before = cuda::GetKernelCacheStats();
    CompiledFn f = compile(mlp, x, frozen);
    const Tensor first = f({x})[0];
    const CompileReport& r = f.report({x});
    const std::string why = absl::StrCat(background ? "background" : "off", ": ", r.Summary());
    if (background) {
      EXPECT_LE(r.background_compiles, 1) << why;
      if (r.background_compiles == 0)
        EXPECT_GE(r.cache_hits, 1) << "a cache had the kernel; " << why;
    } else {
      EXPECT_EQ(r.background_compiles, 0) << why;
      EXPECT_EQ(cuda::GetKernelCacheStats().background_compiles, before.background_compiles);
    }
    EXPECT_EQ(r.kernels_per_step, 2) << "the count is the plan's with the kernel; " << why;
    ExpectCloseToEager(first, want, absl::StrCat(why, ", first call"));
    CompileOptions graphed = frozen;
    graphed.cuda_graphs = true;
    CompiledFn g = compile(mlp, x, graphed);
    g({x});  // captures, waiting for a kernel still compiling
    EXPECT_TRUE(RanSm90Gemm(KernelNames([&] { g({x}); }))) << why;
    WaitForBackgroundCompiles();
    Tensor later;
    EXPECT_TRUE(RanSm90Gemm(KernelNames([&] { later = f({x})[0]; }))) << why;
    ExpectCloseToEager(later, want, absl::StrCat(why, ", after the compile"));
  }
}

}  // namespace
}  // namespace kiln
