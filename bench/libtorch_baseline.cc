// libtorch_baseline.cc - libtorch (PyTorch C++ API) baselines for the kiln benchmark.
//
// What it is for
//   Times the workloads of bench/torch_baseline.py through libtorch's C++ API
//   (no Python, no torch.compile), so kiln's C++ numbers can be compared with
//   PyTorch without the Python interpreter's per-call cost. Rows:
//   tiny_add, tiny_add_out, elementwise, softmax, linear, mlp, mlp_1tok,
//   mlp_1tok_cudagraph (the 5 kernels of one 1-token forward captured with
//   at::cuda::CUDAGraph and replayed), attention, attention_inplace,
//   attention_sdpa. empty_launch is not measured here.
//
// How to build and run (on the GPU machine)
//   bash bench/build_libtorch_baseline.sh /tmp/libtorch_baseline
//   /tmp/libtorch_baseline --json /tmp/libtorch_baseline.json [--quick]
//       [--only mlp,mlp_1tok] [--no-prequeue]
//
// Method (the same as torch_baseline.py; see its header for the details)
//   InferenceMode on, TF32 matmul off. Inputs are randn with a fixed seed per
//   input set; sets smaller than L2 rotate over
//   nsets = clamp(ceil(1.5 * L2 / set_bytes), 2, 8). Warm-up >= 10 steps.
//   host_us: median steady_clock time of the enqueueing call alone (after a
//   sync, no sync inside); tiny ops: (1000 calls, then sync) / 1000.
//   wall_us: median of (sync; t0; step; sync; t1).
//   device_us: median of per-step cudaEvent time, events around each single
//   step; unless --no-prequeue, each chunk of steps waits behind a GPU spin
//   kernel (at::cuda::sleep) so the events see GPU time, not launch rate.
//   peak_mib: caching-allocator peak of allocated bytes over one step with one
//   input set alive (torch.cuda.max_memory_allocated's number);
//   peak_extra_mib subtracts what was allocated just before the step.
//
// JSON (--json PATH), the same shape as the Python script's:
//   {"source": "libtorch", "torch_version", "gpu", "date", "cuda_version",
//    "quick", "method": {...}, "results": {key: {"device_us", "host_us",
//    "wall_us", "tbps" | "tflops", "peak_mib", "peak_extra_mib", "nsets",
//    "reps", "error" (only on failure)}}}   missing values are null.

#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kCyclesPerUs = 2000.0;  // spin-kernel cycles per microsecond (~1.98 GHz boost)
const double kNaN = std::numeric_limits<double>::quiet_NaN();

#define CUDA_CHECK(expr)                                                              \
  do {                                                                                \
    cudaError_t err_ = (expr);                                                        \
    if (err_ != cudaSuccess)                                                          \
      throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorString(err_)); \
  } while (0)

// ---------------------------------------------------------------------------
// Workloads. build(seed) makes one input set; fn(set) runs one step.
// ---------------------------------------------------------------------------

using Set = std::vector<at::Tensor>;
using Fn = std::function<at::Tensor(Set&)>;

struct Workload {
  std::string key;
  std::function<Set(int)> build;
  Fn fn;
  std::string metric;   // "tbps", "tflops" or "" (none)
  double amount = 0.0;  // bytes for tbps, flops for tflops
  bool tiny = false;
  bool cudagraph = false;
};

at::Tensor randn(at::IntArrayRef shape, at::ScalarType dtype = at::kBFloat16) {
  return torch::randn(shape, torch::TensorOptions().device(torch::kCUDA).dtype(dtype));
}

void seed(int s) { torch::manual_seed(static_cast<uint64_t>(1234 + s)); }

constexpr int64_t kEwRows = 8192, kEwCols = 12288;
constexpr int64_t kSmRows = 131072, kSmCols = 1024;
constexpr int64_t kLinM = 8192, kLinN = 3072, kLinK = 768;
constexpr int64_t kDModel = 768, kDFF = 3072;
constexpr int64_t kAttB = 8, kAttH = 16, kAttS = 1024, kAttD = 64;

at::Tensor mlp(Set& s) {  // s = {x, wg, wu, wd}
  at::Tensor gate = at::matmul(s[0], s[1].t());
  at::Tensor up = at::matmul(s[0], s[2].t());
  at::Tensor h = at::gelu(gate, "tanh") * up;
  return at::matmul(h, s[3].t());
}

std::function<Set(int)> build_mlp(int64_t tokens) {
  return [tokens](int s) {
    seed(s);
    return Set{randn({tokens, kDModel}), randn({kDFF, kDModel}), randn({kDFF, kDModel}),
               randn({kDModel, kDFF})};
  };
}

double mlp_flops(int64_t tokens) { return 2.0 * tokens * kDModel * kDFF * 3; }

Set build_attention(int s) {
  seed(s);
  at::Tensor q = randn({kAttB, kAttH, kAttS, kAttD});
  at::Tensor k = randn({kAttB, kAttH, kAttS, kAttD});
  at::Tensor v = randn({kAttB, kAttH, kAttS, kAttD});
  at::Tensor mask = at::triu(
      torch::ones({kAttS, kAttS}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBool)),
      1);
  return Set{q, k, v, mask};
}

const double kAttScale = 1.0 / std::sqrt(static_cast<double>(kAttD));
const double kNegInf = -std::numeric_limits<double>::infinity();

at::Tensor attention(Set& t) {  // t = {q, k, v, mask}
  at::Tensor s = at::matmul(t[0], t[1].transpose(-2, -1)) * kAttScale;
  s = s.masked_fill(t[3], kNegInf);
  at::Tensor p = at::softmax(s, -1);
  return at::matmul(p, t[2]);
}

at::Tensor attention_inplace(Set& t) {
  at::Tensor s = at::matmul(t[0], t[1].transpose(-2, -1)) * kAttScale;
  s.masked_fill_(t[3], kNegInf);
  at::Tensor p = at::softmax(s, -1);
  return at::matmul(p, t[2]);
}

at::Tensor attention_sdpa(Set& t) {  // the mask is unused: is_causal applies it
  return at::scaled_dot_product_attention(t[0], t[1], t[2], {}, 0.0, /*is_causal=*/true);
}

std::vector<Workload> make_workloads() {
  std::vector<Workload> w;
  auto build_tiny = [](int n_tensors) {
    return [n_tensors](int s) {
      seed(s);
      Set set;
      for (int i = 0; i < n_tensors; ++i) set.push_back(randn({16}, at::kFloat));
      return set;
    };
  };
  w.push_back({"tiny_add", build_tiny(2), [](Set& s) { return s[0] + s[1]; }, "", 0.0, true});
  w.push_back({"tiny_add_out", build_tiny(3), [](Set& s) { return at::add_out(s[2], s[0], s[1]); },
               "", 0.0, true});
  w.push_back({"elementwise",
               [](int s) {
                 seed(s);
                 return Set{randn({kEwRows, kEwCols}), randn({kEwRows, kEwCols})};
               },
               [](Set& s) { return at::gelu(s[0] * 1.5 + 0.5, "tanh") * s[1]; }, "tbps",
               3.0 * kEwRows * kEwCols * 2});
  w.push_back({"softmax",
               [](int s) {
                 seed(s);
                 return Set{randn({kSmRows, kSmCols})};
               },
               [](Set& s) { return at::softmax(s[0], -1); }, "tbps", 2.0 * kSmRows * kSmCols * 2});
  w.push_back({"linear",
               [](int s) {
                 seed(s);
                 return Set{randn({kLinM, kLinK}), randn({kLinN, kLinK}), randn({kLinN})};
               },
               [](Set& s) { return at::linear(s[0], s[1], s[2]); }, "tflops",
               2.0 * kLinM * kLinN * kLinK});
  w.push_back({"mlp", build_mlp(8192), mlp, "tflops", mlp_flops(8192)});
  w.push_back({"mlp_1tok", build_mlp(1), mlp, "tflops", mlp_flops(1)});
  w.push_back({"mlp_1tok_cudagraph", build_mlp(1), mlp, "tflops", mlp_flops(1), false, true});
  w.push_back({"attention", build_attention, attention, "", 0.0});
  w.push_back({"attention_inplace", build_attention, attention_inplace, "", 0.0});
  w.push_back({"attention_sdpa", build_attention, attention_sdpa, "", 0.0});
  return w;
}

// ---------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------

struct Config {
  bool quick = false;
  bool prequeue = true;
  int warmup = 20;
  int reps = 200;
  int tiny_loop_reps = 30;
  int tiny_loop_n = 1000;
  int chunk = 50;  // steps enqueued behind one spin kernel
};

struct Row {
  double device_us = kNaN, host_us = kNaN, wall_us = kNaN;
  std::string metric;
  double metric_value = kNaN;
  double peak_mib = kNaN, peak_extra_mib = kNaN;
  int nsets = 0;
  int reps = 0;
  bool failed = false;
  std::string error;
};

using Step = std::function<at::Tensor(int)>;
using Clock = std::chrono::steady_clock;

void sync() { CUDA_CHECK(cudaDeviceSynchronize()); }

double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

size_t set_bytes(const Set& s) {
  size_t b = 0;
  for (const auto& t : s) b += t.numel() * t.element_size();
  return b;
}

int choose_nsets(size_t bytes, size_t l2) {
  if (bytes >= l2) return 1;
  double want =
      std::ceil(1.5 * static_cast<double>(l2) / static_cast<double>(std::max<size_t>(bytes, 1)));
  return static_cast<int>(std::max(2.0, std::min(8.0, want)));
}

const c10::DeviceIndex kDev = 0;

int64_t allocated_bytes() {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(kDev).allocated_bytes[0].current;
}
int64_t peak_allocated_bytes() {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(kDev).allocated_bytes[0].peak;
}

void free_memory() {
  sync();
  c10::cuda::CUDACachingAllocator::emptyCache();
}

void spin(double us) {
  us = std::min(std::max(us, 20.0), 100000.0);
  at::cuda::sleep(static_cast<int64_t>(us * kCyclesPerUs));
}

void time_host_and_wall(const Step& step, int n, int reps, double* host_us, double* wall_us) {
  std::vector<double> host, wall;
  for (int r = 0; r < reps; ++r) {
    sync();
    auto t0 = Clock::now();
    at::Tensor out = step(r % n);
    auto t1 = Clock::now();
    sync();
    auto t2 = Clock::now();
    out.reset();
    host.push_back(us_between(t0, t1));
    wall.push_back(us_between(t0, t2));
  }
  *host_us = median(host);
  *wall_us = median(wall);
}

double time_host_loop(const Step& step, int n, int reps, int inner) {
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    sync();
    auto t0 = Clock::now();
    for (int i = 0; i < inner; ++i) step(i % n);
    sync();
    samples.push_back(us_between(t0, Clock::now()) / inner);
  }
  return median(samples);
}

double time_device(const Step& step, int n, const Config& cfg, double host_us_est) {
  const int reps = cfg.reps;
  std::vector<cudaEvent_t> ev(2 * reps, nullptr);
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  std::vector<double> samples;
  try {
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    sync();
    for (int c0 = 0; c0 < reps; c0 += cfg.chunk) {
      int c1 = std::min(reps, c0 + cfg.chunk);
      if (cfg.prequeue) spin(2.0 * (c1 - c0) * (host_us_est + 5.0));
      for (int i = c0; i < c1; ++i) {
        CUDA_CHECK(cudaEventRecord(ev[2 * i], stream));
        step(i % n);
        CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream));
      }
    }
    sync();
    for (int i = 0; i < reps; ++i) {
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

Row measure(const Workload& w, const Config& cfg, size_t l2) {
  Row row;
  row.metric = w.metric;
  row.reps = cfg.reps;
  free_memory();

  std::vector<Set> sets;
  sets.push_back(w.build(0));
  const int n = choose_nsets(set_bytes(sets[0]), l2);
  for (int i = 1; i < n; ++i) sets.push_back(w.build(i));
  row.nsets = n;

  // For the CUDA-graph row: one graph per input set, captured on a side
  // stream after a warm-up there (cuBLAS handle and workspace), replayed on
  // the current stream.
  std::vector<std::unique_ptr<at::cuda::CUDAGraph>> graphs;
  std::vector<at::Tensor> graph_out;
  Step step;
  if (w.cudagraph) {
    sync();
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      for (int i = 0; i < n; ++i)
        for (int r = 0; r < 3; ++r) w.fn(sets[i]);
      CUDA_CHECK(cudaStreamSynchronize(side.stream()));
      for (int i = 0; i < n; ++i) {
        auto g = std::make_unique<at::cuda::CUDAGraph>();
        g->capture_begin();
        graph_out.push_back(w.fn(sets[i]));
        g->capture_end();
        graphs.push_back(std::move(g));
      }
    }
    sync();
    step = [&](int i) {
      graphs[i]->replay();
      return graph_out[i];
    };
  } else {
    step = [&](int i) { return w.fn(sets[i]); };
  }

  for (int i = 0; i < cfg.warmup; ++i) step(i % n);
  sync();

  time_host_and_wall(step, n, cfg.reps, &row.host_us, &row.wall_us);
  if (w.tiny) row.host_us = time_host_loop(step, n, cfg.tiny_loop_reps, cfg.tiny_loop_n);
  row.device_us = time_device(step, n, cfg, row.host_us);
  if (!w.metric.empty()) row.metric_value = w.amount / (row.device_us * 1e-6) / 1e12;

  // Peak memory of one step with one input set alive.
  if (graphs.size() > 1) graphs.resize(1);
  if (graph_out.size() > 1) graph_out.resize(1);
  sets.resize(1);
  sync();
  int64_t base = allocated_bytes();
  c10::cuda::CUDACachingAllocator::resetPeakStats(kDev);
  {
    at::Tensor out = step(0);  // kept alive while the peak is read
    sync();
    int64_t peak = peak_allocated_bytes();
    row.peak_mib = peak / kMiB;
    row.peak_extra_mib = (peak - base) / kMiB;
    out.reset();
  }
  graphs.clear();
  graph_out.clear();
  sets.clear();
  free_memory();
  return row;
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
    switch (c) {
      case '"':
        o += "\\\"";
        break;
      case '\\':
        o += "\\\\";
        break;
      case '\n':
        o += "\\n";
        break;
      case '\t':
        o += "\\t";
        break;
      case '\r':
        o += "\\r";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  return o + "\"";
}

std::string cell(double v, int width, int prec) {
  char buf[64];
  if (std::isnan(v))
    std::snprintf(buf, sizeof buf, "%*s", width, "-");
  else
    std::snprintf(buf, sizeof buf, "%*.*f", width, prec, v);
  return buf;
}

void print_table(const std::vector<std::pair<std::string, Row>>& results) {
  std::printf("\n%-22s %11s %10s %11s %16s %10s\n", "workload", "device_us", "host_us", "wall_us",
              "metric", "peak_mib");
  std::printf("%s\n", std::string(85, '-').c_str());
  for (const auto& kv : results) {
    const Row& r = kv.second;
    if (r.failed) {
      std::string first = r.error.substr(0, r.error.find('\n')).substr(0, 100);
      std::printf("%-22s ERROR: %s\n", kv.first.c_str(), first.c_str());
      continue;
    }
    std::string metric = "-";
    if (!r.metric.empty() && !std::isnan(r.metric_value)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.3f %s", r.metric_value,
                    r.metric == "tbps" ? "TB/s" : "TFLOP/s");
      metric = buf;
    }
    std::printf("%-22s %s %s %s %16s %s\n", kv.first.c_str(), cell(r.device_us, 11, 2).c_str(),
                cell(r.host_us, 10, 2).c_str(), cell(r.wall_us, 11, 2).c_str(), metric.c_str(),
                cell(r.peak_mib, 10, 1).c_str());
  }
  std::fflush(stdout);
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

bool write_json(const std::string& path, const std::string& gpu, const std::string& cuda_version,
                const Config& cfg, size_t l2,
                const std::vector<std::pair<std::string, Row>>& results) {
  std::ostringstream o;
  o << "{\n  \"source\": \"libtorch\",\n"
    << "  \"torch_version\": " << json_str(torch_version()) << ",\n"
    << "  \"gpu\": " << json_str(gpu) << ",\n"
    << "  \"date\": " << json_str(iso_now()) << ",\n"
    << "  \"cuda_version\": " << json_str(cuda_version) << ",\n"
    << "  \"quick\": " << (cfg.quick ? "true" : "false") << ",\n"
    << "  \"method\": {\"device_us\": "
    << json_str(std::string("median per-step CUDA event time") +
                (cfg.prequeue ? ", GPU pre-queued behind a spin kernel" : ""))
    << ", \"host_us\": \"median per-call enqueue time; tiny ops: (1000 calls + sync) / 1000\""
    << ", \"wall_us\": \"median of sync; t0; step; sync; t1\""
    << ", \"prequeue\": " << (cfg.prequeue ? "true" : "false") << ", \"warmup\": " << cfg.warmup
    << ", \"reps\": " << cfg.reps << ", \"inference_mode\": true, \"allow_tf32\": false"
    << ", \"l2_bytes\": " << l2 << "},\n"
    << "  \"results\": {";
  bool first = true;
  for (const auto& kv : results) {
    const Row& r = kv.second;
    o << (first ? "\n" : ",\n") << "    " << json_str(kv.first) << ": {"
      << "\"device_us\": " << num(r.device_us) << ", \"host_us\": " << num(r.host_us)
      << ", \"wall_us\": " << num(r.wall_us);
    if (!r.metric.empty()) o << ", \"" << r.metric << "\": " << num(r.metric_value);
    o << ", \"peak_mib\": " << num(r.peak_mib) << ", \"peak_extra_mib\": " << num(r.peak_extra_mib)
      << ", \"nsets\": " << (r.nsets ? std::to_string(r.nsets) : std::string("null"))
      << ", \"reps\": " << r.reps;
    if (r.failed) o << ", \"error\": " << json_str(r.error);
    o << "}";
    first = false;
  }
  o << "\n  }\n}\n";
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  std::string s = o.str();
  bool ok = std::fwrite(s.data(), 1, s.size(), f) == s.size();
  return std::fclose(f) == 0 && ok;
}

void usage(const char* argv0) {
  std::printf(
      "usage: %s [--json PATH] [--quick] [--only KEY,KEY...] [--no-prequeue]\n"
      "  libtorch baselines for the kiln benchmark (see the header of libtorch_baseline.cc)\n",
      argv0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, only;
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--quick") {
      cfg.quick = true;
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--no-prequeue") {
      cfg.prequeue = false;
    } else if (a == "-h" || a == "--help") {
      usage(argv[0]);
      return 0;
    } else {
      std::fprintf(stderr, "unknown or incomplete argument: %s\n", a.c_str());
      usage(argv[0]);
      return 2;
    }
  }
  if (cfg.quick) {
    cfg.warmup = 10;
    cfg.reps = 50;
    cfg.tiny_loop_reps = 10;
  }

  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "error: libtorch sees no CUDA device\n");
    return 2;
  }
  at::globalContext().setAllowTF32CuBLAS(false);

  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  size_t l2 = prop.l2CacheSize > 0 ? static_cast<size_t>(prop.l2CacheSize) : (60u << 20);
  int rt = 0;
  CUDA_CHECK(cudaRuntimeGetVersion(&rt));
  std::string cuda_version = std::to_string(rt / 1000) + "." + std::to_string((rt % 1000) / 10);
  std::string gpu = prop.name;
  std::printf("libtorch %s (CUDA runtime %s) on %s, L2 %.0f MiB, %s run, prequeue=%s\n",
              torch_version().c_str(), cuda_version.c_str(), gpu.c_str(), l2 / kMiB,
              cfg.quick ? "quick" : "full", cfg.prequeue ? "on" : "off");
  std::fflush(stdout);

  std::vector<Workload> workloads = make_workloads();
  if (!only.empty()) {
    std::set<std::string> keys;
    std::stringstream ss(only);
    std::string k;
    while (std::getline(ss, k, ','))
      if (!k.empty()) keys.insert(k);
    std::vector<Workload> picked;
    for (const auto& w : workloads)
      if (keys.count(w.key)) picked.push_back(w), keys.erase(w.key);
    if (!keys.empty()) {
      std::fprintf(stderr, "error: unknown workload(s):");
      for (const auto& key : keys) std::fprintf(stderr, " %s", key.c_str());
      std::fprintf(stderr, "\n");
      return 2;
    }
    workloads = picked;
  }

  c10::InferenceMode inference_guard;
  std::vector<std::pair<std::string, Row>> results;
  for (const auto& w : workloads) {
    std::printf("running %s ...\n", w.key.c_str());
    std::fflush(stdout);
    Row row;
    try {
      row = measure(w, cfg, l2);
      std::printf("  device %.2f us, host %.2f us, wall %.2f us, peak %.1f MiB, nsets %d\n",
                  row.device_us, row.host_us, row.wall_us, row.peak_mib, row.nsets);
    } catch (const c10::Error& e) {
      row = Row{};
      row.metric = w.metric;
      row.reps = cfg.reps;
      row.failed = true;
      row.error = std::string("c10::Error: ") + e.what_without_backtrace();
    } catch (const std::exception& e) {
      row = Row{};
      row.metric = w.metric;
      row.reps = cfg.reps;
      row.failed = true;
      row.error = std::string("exception: ") + e.what();
    }
    if (row.failed) {
      std::printf("  FAILED: %s\n", row.error.c_str());
      try {
        free_memory();
      } catch (...) {
      }
    }
    std::fflush(stdout);
    results.emplace_back(w.key, row);
  }

  print_table(results);
  if (!json_path.empty()) {
    if (!write_json(json_path, gpu, cuda_version, cfg, l2, results)) {
      std::fprintf(stderr, "error: could not write %s\n", json_path.c_str());
      return 1;
    }
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
