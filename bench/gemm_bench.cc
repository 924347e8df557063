// The GEMM family's Hopper kernel against cuBLASLt on the same operands (kiln's linear with the
// GEMV off, which calls cuBLASLt), device time by the benchmark harness (bench_harness.h: cold L2,
// the GPU kept busy), repetitions interleaved path by path; the answers are compared first.
// `--variants` also times every tile width in both consumer forms (shared tiles, ping-pong);
// the GeGLU shape's cuBLASLt line is the plain GEMM of the same size (what its epilogue adds);
// the block shapes carry linear's epilogues (tanh GELU, a residual), cuBLASLt's against kiln's.
//
//   build/bench/gemm_bench [--reps 3] [--only mlp_up,square] [--variants]
// Prints one line per shape and path: "gemm <shape> <path> <device µs> [min-max] <TFLOP/s>".
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_harness.h"
#include "codegen/families/gemm/gemm_cuda.h"
#include "ops/cuda/matmul_cuda.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/cuda.h"

namespace {

using kiln::DType;
using kiln::Tensor;
using kiln::cuda_ops::GemmConfig;

struct Shape {
  const char* name;
  int64_t m, n, k;
  bool bias;
  bool geglu = false;
  kiln::Epilogue epilogue = kiln::Epilogue::kNone;  // linear's (kAdd: a residual)
};

constexpr Shape kShapes[] = {
    {"mlp_up", 8192, 6144, 768, false},           // the GeGLU MLP's merged gate/up projection
    {"mlp_geglu", 8192, 6144, 768, false, true},  // the same with the GeGLU epilogue
    {"mlp_down", 8192, 768, 3072, false},         // its down projection
    {"linear", 8192, 3072, 768, true},            // the linear workload (+ bias)
    {"square", 8192, 8192, 8192, false},          // the classic TFLOP/s figure
    {"block_qkv", 8192, 3072, 1024, true},        // a d1024 block's fused QKV
    {"block_up_gelu", 8192, 4096, 1024, true, false, kiln::Epilogue::kGeluTanh},  // its MLP's up
    {"block_down_res", 8192, 1024, 4096, true, false, kiln::Epilogue::kAdd},      // down + residual
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Path {
  std::string name;
  std::function<Tensor()> run;
};

// The kernel's default config for the shape, then (with `variants`) every width in both forms.
std::vector<GemmConfig> ConfigsFor(const Shape& s, bool variants, int sms) {
  using kiln::cuda_ops::Sm90GegluConfigFor;
  using kiln::cuda_ops::Sm90GemmConfigFor;
  const DType t = DType::kBFloat16;
  std::vector<GemmConfig> all = {s.geglu ? Sm90GegluConfigFor(t, s.m, s.n, s.k, s.bias, sms)
                                         : Sm90GemmConfigFor(t, s.m, s.n, s.k, s.bias, sms)};
  auto with_epilogue = [&](GemmConfig c) {
    c.residual = s.epilogue == kiln::Epilogue::kAdd;
    if (!c.residual && s.epilogue != kiln::Epilogue::kNone) {
      c.epilogue = kiln::cuda_ops::Sm90LinearEpilogue(c, s.epilogue);
    }
    return c;
  };
  all[0] = with_epilogue(all[0]);
  if (!variants) return all;
  for (bool pingpong : {false, true}) {
    for (int bn : {128, 192, 256}) {
      if (s.geglu && bn == 192) continue;
      GemmConfig c{.dtype = t, .bn = bn, .pingpong = pingpong, .bias = s.bias, .geglu = s.geglu};
      c.stages = c.MostStages();
      c = with_epilogue(c);
      if (c.Name() != all[0].Name()) all.push_back(c);
    }
  }
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  bool variants = false;
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      only = absl::StrSplit(argv[++i], ',');
    else if (!std::strcmp(argv[i], "--variants"))
      variants = true;
  }
  kiln::cuda_ops::SetGemvMode(kiln::cuda_ops::GemvMode::kOff);
  kiln::bench::Config cfg;
  cfg.count_kernels = false;
  const int sms = kiln::cuda::Props(0).sm_count;
  for (const Shape& s : kShapes) {
    if (!only.empty() && std::find(only.begin(), only.end(), s.name) == only.end()) continue;
    kiln::Generator gen(s.m + s.n + s.k);
    const DType t = DType::kBFloat16;
    const Tensor x = kiln::randn({s.m, s.k}, gen, t, kiln::CUDA(0)) * (1.0 / std::sqrt(s.k));
    const Tensor w = kiln::randn({s.n, s.k}, gen, t, kiln::CUDA(0));
    const Tensor b = s.bias ? kiln::randn({s.n}, gen, t, kiln::CUDA(0)) : Tensor();
    const Tensor out = kiln::empty({s.m, s.geglu ? s.n / 2 : s.n}, t, kiln::CUDA(0));
    const Tensor r = s.epilogue == kiln::Epilogue::kAdd
                         ? kiln::randn({s.m, s.n}, gen, t, kiln::CUDA(0))
                         : Tensor();
    if (!kiln::cuda_ops::Sm90GemmApplies(x, w, b, out, s.geglu, r)) {
      std::printf("gemm %s: the sm_90 kernel does not apply here\n", s.name);
      continue;
    }
    kiln::OpAttrs attrs;
    attrs.epilogue = s.epilogue;
    std::vector<Tensor> in = {x, w};
    if (b.defined()) in.push_back(b);
    if (r.defined()) in.push_back(r);
    std::vector<Path> paths = {{s.geglu ? "cublasLt_plain" : "cublasLt",
                                [&] { return kiln::Dispatch(kiln::OpId::kLinear, in, attrs); }}};
    const std::vector<GemmConfig> configs = ConfigsFor(s, variants, sms);
    for (size_t i = 0; i < configs.size(); ++i) {
      const GemmConfig c = configs[i];
      paths.push_back({i == 0 ? "kiln_sm90" : c.Name(), [&, c] {
                         kiln::cuda_ops::RunSm90Gemm(x, w, b, out, c, r);
                         return out;
                       }});
    }
    // The answers first: each kernel against cuBLASLt (GeGLU: against the default config),
    // relative to the output's scale.
    const Tensor want = kiln::to(paths[s.geglu ? 1 : 0].run(), DType::kFloat32);
    const double scale = kiln::to_vector(kiln::max(kiln::abs(want)))[0];
    for (size_t p = s.geglu ? 2 : 1; p < paths.size(); ++p) {
      const Tensor got = kiln::to(paths[p].run(), DType::kFloat32);
      const double diff = kiln::to_vector(kiln::max(kiln::abs(got - want)))[0];
      std::printf(
          "gemm %s [%lld x %lld x %lld%s%s %s] check %s: max diff %.3g (output max %.3g) %s\n",
          s.name, static_cast<long long>(s.m), static_cast<long long>(s.n),
          static_cast<long long>(s.k), s.bias ? " + bias" : "", s.geglu ? " geglu" : "",
          kiln::EpilogueName(s.epilogue), paths[p].name.c_str(), diff, scale,
          diff <= 1e-2 * scale ? "ok" : "MISMATCH");
    }
    std::vector<std::vector<double>> us(paths.size());
    for (int r = 0; r < reps; ++r) {
      for (size_t p = 0; p < paths.size(); ++p) {
        const kiln::bench::Step step = [&, p] { return kiln::bench::Outputs{paths[p].run()}; };
        us[p].push_back(kiln::bench::Measure(step, cfg).device_us);
      }
    }
    const double flop = 2.0 * s.m * s.n * s.k;
    for (size_t p = 0; p < paths.size(); ++p) {
      const auto [lo, hi] = std::minmax_element(us[p].begin(), us[p].end());
      std::printf("gemm %s %s %.2f [%.2f-%.2f] us %.1f TFLOP/s\n", s.name, paths[p].name.c_str(),
                  Median(us[p]), *lo, *hi, flop / Median(us[p]) * 1e-6);
    }
  }
  return 0;
}
