// kiln_bench: kiln's eager benchmark, the twin of bench/torch_baseline.py and
// bench/libtorch_baseline.cc (same workload keys, same method, same JSON rows), so that
// bench/compare.py can put kiln next to PyTorch and libtorch measured on the same GPU.
//
// How to build and run (on the GPU machine)
//   ninja -C build kiln_bench            # target from bench/CMakeLists.txt
//   build/bench/kiln_bench --json /tmp/kiln.json [--quick] [--only mlp,mlp_1tok]
//       [--no-prequeue] [--no-kernels]
//   python3 bench/compare.py /tmp/kiln.json /tmp/torch_baseline.json /tmp/libtorch_baseline.json
//
// Rows (eager kiln; every input bf16 unless said otherwise)
//   empty_launch       the raw host cost of cudaLaunchKernel of an empty NVRTC kernel
//   tiny_add           kiln::add of two float32 [16] tensors
//   elementwise        gelu(x * 1.5 + 0.5, "tanh") * u on [8192, 12288]; TB/s = 3 tensors / time
//   softmax            softmax(x, -1) on [131072, 1024]; TB/s = 2 tensors / time
//   linear             kiln::linear(x [8192, 768], w [3072, 768], b [3072]); TFLOP/s
//   mlp, mlp_1tok      kiln::GeGLUMLP(768, 3072) on x [8192, 768] / [1, 768]; TFLOP/s
//   attention(_inplace) kiln::causal_attention(q, k, v, mask, inplace), q/k/v [8, 16, 1024, 64]
//   <w>_compiled       the same step through kiln::compile (tiny_add, elementwise, linear, mlp,
//                      mlp_1tok, attention); one CompiledFn per input set
//   <w>_compiledgraph  the same, replayed as a CUDA graph (CompileOptions::cuda_graphs); its
//                      peak includes the graph's memory pool, its kernels are the plan's steps
//
// --compile-latency: instead of the rows, time kiln::compile of the GeGLU MLP (8192 tokens) plus
// its first call, once, and print one JSON line (run it in a fresh process with an empty
// KILN_CACHE_DIR for the cold figure, again for the warm-disk-cache figure).
//
// Method (as in the baselines; see the header of torch_baseline.py)
//   Inputs are kiln::randn drawn from Generator(1234 + set), never zeros; GeGLUMLP's weights
//   are overwritten with randn too, as the baselines' weights are randn. Sets smaller than L2
//   rotate over nsets = clamp(ceil(1.5 * L2 / set_bytes), 2, 8) sets (the MLP's weights count
//   in its set, the attention mask too: one mask is built once and shared by every set).
//   Warm-up 20 steps (10 with --quick), reps 200 (50).
//   host_us: median steady_clock time of the call that enqueues one step (after a sync, no sync
//   inside); tiny rows (empty_launch, tiny_add): median over 30 (10) samples of
//   (1000 back-to-back calls, then sync) / 1000.
//   wall_us: median of (sync; t0; step; sync; t1).
//   device_us: median cudaEvent time around each single step; unless --no-prequeue, every chunk
//   of 50 steps waits behind a clock64() spin kernel (kiln's twin of torch.cuda._sleep, same
//   2000 cycles/us, same length rule as libtorch_baseline.cc) so the events time the GPU, not
//   the host's launch rate.
//   peak_mib: kiln's allocator peak of allocated bytes over one step with one input set alive
//   (cuda::ResetPeakMemoryStats / GetMemoryStats); peak_extra_mib subtracts what was allocated
//   just before the step. Unlike torch's, it does not include cuBLAS workspaces unless kiln
//   allocates them through its allocator. As in libtorch, C++ temporaries live to the end of the
//   full expression, so e.g. elementwise holds all its intermediates at once (Python frees them
//   earlier): compare peak_mib with the libtorch row.
//   kernels: kernel launches of one step, counted (not hard-coded) by capturing the step with
//   CUDA stream capture on a side stream and counting the kernel nodes of the captured graph
//   (child graphs included); memops counts its memcpy/memset nodes. The graph is never run. It
//   sees everything kiln enqueues on its current stream (cuBLAS kernels included); work put on
//   another stream would be missed. null with kernels_error when capture fails; --no-kernels
//   skips it.
//
// JSON (--json PATH), the shape of the baselines' files plus kernels/memops per row:
//   {"source": "kiln", "gpu", "date", "cuda_version", "quick", "method": {...},
//    "results": {key: {"device_us", "host_us", "wall_us", "tbps" | "tflops", "peak_mib",
//    "peak_extra_mib", "nsets", "reps", "kernels", "memops", "kernels_error" (only when counting
//    failed), "error" (only when the row failed)}}}   missing values are null.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "codegen/compile.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "runtime/random.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

namespace {

using kiln::DType;
using kiln::Tensor;
namespace cuda = kiln::cuda;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kCyclesPerUs = 2000.0;  // spin-kernel cycles per microsecond (~1.98 GHz boost)
const double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr DType kBF16 = DType::kBFloat16;

constexpr int64_t kEwRows = 8192, kEwCols = 12288;
constexpr int64_t kSmRows = 131072, kSmCols = 1024;
constexpr int64_t kLinM = 8192, kLinN = 3072, kLinK = 768;
constexpr int64_t kDModel = 768, kDFF = 3072;
constexpr int64_t kAttB = 8, kAttH = 16, kAttS = 1024, kAttD = 64;

// ---------------------------------------------------------------------------
// Helper kernels compiled with NVRTC: the empty kernel and the spin (sleep) kernel.
// ---------------------------------------------------------------------------

constexpr char kEmptySource[] = "extern \"C\" __global__ void kiln_empty() {}\n";
// The same loop as torch.cuda._sleep (at::cuda::sleep).
constexpr char kSpinSource[] = R"(
extern "C" __global__ void kiln_spin(long long cycles) {
  const long long start = clock64();
  long long elapsed = 0;
  while (elapsed < cycles) elapsed = clock64() - start;
}
)";

cudaKernel_t EmptyKernel() {
  static const cudaKernel_t k = kiln::ValueOrThrow(cuda::GetKernel(kEmptySource, "kiln_empty"));
  return k;
}

cudaKernel_t SpinKernel() {
  static const cudaKernel_t k = kiln::ValueOrThrow(cuda::GetKernel(kSpinSource, "kiln_spin"));
  return k;
}

// Enqueues a GPU busy-wait of about `us` microseconds on the current stream.
void Spin(double us) {
  us = std::min(std::max(us, 20.0), 100000.0);
  long long cycles = static_cast<long long>(us * kCyclesPerUs);
  void* args[] = {&cycles};
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(SpinKernel()), dim3(1), dim3(1),
                                   args, 0, cuda::CurrentStream()));
}

// ---------------------------------------------------------------------------
// Workloads. build(seed, first) makes one input set (`first` is set 0, or null while set 0 is
// being built, so later sets can share what is built once); fn(set) runs one step.
// ---------------------------------------------------------------------------

struct InputSet {
  std::vector<Tensor> t;
  std::shared_ptr<kiln::Module> module;        // the MLP rows' GeGLUMLP (its weights are inputs)
  std::shared_ptr<kiln::CompiledFn> compiled;  // compiled rows: the step compiled for this set
};

// How a row runs its step: eagerly, compiled (kiln::compile), or compiled and replayed as a CUDA
// graph. Compiled rows are keyed <workload>_compiled / <workload>_compiledgraph.
enum class Mode { kEager, kCompiled, kGraph };

using BuildFn = std::function<InputSet(int seed, const InputSet* first)>;
using StepFn = std::function<Tensor(InputSet&)>;

struct Workload {
  std::string key;
  BuildFn build;
  StepFn fn;
  std::string metric;   // "tbps", "tflops" or "" (none)
  double amount = 0.0;  // bytes for tbps, flops for tflops
  bool tiny = false;
  Mode mode = Mode::kEager;
};

kiln::Generator SeededGenerator(int seed) { return kiln::Generator(1234 + seed); }

Tensor Randn(kiln::IntList shape, kiln::Generator& gen, DType dtype = kBF16) {
  return kiln::randn(shape, gen, dtype, kiln::CUDA());
}

BuildFn BuildRandn(std::vector<std::vector<int64_t>> shapes, DType dtype = kBF16) {
  return [shapes, dtype](int seed, const InputSet*) {
    kiln::Generator gen = SeededGenerator(seed);
    InputSet set;
    for (const auto& s : shapes) set.t.push_back(Randn(s, gen, dtype));
    return set;
  };
}

// x [tokens, 768] and a GeGLUMLP(768, 3072) whose weights are redrawn as randn (the baselines'
// weights are torch.randn).
BuildFn BuildMlp(int64_t tokens) {
  return [tokens](int seed, const InputSet*) {
    kiln::Generator gen = SeededGenerator(seed);
    InputSet set;
    set.t.push_back(Randn({tokens, kDModel}, gen));
    auto mlp = std::make_shared<kiln::GeGLUMLP>(kDModel, kDFF, gen,
                                                kiln::ModuleOptions{kBF16, kiln::CUDA()});
    for (const auto& [name, p] : mlp->named_parameters()) {
      KILN_CHECK(p.is_contiguous(), "kiln_bench: parameter ", name, " is not contiguous");
      const Tensor host = kiln::randn(p.shape(), gen, p.dtype(), kiln::kCPU);
      kiln::CopyBytes(p.data_ptr(), p.device(), host.data_ptr(), host.device(),
                      static_cast<size_t>(p.numel() * p.element_size()));
    }
    set.module = std::move(mlp);
    return set;
  };
}

double MlpFlops(int64_t tokens) { return 2.0 * tokens * kDModel * kDFF * 3; }

// q, k, v and the causal mask, built once (in set 0) and shared by every set.
InputSet BuildAttention(int seed, const InputSet* first) {
  kiln::Generator gen = SeededGenerator(seed);
  InputSet set;
  for (int i = 0; i < 3; ++i) set.t.push_back(Randn({kAttB, kAttH, kAttS, kAttD}, gen));
  set.t.push_back(first != nullptr
                      ? first->t[3]
                      : kiln::triu(kiln::ones({kAttS, kAttS}, DType::kBool, kiln::CUDA()), 1));
  return set;
}

Tensor LaunchEmpty(InputSet&) {
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(EmptyKernel()), dim3(1), dim3(1),
                                   nullptr, 0, cuda::CurrentStream()));
  return Tensor();
}

std::vector<Workload> MakeWorkloads() {
  std::vector<Workload> w;
  w.push_back({"empty_launch",
               [](int, const InputSet*) {
                 EmptyKernel();  // compile (or load from the kernel cache) before timing
                 return InputSet{};
               },
               LaunchEmpty, "", 0.0, true});
  w.push_back({"tiny_add", BuildRandn({{16}, {16}}, DType::kFloat32),
               [](InputSet& s) { return kiln::add(s.t[0], s.t[1]); }, "", 0.0, true});
  w.push_back({"elementwise", BuildRandn({{kEwRows, kEwCols}, {kEwRows, kEwCols}}),
               [](InputSet& s) { return kiln::gelu(s.t[0] * 1.5 + 0.5, "tanh") * s.t[1]; }, "tbps",
               3.0 * kEwRows * kEwCols * 2});
  w.push_back({"softmax", BuildRandn({{kSmRows, kSmCols}}),
               [](InputSet& s) { return kiln::softmax(s.t[0], -1); }, "tbps",
               2.0 * kSmRows * kSmCols * 2});
  w.push_back({"linear", BuildRandn({{kLinM, kLinK}, {kLinN, kLinK}, {kLinN}}),
               [](InputSet& s) { return kiln::linear(s.t[0], s.t[1], s.t[2]); }, "tflops",
               2.0 * kLinM * kLinN * kLinK});
  auto mlp = [](InputSet& s) { return (*s.module)(s.t[0]); };
  w.push_back({"mlp", BuildMlp(8192), mlp, "tflops", MlpFlops(8192)});
  w.push_back({"mlp_1tok", BuildMlp(1), mlp, "tflops", MlpFlops(1)});
  w.push_back(
      {"attention", BuildAttention,
       [](InputSet& s) { return kiln::causal_attention(s.t[0], s.t[1], s.t[2], s.t[3], false); },
       "", 0.0});
  w.push_back(
      {"attention_inplace", BuildAttention,
       [](InputSet& s) { return kiln::causal_attention(s.t[0], s.t[1], s.t[2], s.t[3], true); }, "",
       0.0});
  // Compiled rows of the workloads the compiler targets (same inputs, same step function).
  std::vector<Workload> compiled;
  for (const Workload& base : w) {
    const std::string& k = base.key;
    if (k != "tiny_add" && k != "elementwise" && k != "mlp" && k != "mlp_1tok" &&
        k != "attention" && k != "linear") {
      continue;
    }
    Workload c = base;
    c.key = k + "_compiled";
    c.mode = Mode::kCompiled;
    compiled.push_back(c);
    c.key = k + "_compiledgraph";
    c.mode = Mode::kGraph;
    compiled.push_back(c);
  }
  w.insert(w.end(), compiled.begin(), compiled.end());
  return w;
}

// The step of `w` as a function of the set's tensors, for kiln::compile (the MLP's module stays
// captured: its weights become constants of the graph).
kiln::ir::TensorFn AsTensorFn(const Workload& w, const InputSet& set) {
  const StepFn fn = w.fn;
  const std::shared_ptr<kiln::Module> module = set.module;
  return [fn, module](const std::vector<Tensor>& in) {
    InputSet s{in, module, nullptr};
    return std::vector<Tensor>{fn(s)};
  };
}

// Compiles the step for every set (each set has its own weights, so the L2 rotation holds).
void CompileSets(const Workload& w, std::vector<InputSet>& sets) {
  kiln::CompileOptions o;
  o.mode = kiln::CompileOptions::Mode::kCompiled;
  o.cuda_graphs = w.mode == Mode::kGraph;
  for (InputSet& s : sets) {
    s.compiled = std::make_shared<kiln::CompiledFn>(kiln::compile(AsTensorFn(w, s), s.t, o));
  }
}

// ---------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------

struct Config {
  bool quick = false;
  bool prequeue = true;
  bool count_kernels = true;
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
  int kernels = -1, memops = -1;  // -1: not counted
  std::string kernels_error;
  std::string graph;  // compiled+graph rows: the report's CUDA graph state
  bool failed = false;
  std::string error;
};

using Step = std::function<Tensor(int)>;
using Clock = std::chrono::steady_clock;

void Sync() { cuda::Synchronize(); }

double UsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

size_t SetBytes(const InputSet& s) {
  size_t b = 0;
  for (const Tensor& t : s.t) b += t.numel() * t.element_size();
  if (s.module) {
    for (const auto& [name, p] : s.module->named_parameters()) b += p.numel() * p.element_size();
  }
  return b;
}

int ChooseNsets(size_t bytes, size_t l2) {
  if (bytes == 0 || bytes >= l2) return 1;  // no inputs (empty_launch): nothing to rotate
  const double want = std::ceil(1.5 * static_cast<double>(l2) / static_cast<double>(bytes));
  return static_cast<int>(std::max(2.0, std::min(8.0, want)));
}

// Synchronizes and hands the cached blocks of kiln's pool back (torch's empty_cache()).
void FreeMemory() {
  Sync();
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
  cudaGetLastError();
}

void TimeHostAndWall(const Step& step, int n, int reps, double* host_us, double* wall_us) {
  std::vector<double> host, wall;
  for (int r = 0; r < reps; ++r) {
    Sync();
    const auto t0 = Clock::now();
    Tensor out = step(r % n);
    const auto t1 = Clock::now();
    Sync();
    const auto t2 = Clock::now();
    out = Tensor();
    host.push_back(UsBetween(t0, t1));
    wall.push_back(UsBetween(t0, t2));
  }
  *host_us = Median(host);
  *wall_us = Median(wall);
}

double TimeHostLoop(const Step& step, int n, int reps, int inner) {
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    Sync();
    const auto t0 = Clock::now();
    for (int i = 0; i < inner; ++i) step(i % n);
    Sync();
    samples.push_back(UsBetween(t0, Clock::now()) / inner);
  }
  return Median(samples);
}

double TimeDevice(const Step& step, int n, const Config& cfg, double host_us_est) {
  const int reps = cfg.reps;
  std::unique_ptr<cuda::Event[]> start(new cuda::Event[reps]), end(new cuda::Event[reps]);
  const cudaStream_t stream = cuda::CurrentStream();
  Sync();
  for (int c0 = 0; c0 < reps; c0 += cfg.chunk) {
    const int c1 = std::min(reps, c0 + cfg.chunk);
    if (cfg.prequeue) Spin(2.0 * (c1 - c0) * (host_us_est + 5.0));
    for (int i = c0; i < c1; ++i) {
      start[i].Record(stream);
      step(i % n);
      end[i].Record(stream);
    }
  }
  Sync();
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) samples.push_back(end[i].ElapsedMs(start[i]) * 1000.0);
  return Median(samples);
}

// ---------------------------------------------------------------------------
// Kernel count: capture one step on a side stream and count the graph's nodes.
// ---------------------------------------------------------------------------

// Kernel and memcpy/memset nodes of `graph`, child graphs included.
void CountNodes(cudaGraph_t graph, int* kernels, int* memops) {
  size_t n = 0;
  KILN_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) KILN_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    KILN_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeKernel) {
      ++*kernels;
    } else if (type == cudaGraphNodeTypeMemcpy || type == cudaGraphNodeTypeMemset) {
      ++*memops;
    } else if (type == cudaGraphNodeTypeGraph) {
      cudaGraph_t child = nullptr;
      KILN_CUDA_CHECK(cudaGraphChildGraphNodeGetGraph(node, &child));
      CountNodes(child, kernels, memops);
    }
  }
}

// The stream used only for capture. Never destroyed and never given real work: anything a
// library caches per stream during a capture (e.g. a workspace allocated inside the discarded
// graph) then can never be used for real.
cudaStream_t CaptureStream() {
  static auto* stream = new cuda::Stream();
  return stream->get();
}

// Device memory held by CUDA graphs' pools (bytes).
double GraphPoolBytes() {
  uint64_t used = 0;
  if (cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used) != cudaSuccess) {
    cudaGetLastError();
    return 0.0;
  }
  return static_cast<double>(used);
}

// Fills row->kernels / row->memops, or row->kernels_error when the step cannot be captured.
void CountLaunches(const Step& step, Row* row) {
  Sync();
  const cudaStream_t stream = CaptureStream();
  cudaGraph_t graph = nullptr;
  std::string error;
  {
    cuda::StreamGuard guard(stream);
    const cudaError_t begin = cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed);
    if (begin != cudaSuccess) {
      cudaGetLastError();
      row->kernels_error =
          std::string("cudaStreamBeginCapture failed: ") + cudaGetErrorString(begin);
      return;
    }
    try {
      Tensor out = step(0);  // freed inside the capture, so every allocation is matched
    } catch (const std::exception& e) {
      error = e.what();
    }
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    if (end != cudaSuccess && error.empty()) {
      error = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
    }
  }
  cudaGetLastError();  // a failed capture leaves its error behind
  if (error.empty() && graph != nullptr) {
    int kernels = 0, memops = 0;
    try {
      CountNodes(graph, &kernels, &memops);
      row->kernels = kernels;
      row->memops = memops;
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!error.empty()) row->kernels_error = "stream capture failed: " + error;
  Sync();
}

Row Measure(const Workload& w, const Config& cfg, size_t l2) {
  Row row;
  row.metric = w.metric;
  row.reps = cfg.reps;
  FreeMemory();

  std::vector<InputSet> sets;
  sets.push_back(w.build(0, nullptr));
  const int n = ChooseNsets(SetBytes(sets[0]), l2);
  for (int i = 1; i < n; ++i) sets.push_back(w.build(i, &sets[0]));
  row.nsets = n;
  if (w.mode != Mode::kEager) CompileSets(w, sets);
  const Step step = [&](int i) {
    if (w.mode == Mode::kEager) return w.fn(sets[i]);
    return (*sets[i].compiled)(sets[i].t)[0];
  };

  for (int i = 0; i < cfg.warmup; ++i) step(i % n);
  Sync();

  TimeHostAndWall(step, n, cfg.reps, &row.host_us, &row.wall_us);
  if (w.tiny) row.host_us = TimeHostLoop(step, n, cfg.tiny_loop_reps, cfg.tiny_loop_n);
  row.device_us = TimeDevice(step, n, cfg, row.host_us);
  if (!w.metric.empty()) row.metric_value = w.amount / (row.device_us * 1e-6) / 1e12;

  // Peak memory of one step with one input set alive.
  sets.resize(1);
  Sync();
  const size_t base = cuda::GetMemoryStats().allocated;
  cuda::ResetPeakMemoryStats();
  {
    Tensor out = step(0);  // kept alive while the peak is read
    Sync();
    const size_t peak = cuda::GetMemoryStats().peak_allocated;
    // A CUDA graph keeps its intermediates in its own pool, outside kiln's allocator.
    const double graph_pool = w.mode == Mode::kGraph ? GraphPoolBytes() : 0.0;
    row.peak_mib = (peak + graph_pool) / kMiB;
    row.peak_extra_mib =
        (static_cast<double>(peak) + graph_pool - static_cast<double>(base)) / kMiB;
  }

  if (w.mode == Mode::kGraph) {
    // The replay is one graph launch; its kernels are the plan's (capturing a graph launch
    // inside another capture would say nothing more).
    row.kernels = sets[0].compiled->report(sets[0].t).kernels_per_step;
    row.graph = sets[0].compiled->report(sets[0].t).cuda_graph;
  } else if (cfg.count_kernels) {
    CountLaunches(step, &row);
  }
  sets.clear();
  FreeMemory();
  return row;
}

// ---------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------

std::string Num(double v) {
  if (std::isnan(v) || std::isinf(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string Count(int v) { return v < 0 ? "null" : std::to_string(v); }

std::string JsonString(const std::string& s) {
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

std::string Cell(double v, int width, int prec) {
  char buf[64];
  if (std::isnan(v)) {
    std::snprintf(buf, sizeof buf, "%*s", width, "-");
  } else {
    std::snprintf(buf, sizeof buf, "%*.*f", width, prec, v);
  }
  return buf;
}

void PrintTable(const std::vector<std::pair<std::string, Row>>& results) {
  std::printf("\n%-22s %11s %10s %11s %16s %10s %8s\n", "workload", "device_us", "host_us",
              "wall_us", "metric", "peak_mib", "kernels");
  std::printf("%s\n", std::string(94, '-').c_str());
  for (const auto& [key, r] : results) {
    if (r.failed) {
      const std::string first = r.error.substr(0, r.error.find('\n')).substr(0, 100);
      std::printf("%-22s ERROR: %s\n", key.c_str(), first.c_str());
      continue;
    }
    std::string metric = "-";
    if (!r.metric.empty() && !std::isnan(r.metric_value)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.3f %s", r.metric_value,
                    r.metric == "tbps" ? "TB/s" : "TFLOP/s");
      metric = buf;
    }
    const std::string kernels = r.kernels < 0 ? "-" : std::to_string(r.kernels);
    std::printf("%-22s %s %s %s %16s %s %8s\n", key.c_str(), Cell(r.device_us, 11, 2).c_str(),
                Cell(r.host_us, 10, 2).c_str(), Cell(r.wall_us, 11, 2).c_str(), metric.c_str(),
                Cell(r.peak_mib, 10, 1).c_str(), kernels.c_str());
  }
  std::fflush(stdout);
}

std::string IsoNow() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S+00:00", &tm);
  return buf;
}

std::string RowJson(const Row& r) {
  std::ostringstream o;
  o << "{\"device_us\": " << Num(r.device_us) << ", \"host_us\": " << Num(r.host_us)
    << ", \"wall_us\": " << Num(r.wall_us);
  if (!r.metric.empty()) o << ", \"" << r.metric << "\": " << Num(r.metric_value);
  o << ", \"peak_mib\": " << Num(r.peak_mib) << ", \"peak_extra_mib\": " << Num(r.peak_extra_mib)
    << ", \"nsets\": " << (r.nsets ? std::to_string(r.nsets) : std::string("null"))
    << ", \"reps\": " << r.reps << ", \"kernels\": " << Count(r.kernels)
    << ", \"memops\": " << Count(r.memops);
  if (!r.kernels_error.empty()) o << ", \"kernels_error\": " << JsonString(r.kernels_error);
  if (!r.graph.empty()) o << ", \"cuda_graph\": " << JsonString(r.graph);
  if (r.failed) o << ", \"error\": " << JsonString(r.error);
  o << "}";
  return o.str();
}

bool WriteJson(const std::string& path, const std::string& gpu, const std::string& cuda_version,
               const Config& cfg, size_t l2,
               const std::vector<std::pair<std::string, Row>>& results) {
  std::ostringstream o;
  o << "{\n  \"source\": \"kiln\",\n"
    << "  \"gpu\": " << JsonString(gpu) << ",\n"
    << "  \"date\": " << JsonString(IsoNow()) << ",\n"
    << "  \"cuda_version\": " << JsonString(cuda_version) << ",\n"
    << "  \"quick\": " << (cfg.quick ? "true" : "false") << ",\n"
    << "  \"method\": {\"device_us\": "
    << JsonString(std::string("median per-step CUDA event time") +
                  (cfg.prequeue ? ", GPU pre-queued behind a spin kernel" : ""))
    << ", \"host_us\": \"median per-call enqueue time; tiny ops: (1000 calls + sync) / 1000\""
    << ", \"wall_us\": \"median of sync; t0; step; sync; t1\""
    << ", \"kernels\": "
    << JsonString(cfg.count_kernels ? "kernel nodes of one step captured with CUDA stream capture"
                                    : "not counted (--no-kernels)")
    << ", \"prequeue\": " << (cfg.prequeue ? "true" : "false") << ", \"warmup\": " << cfg.warmup
    << ", \"reps\": " << cfg.reps << ", \"l2_bytes\": " << l2 << "},\n"
    << "  \"results\": {";
  bool first = true;
  for (const auto& [key, r] : results) {
    o << (first ? "\n" : ",\n") << "    " << JsonString(key) << ": " << RowJson(r);
    first = false;
  }
  o << "\n  }\n}\n";
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  const std::string s = o.str();
  const bool ok = std::fwrite(s.data(), 1, s.size(), f) == s.size();
  return std::fclose(f) == 0 && ok;
}

// ---------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------

void Usage(const char* argv0) {
  std::printf(
      "usage: %s [--json PATH] [--quick] [--only KEY,KEY...] [--no-prequeue] [--no-kernels]\n"
      "       %s --compile-latency\n"
      "  kiln's benchmark (see the header of bench/kiln_bench.cc)\n",
      argv0, argv0);
}

// Returns the workloads named in `only` (all when empty), or false naming the unknown keys.
bool SelectWorkloads(const std::string& only, std::vector<Workload>* workloads) {
  if (only.empty()) return true;
  std::set<std::string> keys;
  std::stringstream ss(only);
  std::string k;
  while (std::getline(ss, k, ',')) {
    if (!k.empty()) keys.insert(k);
  }
  std::vector<Workload> picked;
  for (const auto& w : *workloads) {
    if (keys.erase(w.key) > 0) picked.push_back(w);
  }
  if (!keys.empty()) {
    std::fprintf(stderr, "error: unknown workload(s):");
    for (const auto& key : keys) std::fprintf(stderr, " %s", key.c_str());
    std::fprintf(stderr, "\n");
    return false;
  }
  *workloads = std::move(picked);
  return true;
}

Row RunOne(const Workload& w, const Config& cfg, size_t l2) {
  Row row;
  try {
    row = Measure(w, cfg, l2);
    std::printf(
        "  device %.2f us, host %.2f us, wall %.2f us, peak %.1f MiB, nsets %d, kernels %s\n",
        row.device_us, row.host_us, row.wall_us, row.peak_mib, row.nsets,
        Count(row.kernels).c_str());
    if (!row.kernels_error.empty()) std::printf("  (kernels: %s)\n", row.kernels_error.c_str());
    if (!row.graph.empty()) std::printf("  (CUDA graph: %s)\n", row.graph.c_str());
    return row;
  } catch (const kiln::Error& e) {
    row = Row{};
    row.error = std::string("kiln::Error: ") + e.what();
  } catch (const std::exception& e) {
    row = Row{};
    row.error = std::string("exception: ") + e.what();
  }
  row.metric = w.metric;
  row.reps = cfg.reps;
  row.failed = true;
  std::printf("  FAILED: %s\n", row.error.c_str());
  try {
    FreeMemory();
  } catch (...) {
  }
  return row;
}

// One compile of the MLP plus its first call (CUDA already initialised), as a JSON line.
int CompileLatency() {
  kiln::Generator gen(7);
  kiln::GeGLUMLP mlp(kDModel, kDFF, gen, kiln::ModuleOptions{kBF16, kiln::CUDA()});
  const Tensor x = Randn({8192, kDModel}, gen);
  Sync();
  const auto t0 = Clock::now();
  kiln::CompiledFn f = kiln::compile(mlp, x);
  f({x});
  Sync();
  const double ms = UsBetween(t0, Clock::now()) / 1000.0;
  const kiln::CompileReport& r = f.report({x});
  const kiln::cuda::KernelCacheStats c = kiln::cuda::GetKernelCacheStats();
  std::printf(
      "{\"compile_ms\": %.2f, \"compile_report_ms\": %.2f, \"nvrtc_ms\": %.2f, "
      "\"nvrtc_compiles\": %lld, \"disk_hits\": %lld, \"cache_dir\": %s}\n",
      ms, r.compile_ms, r.nvrtc_ms, static_cast<long long>(c.compiles),
      static_cast<long long>(c.disk_hits), JsonString(kiln::cuda::KernelCacheDir()).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, only;
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--quick") {
      cfg.quick = true;
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--no-prequeue") {
      cfg.prequeue = false;
    } else if (a == "--no-kernels") {
      cfg.count_kernels = false;
    } else if (a == "--compile-latency") {
      if (!cuda::IsAvailable()) return 1;
      return CompileLatency();
    } else if (a == "-h" || a == "--help") {
      Usage(argv[0]);
      return 0;
    } else {
      std::fprintf(stderr, "unknown or incomplete argument: %s\n", a.c_str());
      Usage(argv[0]);
      return 2;
    }
  }
  if (cfg.quick) {
    cfg.warmup = 10;
    cfg.reps = 50;
    cfg.tiny_loop_reps = 10;
  }
  std::vector<Workload> workloads = MakeWorkloads();
  if (!SelectWorkloads(only, &workloads)) return 2;

  if (!cuda::IsAvailable()) {
    std::printf("kiln_bench: no CUDA device\n");
    return 1;
  }
  std::string gpu, cuda_version;
  size_t l2 = 60u << 20;
  try {
    const cuda::DeviceProps& props = cuda::Props(0);
    gpu = props.name;
    if (props.l2_bytes > 0) l2 = props.l2_bytes;
    int rt = 0;
    KILN_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
    cuda_version = std::to_string(rt / 1000) + "." + std::to_string((rt % 1000) / 10);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_bench: %s\n", e.what());
    return 1;
  }
  std::printf("kiln eager (CUDA runtime %s) on %s, L2 %.0f MiB, %s run, prequeue=%s, kernels=%s\n",
              cuda_version.c_str(), gpu.c_str(), l2 / kMiB, cfg.quick ? "quick" : "full",
              cfg.prequeue ? "on" : "off", cfg.count_kernels ? "counted" : "off");
  std::fflush(stdout);

  std::vector<std::pair<std::string, Row>> results;
  for (const auto& w : workloads) {
    std::printf("running %s ...\n", w.key.c_str());
    std::fflush(stdout);
    results.emplace_back(w.key, RunOne(w, cfg, l2));
    std::fflush(stdout);
  }

  PrintTable(results);
  if (!json_path.empty()) {
    if (!WriteJson(json_path, gpu, cuda_version, cfg, l2, results)) {
      std::fprintf(stderr, "error: could not write %s\n", json_path.c_str());
      return 1;
    }
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
