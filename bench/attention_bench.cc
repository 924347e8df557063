// kiln's attention kernels at the shapes of docs/BENCHMARKS.md "Attention at other shapes":
// scaled_dot_product_attention (bf16, no mask) with the Hopper kernel (KILN_FLASH_SM90 on) and
// the mma.sync kernel (off), on the same inputs, device time by the benchmark harness
// (bench_harness.h: cold L2, the GPU kept busy; bench/attention_torch.py measures PyTorch's SDPA
// backends the same way), repetitions interleaved kernel by kernel; the answers are checked
// first, each against the first kernel's and, on the first batch, against float32 math.
//
//   build/bench/attention_bench [--reps 3] [--only s1024_d64_causal,...]
//                               [--variant label:KILN_FLASH_SM90_STAGES=3+KEY=VALUE ...]
// (each --variant adds the Hopper kernel under those settings, interleaved with the others).
// Prints one line per shape and kernel:
//   "attention <shape> <kernel> <device µs> [min-max] us <TFLOP/s> TFLOP/s"
// (causal shapes count half the FLOPs, as PyTorch's FlashAttention benchmarks do).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
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
    {"s2048_d64_causal", 8, 16, 2048, 64, true},   {"s1024_d128_causal", 8, 16, 1024, 128, true},
    {"s1024_d128", 8, 16, 1024, 128, false},       {"s4096_d128", 8, 16, 4096, 128, false},
    {"s4096_d128_causal", 8, 16, 4096, 128, true},
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The first batch of [B, H, L, D]: [1, H, L, D].
Tensor First(const Tensor& t) { return kiln::slice(t, 0, 0, 1); }

double MaxAbs(const Tensor& t) { return kiln::to_vector(kiln::max(kiln::abs(t)))[0]; }

// A kernel to time: the Hopper kernel (KILN_FLASH_SM90 on) or the mma.sync one, with the
// settings it runs under (an A/B variant of the Hopper kernel's tiling, say).
struct Variant {
  std::string name;
  bool sm90 = true;
  std::vector<std::pair<std::string, std::string>> env;
};

// "label:KEY=VALUE+KEY=VALUE" (the Hopper kernel under those settings).
Variant ParseVariant(const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  Variant v{parts[0], true, {}};
  if (parts.size() > 1) {
    for (const absl::string_view kv : absl::StrSplit(parts[1], '+', absl::SkipEmpty())) {
      const std::vector<std::string> p = absl::StrSplit(kv, '=');
      v.env.emplace_back(p[0], p.size() > 1 ? p[1] : "");
    }
  }
  return v;
}

Tensor Sdpa(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const Variant& how) {
  setenv("KILN_FLASH_SM90", how.sm90 ? "on" : "off", 1);
  for (const auto& [key, value] : how.env) setenv(key.c_str(), value.c_str(), 1);
  Tensor out = kiln::scaled_dot_product_attention(q, k, v, Tensor(), causal);
  for (const auto& [key, value] : how.env) unsetenv(key.c_str());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  std::vector<std::string> only;
  std::vector<Variant> variants = {{"kiln_sm90", true, {}}, {"kiln_mma_sync", false, {}}};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      only = absl::StrSplit(argv[++i], ',');
    else if (!std::strcmp(argv[i], "--variant") && i + 1 < argc)
      variants.push_back(ParseVariant(argv[++i]));
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
    // The answers first: each kernel against float32 math on the first batch (its [h, l, l]
    // scores fit in memory at every shape), and against the first kernel on every batch.
    Tensor want;
    {
      kiln::SdpaBackendGuard g(kiln::SdpaBackend::kMath);
      auto first = [](const Tensor& t) { return kiln::to(First(t), DType::kFloat32); };
      want = kiln::scaled_dot_product_attention(first(q), first(k), first(v), Tensor(), s.causal);
    }
    const double scale = MaxAbs(want);
    const Tensor a = kiln::to(Sdpa(q, k, v, s.causal, variants[0]), DType::kFloat32);
    for (const Variant& how : variants) {
      const Tensor b = kiln::to(Sdpa(q, k, v, s.causal, how), DType::kFloat32);
      const double d_ab = MaxAbs(a - b), d_b = MaxAbs(First(b) - want);
      std::printf(
          "attention %s [%lld,%lld,%lld,%lld]%s check %s: vs %s %.3g, vs float32 (batch 0) %.3g "
          "(output max %.3g) %s\n",
          s.name, static_cast<long long>(s.b), static_cast<long long>(s.h),
          static_cast<long long>(s.l), static_cast<long long>(s.d), s.causal ? " causal" : "",
          how.name.c_str(), variants[0].name.c_str(), d_ab, d_b, scale,
          d_b <= 2e-2 * (1 + scale) ? "ok" : "MISMATCH");
    }
    std::vector<std::vector<double>> us(variants.size());
    for (int r = 0; r < reps; ++r) {
      for (size_t p = 0; p < variants.size(); ++p) {
        const kiln::bench::Step step = [&, p] {
          return kiln::bench::Outputs{Sdpa(q, k, v, s.causal, variants[p])};
        };
        us[p].push_back(kiln::bench::Measure(step, cfg).device_us);
      }
    }
    const double flop = 4.0 * s.b * s.h * s.l * s.l * s.d * (s.causal ? 0.5 : 1.0);
    for (size_t p = 0; p < variants.size(); ++p) {
      const auto [lo, hi] = std::minmax_element(us[p].begin(), us[p].end());
      std::printf("attention %s %s %.2f [%.2f-%.2f] us %.1f TFLOP/s\n", s.name,
                  variants[p].name.c_str(), Median(us[p]), *lo, *hi, flop / Median(us[p]) * 1e-6);
    }
    std::fflush(stdout);
  }
  return 0;
}
