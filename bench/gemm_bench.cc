// The GEMM family's Hopper kernel against cuBLASLt on the same operands (kiln's linear with the
// GEMV off, which calls cuBLASLt), device time by the benchmark harness (bench_harness.h: cold L2,
// the GPU kept busy), repetitions interleaved path by path; the answers are compared first.
//
//   build/bench/gemm_bench [--reps 3] [--only mlp_up,square]
// Prints one line per shape and path: "gemm <shape> <path> <device µs> [min-max] <TFLOP/s>".
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench/bench_harness.h"
#include "codegen/families/gemm/gemm_cuda.h"
#include "ops/cuda/matmul_cuda.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/cuda.h"

namespace {

using kiln::DType;
using kiln::Tensor;

struct Shape {
  const char* name;
  int64_t m, n, k;
  bool bias;
};

constexpr Shape kShapes[] = {
    {"mlp_up", 8192, 6144, 768, false},     // the GeGLU MLP's merged gate/up projection
    {"mlp_down", 8192, 768, 3072, false},   // its down projection
    {"linear", 8192, 3072, 768, true},      // the linear workload (+ bias)
    {"square", 8192, 8192, 8192, false},    // the classic TFLOP/s figure
    {"block_qkv", 8192, 3072, 1024, true},  // a d1024 block's fused QKV
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
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
  kiln::cuda_ops::SetGemvMode(kiln::cuda_ops::GemvMode::kOff);
  kiln::bench::Config cfg;
  cfg.count_kernels = false;
  for (const Shape& s : kShapes) {
    if (!only.empty() && std::find(only.begin(), only.end(), s.name) == only.end()) continue;
    kiln::Generator gen(s.m + s.n + s.k);
    const DType t = DType::kBFloat16;
    const Tensor x = kiln::randn({s.m, s.k}, gen, t, kiln::CUDA(0)) * (1.0 / std::sqrt(s.k));
    const Tensor w = kiln::randn({s.n, s.k}, gen, t, kiln::CUDA(0));
    const Tensor b = s.bias ? kiln::randn({s.n}, gen, t, kiln::CUDA(0)) : Tensor();
    const Tensor out = kiln::empty({s.m, s.n}, t, kiln::CUDA(0));
    if (!kiln::cuda_ops::Sm90GemmApplies(x, w, b, out)) {
      std::printf("gemm %s: the sm_90 kernel does not apply here\n", s.name);
      continue;
    }
    const kiln::bench::Step ours = [&] {
      kiln::cuda_ops::RunSm90Gemm(x, w, b, out);
      return kiln::bench::Outputs{out};
    };
    const kiln::bench::Step cublas = [&] {
      return kiln::bench::Outputs{b.defined() ? kiln::linear(x, w, b) : kiln::linear(x, w)};
    };
    // The answer first: the kernel against cuBLASLt, relative to the output's scale.
    const Tensor want = kiln::to(cublas()[0], DType::kFloat32);
    const Tensor got = kiln::to(ours()[0], DType::kFloat32);
    const double diff = kiln::to_vector(kiln::max(kiln::abs(got - want)))[0];
    const double scale = kiln::to_vector(kiln::max(kiln::abs(want)))[0];
    std::printf(
        "gemm %s [%lld x %lld x %lld%s] check: max |sm90 - cublasLt| = %.3g (output max %.3g) %s\n",
        s.name, static_cast<long long>(s.m), static_cast<long long>(s.n),
        static_cast<long long>(s.k), s.bias ? " + bias" : "", diff, scale,
        diff <= 1e-2 * scale ? "ok" : "MISMATCH");
    std::vector<double> us[2];
    for (int r = 0; r < reps; ++r) {
      us[0].push_back(kiln::bench::Measure(ours, cfg).device_us);
      us[1].push_back(kiln::bench::Measure(cublas, cfg).device_us);
    }
    const double flop = 2.0 * s.m * s.n * s.k;
    for (int p = 0; p < 2; ++p) {
      const auto [lo, hi] = std::minmax_element(us[p].begin(), us[p].end());
      std::printf("gemm %s %s %.2f [%.2f-%.2f] us %.1f TFLOP/s\n", s.name,
                  p == 0 ? "kiln_sm90" : "cublasLt", Median(us[p]), *lo, *hi,
                  flop / Median(us[p]) * 1e-6);
    }
  }
  return 0;
}
