// kiln's attention kernels at the shapes of docs/BENCHMARKS.md "Attention at other shapes":
// scaled_dot_product_attention (bf16, no mask) with the Hopper kernel (KILN_FLASH_SM90 on) and
// the mma.sync kernel (off), on the same inputs, device time by the benchmark harness
// (bench_harness.h: cold L2, the GPU kept busy; bench/attention_torch.py measures PyTorch's SDPA
// backends the same way), repetitions interleaved kernel by kernel; the answers are compared
// first, with each other and, below 2^31 scores, with float32 math.
//
//   build/bench/attention_bench [--reps 3] [--only s1024_d64_causal,...]
// Prints one line per shape and kernel:
//   "attention <shape> <kernel> <device µs> [min-max] us <TFLOP/s> TFLOP/s"
// (causal shapes count half the FLOPs, as PyTorch's FlashAttention benchmarks do).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench/bench_harness.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/cuda.h"

namespace {

using kiln::DType;
using kiln::Tensor;

struct Shape {
  const char* name;
  int64_t b, h, l, d;
  bool causal;
};

constexpr Shape kShapes[] = {
    {"s1024_d64_causal", 8, 16, 1024, 64, true},   {"s1024_d64", 8, 16, 1024, 64, false},
    {"s4096_d64_causal", 8, 16, 4096, 64, true},   {"s4096_d64", 8, 16, 4096, 64, false},
    {"s1024_d128_causal", 8, 16, 1024, 128, true}, {"s1024_d128", 8, 16, 1024, 128, false},
    {"s4096_d128", 8, 16, 4096, 128, false},
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The first batch of [B, H, L, D]: [1, H, L, D].
Tensor First(const Tensor& t) { return kiln::slice(t, 0, 0, 1); }

double MaxAbs(const Tensor& t) { return kiln::to_vector(kiln::max(kiln::abs(t)))[0]; }

Tensor Sdpa(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, bool sm90) {
  setenv("KILN_FLASH_SM90", sm90 ? "on" : "off", 1);
  return kiln::scaled_dot_product_attention(q, k, v, Tensor(), causal);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      only = absl::StrSplit(argv[++i], ',');
  }
  kiln::bench::Config cfg;
  cfg.count_kernels = false;
  for (const Shape& s : kShapes) {
    if (!only.empty() && std::find(only.begin(), only.end(), s.name) == only.end()) continue;
    kiln::Generator gen(s.l + s.d);
    const std::vector<int64_t> dims = {s.b, s.h, s.l, s.d};
    const Tensor q = kiln::randn(dims, gen, DType::kBFloat16, kiln::CUDA(0));
    const Tensor k = kiln::randn(dims, gen, DType::kBFloat16, kiln::CUDA(0));
    const Tensor v = kiln::randn(dims, gen, DType::kBFloat16, kiln::CUDA(0));
    const char* names[] = {"kiln_sm90", "kiln_mma_sync"};
    // The answers first: the two kernels against each other, and against float32 math on the
    // first batch (its [h, l, l] scores fit in memory at every shape).
    const Tensor a = kiln::to(Sdpa(q, k, v, s.causal, true), DType::kFloat32);
    const Tensor b = kiln::to(Sdpa(q, k, v, s.causal, false), DType::kFloat32);
    Tensor want;
    {
      kiln::SdpaBackendGuard g(kiln::SdpaBackend::kMath);
      auto first = [](const Tensor& t) { return kiln::to(First(t), DType::kFloat32); };
      want = kiln::scaled_dot_product_attention(first(q), first(k), first(v), Tensor(), s.causal);
    }
    const double scale = MaxAbs(want);
    const double d_ab = MaxAbs(a - b), d_a = MaxAbs(First(a) - want), d_b = MaxAbs(First(b) - want);
    const bool ok = d_a <= 2e-2 * (1 + scale) && d_b <= 2e-2 * (1 + scale);
    std::printf(
        "attention %s [%lld,%lld,%lld,%lld]%s check: sm90 vs mma.sync %.3g, vs float32 (batch 0)"
        " %.3g / %.3g (output max %.3g) %s\n",
        s.name, static_cast<long long>(s.b), static_cast<long long>(s.h),
        static_cast<long long>(s.l), static_cast<long long>(s.d), s.causal ? " causal" : "", d_ab,
        d_a, d_b, scale, ok ? "ok" : "MISMATCH");
    std::vector<std::vector<double>> us(2);
    for (int r = 0; r < reps; ++r) {
      for (int p = 0; p < 2; ++p) {
        const kiln::bench::Step step = [&, p] {
          return kiln::bench::Outputs{Sdpa(q, k, v, s.causal, p == 0)};
        };
        us[p].push_back(kiln::bench::Measure(step, cfg).device_us);
      }
    }
    const double flop = 4.0 * s.b * s.h * s.l * s.l * s.d * (s.causal ? 0.5 : 1.0);
    for (int p = 0; p < 2; ++p) {
      const auto [lo, hi] = std::minmax_element(us[p].begin(), us[p].end());
      std::printf("attention %s %s %.2f [%.2f-%.2f] us %.1f TFLOP/s\n", s.name, names[p],
                  Median(us[p]), *lo, *hi, flop / Median(us[p]) * 1e-6);
    }
    std::fflush(stdout);
  }
  return 0;
}
