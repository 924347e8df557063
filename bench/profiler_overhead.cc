// Per-op host overhead of the profiler: `kiln::add` of two 16-element tensors, timed with the
// profiler off (one branch per op), on with host ranges only, on with input shapes, and (CUDA
// tensors) on with host ranges + CUPTI device activity. Each mode runs --reps times over --ops
// ops; the median ns/op is reported. With --device cuda the ops are launches on the GPU (the
// queue is synchronised at the end of each run, inside the timing).
//
//   build/bench/profiler_overhead [--ops 100000] [--reps 7] [--device cpu|cuda]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ops/factories.h"
#include "ops/ops.h"
#include "profiler/profiler.h"
#include "runtime/cuda.h"

namespace {

using kiln::Tensor;
namespace prof = kiln::profiler;

double NsPerOp(const Tensor& a, const Tensor& b, int ops) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < ops; ++i) {
    Tensor c = kiln::add(a, b);
    if (c.numel() != 16) std::abort();
  }
  if (a.device().is_cuda()) kiln::cuda::Synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / ops;
}

// One timed run in `mode`: "off", "on" (host ranges), "shapes" (host ranges + input shapes),
// "cupti" (host ranges + CUPTI device activity).
double RunMode(const std::string& mode, const Tensor& a, const Tensor& b, int ops) {
  if (mode == "off") return NsPerOp(a, b, ops);
  prof::ProfilerOptions options;
  options.device = mode == "cupti";
  options.record_shapes = mode == "shapes";
  prof::Profiler p(std::move(options));
  p.Start();
  const double ns = NsPerOp(a, b, ops);
  const prof::ProfileResult r = p.Stop();
  if (static_cast<int>(r.host.size()) < ops) std::abort();
  return ns;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int ops = 100000, reps = 7;
  std::string device = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--ops") == 0) ops = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--device") == 0) device = argv[i + 1];
  }
  const bool gpu = device == "cuda";
  if (gpu && !kiln::cuda::IsAvailable()) {
    std::fprintf(stderr, "profiler_overhead: --device cuda: no CUDA device\n");
    return 1;
  }
  const kiln::Device d = gpu ? kiln::CUDA(0) : kiln::kCPU;
  const Tensor a = kiln::ones({16}, kiln::DType::kFloat32, d);
  const Tensor b = kiln::ones({16}, kiln::DType::kFloat32, d);
  NsPerOp(a, b, ops / 10 + 1);  // warm-up: allocator, caches
  std::vector<std::string> modes = {"off", "on", "shapes"};
  if (gpu) modes.push_back("cupti");
  std::vector<std::vector<double>> runs(modes.size());
  for (int r = 0; r < reps; ++r) {  // interleaved, so drift hits every mode alike
    for (size_t m = 0; m < modes.size(); ++m) runs[m].push_back(RunMode(modes[m], a, b, ops));
  }
  const double off = Median(runs[0]);
  std::printf("profiler overhead: kiln::add of two float32[16] %s tensors, %d ops x %d runs\n",
              gpu ? "CUDA" : "CPU", ops, reps);
  for (size_t m = 0; m < modes.size(); ++m) {
    const double med = Median(runs[m]);
    std::printf("  %-7s median %8.1f ns/op  (min %8.1f, max %8.1f)  overhead %+7.1f ns/op\n",
                modes[m].c_str(), med, *std::min_element(runs[m].begin(), runs[m].end()),
                *std::max_element(runs[m].begin(), runs[m].end()), med - off);
  }
  return 0;
}
