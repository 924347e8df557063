// Host cost of eager CUDA ops and of compiled calls (plain and CUDA-graph replays), and where it
// goes. Each case enqueues --ops small ops back to back
// (device time per op is below the host's, so the host bounds the loop) and reports ns per op,
// median and min over --reps runs, interleaved so that drift hits every case alike; the large
// cases (kiln_bench's linear, softmax and eager attention, whose kernels outlast their enqueue)
// time each enqueue alone from an idle stream, as kiln_bench's host_us does. The floor is
// "launch": one cudaLaunchKernel of an empty kernel; "graph_launch" is the floor of the replays,
// one cudaGraphLaunch of a one-kernel graph. With --samples FILE each --profile case (a
// comma-separated list) runs again under a sampler (the main thread's stacks every 50 µs of wall
// time inside an op) and FILE.CASE gets one line per sample of "module offset" frames, leaf
// first; bench/host_cost_symbols.py
// turns it into self and inclusive time per function with the unstripped binary's symbols.
//
//   build/bench/host_cost [--ops 20000] [--reps 7] [--profile add,linear_64x768] [--samples FILE]
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "codegen/compile.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/cuda_api.h"
#include "runtime/nvrtc.h"
#include "runtime/status.h"

namespace {

using kiln::DType;
using kiln::Tensor;

struct Case {
  std::string name;
  std::function<void()> op;
  // Ops whose device time exceeds their host time (a GEMM of 8192 rows): each is timed alone from
  // an idle stream (synchronise, then time the enqueue; kiln_bench's host_us), 1/20 of --ops.
  bool synced = false;
};

// The sampler keeps only samples taken while this is set (a synced case's enqueues).
std::atomic<bool> g_sampling{true};

double Elapsed(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
}

double NsPerOp(const Case& c, int ops) {
  if (!c.synced) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < ops; ++i) c.op();
    kiln::cuda::Synchronize();
    return Elapsed(t0) / ops;
  }
  ops = ops / 20 + 1;
  double enqueue = 0;
  for (int i = 0; i < ops; ++i) {
    kiln::cuda::Synchronize();
    g_sampling.store(true);
    const auto t0 = std::chrono::steady_clock::now();
    c.op();
    enqueue += Elapsed(t0);
    g_sampling.store(false);
  }
  kiln::cuda::Synchronize();
  g_sampling.store(true);
  return enqueue / ops;
}

// --- the sampler --------------------------------------------------------------------------------

constexpr int kMaxFrames = 40;
constexpr int kMaxSamples = 200000;
struct Sample {
  int n;
  void* pc[kMaxFrames];
};
Sample* g_samples = nullptr;
std::atomic<int> g_count{0};
pid_t g_main_tid = 0;

void OnProf(int, siginfo_t*, void*) {
  if (static_cast<pid_t>(syscall(SYS_gettid)) != g_main_tid || !g_sampling.load()) return;
  const int i = g_count.fetch_add(1);
  if (i >= kMaxSamples) return;
  g_samples[i].n = backtrace(g_samples[i].pc, kMaxFrames);
}

// A timer on the monotonic clock (high resolution, unlike the CPU-time itimer's scheduler ticks)
// signals the main thread every kSampleUs; the handler keeps a sample only inside an op
// (g_sampling), so a synced case's waits for the GPU are not sampled.
constexpr long kSampleUs = 50;
timer_t g_timer;

void StartSampler() {
  g_samples = new Sample[kMaxSamples];
  g_main_tid = static_cast<pid_t>(syscall(SYS_gettid));
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder outside the handler
  struct sigaction sa = {};
  sa.sa_sigaction = OnProf;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGPROF, &sa, nullptr);
  sigevent ev = {};
  ev.sigev_notify = SIGEV_THREAD_ID;
  ev.sigev_signo = SIGPROF;
  ev._sigev_un._tid = g_main_tid;
  if (timer_create(CLOCK_MONOTONIC, &ev, &g_timer) != 0) {
    std::perror("timer_create");
    std::exit(1);
  }
  const itimerspec every = {{0, kSampleUs * 1000}, {0, kSampleUs * 1000}};
  timer_settime(g_timer, 0, &every, nullptr);
}

void StopSampler() { timer_delete(g_timer); }

// "module offset" of a return address: the module's file name and the address less its load base
// (addr2line takes such offsets for position-independent binaries and shared libraries).
std::string Frame(void* pc) {
  Dl_info info;
  if (dladdr(pc, &info) == 0 || info.dli_fname == nullptr) return "? 0";
  const char* slash = std::strrchr(info.dli_fname, '/');
  const uintptr_t off =
      reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase);
  char buf[64];
  std::snprintf(buf, sizeof(buf), " 0x%lx", static_cast<unsigned long>(off));
  return std::string(slash ? slash + 1 : info.dli_fname) + buf;
}

void WriteSamples(const std::string& path, const std::string& case_name) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::perror(path.c_str());
    return;
  }
  const int n = std::min(g_count.load(), kMaxSamples);
  std::fprintf(f, "# host_cost samples of case %s: %d samples, one per %ld us inside an op\n",
               case_name.c_str(), n, kSampleUs);
  for (int i = 0; i < n; ++i) {
    // Frame 0 is the handler, 1 the signal trampoline: the interrupted code starts at 2.
    for (int k = 2; k < g_samples[i].n; ++k) {
      std::fprintf(f, "%s%s", k > 2 ? "|" : "", Frame(g_samples[i].pc[k]).c_str());
    }
    std::fprintf(f, "\n");
  }
  std::fclose(f);
}

// A graph of one launch of `kernel`, instantiated: the floor under a CUDA-graph replay (captured
// on a stream of its own: the legacy default stream cannot be captured).
cudaGraphExec_t OneKernelGraph(cudaKernel_t kernel) {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(1), dim3(32),
                                   nullptr, 0, stream));
  KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  KILN_CUDA_CHECK(cudaGraphDestroy(graph));
  KILN_CUDA_CHECK(cudaStreamDestroy(stream));
  return exec;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int ops = 20000, reps = 7;
  std::string profile = "add", samples;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--ops") == 0) ops = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--profile") == 0) profile = argv[i + 1];
    if (std::strcmp(argv[i], "--samples") == 0) samples = argv[i + 1];
  }
  if (!kiln::cuda::IsAvailable()) {
    std::fprintf(stderr, "host_cost: no CUDA device\n");
    return 1;
  }
  const kiln::Device gpu = kiln::CUDA(0);
  const Tensor a = kiln::ones({16}, DType::kFloat32, gpu);
  const Tensor b = kiln::ones({16}, DType::kFloat32, gpu);
  const Tensor rows = kiln::ones({8, 768}, DType::kBFloat16, gpu);
  const Tensor bias = kiln::ones({768}, DType::kBFloat16, gpu);
  const Tensor x1 = kiln::ones({1, 768}, DType::kBFloat16, gpu);
  const Tensor w = kiln::ones({768, 768}, DType::kBFloat16, gpu);
  const Tensor x64 = kiln::ones({64, 768}, DType::kBFloat16, gpu);
  // kiln_bench's linear row: [8192, 768] x [3072, 768]^T + bias, a 48 MiB output.
  const Tensor x8k = kiln::ones({8192, 768}, DType::kBFloat16, gpu);
  const Tensor w3k = kiln::ones({3072, 768}, DType::kBFloat16, gpu);
  const Tensor bias3k = kiln::ones({3072}, DType::kBFloat16, gpu);
  const Tensor big = kiln::ones({8192, 3072}, DType::kBFloat16, gpu);
  // kiln_bench's softmax and eager attention rows.
  const Tensor scores = kiln::ones({131072, 1024}, DType::kBFloat16, gpu);
  const Tensor q = kiln::ones({8, 16, 1024, 64}, DType::kBFloat16, gpu);
  const Tensor mask = kiln::triu(kiln::ones({1024, 1024}, DType::kBool, gpu), 1);
  const cudaKernel_t empty = kiln::ValueOrThrow(
      kiln::cuda::GetKernel("extern \"C\" __global__ void kiln_empty() {}", "kiln_empty"));
  kiln::CompileOptions graph_options;
  graph_options.mode = kiln::CompileOptions::Mode::kCompiled;
  graph_options.cuda_graphs = true;
#ifndef KILN_HOST_COST_NO_FREEZE  // scripts/pair-bins builds it against libraries without freezing
  graph_options.freeze_weights = true;
#endif
  kiln::CompileOptions plain_options = graph_options;
  plain_options.cuda_graphs = false;
  auto add_fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kiln::add(in[0], in[1])};
  };
  auto linear_fn = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kiln::linear(in[0], w, bias)};
  };
  auto linear8k_fn = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kiln::linear(in[0], w3k, bias3k)};
  };
  kiln::CompiledFn compiled_linear8k = kiln::compile(linear8k_fn, {x8k}, plain_options);
  kiln::CompiledFn compiled_add = kiln::compile(add_fn, {a, b}, plain_options);
  kiln::CompiledFn graph_add = kiln::compile(add_fn, {a, b}, graph_options);
  kiln::CompiledFn graph_linear = kiln::compile(linear_fn, {x64}, graph_options);
  kiln::CompiledFn compiled_linear = kiln::compile(linear_fn, {x64}, plain_options);
  cudaGraphExec_t one_kernel = OneKernelGraph(empty);
  const std::vector<Case> cases = {
      {"launch",
       [&] {
         KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(empty), dim3(1), dim3(32),
                                          nullptr, 0, kiln::cuda::CurrentStream()));
       }},
      {"malloc_free",
       [&] {
         void* p = nullptr;
         KILN_CUDA_CHECK(cudaMallocAsync(&p, 64, kiln::cuda::CurrentStream()));
         KILN_CUDA_CHECK(cudaFreeAsync(p, kiln::cuda::CurrentStream()));
       }},
      {"empty", [&] { Tensor t = kiln::empty({16}, DType::kFloat32, gpu); }},
      {"add", [&] { Tensor t = kiln::add(a, b); }},
      {"add_", [&] { kiln::add_(a, b); }},
      {"add_scalar", [&] { Tensor t = kiln::add(a, 1.0); }},
      {"gelu", [&] { Tensor t = kiln::gelu(a); }},
      {"bias_rows_bf16", [&] { Tensor t = kiln::add(rows, bias); }},
      {"linear_1x768", [&] { Tensor t = kiln::linear(x1, w); }},
      {"linear_64x768", [&] { Tensor t = kiln::linear(x64, w); }},
      {"graph_launch",
       [&] { KILN_CUDA_CHECK(cudaGraphLaunch(one_kernel, kiln::cuda::CurrentStream())); }},
      {"compiled_add",
       [&] {
         std::vector<Tensor> t = compiled_add({a, b});
       }},
      {"graph_add",
       [&] {
         std::vector<Tensor> t = graph_add({a, b});
       }},
      {"graph_linear_64x768", [&] { std::vector<Tensor> t = graph_linear({x64}); }},
      {"compiled_linear_64x768", [&] { std::vector<Tensor> t = compiled_linear({x64}); }},
      {"empty_48mib",
       [&] {
         Tensor t = kiln::empty({8192, 3072}, DType::kBFloat16, gpu);
       }},
      {"add_8192x3072", [&] { Tensor t = kiln::add(big, big); }, true},
      {"linear_8192x768", [&] { Tensor t = kiln::linear(x8k, w3k, bias3k); }, true},
      {"compiled_linear_8192x768", [&] { std::vector<Tensor> t = compiled_linear8k({x8k}); }, true},
      {"softmax_131072x1024", [&] { Tensor t = kiln::softmax(scores, -1); }, true},
      {"attention_eager", [&] { Tensor t = kiln::causal_attention(q, q, q, mask, false); }, true},
  };
  for (const Case& c : cases) NsPerOp(c, ops / 10 + 1);  // warm-up: kernels, allocator, choices
  std::vector<std::vector<double>> runs(cases.size());
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < cases.size(); ++i) runs[i].push_back(NsPerOp(cases[i], ops));
  }
  std::printf(
      "host cost per CUDA op or compiled call, %d ops x %d runs (ns/op; host-bound loops; the\n"
      "cases from add_8192x3072 on: %d enqueues each timed from an idle stream)\n",
      ops, reps, ops / 20 + 1);
  for (size_t i = 0; i < cases.size(); ++i) {
    std::printf("  %-16s median %8.1f  min %8.1f  max %8.1f\n", cases[i].name.c_str(),
                Median(runs[i]), *std::min_element(runs[i].begin(), runs[i].end()),
                *std::max_element(runs[i].begin(), runs[i].end()));
  }
  if (samples.empty()) return 0;
  StartSampler();
  for (const std::string& name :
       std::vector<std::string>(absl::StrSplit(profile, ',', absl::SkipEmpty()))) {
    const auto it =
        std::find_if(cases.begin(), cases.end(), [&](const Case& c) { return c.name == name; });
    if (it == cases.end()) {
      std::fprintf(stderr, "host_cost: --profile %s: no such case\n", name.c_str());
      return 1;
    }
    g_count.store(0);
    for (int r = 0; r < 10; ++r) NsPerOp(*it, ops);
    const std::string path = samples + "." + name;
    WriteSamples(path, name);
    std::printf("profile of %s: %d samples in %s\n", name.c_str(), g_count.load(), path.c_str());
  }
  StopSampler();
  return 0;
}
