// Per-op host overhead of the profiler: `kiln::add` of two 16-element CPU tensors, timed with
// the profiler off (one branch per op), on with host ranges only, and on with input shapes.
// Each mode runs --reps times over --ops ops; the median ns/op is reported.
//
//   build/bench/profiler_overhead [--ops 100000] [--reps 7]
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

namespace {

using kiln::Tensor;
namespace prof = kiln::profiler;

double NsPerOp(const Tensor& a, const Tensor& b, int ops) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < ops; ++i) {
    Tensor c = kiln::add(a, b);
    if (c.numel() != 16) std::abort();
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / ops;
}

// One timed run in `mode`: "off", "on" (host ranges), "shapes" (host ranges + input shapes).
double RunMode(const std::string& mode, const Tensor& a, const Tensor& b, int ops) {
  if (mode == "off") return NsPerOp(a, b, ops);
  prof::ProfilerOptions options;
  options.device = false;  // host overhead only (CUPTI's own cost is device-side tracing)
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
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--ops") == 0) ops = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  }
  const Tensor a = kiln::ones({16}), b = kiln::ones({16});
  NsPerOp(a, b, ops / 10 + 1);  // warm-up: allocator, caches
  const std::vector<std::string> modes = {"off", "on", "shapes"};
  std::vector<std::vector<double>> runs(modes.size());
  for (int r = 0; r < reps; ++r) {  // interleaved, so drift hits every mode alike
    for (size_t m = 0; m < modes.size(); ++m) runs[m].push_back(RunMode(modes[m], a, b, ops));
  }
  const double off = Median(runs[0]);
  std::printf("profiler overhead: kiln::add of two float32[16] CPU tensors, %d ops x %d runs\n",
              ops, reps);
  for (size_t m = 0; m < modes.size(); ++m) {
    const double med = Median(runs[m]);
    std::printf("  %-7s median %8.1f ns/op  (min %8.1f, max %8.1f)  overhead %+7.1f ns/op\n",
                modes[m].c_str(), med, *std::min_element(runs[m].begin(), runs[m].end()),
                *std::max_element(runs[m].begin(), runs[m].end()), med - off);
  }
  return 0;
}
