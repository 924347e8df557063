// All-reduce against the engine's own limit (issue #33): kiln's collective op (kiln::all_reduce
// over an NCCL group, eager, and N of them replayed as one CUDA graph) beside this program calling
// ncclAllReduce directly on communicators of its own, same sizes, same GPUs, interleaved.
//
//   allreduce_bench [--gpus N] [--dtype bf16|f32] [--iters 50] [--reps 5]
//
// One thread per GPU (cuda:0..N-1; default every visible one). Per size: latency (µs per call,
// calls enqueued back to back and timed with CUDA events on rank 0, median over interleaved
// repetitions, min..max after it) at 4 KB .. 1 MB (what a decode step sends) and algorithm and
// bus bandwidth (NCCL's busbw: 2(n-1)/n x bytes / time) at 64 MB .. 1 GB. With one GPU NCCL's
// all-reduce is a local copy: the figures then measure each path's own overhead only. A line
// "ALLREDUCE {json}" per size carries the figures.
#include <nccl.h>

#include <algorithm>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/compile.h"
#include "ops/distributed.h"
#include "ops/factories.h"
#include "ops/nccl.h"
#include "ops/ops.h"
#include "profiler/timer.h"
#include "runtime/cuda.h"
#include "runtime/dynamic_symbols.h"

namespace {

using kiln::Tensor;

struct Nccl {
  decltype(&ncclCommInitAll) CommInitAll = nullptr;
  decltype(&ncclCommDestroy) CommDestroy = nullptr;
  decltype(&ncclAllReduce) AllReduce = nullptr;
  decltype(&ncclGetErrorString) GetErrorString = nullptr;
};

// The direct path's NCCL, opened as the library opens it (ops/cuda/nccl_group.cc).
const Nccl& Lib() {
  static const Nccl lib = [] {
    Nccl l;
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      std::fprintf(stderr, "libnccl.so.2: %s\n", dlerror());
      std::exit(2);
    }
    std::string missing;
    kiln::ResolveSymbol(h, "ncclCommInitAll", &l.CommInitAll, &missing);
    kiln::ResolveSymbol(h, "ncclCommDestroy", &l.CommDestroy, &missing);
    kiln::ResolveSymbol(h, "ncclAllReduce", &l.AllReduce, &missing);
    kiln::ResolveSymbol(h, "ncclGetErrorString", &l.GetErrorString, &missing);
    if (!missing.empty()) {
      std::fprintf(stderr, "libnccl.so.2 has no %s\n", missing.c_str());
      std::exit(2);
    }
    return l;
  }();
  return lib;
}

void Check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, Lib().GetErrorString(r));
    std::exit(2);
  }
}

int Flag(int argc, char** argv, const std::string& name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == "--" + name) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

std::string StrFlag(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == "--" + name) return argv[i + 1];
  }
  return fallback;
}

// A barrier for the rank threads (between timed sections, so every rank starts together).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen; });
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int count_ = 0;
  int64_t gen_ = 0;
};

struct Figures {
  std::vector<double> kiln_us, graph_us, nccl_us;  // per call, one entry per repetition
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string Range(const std::vector<double>& v) {
  if (v.empty()) return "-";
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f..%.1f", *lo, *hi);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  if (!kiln::cuda::IsAvailable()) {
    std::printf("allreduce_bench: no CUDA device, nothing to measure\n");
    return 0;
  }
  std::string why;
  if (!kiln::NcclAvailable(&why)) {
    std::printf("allreduce_bench: NCCL is not available: %s\n", why.c_str());
    return 0;
  }
  const int n = Flag(argc, argv, "gpus", kiln::cuda::DeviceCount());
  const int iters = Flag(argc, argv, "iters", 50), reps = Flag(argc, argv, "reps", 5);
  const kiln::DType dtype = StrFlag(argc, argv, "dtype", "bf16") == "f32" ? kiln::DType::kFloat32
                                                                          : kiln::DType::kBFloat16;
  const ncclDataType_t nccl_type = dtype == kiln::DType::kFloat32 ? ncclFloat32 : ncclBfloat16;
  const int64_t elem = kiln::DTypeSize(dtype);
  std::vector<int64_t> sizes;
  for (int64_t b = 4 << 10; b <= (1 << 20); b *= 4) sizes.push_back(b);  // latency
  for (int64_t b = int64_t{64} << 20; b <= (int64_t{1} << 30); b *= 4)
    sizes.push_back(b);  // bandwidth

  std::vector<int> devices(n);
  for (int i = 0; i < n; ++i) devices[i] = i;
  std::vector<ncclComm_t> direct(n);  // the direct path's own communicators
  Check(Lib().CommInitAll(direct.data(), n, devices.data()), "ncclCommInitAll");
  std::vector<Figures> figures(sizes.size());
  Barrier barrier(n);

  std::printf(
      "== all-reduce (sum, %s) over %d GPU(s): kiln's op vs ncclAllReduce, %d calls x %d "
      "interleaved repetitions ==\n",
      kiln::DTypeName(dtype), n, iters, reps);
  kiln::RunNcclRanks(devices, [&](kiln::ProcessGroup& pg) {
    const int r = pg.rank();
    const kiln::Device dev = kiln::CUDA(devices[r]);
    for (size_t s = 0; s < sizes.size(); ++s) {
      const int64_t count = sizes[s] / elem;
      const Tensor x = kiln::full({count}, 1.0, dtype, dev);
      Tensor out = kiln::empty({count}, dtype, dev);
      // N kiln all-reduces, each reading the previous one's result, as one compiled CUDA graph.
      kiln::CompileOptions o;
      o.mode = kiln::CompileOptions::Mode::kCompiled;
      o.cuda_graphs = true;
      const kiln::CompiledFn chain = kiln::compile(
          [&pg, iters](const std::vector<Tensor>& in) {
            Tensor y = in[0];
            for (int i = 0; i < iters; ++i) y = kiln::all_reduce(y, pg);
            return std::vector<Tensor>{y};
          },
          {x}, o);
      for (int w = 0; w < 2; ++w) chain({x});  // plan, then capture
      auto timed = [&](auto&& body, std::vector<double>* into) {
        barrier.Wait();
        kiln::cuda::Synchronize();
        barrier.Wait();
        kiln::DeviceTimer t(dev);
        t.Start();
        body();
        t.Stop();
        const double us = t.MedianMs() * 1000 / iters;
        if (r == 0) into->push_back(us);
      };
      for (int rep = 0; rep < reps; ++rep) {
        timed(
            [&] {
              for (int i = 0; i < iters; ++i) kiln::all_reduce(x, pg);
            },
            &figures[s].kiln_us);
        timed(
            [&] {
              for (int i = 0; i < iters; ++i) {
                Check(Lib().AllReduce(x.data_ptr(), out.data_ptr(), count, nccl_type, ncclSum,
                                      direct[r], kiln::cuda::CurrentStream()),
                      "ncclAllReduce");
              }
            },
            &figures[s].nccl_us);
        timed([&] { chain({x}); }, &figures[s].graph_us);
      }
    }
  });
  for (ncclComm_t c : direct) Lib().CommDestroy(c);

  std::printf("\n%10s %14s %14s %14s %8s %12s %12s\n", "bytes", "kiln op us", "kiln graph us",
              "ncclAllReduce", "op/nccl", "busbw GB/s", "nccl GB/s");
  for (size_t s = 0; s < sizes.size(); ++s) {
    const Figures& f = figures[s];
    const double k = Median(f.kiln_us), g = Median(f.graph_us), d = Median(f.nccl_us);
    const double factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
    const double busbw = factor * sizes[s] / (std::min(k, g) * 1e3),
                 nccl_busbw = factor * sizes[s] / (d * 1e3);
    std::printf("%10" PRId64
                " %14.2f %14.2f %14.2f %8.2f %12.1f %12.1f   (spread: op %s, graph %s, "
                "nccl %s)\n",
                sizes[s], k, g, d, k / d, busbw, nccl_busbw, Range(f.kiln_us).c_str(),
                Range(f.graph_us).c_str(), Range(f.nccl_us).c_str());
    std::printf("ALLREDUCE {\"gpus\": %d, \"bytes\": %" PRId64
                ", \"kiln_op_us\": %.3f, \"kiln_graph_us\": %.3f, \"nccl_us\": %.3f}\n",
                n, sizes[s], k, g, d);
  }
  return 0;
}
