// The GEMV's weights loaded before its dependency wait (GemvArgs::preload_weights; the rule is
// matmul_cuda.cc PreloadWeights and cuda::ScopedPlanRun). The race the rule must rule out: a
// weight written by the kernel launched right before the GEMV, which a programmatic dependent
// launch lets the GEMV overlap. The writer here (cuda_kernels::FillAfterDelay) lets the next
// kernel start at once, then writes ones over a zero weight 200 µs later; a GEMV that read the
// weight before its wait would sum the zeros.
//   - the kernel itself: the same schedule with the preload forced reads the zeros (the race is
//     real, so the cases below can see a broken rule), and without it reads the ones;
//   - the rule: eagerly (the weight is no plan's constant), a compiled plan whose GEMV is its
//     first launch (plain, so it waits for the user's writer), one whose GEMV follows another
//     kernel (the constant is read before the wait there), and the same plans replayed as CUDA
//     graphs. With KILN_GEMV_PRELOAD=always (the rule broken) the eager case fails; the plan
//     cases would fail if a run's first launch were a dependent one.
// Then the kernels' paths with and without the preload give the same bits. GPU cases skip without
// a GPU (KILN_REQUIRE_GPU=1 makes them fail instead).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/compile.h"
#include "ops/cuda/elem_type.h"
#include "ops/cuda/gemv_kernels.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/cuda.h"
#include "runtime/cuda_api.h"
#include "runtime/random.h"
#include "tests/gemv_test_util.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

constexpr int64_t kN = 1024, kK = 1024;
constexpr uint16_t kBf16One = 0x3F80;
constexpr int64_t kWriterDelayNs = 200'000;

// `value` into every word of `w` (bfloat16) `ns` after the writer lets the next kernel start.
// Written through the pointer, as a user's own kernel would: the tensor's version stays, so a
// plan that folded w as a constant runs on without recompiling.
void FillAfter(const Tensor& w, uint16_t value, int64_t ns) {
  KILN_CUDA_CHECK(cuda_kernels::FillAfterDelay(static_cast<uint16_t*>(w.data_ptr()), w.numel(),
                                               value, ns, cuda::CurrentStream()));
}
void OnesAfterDelay(const Tensor& w) { FillAfter(w, kBf16One, kWriterDelayNs); }

// How many of y's values differ from `want`.
int64_t Wrong(const Tensor& y, double want) {
  int64_t wrong = 0;
  for (double v : to_vector(y)) wrong += v != want;
  return wrong;
}

bool DependentLaunchesExist() { return cuda::DependentLaunchEnabled(0); }

// out [m, n] = x [m, k] · w [n, k]ᵀ, contiguous, with no bias, activation or norm.
cuda_kernels::GemvArgs ArgsOf(const Tensor& x, const Tensor& w, const Tensor& out) {
  cuda_kernels::GemvArgs a{};
  a.x = x.data_ptr();
  a.ldx = x.size(1);
  a.w = w.data_ptr();
  a.ldw = w.size(1);
  a.out = out.data_ptr();
  a.m = x.size(0);
  a.n = w.size(0);
  a.k = w.size(1);
  a.type = *cuda_kernels::ElemTypeOf(out.dtype());
  a.sm_count = cuda::Props(0).sm_count;
  return a;
}

// The GEMV of x [1, kK] and w [kN, kK] launched as a programmatic dependent of the writer.
Tensor GemvAfterWriter(const Tensor& x, const Tensor& w, bool preload) {
  Tensor out = empty({1, kN}, DType::kBFloat16, CUDA(0));
  cuda_kernels::GemvArgs a = ArgsOf(x, w, out);
  a.dependent_launch = true;
  a.preload_weights = preload;
  cuda::Synchronize();
  OnesAfterDelay(w);
  KILN_CUDA_CHECK(cuda_kernels::Gemv(a, cuda::CurrentStream()));
  return out;
}

TEST(GemvPreload, TheRaceIsRealAndWaitingAvoidsIt) {
  KILN_SKIP_WITHOUT_GPU();
  if (!DependentLaunchesExist()) GTEST_SKIP() << "no programmatic dependent launches here";
  const Tensor x = full({1, kK}, 1.0, DType::kBFloat16, CUDA(0));
  const Tensor w = zeros({kN, kK}, DType::kBFloat16, CUDA(0));
  EXPECT_EQ(Wrong(GemvAfterWriter(x, w, /*preload=*/false), kK), 0)
      << "read after the wait, every column sums the ones";
  const Tensor w2 = zeros({kN, kK}, DType::kBFloat16, CUDA(0));
  EXPECT_GT(Wrong(GemvAfterWriter(x, w2, /*preload=*/true), kK), 0)
      << "read before the wait, the columns should have seen the zeros: the cases below could "
         "not see a broken rule";
}

// Each round: zeros into w (waited for), then the delayed writer's ones right before `call`,
// whose result must sum the ones.
void ExpectEachCallSeesTheLastWrite(const std::string& what, const Tensor& w,
                                    const std::function<Tensor()>& call, double ones_sum) {
  for (int round = 0; round < 4; ++round) {
    FillAfter(w, 0, 0);
    cuda::Synchronize();
    OnesAfterDelay(w);
    EXPECT_EQ(Wrong(call(), ones_sum), 0)
        << what << ", round " << round << ": read the weight before the user's write ended";
  }
}

TEST(GemvPreload, EagerlyTheWeightIsReadAfterTheWait) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvMode on(cuda_ops::GemvMode::kOn);
  const Tensor x = full({1, kK}, 1.0, DType::kBFloat16, CUDA(0));
  const Tensor w = zeros({kN, kK}, DType::kBFloat16, CUDA(0));
  ExpectEachCallSeesTheLastWrite(
      "eager", w, [&] { return linear(x, w); }, kK);
}

// A plan whose GEMV is its first launch, and one whose GEMV follows a pointwise kernel, each
// folding w as a constant; run eagerly and replayed as a CUDA graph.
TEST(GemvPreload, AConstantIsReadBeforeTheWaitOnlyAfterTheRunsFirstLaunch) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvMode on(cuda_ops::GemvMode::kOn);
  const Tensor x = full({1, kK}, 1.0, DType::kBFloat16, CUDA(0));
  const Tensor w = zeros({kN, kK}, DType::kBFloat16, CUDA(0));
  for (bool graphs : {false, true}) {
    CompileOptions options;
    options.cuda_graphs = graphs;
    const std::string mode = graphs ? "graph" : "compiled";
    CompiledFn first =
        compile([&w](const std::vector<Tensor>& in) { return std::vector{linear(in[0], w)}; }, {x},
                options);
    ExpectEachCallSeesTheLastWrite(
        mode + ", the GEMV first", w, [&] { return first({x})[0]; }, kK);
    CompiledFn second = compile(
        [&w](const std::vector<Tensor>& in) { return std::vector{linear(mul(in[0], 2.0), w)}; },
        {x}, options);
    ExpectEachCallSeesTheLastWrite(
        mode + ", the GEMV second", w, [&] { return second({x})[0]; }, 2 * kK);
  }
}

// The preload changes where the first weights are loaded, not the sums: with and without it, every
// path (the FMA loop of 1..8 rows, the folded norm of one row, the norm prologue, the tensor-core
// path of 2..8 rows with and without a norm, split over a cluster) gives the same bits. Launched
// plainly, so both are safe; n wide enough that the norm kernels' CTAs take several column tiles
// (only the first starts from the preloaded weights), k of partial chunks and vectors too.
struct PreloadCase {
  DType dtype;
  int64_t m, n, k;
  cuda_kernels::GemvNorm norm;
};

Tensor GemvOf(const PreloadCase& c, const Tensor& x, const Tensor& w, const Tensor& bias,
              const Tensor& gamma, const Tensor& beta, bool preload) {
  Tensor out = zeros({c.m, c.n}, c.dtype, CUDA(0));
  cuda_kernels::GemvArgs a = ArgsOf(x, w, out);
  a.bias = bias.data_ptr();
  a.bias_stride = 1;
  a.act = cuda_kernels::GemvAct::kGeluTanh;
  a.preload_weights = preload;
  a.norm = c.norm;
  if (c.norm != cuda_kernels::GemvNorm::kNone) {
    a.norm_weight = gamma.data_ptr();
    a.norm_bias = c.norm == cuda_kernels::GemvNorm::kLayer ? beta.data_ptr() : nullptr;
    a.norm_eps = 1e-5f;
  }
  KILN_CUDA_CHECK(cuda_kernels::Gemv(a, cuda::CurrentStream()));
  return out;
}

TEST(GemvPreload, PreloadedWeightsGiveTheSameBits) {
  KILN_SKIP_WITHOUT_GPU();
  using cuda_kernels::GemvNorm;
  const PreloadCase cases[] = {
      {DType::kBFloat16, 1, 2304, 768, GemvNorm::kNone},    // the FMA loop, one chunk a row
      {DType::kBFloat16, 1, 768, 3072, GemvNorm::kNone},    // 4 warps a column
      {DType::kFloat32, 3, 1000, 4100, GemvNorm::kNone},    // several chunks, a partial vector
      {DType::kBFloat16, 1, 20000, 768, GemvNorm::kLayer},  // the folded norm
      {DType::kFloat32, 2, 20000, 776, GemvNorm::kRms},     // the prologue, several tiles a CTA
      {DType::kBFloat16, 8, 3072, 768, GemvNorm::kNone},    // tensor cores
      {DType::kBFloat16, 4, 256, 4096, GemvNorm::kNone},    // tensor cores, a cluster's splits
      {DType::kFloat16, 2, 20000, 200, GemvNorm::kLayer},   // tensor cores with the prologue
      {DType::kBFloat16, 8, 50257, 768, GemvNorm::kLayer},  // an LM head's shape
  };
  Generator gen(7);
  for (const PreloadCase& c : cases) {
    const Tensor x = randn({c.m, c.k}, gen, c.dtype, CUDA(0));
    const Tensor w = randn({c.n, c.k}, gen, c.dtype, CUDA(0));
    const Tensor bias = randn({c.n}, gen, c.dtype, CUDA(0));
    const Tensor gamma = randn({c.k}, gen, c.dtype, CUDA(0));
    const Tensor beta = randn({c.k}, gen, c.dtype, CUDA(0));
    const Tensor without = GemvOf(c, x, w, bias, gamma, beta, false);
    const Tensor with = GemvOf(c, x, w, bias, gamma, beta, true);
    const std::vector<double> a = to_vector(without), b = to_vector(with);
    int64_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i)
      differ += !(a[i] == b[i] || (a[i] != a[i] && b[i] != b[i]));
    EXPECT_EQ(differ, 0) << DTypeName(c.dtype) << " m " << c.m << " n " << c.n << " k " << c.k
                         << " norm " << static_cast<int>(c.norm) << ": " << differ << " of "
                         << a.size() << " outputs differ with the preload";
  }
}

// Without a GPU: a run's read-only ranges answer only inside the run (whole ranges, nothing past
// their ends), its first launch is plain, and a nested run has its own ranges and first launch.
TEST(PlanRun, ReadOnlyRangesAndAPlainFirstLaunch) {
  std::vector<char> buf(64);
  const std::vector<cuda::ByteRange> ranges = {{buf.data() + 16, 32}};
  EXPECT_FALSE(cuda::ReadOnlyDuringRun(buf.data() + 16, 8));  // no run
  {
    cuda::ScopedPlanRun run(ranges);
    EXPECT_TRUE(cuda::ReadOnlyDuringRun(buf.data() + 16, 32));
    EXPECT_TRUE(cuda::ReadOnlyDuringRun(buf.data() + 40, 8));
    EXPECT_FALSE(cuda::ReadOnlyDuringRun(buf.data() + 40, 9));  // one byte past the end
    EXPECT_FALSE(cuda::ReadOnlyDuringRun(buf.data() + 8, 16));  // starts before it
    EXPECT_FALSE(cuda::ReadOnlyDuringRun(nullptr, 0));
    EXPECT_TRUE(run.first_launch_pending);
    EXPECT_FALSE(cuda::UseDependentLaunch(0, nullptr));  // the run's first launch: plain
    EXPECT_FALSE(run.first_launch_pending);
    {
      const std::vector<cuda::ByteRange> none;
      cuda::ScopedPlanRun inner(none);
      EXPECT_FALSE(cuda::ReadOnlyDuringRun(buf.data() + 16, 8));
      EXPECT_FALSE(cuda::UseDependentLaunch(0, nullptr));
      EXPECT_FALSE(inner.first_launch_pending);
    }
    EXPECT_TRUE(cuda::ReadOnlyDuringRun(buf.data() + 16, 8));  // the outer run's again
  }
  EXPECT_FALSE(cuda::ReadOnlyDuringRun(buf.data() + 16, 8));
}

}  // namespace
}  // namespace kiln
