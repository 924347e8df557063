// 03_mlp: the GeGLU MLP of the "Profiling in PyTorch" series, x [64·128, 768] -> 3072 -> 768,
// no bias, tanh GELU: down(gelu(gate(x)) * up(x)).
//
//   03_mlp [--device cpu|cuda] [--dtype bfloat16|float16|float32] [--tokens N] [--dim D]
//          [--hidden H] [--warmup W] [--iters I]
//
// Defaults reproduce the series' shapes on a GPU (8192 tokens, bf16) and scale the token count
// down on the CPU (256 tokens, float32) so the demo finishes in seconds; it says which it used.
// Output: the answer check (max error against a float32 evaluation with plain ops), then timings.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace {

struct Flags {
  std::string device = "cpu", dtype;
  int64_t tokens = -1, dim = 768, hidden = 3072;
  int warmup = 2, iters = 5;
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "error: %s\nusage: 03_mlp [--device cpu|cuda] [--dtype bfloat16|float16|float32] "
               "[--tokens N] [--dim D] [--hidden H] [--warmup W] [--iters I]\n",
               why);
  std::exit(2);
}

int64_t PositiveInt(const char* s) {
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0' || v <= 0) Usage("sizes and counts must be positive integers");
  return v;
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage(("missing value for " + a).c_str());
    const char* v = argv[++i];
    if (a == "--device")
      f.device = v;
    else if (a == "--dtype")
      f.dtype = v;
    else if (a == "--tokens")
      f.tokens = PositiveInt(v);
    else if (a == "--dim")
      f.dim = PositiveInt(v);
    else if (a == "--hidden")
      f.hidden = PositiveInt(v);
    else if (a == "--warmup")
      f.warmup = static_cast<int>(PositiveInt(v));
    else if (a == "--iters")
      f.iters = static_cast<int>(PositiveInt(v));
    else
      Usage(("unknown flag " + a).c_str());
  }
  return f;
}

kiln::DType ParseDType(const std::string& s) {
  if (s == "float32") return kiln::DType::kFloat32;
  if (s == "float16") return kiln::DType::kFloat16;
  if (s == "bfloat16") return kiln::DType::kBFloat16;
  Usage("--dtype must be float32, float16 or bfloat16");
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Max abs error of `rows` evenly spaced rows of y against a double-precision evaluation.
std::pair<double, double> CheckRows(const kiln::Tensor& x, const kiln::Tensor& y,
                                    kiln::GeGLUMLP& mlp, int rows) {
  using kiln::to_vector;
  const auto xv = to_vector(x), yv = to_vector(y);
  const auto wg = to_vector(mlp.gate().weight()), wu = to_vector(mlp.up().weight());
  const auto wd = to_vector(mlp.down().weight());
  const int64_t n = x.size(0), d = x.size(1), h = mlp.gate().weight().size(0);
  double max_err = 0, max_ref = 0;
  for (int r = 0; r < rows; ++r) {
    const int64_t row = r * (n - 1) / std::max(rows - 1, 1);
    std::vector<double> hid(h);
    for (int64_t j = 0; j < h; ++j) {
      double g = 0, u = 0;
      for (int64_t k = 0; k < d; ++k) {
        g += xv[row * d + k] * wg[j * d + k];
        u += xv[row * d + k] * wu[j * d + k];
      }
      hid[j] = 0.5 * g * (1 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
    }
    for (int64_t o = 0; o < d; ++o) {
      double acc = 0;
      for (int64_t j = 0; j < h; ++j) acc += hid[j] * wd[o * h + j];
      max_err = std::max(max_err, std::fabs(acc - yv[row * d + o]));
      max_ref = std::max(max_ref, std::fabs(acc));
    }
  }
  return {max_err, max_ref};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln;
  Flags f = ParseFlags(argc, argv);
  try {
    const Device device = ParseDevice(f.device);
    const bool gpu = device.is_cuda();
    const DType dtype = ParseDType(f.dtype.empty() ? (gpu ? "bfloat16" : "float32") : f.dtype);
    if (f.tokens < 0) {
      f.tokens = gpu ? 64 * 128 : 256;
      std::printf("shapes: %s defaults (%s)\n", gpu ? "the series'" : "scaled-down CPU",
                  gpu ? "64·128 tokens" : "256 tokens instead of 8192: no GPU");
    }
    std::printf("GeGLU MLP: x [%ld, %ld] -> %ld -> %ld, %s on %s\n", long(f.tokens), long(f.dim),
                long(f.hidden), long(f.dim), std::string(DTypeName(dtype)).c_str(),
                device.str().c_str());
    Generator gen(0);
    GeGLUMLP mlp(f.dim, f.hidden, gen, {dtype, device});
    const Tensor x = randn({f.tokens, f.dim}, gen, dtype, device);

    // Answer check: a few output rows against the same math in double, from the raw weights.
    const Tensor y = mlp(x);
    const auto [max_err, max_ref] = CheckRows(x, y, mlp, /*rows=*/4);
    const double tol = dtype == DType::kFloat32 ? 1e-4 : 3e-2;
    const bool ok = max_err <= tol * std::max(1.0, max_ref);
    std::printf("check: max |kiln - float64 reference| over 4 rows = %.3g (max |ref| %.3g) %s\n",
                max_err, max_ref, ok ? "OK" : "MISMATCH");

    std::vector<double> ms;
    for (int i = 0; i < f.warmup + f.iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const Tensor out = mlp(x);
      to_vector(slice(reshape(out, {-1}), 0, 0, 1));  // waits for the result
      const auto t1 = std::chrono::steady_clock::now();
      if (i >= f.warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    const double flops = 2.0 * f.tokens * f.dim * f.hidden * 3;
    const double med = Median(ms);
    std::printf("eager forward: median %.3f ms over %d iterations (%.1f GFLOP/s)\n", med, f.iters,
                flops / (med * 1e6));
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
