// CUDA linear with few rows on kiln's GEMV (ops/cuda/gemv_kernels.h), forced with
// SetGemvMode(kOn), against the CPU linear on the same values: m in {1, 2, 3, 8} over the decode
// shapes and odd ones (n, k of 1, 3, 7, 17; k 200 and 4104 for the tensor-core path's partial
// chunk and cluster splits), every dtype, bias and epilogue (activations and the residual add);
// strided x rows,
// weight slices misaligned for 16-byte loads, NaN propagation, rows of w beyond 2^31 elements.
// Then the choice (ops/cuda/gemv_choice.h): kOff runs cuBLASLt (no GEMV kernel in the profile),
// kAuto records a timed decision, and a problem first met under graph capture runs the GEMV
// untimed. GPU cases skip without a GPU (KILN_REQUIRE_GPU=1 makes them fail instead).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ops/cuda/device_timing.h"
#include "ops/cuda/gemv_kernels.h"
#include "ops/cuda/matmul_cuda.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "profiler/profiler.h"
#include "runtime/cuda_api.h"
#include "runtime/nvrtc.h"
#include "runtime/settings.h"
#include "runtime/status.h"
#include "tests/gemv_test_util.h"
#include "tests/kernel_test_util.h"
#include "tests/numerics_policy.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

using cuda_ops::GemvMode;
using profiler::DeviceKind;
using profiler::DeviceRecord;
using profiler::Profiler;
using profiler::ProfileResult;
using profiler::ProfilerOptions;

struct Act {
  Epilogue epilogue;
  bool bias;
};
constexpr Act kActs[] = {{Epilogue::kNone, false},     {Epilogue::kNone, true},
                         {Epilogue::kRelu, false},     {Epilogue::kRelu, true},
                         {Epilogue::kGeluTanh, false}, {Epilogue::kGeluTanh, true},
                         {Epilogue::kAdd, false},      {Epilogue::kAdd, true}};
constexpr int kNumActs = sizeof(kActs) / sizeof(kActs[0]);

std::string Name(const Act& a) {
  return absl::StrCat(EpilogueName(a.epilogue), a.bias ? "+bias" : "");
}

// linear{epilogue} through Dispatch (the path compiled plans take; eager linear() has no
// epilogue), on whatever device the operands are; `residual` is epilogue=add's.
Tensor Linear(const Tensor& x, const Tensor& w, const Tensor& b, Epilogue act,
              const Tensor& residual = Tensor()) {
  OpAttrs attrs;
  attrs.epilogue = act;
  std::vector<Tensor> in = {x, w};
  if (b.defined()) in.push_back(b);
  if (residual.defined()) in.push_back(residual);
  return Dispatch(OpId::kLinear, in, attrs);
}

// epilogue=add's residual for linear(x, w): normal values of the output's shape; else none.
Tensor ResidualFor(const Tensor& x, const Tensor& w, Epilogue act) {
  if (act != Epilogue::kAdd) return Tensor();
  Shape shape = x.shape();
  shape.back() = w.size(0);
  Generator gen(shape.back() * 7 + x.numel());
  return randn(shape, gen, x.dtype(), x.device());
}

// The other CUDA linear tests' tolerance; float32 sums of k products, added up in another order
// than the CPU GEMM's, get room growing with sqrt(k) (inputs are scaled so results are O(1)).
Tolerance LinearTolerance(DType t, int64_t k) {
  Tolerance tol = ToleranceFor(t);
  if (t == DType::kFloat32) tol.atol *= std::max(1.0, std::sqrt(k / 16.0));
  return tol;
}

// CUDA linear of (x, w, b) against the CPU linear of the same values.
void ExpectMatchesCpu(const Tensor& x, const Tensor& w, const Tensor& b, Epilogue act,
                      const std::string& what) {
  const Tensor r = ResidualFor(x, w, act);
  const Tensor got = Linear(x, w, b, act, r);
  const Tensor want = Linear(to(x, kCPU), to(w, kCPU), b.defined() ? to(b, kCPU) : b, act,
                             r.defined() ? to(r, kCPU) : r);
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ExpectClose(to_vector(got), to_vector(want), LinearTolerance(x.dtype(), w.size(-1)), what);
}

// x [rows, k] with values of scale 1/sqrt(k), so that x·w is O(1) for standard normal w.
Tensor RandomX(IntList shape, int64_t k, DType t, Generator& gen) {
  return randn(shape, gen, t, CUDA(0)) * (1.0 / std::sqrt(static_cast<double>(k)));
}

// ---- Every (m, n, k, dtype, bias, activation) of the decode shapes and odd ones. -------------

using SweepParam = std::tuple<DType, int64_t, int64_t>;  // dtype, n, k

class GemvSweep : public testing::TestWithParam<SweepParam> {};

TEST_P(GemvSweep, MatchesCpuLinear) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvMode on(GemvMode::kOn);
  const auto [t, n, k] = GetParam();
  Generator gen(n * 31 + k);
  const Tensor w = randn({n, k}, gen, t, CUDA(0));
  const Tensor b = randn({n}, gen, t, CUDA(0));
  const bool small = n * k <= (int64_t{1} << 20);
  const int64_t rows[] = {1, 2, 3, 8};
  for (int i = 0; i < 4; ++i) {
    const Tensor x = RandomX({rows[i], k}, k, t, gen);
    // Small problems run every (bias, epilogue); large ones two per m, all eight over the four m.
    for (int j = 0; j < kNumActs; ++j) {
      if (!small && j != 2 * i && j != 2 * i + 1) continue;
      const Act& a = kActs[j];
      ExpectMatchesCpu(x, w, a.bias ? b : Tensor(), a.epilogue,
                       absl::StrCat("m=", rows[i], " ", Name(a)));
    }
  }
}

std::vector<SweepParam> SweepParams() {
  std::vector<SweepParam> out;
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t n : {1, 7, 768, 2304, 50257}) {
      // 200 and 4104: the tensor-core path's last 64-element chunk in part (2..8 rows of a
      // 2-byte type, k a multiple of 8), and 4104 its chunks split over a cluster for small n.
      for (int64_t k : {1, 3, 17, 200, 768, 3072, 4104}) {
        if (n == 50257 && k >= 3072) continue;  // 154M weights: the CPU reference alone takes long
        out.emplace_back(t, n, k);
      }
    }
  }
  return out;
}

std::string SweepName(const testing::TestParamInfo<SweepParam>& info) {
  const auto [t, n, k] = info.param;
  return absl::StrCat(DTypeName(t), "_n", n, "_k", k);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvSweep, testing::ValuesIn(SweepParams()), SweepName);

// ---- The norm prologue (GemvArgs::norm, cuda_ops::NormLinearGemv). ---------------------------

// The norm op then linear{epilogue} on the CPU, computed in `dtype`: the operands' own (eager's
// roundings: the normalised rows rounded to it) or float32 (the numerics policy's reference on the
// same, already rounded, operands). `rest` is linear's weight, then its bias and residual if any.
Tensor NormThenLinearOnCpu(OpId norm, const std::vector<Tensor>& norm_in, double eps,
                           const std::vector<Tensor>& rest, Epilogue act, DType dtype) {
  auto on_cpu = [dtype](const std::vector<Tensor>& ts) {
    std::vector<Tensor> out;
    for (const Tensor& t : ts) out.push_back(cast(to(t, kCPU), dtype));
    return out;
  };
  OpAttrs na;
  na.eps = eps;
  std::vector<Tensor> in = on_cpu(rest);
  in.insert(in.begin(), Dispatch(norm, on_cpu(norm_in), na));
  OpAttrs la;
  la.epilogue = act;
  return Dispatch(OpId::kLinear, in, la);
}

// A norm GEMV that rounds where eager does not (2..8 rows of bfloat16 fold the norm into the
// tensor-core operands: γ·x or γ·(x - x0) is rounded, not the normalised value) is judged as
// every such family is, by the numerics policy (docs/ARCHITECTURE.md) against the float32
// reference and eager's own error; every other form against eager within the per-op tolerance.
void ExpectNormGemvClose(const Tensor& got, OpId norm, const std::vector<Tensor>& norm_in,
                         double eps, const std::vector<Tensor>& rest, Epilogue act,
                         const std::string& what) {
  const DType t = got.dtype();
  const Tensor eager = NormThenLinearOnCpu(norm, norm_in, eps, rest, act, t);
  if (t == DType::kBFloat16 && got.size(0) >= 2) {
    const Tensor reference = NormThenLinearOnCpu(norm, norm_in, eps, rest, act, DType::kFloat32);
    ExpectWithinPolicy({to(got, kCPU)}, {eager}, {reference}, what);
  } else {
    ExpectClose(to_vector(got), to_vector(eager), LinearTolerance(t, rest[0].size(1)), what);
  }
}

// A layer norm or an RMS norm (each with and without its affine) applied by the GEMV as it reads
// x, against the two ops on the CPU (the norm's output rounded to the dtype, then the linear), for
// every dtype, a few row counts, lengths with a tail past the 16-byte vectors, and the epilogues.
// 3 and 8 rows of bfloat16 take the tensor-core kernels that fold the norm (k = 2048 splits a
// tile over a cluster of 4 CTAs), judged by the numerics policy (ExpectNormGemvClose); float16
// the shared-memory prologue.
TEST(Gemv, NormPrologueMatchesTheNormThenTheLinear) {
  KILN_SKIP_WITHOUT_GPU();
  struct Norm {
    OpId op;
    bool weight, bias;
  };
  const Norm norms[] = {{OpId::kLayerNorm, true, true},
                        {OpId::kLayerNorm, false, false},
                        {OpId::kRmsNorm, true, false},
                        {OpId::kRmsNorm, false, false}};
  const double eps = 1e-5;
  const ScopedGemvMode on(GemvMode::kOn);  // the fused GEMV, never the two ops
  auto separate = [](const Tensor&) { ADD_FAILURE() << "ran the norm and the linear apart"; };
  int checked = 0;
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const auto& [n, k] :
         {std::pair<int64_t, int64_t>{768, 768}, {7, 17}, {50, 100}, {2311, 200}, {64, 2048}}) {
      Generator gen(n + k);
      const Tensor w = randn({n, k}, gen, t, CUDA(0)) * (1.0 / std::sqrt(static_cast<double>(k)));
      const Tensor b = randn({n}, gen, t, CUDA(0));
      const Tensor g = randn({k}, gen, t, CUDA(0)) * 0.5 + 1.0, beta = randn({k}, gen, t, CUDA(0));
      for (int64_t m : {1, 3, 8}) {
        const Tensor x = randn({m, k}, gen, t, CUDA(0)) * 3.0 + 0.5;
        for (const Norm& nm : norms) {
          for (const Act& a : {kActs[0], kActs[5], kActs[6]}) {
            std::vector<Tensor> norm_in = {x};
            if (nm.weight) norm_in.push_back(g);
            if (nm.bias) norm_in.push_back(beta);
            std::vector<Tensor> rest = {w};
            if (a.bias) rest.push_back(b);
            const Tensor r = ResidualFor(x, w, a.epilogue);
            if (r.defined()) rest.push_back(r);
            OpAttrs lin;
            lin.epilogue = a.epilogue;
            const Tensor got = Tensor::Empty({m, n}, t, CUDA(0));
            ASSERT_TRUE(cuda_ops::NormLinearGemv(nm.op, norm_in, eps, rest, lin, got, separate));
            ExpectNormGemvClose(
                got, nm.op, norm_in, eps, rest, a.epilogue,
                absl::StrCat(DTypeName(t), " ", GetOpDef(nm.op).name, nm.weight ? "+w" : "",
                             nm.bias ? "+b" : "", " m=", m, " n=", n, " k=", k, " ", Name(a)));
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 5 * 3 * 4 * 3);
}

// One row of float16 / bfloat16 folds the norm into the column sums (gemv_kernels.cu
// FoldedNormGemvKernel): rows far from zero (the sums are taken from x - x[0]), long rows (a
// Llama-sized k), column counts that leave warps of a CTA without a column (their share of the
// row's statistics is still summed), every norm with and without its affine (an RMS norm with
// γ runs a kernel of its own), against the two ops on the CPU.
TEST(Gemv, FoldedNormOfOneRowMatchesTheNormThenTheLinear) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvMode on(GemvMode::kOn);
  auto separate = [](const Tensor&) { ADD_FAILURE() << "ran the norm and the linear apart"; };
  struct Norm {
    OpId op;
    bool affine;
  };
  const Norm norms[] = {{OpId::kLayerNorm, true},
                        {OpId::kLayerNorm, false},
                        {OpId::kRmsNorm, true},
                        {OpId::kRmsNorm, false}};
  int checked = 0;
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    for (const auto& [n, k] :
         {std::pair<int64_t, int64_t>{96, 64}, {2304, 768}, {40, 4096}, {7, 256}, {1001, 2048}}) {
      Generator gen(n * 7 + k);
      const Tensor w = randn({n, k}, gen, t, CUDA(0)) * (1.0 / std::sqrt(static_cast<double>(k)));
      const Tensor g = randn({k}, gen, t, CUDA(0)) * 0.5 + 1.0, beta = randn({k}, gen, t, CUDA(0));
      for (double offset : {0.0, 40.0, -300.0}) {
        const Tensor x = randn({1, k}, gen, t, CUDA(0)) * 2.0 + offset;
        for (const Norm& nm : norms) {
          std::vector<Tensor> norm_in = {x};
          if (nm.affine) norm_in.push_back(g);
          if (nm.affine && nm.op == OpId::kLayerNorm) norm_in.push_back(beta);
          const Tensor got = Tensor::Empty({1, n}, t, CUDA(0));
          ASSERT_TRUE(
              cuda_ops::NormLinearGemv(nm.op, norm_in, 1e-5, {w}, OpAttrs{}, got, separate));
          ExpectNormGemvClose(
              got, nm.op, norm_in, 1e-5, {w}, Epilogue::kNone,
              absl::StrCat(DTypeName(t), " ", GetOpDef(nm.op).name, nm.affine ? "+affine" : "",
                           " n=", n, " k=", k, " offset ", offset));
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 5 * 3 * 4);
}

// 2..8 rows of bfloat16 fold their norm into the tensor-core GEMV (gemv_kernels.cu
// FoldedRmsMmaGemvKernel, FoldedLayerMmaGemvKernel): rows far from zero (a layer norm's sums are
// taken from x - x0, x0 the mean of the row's first 64 elements), a chunk past k in part (k = 200,
// 104; k = 64: one chunk), a tile split over a cluster (k = 2048), columns past n in a tile, every
// norm with and without its affine and a layer norm with γ alone, by the numerics policy against
// the two ops on the CPU in float32 and in bfloat16 (ExpectNormGemvClose). The layer norm's
// kernel is the one that runs.
TEST(Gemv, FoldedNormOnTensorCoresMatchesTheNormThenTheLinear) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvMode on(GemvMode::kOn);
  auto separate = [](const Tensor&) { ADD_FAILURE() << "ran the norm and the linear apart"; };
  struct Norm {
    OpId op;
    bool weight, bias;
  };
  const Norm norms[] = {{OpId::kLayerNorm, true, true},
                        {OpId::kLayerNorm, true, false},
                        {OpId::kLayerNorm, false, false},
                        {OpId::kRmsNorm, true, false}};
  const DType t = DType::kBFloat16;
  int checked = 0;
  for (const auto& [n, k] :
       {std::pair<int64_t, int64_t>{96, 64}, {2304, 768}, {64, 2048}, {7, 200}, {1001, 104}}) {
    Generator gen(n * 5 + k);
    const Tensor w = randn({n, k}, gen, t, CUDA(0)) * (1.0 / std::sqrt(static_cast<double>(k)));
    const Tensor b = randn({n}, gen, t, CUDA(0));
    const Tensor g = randn({k}, gen, t, CUDA(0)) * 0.5 + 1.0, beta = randn({k}, gen, t, CUDA(0));
    for (int64_t m : {2, 5, 8}) {
      for (double offset : {0.0, 40.0, -300.0}) {
        const Tensor x = randn({m, k}, gen, t, CUDA(0)) * 2.0 + offset;
        for (const Norm& nm : norms) {
          std::vector<Tensor> norm_in = {x};
          if (nm.weight) norm_in.push_back(g);
          if (nm.bias) norm_in.push_back(beta);
          const Tensor got = Tensor::Empty({m, n}, t, CUDA(0));
          ASSERT_TRUE(
              cuda_ops::NormLinearGemv(nm.op, norm_in, 1e-5, {w, b}, OpAttrs{}, got, separate));
          ExpectNormGemvClose(
              got, nm.op, norm_in, 1e-5, {w, b}, Epilogue::kNone,
              absl::StrCat(GetOpDef(nm.op).name, nm.weight ? "+w" : "", nm.bias ? "+b" : "",
                           " m=", m, " n=", n, " k=", k, " offset ", offset));
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 5 * 3 * 3 * 4);
  Generator gen(3);
  const Tensor x = randn({4, 768}, gen, t, CUDA(0)), w = randn({2304, 768}, gen, t, CUDA(0));
  const Tensor g = randn({768}, gen, t, CUDA(0)), beta = randn({768}, gen, t, CUDA(0));
  const Tensor out = Tensor::Empty({4, 2304}, t, CUDA(0));
  const std::vector<std::string> names = KernelNames([&] {
    cuda_ops::NormLinearGemv(OpId::kLayerNorm, {x, g, beta}, 1e-5, {w}, OpAttrs{}, out, separate);
  });
  ASSERT_EQ(names.size(), 1u) << absl::StrJoin(names, "\n");
  EXPECT_NE(names[0].find("FoldedLayerMmaGemvKernel"), std::string::npos) << names[0];
}

// What the fused call refuses (it launches nothing, runs nothing and returns false): more rows
// than the GEMV takes, operands of two dtypes, a norm weight that is not a contiguous [k],
// KILN_GEMV=off.
TEST(Gemv, NormPrologueRefusesWhatItCannotRead) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(12);
  const Tensor w = randn({16, 32}, gen, DType::kFloat32, CUDA(0));
  const Tensor g = randn({32}, gen, DType::kFloat32, CUDA(0));
  const Tensor out1 = Tensor::Empty({1, 16}, DType::kFloat32, CUDA(0));
  const Tensor x1 = randn({1, 32}, gen, DType::kFloat32, CUDA(0));
  const Tensor x9 = randn({9, 32}, gen, DType::kFloat32, CUDA(0));
  const Tensor out9 = Tensor::Empty({9, 16}, DType::kFloat32, CUDA(0));
  const OpAttrs none;
  int separate_calls = 0;
  auto separate = [&](const Tensor&) { ++separate_calls; };
  const ScopedGemvMode on(GemvMode::kOn);
  EXPECT_TRUE(cuda_ops::NormLinearGemv(OpId::kLayerNorm, {x1, g}, 1e-5, {w}, none, out1, separate));
  EXPECT_FALSE(
      cuda_ops::NormLinearGemv(OpId::kLayerNorm, {x9, g}, 1e-5, {w}, none, out9, separate));
  EXPECT_FALSE(cuda_ops::NormLinearGemv(OpId::kLayerNorm, {x1, cast(g, DType::kBFloat16)}, 1e-5,
                                        {w}, none, out1, separate));
  const Tensor g2 = randn({64}, gen, DType::kFloat32, CUDA(0));
  EXPECT_FALSE(cuda_ops::NormLinearGemv(OpId::kLayerNorm, {x1, slice(g2, 0, 0, 64, 2)}, 1e-5, {w},
                                        none, out1, separate));
  const ScopedGemvMode off(GemvMode::kOff);
  EXPECT_FALSE(
      cuda_ops::NormLinearGemv(OpId::kLayerNorm, {x1, g}, 1e-5, {w}, none, out1, separate));
  EXPECT_EQ(separate_calls, 0);
}

// In auto mode the fused GEMV is timed once against the two ops (the norm named in the choice's
// log line); when it loses, the call runs nothing and the caller runs the two ops.
TEST(Gemv, NormPrologueIsChosenAgainstTheTwoOps) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvMode mode(GemvMode::kAuto);
  Generator gen(13);
  const int64_t m = 2, n = 96, k = 160;
  const Tensor x = randn({m, k}, gen, DType::kBFloat16, CUDA(0));
  const Tensor g = randn({k}, gen, DType::kBFloat16, CUDA(0));
  const Tensor w = randn({n, k}, gen, DType::kBFloat16, CUDA(0)) * 0.1;
  OpAttrs na;
  na.eps = 1e-5;
  auto separate = [&](const Tensor& dst) {
    DispatchOut(OpId::kLinear, {Dispatch(OpId::kRmsNorm, {x, g}, na), w}, OpAttrs{}, dst);
  };
  const Tensor want = Tensor::Empty({m, n}, DType::kBFloat16, CUDA(0));
  separate(want);
  const Tensor got = Tensor::Empty({m, n}, DType::kBFloat16, CUDA(0));
  if (!cuda_ops::NormLinearGemv(OpId::kRmsNorm, {x, g}, 1e-5, {w}, OpAttrs{}, got, separate)) {
    separate(got);  // the two ops timed faster
  }
  ExpectClose(to_vector(got), to_vector(want), LinearTolerance(DType::kBFloat16, k), "auto");
  EXPECT_NE(cuda_ops::GemvDecisions().find("[2x96x160 bf16 rms_norm]"), std::string::npos)
      << cuda_ops::GemvDecisions();
}

// ---- The gated product (GemvArgs::w_up, NormLinearGemv's `gated`). -------------------------

struct Gate {
  OpId op;
  GeluApprox approximate;
};

// act(gate) · up of the norm then the linear of `rest` (its output's halves of f columns each) on
// the CPU, computed in `dtype` (as NormThenLinearOnCpu).
Tensor GatedProductOnCpu(OpId norm, const std::vector<Tensor>& norm_in,
                         const std::vector<Tensor>& rest, const Gate& gate, bool gate_first,
                         int64_t f, DType dtype) {
  const Tensor y = NormThenLinearOnCpu(norm, norm_in, 1e-5, rest, Epilogue::kNone, dtype);
  const Tensor first = slice(y, 1, 0, f), second = slice(y, 1, f, 2 * f);
  OpAttrs ga;
  ga.approximate = gate.approximate;
  return Dispatch(gate.op, {gate_first ? first : second}, ga) * (gate_first ? second : first);
}

// act(gate) · up of a merged gate/up linear's halves, as the norm-linear family's node asks for
// it (a Llama or GeGLU MLP at decode): every gate activation, either half the gate, with and
// without the linear's bias, 1, 3 and 8 rows (the folded one-row path, the shared-memory
// prologue, and for bfloat16 after an RMS norm the tensor-core kernel that folds it), every dtype,
// against the CPU's norm, linear (rounded to the dtype) and product in float32; the tensor-core
// fold (it rounds γ·x, not the normalised value) by the numerics policy against the same in
// float32 and in bfloat16 (as ExpectNormGemvClose). 8 rows of bfloat16 after an RMS norm run
// GatedFoldedRmsMmaGemvKernel, one launch.
TEST(Gemv, GatedProductMatchesTheLinearThenTheProduct) {
  KILN_SKIP_WITHOUT_GPU();
  const Gate gates[] = {{OpId::kSilu, GeluApprox::kNone},
                        {OpId::kGelu, GeluApprox::kNone},
                        {OpId::kGelu, GeluApprox::kTanh},
                        {OpId::kRelu, GeluApprox::kNone}};
  const ScopedGemvMode on(GemvMode::kOn);  // the gated GEMV, never the linear and the product
  auto apart = [](const Tensor&) { ADD_FAILURE() << "ran the linear and the product apart"; };
  int checked = 0;
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const auto& [f, k] :
         {std::pair<int64_t, int64_t>{128, 64}, {7, 17}, {1024, 2048}, {40, 3000}}) {
      Generator gen(f * 5 + k);
      const Tensor w =
          randn({2 * f, k}, gen, t, CUDA(0)) * (1.0 / std::sqrt(static_cast<double>(k)));
      const Tensor b = randn({2 * f}, gen, t, CUDA(0));
      const Tensor g = randn({k}, gen, t, CUDA(0)) * 0.5 + 1.0, beta = randn({k}, gen, t, CUDA(0));
      for (int64_t m : {1, 3, 8}) {
        const Tensor x = randn({m, k}, gen, t, CUDA(0)) * 2.0 + 0.25;
        for (OpId norm : {OpId::kRmsNorm, OpId::kLayerNorm}) {
          for (int a = 0; a < 4; ++a) {
            const Gate& gate = gates[a];
            const cuda_ops::GatedProduct gp{gate.op, gate.approximate, a % 2 == 1};
            const bool bias = m != 3;
            std::vector<Tensor> norm_in = {x, g};
            if (norm == OpId::kLayerNorm) norm_in.push_back(beta);
            std::vector<Tensor> rest = {w};
            if (bias) rest.push_back(b);
            const Tensor got = Tensor::Empty({m, f}, t, CUDA(0));
            ASSERT_TRUE(
                cuda_ops::NormLinearGemv(norm, norm_in, 1e-5, rest, OpAttrs{}, got, apart, &gp));
            const std::string what =
                absl::StrCat(DTypeName(t), " ", GetOpDef(norm).name, " ", GetOpDef(gate.op).name,
                             gate.approximate == GeluApprox::kTanh ? "_tanh" : "",
                             gp.gate_first ? " gate first" : " gate second", bias ? " bias" : "",
                             " m=", m, " f=", f, " k=", k);
            ++checked;
            if (t == DType::kBFloat16 && norm == OpId::kRmsNorm && m >= 2) {
              ExpectWithinPolicy(
                  {to(got, kCPU)},
                  {GatedProductOnCpu(norm, norm_in, rest, gate, gp.gate_first, f, t)},
                  {GatedProductOnCpu(norm, norm_in, rest, gate, gp.gate_first, f, DType::kFloat32)},
                  what);
              continue;
            }
            // The linear rounded to the dtype (as eager), the product in float32.
            const Tensor y =
                cast(NormThenLinearOnCpu(norm, norm_in, 1e-5, rest, Epilogue::kNone, t),
                     DType::kFloat32);
            const Tensor first = slice(y, 1, 0, f), second = slice(y, 1, f, 2 * f);
            OpAttrs ga;
            ga.approximate = gate.approximate;
            const Tensor want = Dispatch(gate.op, {gp.gate_first ? first : second}, ga) *
                                (gp.gate_first ? second : first);
            Tolerance tol = LinearTolerance(t, k);
            tol.atol *= 2, tol.rtol *= 2;  // two rounded sums multiplied, the reference's rounded
            ExpectClose(to_vector(got), to_vector(want), tol, what);
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 4 * 3 * 2 * 4);
  Generator gen(5);
  const DType t = DType::kBFloat16;
  const Tensor x = randn({8, 2048}, gen, t, CUDA(0)), w = randn({2 * 512, 2048}, gen, t, CUDA(0));
  const Tensor g = randn({2048}, gen, t, CUDA(0));
  const Tensor out = Tensor::Empty({8, 512}, t, CUDA(0));
  const cuda_ops::GatedProduct silu{OpId::kSilu, GeluApprox::kNone, true};
  const std::vector<std::string> names = KernelNames([&] {
    cuda_ops::NormLinearGemv(OpId::kRmsNorm, {x, g}, 1e-5, {w}, OpAttrs{}, out, apart, &silu);
  });
  ASSERT_EQ(names.size(), 1u) << absl::StrJoin(names, "\n");
  EXPECT_NE(names[0].find("GatedFoldedRmsMmaGemvKernel"), std::string::npos) << names[0];
}

// What the gated call refuses (it runs nothing and returns false): a residual (the linear has an
// epilogue), an odd number of weight rows, an output that is not half the weight's rows, an
// activation the kernel has not, KILN_GEMV=off. In auto mode it is timed against the linear and
// the product (" glu(silu)" in the choice's log line).
TEST(Gemv, GatedProductRefusesWhatItCannotRunAndIsChosen) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(14);
  const DType t = DType::kBFloat16;
  const Tensor x = randn({1, 64}, gen, t, CUDA(0));
  const Tensor g = randn({64}, gen, t, CUDA(0));
  const Tensor w = randn({96, 64}, gen, t, CUDA(0)) * 0.125;
  const Tensor out = Tensor::Empty({1, 48}, t, CUDA(0));
  int apart_calls = 0;
  auto count = [&](const Tensor&) { ++apart_calls; };
  const cuda_ops::GatedProduct silu{OpId::kSilu, GeluApprox::kNone, false};
  {
    const ScopedGemvMode on(GemvMode::kOn);
    OpAttrs add;
    add.epilogue = Epilogue::kAdd;
    EXPECT_FALSE(cuda_ops::NormLinearGemv(OpId::kRmsNorm, {x, g}, 1e-5,
                                          {w, Tensor::Empty({1, 48}, t, CUDA(0))}, add, out, count,
                                          &silu));
    const Tensor w_odd = randn({95, 64}, gen, t, CUDA(0));
    EXPECT_FALSE(cuda_ops::NormLinearGemv(OpId::kRmsNorm, {x, g}, 1e-5, {w_odd}, OpAttrs{}, out,
                                          count, &silu));
    const Tensor out_wide = Tensor::Empty({1, 96}, t, CUDA(0));
    EXPECT_FALSE(cuda_ops::NormLinearGemv(OpId::kRmsNorm, {x, g}, 1e-5, {w}, OpAttrs{}, out_wide,
                                          count, &silu));
    const cuda_ops::GatedProduct tanh_gate{OpId::kTanh, GeluApprox::kNone, true};
    EXPECT_FALSE(cuda_ops::NormLinearGemv(OpId::kRmsNorm, {x, g}, 1e-5, {w}, OpAttrs{}, out, count,
                                          &tanh_gate));
  }
  {
    const ScopedGemvMode off(GemvMode::kOff);
    EXPECT_FALSE(
        cuda_ops::NormLinearGemv(OpId::kRmsNorm, {x, g}, 1e-5, {w}, OpAttrs{}, out, count, &silu));
  }
  EXPECT_EQ(apart_calls, 0);
  const ScopedGemvMode mode(GemvMode::kAuto);
  OpAttrs na;
  na.eps = 1e-5;
  auto apart = [&](const Tensor& dst) {
    const Tensor y = Dispatch(OpId::kLinear, {Dispatch(OpId::kRmsNorm, {x, g}, na), w}, {});
    DispatchOut(OpId::kMul, {Dispatch(OpId::kSilu, {slice(y, 1, 48, 96)}, {}), slice(y, 1, 0, 48)},
                {}, dst);
  };
  const Tensor want = Tensor::Empty({1, 48}, t, CUDA(0));
  apart(want);
  if (!cuda_ops::NormLinearGemv(OpId::kRmsNorm, {x, g}, 1e-5, {w}, OpAttrs{}, out, apart, &silu)) {
    apart(out);  // the two kernels timed faster
  }
  Tolerance tol = LinearTolerance(t, 64);
  tol.atol *= 2, tol.rtol *= 2;
  ExpectClose(to_vector(out), to_vector(want), tol, "auto");
  EXPECT_NE(cuda_ops::GemvDecisions().find("[1x48x64 bf16 rms_norm glu(silu)]"), std::string::npos)
      << cuda_ops::GemvDecisions();
}

// ---- Layouts: strided x rows, weight slices, other ranks. -----------------------------------

constexpr DType kTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// x rows `gap` elements apart beyond k: gap 5 leaves the rows misaligned for 16-byte loads
// (w stays aligned: the vector path with scalar x), gap 8 keeps them aligned.
TEST(Gemv, StridedRowsOfX) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvMode on(GemvMode::kOn);
  Generator gen(5);
  for (DType t : kTypes) {
    for (int64_t k : {17, 768}) {
      for (int64_t gap : {5, 8}) {
        const Tensor base = RandomX({3, k + gap}, k, t, gen);
        const Tensor x = base.as_strided({3, k}, {k + gap, 1}, base.offset());
        const Tensor w = randn({300, k}, gen, t, CUDA(0));
        const Tensor b = randn({300}, gen, t, CUDA(0));
        ExpectMatchesCpu(x, w, b, Epilogue::kGeluTanh,
                         absl::StrCat(DTypeName(t), " k=", k, " gap=", gap));
      }
    }
  }
}

// w as a slice of a wider matrix: offset 1 and row stride k + 1 (misaligned rows: the scalar
// path); offset 8 and a row stride that is a multiple of 8 elements (16-byte aligned rows:
// vectors, plus for k = 21 a tail of 5 (16-bit types) or 1 (float32) elements); and x starting
// one element in (misaligned rows: scalar x loads) against an aligned w.
TEST(Gemv, WeightSlicesAndMisalignedX) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvMode on(GemvMode::kOn);
  Generator gen(6);
  for (DType t : kTypes) {
    for (int64_t k : {21, 768}) {
      const Tensor wide = randn({500, k + 1}, gen, t, CUDA(0));
      const Tensor w1 = wide.as_strided({500, k}, {k + 1, 1}, wide.offset() + 1);
      const Tensor x = RandomX({2, k}, k, t, gen);
      ExpectMatchesCpu(x, w1, Tensor(), Epilogue::kRelu,
                       absl::StrCat(DTypeName(t), " k=", k, " w offset 1"));
      const int64_t ld = (k / 8 + 2) * 8;  // >= k + 8
      const Tensor padded = randn({500, ld}, gen, t, CUDA(0));
      const Tensor w8 = padded.as_strided({500, k}, {ld, 1}, padded.offset() + 8);
      ExpectMatchesCpu(x, w8, randn({500}, gen, t, CUDA(0)), Epilogue::kNone,
                       absl::StrCat(DTypeName(t), " k=", k, " w offset 8"));
      const Tensor xs = RandomX({2 * k + 1}, k, t, gen);
      const Tensor x1 = xs.as_strided({2, k}, {k, 1}, xs.offset() + 1);
      ExpectMatchesCpu(x1, randn({500, k}, gen, t, CUDA(0)), Tensor(), Epilogue::kNone,
                       absl::StrCat(DTypeName(t), " k=", k, " x offset 1"));
    }
  }
}

// A 1-D x (m = 1), a [2, 3, k] x (m = 6), a bias with stride 2, and a transposed w (column
// stride != 1: not the GEMV's, cuBLASLt runs it even when forced on).
TEST(Gemv, OtherRanksAndLayouts) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvMode on(GemvMode::kOn);
  Generator gen(7);
  for (DType t : kTypes) {
    const Tensor w = randn({129, 64}, gen, t, CUDA(0));
    const Tensor b2 = randn({258}, gen, t, CUDA(0));
    const Tensor b = b2.as_strided({129}, {2}, b2.offset());
    ExpectMatchesCpu(RandomX({64}, 64, t, gen), w, b, Epilogue::kNone, "1-D x");
    ExpectMatchesCpu(RandomX({2, 3, 64}, 64, t, gen), w, b, Epilogue::kRelu, "3-D x");
    const Tensor wt = randn({64, 129}, gen, t, CUDA(0));
    ExpectMatchesCpu(RandomX({4, 64}, 64, t, gen), transpose(wt, 0, 1), Tensor(), Epilogue::kNone,
                     "transposed w");
  }
}

// A NaN in row 0 of x makes all of out's row 0 NaN, through relu too (relu keeps NaN, as kiln's
// relu op does; cuBLASLt's ReLU epilogue would give 0); the other rows are unaffected.
TEST(Gemv, NanInXPropagates) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvMode on(GemvMode::kOn);
  Generator gen(8);
  for (DType t : kTypes) {
    for (int64_t k : {3, 768}) {
      std::vector<double> xv = to_vector(randn({3, k}, gen, DType::kFloat32));
      xv[k / 2] = std::numeric_limits<double>::quiet_NaN();
      const Tensor x = from_vector(xv, {3, k}, t, CUDA(0));
      const Tensor w = randn({40, k}, gen, t, CUDA(0));
      for (const Act& a : kActs) {
        const Tensor b = a.bias ? randn({40}, gen, t, CUDA(0)) : Tensor();
        const std::string what = absl::StrCat(DTypeName(t), " k=", k, " ", Name(a));
        const std::vector<double> out =
            to_vector(Linear(x, w, b, a.epilogue, ResidualFor(x, w, a.epilogue)));
        for (int64_t c = 0; c < 40; ++c) EXPECT_TRUE(std::isnan(out[c])) << what << " col " << c;
        for (int64_t i = 40; i < 120; ++i) EXPECT_FALSE(std::isnan(out[i])) << what << " " << i;
        ExpectMatchesCpu(x, w, b, a.epilogue, what);
      }
    }
  }
}

// Rows of w past element 2^31 (int64 indexing): [270000, 8192] bf16 (4.4 GB); columns on both
// sides of row 262144 (element 2^31) against double dot products.
TEST(Gemv, RowsBeyondTwoToThe31Elements) {
  KILN_SKIP_WITHOUT_GPU();
  const int64_t n = 270000, k = 8192;
  if (cuda::Props(0).total_memory < (size_t{16} << 30)) GTEST_SKIP() << "needs 16 GB of memory";
  const ScopedGemvMode on(GemvMode::kOn);
  Generator gen(9);
  const Tensor w = randn({n, k}, gen, DType::kBFloat16, CUDA(0));
  const Tensor x = RandomX({1, k}, k, DType::kBFloat16, gen);
  const std::vector<double> out = to_vector(Linear(x, w, Tensor(), Epilogue::kNone));
  const std::vector<double> xv = to_vector(x);
  for (int64_t c : {int64_t{0}, int64_t{262143}, int64_t{262144}, int64_t{262145}, n - 1}) {
    const std::vector<double> row = to_vector(w.as_strided({k}, {1}, w.offset() + c * k));
    double want = 0;
    for (int64_t i = 0; i < k; ++i) want += row[i] * xv[i];
    const Tolerance tol = ToleranceFor(DType::kBFloat16);
    EXPECT_NEAR(out[c], want, tol.atol + tol.rtol * std::fabs(want)) << "column " << c;
  }
}

// ---- The choice. ----------------------------------------------------------------------------

int CountGemv(const std::vector<std::string>& names) {
  return static_cast<int>(std::count_if(names.begin(), names.end(), [](const std::string& s) {
    return s.find("GemvKernel") != std::string::npos;
  }));
}

// KILN_GEMV=off (SetGemvMode(kOff)): cuBLASLt runs (no GEMV kernel) and its answer is right;
// kOn: exactly one kernel, the GEMV (bias and gelu inside).
TEST(GemvChoice, OffRunsCublasLtAndOnRunsTheGemv) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(10);
  const Tensor x = RandomX({1, 768}, 768, DType::kBFloat16, gen);
  const Tensor w = randn({2304, 768}, gen, DType::kBFloat16, CUDA(0));
  const Tensor b = randn({2304}, gen, DType::kBFloat16, CUDA(0));
  {
    const ScopedGemvMode off(GemvMode::kOff);
    ExpectMatchesCpu(x, w, b, Epilogue::kGeluTanh, "off");
    const std::vector<std::string> names =
        KernelNames([&] { Linear(x, w, b, Epilogue::kGeluTanh); });
    EXPECT_FALSE(names.empty());
    EXPECT_EQ(CountGemv(names), 0) << absl::StrJoin(names, "\n");
  }
  const ScopedGemvMode on(GemvMode::kOn);
  const std::vector<std::string> names = KernelNames([&] { Linear(x, w, b, Epilogue::kGeluTanh); });
  ASSERT_EQ(names.size(), 1u) << absl::StrJoin(names, "\n");
  EXPECT_EQ(CountGemv(names), 1) << names[0];
}

// kAuto: the first call of a problem times both paths and the decision is listed; the result is
// right whichever won.
TEST(GemvChoice, AutoRecordsATimedDecision) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvMode automatic(GemvMode::kAuto);
  Generator gen(11);
  const Tensor x = RandomX({2, 777}, 777, DType::kFloat16, gen);  // k = 777: odd, unaligned rows
  const Tensor w = randn({1000, 777}, gen, DType::kFloat16, CUDA(0));
  ExpectMatchesCpu(x, w, Tensor(), Epilogue::kRelu, "auto");
  const std::string log = cuda_ops::GemvDecisions();
  const std::string line = "gemv: [2x1000x777 f16 relu align x=2,w=2]";
  const size_t at = log.find(line);
  ASSERT_NE(at, std::string::npos) << log;
  const std::string rest = log.substr(at, log.find('\n', at) - at);
  // Timed now, or by an earlier process that stored it in the cache directory.
  EXPECT_TRUE(rest.find("µs vs cublasLt") != std::string::npos ||
              rest.find("(stored)") != std::string::npos)
      << rest;
  const bool gemv = rest.find("-> gemv") != std::string::npos;
  EXPECT_TRUE(gemv || rest.find("-> cublasLt") != std::string::npos) << rest;
  if (cuda::KernelCacheDir().empty() || EnvBool("KILN_RETIME")) return;
  const std::optional<std::string> stored = cuda_ops::LoadDecision(
      absl::StrCat("gemv|[2x1000x777 f16 relu align x=2,w=2]|", cuda_ops::DeviceIdentity(CUDA(0))));
  ASSERT_TRUE(stored.has_value()) << "the decision is kept for later processes";
  EXPECT_EQ(*stored, gemv ? "gemv" : "cublasLt");
}

// A problem first met while the stream captures cannot be timed: the GEMV runs (the capture
// holds its kernel), the log says so, and the next call for a graph replay outside the capture
// (cuda::ScopedGraphReplay, as a plan's run before its capture) times it. Plain runs are a
// problem of their own (no " graph"), timed at their first call.
TEST(GemvChoice, UnseenProblemUnderCaptureRunsTheGemvUntimed) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvMode automatic(GemvMode::kAuto);
  Generator gen(12);
  const Tensor x = RandomX({3, 333}, 333, DType::kFloat32, gen);
  const Tensor w = randn({555, 333}, gen, DType::kFloat32, CUDA(0));
  const Tensor out = empty({3, 555}, DType::kFloat32, CUDA(0));
  // Forget decisions an earlier run stored (they would be used under the capture).
  for (const char* graph : {" graph", ""}) {
    const std::string key = absl::StrCat("gemv|[3x555x333 f32 align x=4,w=4,out=4", graph, "]|",
                                         cuda_ops::DeviceIdentity(CUDA(0)));
    std::filesystem::remove(absl::StrCat(
        cuda::KernelCacheDir(), "/", absl::Hex(cuda::Fnv1a(key), absl::kZeroPad16), ".decision"));
    ASSERT_FALSE(cuda_ops::LoadDecision(key).has_value());
  }
  cuda::Synchronize();
  cuda::Stream stream;
  {
    cuda::StreamGuard guard(stream.get());
    KILN_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    DispatchOut(OpId::kLinear, {x, w}, OpAttrs{}, out);
    cudaGraph_t graph = nullptr;
    KILN_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
    cudaGraphExec_t exec = nullptr;
    KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  const Tensor want = Linear(to(x, kCPU), to(w, kCPU), Tensor(), Epilogue::kNone);
  ExpectClose(to_vector(out), to_vector(want), LinearTolerance(DType::kFloat32, 333), "captured");
  const std::string for_graph = "gemv: [3x555x333 f32 align x=4,w=4,out=4 graph] ";
  const std::string plain = "gemv: [3x555x333 f32 align x=4,w=4,out=4] ";
  const std::string log = cuda_ops::GemvDecisions();
  EXPECT_NE(log.find(for_graph + "first seen in a CUDA graph capture -> gemv"), std::string::npos)
      << log;
  EXPECT_EQ(log.find(for_graph, log.find(for_graph) + 1), std::string::npos) << log;  // untimed
  EXPECT_EQ(log.find(plain), std::string::npos) << log;
  {
    const cuda::ScopedGraphReplay replayed;
    ExpectMatchesCpu(x, w, Tensor(), Epilogue::kNone, "for a graph, after the capture");
  }
  ExpectMatchesCpu(x, w, Tensor(), Epilogue::kNone, "plain");
  const std::string after = cuda_ops::GemvDecisions();
  const size_t timed = after.find(for_graph, after.find(for_graph) + 1);  // a second line
  ASSERT_NE(timed, std::string::npos) << after;
  EXPECT_NE(after.substr(timed, after.find('\n', timed) - timed).find("µs vs cublasLt"),
            std::string::npos)
      << after;
  const size_t timed_plain = after.find(plain);
  ASSERT_NE(timed_plain, std::string::npos) << after;
  EXPECT_NE(
      after.substr(timed_plain, after.find('\n', timed_plain) - timed_plain).find("µs vs cublasLt"),
      std::string::npos)
      << after;
}

// The timing both per-shape choices use (ops/cuda/device_timing.h) measures device time: a path
// that keeps the device busy ten times longer times about ten times longer, each within the delay
// it asked for plus launch slack, in the order the paths were given.
TEST(DeviceTiming, MediansFollowTheDeviceWork) {
  KILN_SKIP_WITHOUT_GPU();
  auto delay = [](int64_t ns) {
    return [ns] { KILN_CUDA_CHECK(cuda_kernels::DeviceDelay(ns, cuda::CurrentStream())); };
  };
  const std::vector<double> us =
      cuda_ops::MedianDeviceUs(CUDA(0), {delay(200'000), delay(20'000)}, 5);
  ASSERT_EQ(us.size(), 2u);
  EXPECT_GE(us[0], 200.0);
  EXPECT_LT(us[0], 400.0);
  EXPECT_GE(us[1], 20.0);
  EXPECT_LT(us[1], 100.0);
}

// Without a GPU: the mode round-trips and overrides the environment.
TEST(GemvChoice, SetGemvModeOverrides) {
  const ScopedGemvMode off(GemvMode::kOff);
  EXPECT_EQ(cuda_ops::CurrentGemvMode(), GemvMode::kOff);
  cuda_ops::SetGemvMode(GemvMode::kOn);
  EXPECT_EQ(cuda_ops::CurrentGemvMode(), GemvMode::kOn);
}

}  // namespace
}  // namespace kiln
