// libtorch_baseline.cc - libtorch (PyTorch C++ API) side of the kiln benchmark.
//
// What it is for
//   Times the workloads of bench/kiln_bench.cc through libtorch's C++ API (no Python, no
//   torch.compile), eager and captured in a CUDA graph, so kiln's C++ numbers have a PyTorch
//   reference without the interpreter's per-call cost. bench/torch_baseline.py is the Python
//   twin (it has the compiled, frozen and SDPA-backend modes); the method is the one of
//   bench/bench_harness.h.
//
// How to build and run (on the GPU machine)
//   bash bench/build_libtorch_baseline.sh /tmp/libtorch_baseline
//   /tmp/libtorch_baseline --json libtorch.json [--quick] [--reps 3] [--only mlp,attention]
//       [--sync-dir DIR] [--no-prequeue] [--no-kernels]
//
// Modes (rows "<workload>/<mode>"): eager; eager+graph (at::cuda::CUDAGraph captured once on
// the row's inputs, replayed); attention also eager_inplace, and sdpa / sdpa+graph for
// attention, block_* and decode_* (at::scaled_dot_product_attention, default backend); tiny_add
// also out (at::add_out).
//
// Method (bench_harness.h): InferenceMode, TF32 off, one input set per workload (randn, seed
// 1234; block weights randn / sqrt(fan_in)), every row set up once (warm-up, capture, a check of
// its output against the eager row: relative L2, bf16 < 2e-2, fp32 < 1e-5), kernels counted with
// Kineto (CUPTI) over N steps / N (built with -DKILN_NO_KINETO: not counted), then --reps
// repetitions of device_us / latency_us / throughput_us / host_us over every row, each sample
// after a kernel that reads a 256 MiB buffer (cold L2). With --sync-dir each repetition waits
// for scripts/gpu-run's go (files go.libtorch.R / done.libtorch.R).
//
// JSON (--json PATH): the shape of kiln_bench's ("source": "libtorch", "torch_version", ...,
//   "results": {"<workload>/<mode>": {"workload", "mode", "metric", "amount", "device_us":
//   [per repetition], "latency_us", "throughput_us", "host_us", "kernels", "memsets",
//   "memcpys", "kernel_names", "kernels_error", "check": {"ok", "rel_l2", "tol"},
//   "peak_extra_mib", "error"}}).

#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>
#ifndef KILN_NO_KINETO
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using Tensor = at::Tensor;
using Tensors = std::vector<Tensor>;
using Fn = std::function<Tensors(const Tensors& args)>;  // args = activations, then weights
using Step = std::function<Tensors()>;
using Clock = std::chrono::steady_clock;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kCyclesPerUs = 2000.0;  // spin-kernel cycles per microsecond (~1.98 GHz boost)
constexpr int64_t kHeadDim = 64, kKvLength = 1024;
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kNegInf = -std::numeric_limits<double>::infinity();

#define CUDA_CHECK(expr)                                                              \
  do {                                                                                \
    cudaError_t err_ = (expr);                                                        \
    if (err_ != cudaSuccess)                                                          \
      throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorString(err_)); \
  } while (0)

// ---------------------------------------------------------------------------
// Workloads (the same keys, shapes and input order as bench/bench_workloads.cc)
// ---------------------------------------------------------------------------

Tensor randn(at::IntArrayRef shape, at::ScalarType dtype = at::kBFloat16) {
  return torch::randn(shape, torch::TensorOptions().device(torch::kCUDA).dtype(dtype));
}

Tensor weight(int64_t out, int64_t in) { return randn({out, in}) * (1.0 / std::sqrt(double(in))); }

Tensor causal_mask(int64_t t) {
  auto o = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBool);
  return at::triu(torch::ones({t, t}, o), 1);
}

Tensor geglu(const Tensor& x, const Tensor& gate, const Tensor& up, const Tensor& down) {
  return at::linear(at::gelu(at::linear(x, gate), "tanh") * at::linear(x, up), down);
}

Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                       bool inplace) {
  Tensor s = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(q.size(-1))));
  if (inplace) {
    s.masked_fill_(mask, kNegInf);
  } else {
    s = s.masked_fill(mask, kNegInf);
  }
  return at::matmul(at::softmax(s, -1), v);
}

Tensor sdpa_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&) {
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
}

using Attend = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&);
Tensor attend_naive(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& m) {
  return naive_attention(q, k, v, m, false);
}

// ln1.weight, ln1.bias, wq, wk, wv, wo, rms.weight, w_gate, w_up, w_down.
Tensors block_weights(int64_t d) {
  Tensors w{1.0 + randn({d}) * 0.1, randn({d}) * 0.1};
  for (int i = 0; i < 4; ++i) w.push_back(weight(d, d));
  w.push_back(1.0 + randn({d}) * 0.1);
  w.push_back(weight(4 * d, d));
  w.push_back(weight(4 * d, d));
  w.push_back(weight(d, 4 * d));
  return w;
}

Tensor split_heads(const Tensor& y, int64_t b, int64_t t) {
  return y.view({b, t, y.size(-1) / kHeadDim, kHeadDim}).transpose(1, 2);
}

Tensor merge_heads(const Tensor& o, int64_t b, int64_t t) {
  return o.transpose(1, 2).reshape({b, t, o.size(1) * kHeadDim});
}

// a = {x, mask, w...}.
Tensor block(const Tensors& a, Attend attend) {
  const Tensor& x = a[0];
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  const Tensor ln = at::layer_norm(x, {d}, a[2], a[3], 1e-5);
  const Tensor o =
      attend(split_heads(at::linear(ln, a[4]), b, t), split_heads(at::linear(ln, a[5]), b, t),
             split_heads(at::linear(ln, a[6]), b, t), a[1]);
  const Tensor h = x + at::linear(merge_heads(o, b, t), a[7]);
  return h + geglu(at::rms_norm(h, {d}, a[8], 1e-6), a[9], a[10], a[11]);
}

// a = {x, k_cache, v_cache, w...}.
Tensors decode(const Tensors& a, bool sdpa) {
  const Tensor& x = a[0];
  const int64_t d = x.size(-1);
  const Tensor ln = at::layer_norm(x, {d}, a[3], a[4], 1e-5);
  const Tensor q = split_heads(at::linear(ln, a[5]), 1, 1);
  const Tensor k_new = at::linear(ln, a[6]), v_new = at::linear(ln, a[7]);
  Tensor o;
  if (sdpa) {
    o = at::scaled_dot_product_attention(q, a[1], a[2]);
  } else {
    const Tensor s = at::matmul(q, a[1].transpose(-2, -1)) * (1.0 / std::sqrt(double(kHeadDim)));
    o = at::matmul(at::softmax(s, -1), a[2]);
  }
  const Tensor h = x + at::linear(merge_heads(o, 1, 1), a[8]);
  return {h + geglu(at::rms_norm(h, {d}, a[9], 1e-6), a[10], a[11], a[12]), k_new, v_new};
}

struct Workload {
  std::string key;
  std::function<Tensors()> build;                 // activations, then weights
  std::vector<std::pair<std::string, Fn>> modes;  // mode -> step function ("+graph" added)
  std::string metric;
  double amount = 0.0;
};

Fn one(std::function<Tensor(const Tensors&)> f) {
  return [f](const Tensors& a) { return Tensors{f(a)}; };
}

std::function<Tensors()> acts(std::vector<std::vector<int64_t>> shapes,
                              at::ScalarType dtype = at::kBFloat16) {
  return [shapes, dtype] {
    Tensors set;
    for (const auto& s : shapes) set.push_back(randn(s, dtype));
    return set;
  };
}

Workload block_workload(int64_t b, int64_t t, int64_t d) {
  Workload w{"block_" + std::to_string(b) + "x" + std::to_string(t) + "_d" + std::to_string(d),
             [b, t, d] {
               Tensors set{randn({b, t, d}), causal_mask(t)};
               for (const Tensor& x : block_weights(d)) set.push_back(x);
               return set;
             },
             {{"eager", one([](const Tensors& a) { return block(a, attend_naive); })},
              {"sdpa", one([](const Tensors& a) { return block(a, sdpa_attention); })}},
             "tflops",
             2.0 * b * t * 16.0 * d * d + 4.0 * b * t * t * d};
  return w;
}

Workload decode_workload(int64_t d) {
  const int64_t h = d / kHeadDim;
  return {"decode_d" + std::to_string(d),
          [d, h] {
            Tensors set{randn({1, 1, d}), randn({1, h, kKvLength, kHeadDim}),
                        randn({1, h, kKvLength, kHeadDim})};
            for (const Tensor& x : block_weights(d)) set.push_back(x);
            return set;
          },
          {{"eager", [](const Tensors& a) { return decode(a, false); }},
           {"sdpa", [](const Tensors& a) { return decode(a, true); }}},
          "tbps",
          2.0 * (16.0 * d * d + 2.0 * kKvLength * d)};
}

std::vector<Workload> make_workloads() {
  std::vector<Workload> w;
  auto tiny_out = std::make_shared<Tensor>();
  w.push_back({"tiny_add",
               acts({{16}, {16}}, at::kFloat),
               {{"eager", one([](const Tensors& a) { return a[0] + a[1]; })},
                {"out", one([tiny_out](const Tensors& a) {
                   if (!tiny_out->defined()) *tiny_out = at::empty_like(a[0]);
                   return at::add_out(*tiny_out, a[0], a[1]);
                 })}},
               "",
               0.0});
  w.push_back(
      {"elementwise",
       acts({{8192, 12288}, {8192, 12288}}),
       {{"eager", one([](const Tensors& a) { return at::gelu(a[0] * 1.5 + 0.5, "tanh") * a[1]; })}},
       "tbps",
       3.0 * 8192 * 12288 * 2});
  w.push_back({"softmax",
               acts({{131072, 1024}}),
               {{"eager", one([](const Tensors& a) { return at::softmax(a[0], -1); })}},
               "tbps",
               2.0 * 131072 * 1024 * 2});
  w.push_back({"linear",
               acts({{8192, 768}, {3072, 768}, {3072}}),
               {{"eager", one([](const Tensors& a) { return at::linear(a[0], a[1], a[2]); })}},
               "tflops",
               2.0 * 8192 * 3072 * 768});
  for (int64_t tokens : {int64_t{8192}, int64_t{1}}) {
    w.push_back({tokens == 1 ? "mlp_1tok" : "mlp",
                 acts({{tokens, 768}, {3072, 768}, {3072, 768}, {768, 3072}}),
                 {{"eager", one([](const Tensors& a) { return geglu(a[0], a[1], a[2], a[3]); })}},
                 "tflops",
                 2.0 * tokens * 768 * 3072 * 3});
  }
  w.push_back(
      {"attention",
       [] {
         Tensors set = acts({{8, 16, 1024, 64}, {8, 16, 1024, 64}, {8, 16, 1024, 64}})();
         set.push_back(causal_mask(1024));
         return set;
       },
       {{"eager",
         one([](const Tensors& a) { return naive_attention(a[0], a[1], a[2], a[3], false); })},
        {"eager_inplace",
         one([](const Tensors& a) { return naive_attention(a[0], a[1], a[2], a[3], true); })},
        {"sdpa", one([](const Tensors& a) { return sdpa_attention(a[0], a[1], a[2], a[3]); })}},
       "tflops",
       4.0 * 8 * 16 * 1024.0 * 1024 * 64});
  for (int64_t d : {512, 1024}) w.push_back(block_workload(2, 256, d));
  for (int64_t d : {512, 1024}) w.push_back(block_workload(8, 1024, d));
  for (int64_t d : {512, 1024}) w.push_back(decode_workload(d));
  return w;
}

// ---------------------------------------------------------------------------
// Measuring (bench_harness.h has the method)
// ---------------------------------------------------------------------------

struct Config {
  bool quick = false, prequeue = true, count_kernels = true;
  int reps = 3, warmup = 5, latency_samples = 25, device_samples = 40, throughput_steps = 40;
  int count_steps = 5;
  int64_t flush_bytes = int64_t{256} << 20;
};

struct Figures {
  double device_us, latency_us, throughput_us, host_us;
};

void sync() { CUDA_CHECK(cudaDeviceSynchronize()); }

double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// A reduction that reads a 256 MiB buffer: the next step finds none of its inputs in L2.
void flush_l2(const Config& cfg) {
  static Tensor buf;
  if (!buf.defined()) {
    buf = torch::zeros({cfg.flush_bytes / 4},
                       torch::TensorOptions().device(torch::kCUDA).dtype(torch::kInt));
  }
  buf.sum();
}

void spin(double us) {
  us = std::min(std::max(us, 20.0), 100000.0);
  at::cuda::sleep(static_cast<int64_t>(us * kCyclesPerUs));
}

double host_and_latency(const Step& step, const Config& cfg, double* host_us) {
  std::vector<double> host, latency;
  for (int i = 0; i < cfg.latency_samples; ++i) {
    flush_l2(cfg);
    sync();
    const auto t0 = Clock::now();
    Tensors out = step();
    const auto t1 = Clock::now();
    sync();
    const auto t2 = Clock::now();
    out.clear();
    host.push_back(us_between(t0, t1));
    latency.push_back(us_between(t0, t2));
  }
  *host_us = median(host);
  return median(latency);
}

double device_time(const Step& step, const Config& cfg, double host_us) {
  const int n = cfg.device_samples;
  std::vector<cudaEvent_t> ev(2 * n, nullptr);
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  std::vector<double> samples;
  try {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    sync();
    if (cfg.prequeue) spin(2.0 * n * (host_us + 15.0));
    for (int i = 0; i < n; ++i) {
      flush_l2(cfg);
      CUDA_CHECK(cudaEventRecord(ev[2 * i], stream));
      step();
      CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream));
    }
    sync();
    for (int i = 0; i < n; ++i) {
      float ms = 0.f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
      samples.push_back(ms * 1000.0);
    }
  } catch (...) {
    for (auto& e : ev) cudaEventDestroy(e);
    throw;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return median(samples);
}

double throughput(const Step& step, const Config& cfg) {
  flush_l2(cfg);
  sync();
  const auto t0 = Clock::now();
  for (int i = 0; i < cfg.throughput_steps; ++i) step();
  sync();
  return us_between(t0, Clock::now()) / cfg.throughput_steps;
}

Figures measure(const Step& step, const Config& cfg) {
  for (int i = 0; i < cfg.warmup; ++i) step();
  sync();
  Figures f{};
  f.latency_us = host_and_latency(step, cfg, &f.host_us);
  f.device_us = device_time(step, cfg, f.host_us);
  f.throughput_us = throughput(step, cfg);
  return f;
}

struct KernelCount {
  double kernels = -1, memsets = -1, memcpys = -1;
  std::map<std::string, double> names;
  std::string error;
};

#ifndef KILN_NO_KINETO
namespace prof = torch::autograd::profiler;
namespace prof_impl = torch::profiler::impl;

// Kineto (CUPTI) records of `steps` steps: kernels, memsets and memcpys by name.
KernelCount count_kernels(const Step& step, int steps) {
  KernelCount k;
  const prof_impl::ProfilerConfig config(prof_impl::ProfilerState::KINETO);
  const std::set<prof_impl::ActivityType> activities{prof_impl::ActivityType::CUDA};
  sync();
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  try {
    for (int i = 0; i < steps; ++i) step();
    sync();
  } catch (...) {
    prof::disableProfiler();
    throw;
  }
  const std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  int kernels = 0, memsets = 0, memcpys = 0;
  for (const prof::KinetoEvent& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    const std::string name = e.name();
    if (name.rfind("Memset", 0) == 0) {
      ++memsets;
    } else if (name.rfind("Memcpy", 0) == 0) {
      ++memcpys;
    } else {
      ++kernels;
      k.names[name.substr(0, 300)] += 1.0 / steps;
    }
  }
  k.kernels = double(kernels) / steps;
  k.memsets = double(memsets) / steps;
  k.memcpys = double(memcpys) / steps;
  return k;
}

// Starts and stops the profiler once before any capture (graph replays then traced node by node).
void init_profiler() {
  try {
    count_kernels([] { return Tensors{}; }, 1);
  } catch (const std::exception& e) {
    std::printf("warning: profiler init failed: %s\n", e.what());
  }
}
#else
KernelCount count_kernels(const Step&, int) {
  KernelCount k;
  k.error = "built without Kineto (KILN_NO_KINETO)";
  return k;
}
void init_profiler() {}
#endif

double peak_extra_mib(const Step& step) {
  sync();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  const double base = double(stats.allocated_bytes[0].current);
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  Tensors out = step();
  sync();
  const double peak =
      double(c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak);
  return (peak - base) / kMiB;
}

// Largest relative L2 error over the outputs (float64), inf on a NaN/inf or shape mismatch.
double rel_l2(const Tensors& got, const Tensors& want) {
  if (got.size() != want.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].sizes() != want[i].sizes()) return INFINITY;
    const Tensor g = got[i].to(at::kDouble), w = want[i].to(at::kDouble);
    if (!at::isfinite(g).all().item<bool>() || !at::isfinite(w).all().item<bool>()) return INFINITY;
    const double den = at::linalg_vector_norm(w).item<double>();
    const double num = at::linalg_vector_norm(g - w).item<double>();
    worst = std::max(worst, den > 0 ? num / den : num);
  }
  return worst;
}

// ---------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------

struct Row {
  std::string workload, mode, metric;
  double amount = 0.0;
  Step step;
  std::shared_ptr<at::cuda::CUDAGraph> graph;
  std::vector<Figures> reps;
  KernelCount count;
  double peak_extra = kNaN, check = kNaN, tol = 0.0;
  std::string error;
};

// fn(args) captured once in a CUDA graph after a warm-up on a side stream.
Step capture(const Fn& fn, const Tensors& args, Row* row) {
  sync();
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false);
  auto outputs = std::make_shared<Tensors>();
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int r = 0; r < 3; ++r) fn(args);
    CUDA_CHECK(cudaStreamSynchronize(side.stream()));
    row->graph = std::make_shared<at::cuda::CUDAGraph>();
    row->graph->capture_begin();
    *outputs = fn(args);
    row->graph->capture_end();
  }
  sync();
  std::shared_ptr<at::cuda::CUDAGraph> g = row->graph;
  return [g, outputs] {
    g->replay();
    return *outputs;
  };
}

void set_up_row(Row& row, const Fn& fn, const Tensors& args, const Tensors& reference,
                const Config& cfg) {
  const bool graph = row.mode.find("+graph") != std::string::npos;
  row.step = graph ? capture(fn, args, &row) : Step([fn, args] { return fn(args); });
  Tensors out;
  for (int i = 0; i < cfg.warmup; ++i) out = row.step();
  sync();
  if (row.mode != "eager") {
    row.check = rel_l2(out, reference);
    row.tol = reference[0].scalar_type() == at::kFloat ? 1e-5 : 2e-2;
  }
  out.clear();
  if (cfg.count_kernels) {
    try {
      row.count = count_kernels(row.step, cfg.count_steps);
    } catch (const std::exception& e) {
      row.count = KernelCount{};
      row.count.error = e.what();
    }
  }
  if (!graph) row.peak_extra = peak_extra_mib(row.step);
}

bool selected(const std::set<std::string>& only, const std::string& workload,
              const std::string& mode) {
  if (only.empty() || only.count(workload)) return true;
  if (!mode.empty()) return only.count(workload + "/" + mode) > 0;
  for (const std::string& k : only) {
    if (k.rfind(workload + "/", 0) == 0) return true;
  }
  return false;
}

template <typename F>
void guarded(Row& row, F&& what) {
  try {
    what();
  } catch (const c10::Error& e) {
    row.error = std::string("c10::Error: ") + e.what_without_backtrace();
  } catch (const std::exception& e) {
    row.error = std::string("exception: ") + e.what();
  }
  if (!row.error.empty()) {
    row.step = nullptr;
    std::printf("  %s/%s FAILED: %s\n", row.workload.c_str(), row.mode.c_str(),
                row.error.substr(0, 300).c_str());
    cudaGetLastError();
  }
}

std::vector<Row> set_up(const std::vector<Workload>& workloads, const std::set<std::string>& only,
                        const Config& cfg) {
  std::vector<Row> rows;
  for (const Workload& w : workloads) {
    if (!selected(only, w.key, "")) continue;
    const auto t0 = Clock::now();
    torch::manual_seed(1234);
    Tensors args;
    Tensors reference;
    try {
      args = w.build();
      reference = w.modes[0].second(args);
      sync();
    } catch (const std::exception& e) {
      std::printf("%s: building the inputs failed: %s\n", w.key.c_str(), e.what());
      continue;
    }
    for (const auto& [mode, fn] : w.modes) {
      for (const std::string& m : {mode, mode + "+graph"}) {
        if (m == "out+graph" || m == "eager_inplace+graph" || !selected(only, w.key, m)) continue;
        Row row{w.key, m, w.metric, w.amount};
        const Fn f = fn;
        guarded(row, [&] { set_up_row(row, f, args, reference, cfg); });
        rows.push_back(std::move(row));
      }
    }
    std::printf("set up %s (%.1f s)\n", w.key.c_str(), us_between(t0, Clock::now()) / 1e6);
    std::fflush(stdout);
  }
  return rows;
}

// ---------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------

std::string num(double v) {
  if (std::isnan(v) || std::isinf(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c == '\n') {
      o += "\\n";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

std::string list(const std::vector<Figures>& reps, double Figures::*field) {
  std::string o = "[";
  for (size_t i = 0; i < reps.size(); ++i) o += (i ? ", " : "") + num(reps[i].*field);
  return o + "]";
}

std::string row_json(const Row& r) {
  std::ostringstream o;
  o << "{\"workload\": " << json_str(r.workload) << ", \"mode\": " << json_str(r.mode)
    << ", \"metric\": " << (r.metric.empty() ? "null" : json_str(r.metric))
    << ", \"amount\": " << num(r.amount) << ", \"device_us\": " << list(r.reps, &Figures::device_us)
    << ", \"latency_us\": " << list(r.reps, &Figures::latency_us)
    << ", \"throughput_us\": " << list(r.reps, &Figures::throughput_us)
    << ", \"host_us\": " << list(r.reps, &Figures::host_us);
  if (r.count.kernels >= 0) {
    o << ", \"kernels\": " << num(r.count.kernels) << ", \"memsets\": " << num(r.count.memsets)
      << ", \"memcpys\": " << num(r.count.memcpys) << ", \"kernel_names\": {";
    bool first = true;
    for (const auto& [name, n] : r.count.names) {
      o << (first ? "" : ", ") << json_str(name) << ": " << num(n);
      first = false;
    }
    o << "}";
  }
  if (!r.count.error.empty()) o << ", \"kernels_error\": " << json_str(r.count.error);
  if (r.mode != "eager" && r.error.empty()) {
    const bool ok = std::isfinite(r.check) && r.check < r.tol;
    o << ", \"check\": {\"ok\": " << (ok ? "true" : "false") << ", \"rel_l2\": " << num(r.check)
      << ", \"tol\": " << num(r.tol) << "}";
  }
  o << ", \"peak_extra_mib\": " << num(r.peak_extra);
  if (!r.error.empty()) o << ", \"error\": " << json_str(r.error.substr(0, 4000));
  return o.str() + "}";
}

std::string iso_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S+00:00", &tm);
  return buf;
}

std::string torch_version() {
#ifdef TORCH_VERSION
  return TORCH_VERSION;
#else
  return "unknown";
#endif
}

struct RunInfo {
  std::string gpu, cuda_version;
  size_t l2 = 0;
};

bool write_json(const std::string& path, const RunInfo& info, const Config& cfg,
                const std::vector<Row>& rows) {
  std::ostringstream o;
  o << "{\n  \"source\": \"libtorch\",\n  \"torch_version\": " << json_str(torch_version())
    << ",\n  \"gpu\": " << json_str(info.gpu) << ",\n  \"date\": " << json_str(iso_now())
    << ",\n  \"cuda_version\": " << json_str(info.cuda_version)
    << ",\n  \"quick\": " << (cfg.quick ? "true" : "false") << ",\n  \"repetitions\": " << cfg.reps
    << ",\n  \"l2_bytes\": " << info.l2
    << ",\n  \"method\": {\"device_us\": \"median CUDA-event time of single steps, L2 flushed "
       "before each"
    << (cfg.prequeue ? ", GPU kept busy (steps queued behind at::cuda::sleep)" : "")
    << "\", \"latency_us\": \"median of (L2 flush; sync; t0; step; sync; t1)\", "
       "\"throughput_us\": \"(t1 - t0) / N over N back-to-back steps, one sync\", "
       "\"kernels\": \"Kineto (CUPTI) kernel records of N steps / N\", \"inference_mode\": "
       "true, \"allow_tf32\": false, \"latency_samples\": "
    << cfg.latency_samples << ", \"device_samples\": " << cfg.device_samples
    << ", \"throughput_steps\": " << cfg.throughput_steps << "},\n  \"results\": {";
  for (size_t i = 0; i < rows.size(); ++i) {
    o << (i ? ",\n" : "\n") << "    " << json_str(rows[i].workload + "/" + rows[i].mode) << ": "
      << row_json(rows[i]);
  }
  o << "\n  }\n}\n";
  std::ofstream f(path, std::ios::trunc);
  f << o.str();
  return f.good();
}

// ---------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------

bool wait_for(const std::string& path) {
  const auto deadline = Clock::now() + std::chrono::minutes(30);
  while (!std::filesystem::exists(path)) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

void touch(const std::string& path) { std::ofstream(path) << "ok\n"; }

void usage(const char* argv0) {
  std::printf(
      "usage: %s [--json PATH] [--quick] [--reps N] [--only KEY,...] [--sync-dir DIR]\n"
      "          [--no-prequeue] [--no-kernels]\n"
      "  libtorch side of the kiln benchmark (see the header of libtorch_baseline.cc)\n",
      argv0);
}

struct Args {
  std::string json, only, sync_dir;
  Config cfg;
};

bool parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const bool has_value = i + 1 < argc;
    if (s == "--json" && has_value) {
      a->json = argv[++i];
    } else if (s == "--only" && has_value) {
      a->only = argv[++i];
    } else if (s == "--sync-dir" && has_value) {
      a->sync_dir = argv[++i];
    } else if (s == "--reps" && has_value) {
      a->cfg.reps = std::max(1, std::atoi(argv[++i]));
    } else if (s == "--quick") {
      a->cfg.quick = true;
      a->cfg.latency_samples = 10;
      a->cfg.device_samples = 20;
      a->cfg.throughput_steps = 20;
    } else if (s == "--no-prequeue") {
      a->cfg.prequeue = false;
    } else if (s == "--no-kernels") {
      a->cfg.count_kernels = false;
    } else if (s == "-h" || s == "--help") {
      usage(argv[0]);
      std::exit(0);
    } else {
      std::fprintf(stderr, "unknown or incomplete argument: %s\n", s.c_str());
      usage(argv[0]);
      return false;
    }
  }
  return true;
}

void run_repetitions(const Args& args, const RunInfo& info, std::vector<Row>& rows) {
  for (int rep = 0; rep < args.cfg.reps; ++rep) {
    if (!args.sync_dir.empty() &&
        !wait_for(args.sync_dir + "/go.libtorch." + std::to_string(rep))) {
      std::printf("no go for repetition %d: stopping\n", rep);
      break;
    }
    const auto t0 = Clock::now();
    for (Row& row : rows) {
      if (row.step) guarded(row, [&] { row.reps.push_back(measure(row.step, args.cfg)); });
    }
    std::printf("repetition %d: %zu rows in %.1f s\n", rep, rows.size(),
                us_between(t0, Clock::now()) / 1e6);
    std::fflush(stdout);
    if (!args.json.empty()) write_json(args.json, info, args.cfg, rows);
    if (!args.sync_dir.empty()) touch(args.sync_dir + "/done.libtorch." + std::to_string(rep));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse(argc, argv, &args)) return 2;
  std::set<std::string> only;
  std::stringstream ss(args.only);
  for (std::string k; std::getline(ss, k, ',');) {
    if (!k.empty()) only.insert(k);
  }
  const std::vector<Workload> workloads = make_workloads();
  for (const std::string& k : only) {
    const std::string key = k.substr(0, k.find('/'));
    if (std::none_of(workloads.begin(), workloads.end(),
                     [&](const Workload& w) { return w.key == key; })) {
      std::fprintf(stderr, "error: unknown workload: %s\n", k.c_str());
      return 2;
    }
  }
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "error: libtorch sees no CUDA device\n");
    return 2;
  }
  at::globalContext().setAllowTF32CuBLAS(false);
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  RunInfo info;
  info.gpu = prop.name;
  info.l2 = prop.l2CacheSize > 0 ? static_cast<size_t>(prop.l2CacheSize) : 0;
  int rt = 0;
  CUDA_CHECK(cudaRuntimeGetVersion(&rt));
  info.cuda_version = std::to_string(rt / 1000) + "." + std::to_string((rt % 1000) / 10);
  std::printf("libtorch %s (CUDA runtime %s) on %s, %d repetitions%s, prequeue=%s\n",
              torch_version().c_str(), info.cuda_version.c_str(), info.gpu.c_str(), args.cfg.reps,
              args.cfg.quick ? " (quick)" : "", args.cfg.prequeue ? "on" : "off");
  std::fflush(stdout);

  c10::InferenceMode inference_guard;
  init_profiler();
  std::vector<Row> rows = set_up(workloads, only, args.cfg);
  if (!args.json.empty()) write_json(args.json, info, args.cfg, rows);
  if (!args.sync_dir.empty()) touch(args.sync_dir + "/ready.libtorch");
  run_repetitions(args, info, rows);
  std::printf("\n%-40s %11s %11s %11s %8s\n", "workload/mode", "device_us", "latency_us",
              "thruput_us", "kernels");
  for (const Row& r : rows) {
    std::vector<double> d, l, t;
    for (const Figures& f : r.reps) {
      d.push_back(f.device_us);
      l.push_back(f.latency_us);
      t.push_back(f.throughput_us);
    }
    std::printf("%-40s %11.2f %11.2f %11.2f %8.2f%s\n", (r.workload + "/" + r.mode).c_str(),
                median(d), median(l), median(t), r.count.kernels, r.error.empty() ? "" : "  ERROR");
  }
  if (!args.json.empty()) {
    if (!write_json(args.json, info, args.cfg, rows)) return 1;
    std::printf("wrote %s\n", args.json.c_str());
  }
  return 0;
}
