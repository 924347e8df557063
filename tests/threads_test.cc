// kiln from several threads (issue #13 item 7), the binary the ThreadSanitizer build runs
// (KILN_TSAN, scripts/test --tsan). torch's rules: any thread may issue ops; the allocator, the
// cuBLASLt handle and plan cache, the NVRTC kernel caches and the profiler are thread-safe; work
// several threads issue on one stream runs in issue order; memory freed by one thread is not
// reused while work queued where it was allocated may still read it.
//   - eager ops from 4 threads sharing weights, on the CPU and on CUDA (legacy default stream, a
//     stream per thread, one shared stream), each result checked against a single-threaded run;
//   - a tensor made on one thread's stream and freed by another thread;
//   - NVRTC compiles and the disk kernel cache from several threads sharing one directory;
//   - several threads compiling and running their own functions, and the profiler collecting
//     ranges from several threads.
// One CompiledFn called from several threads (issue #13 item 7b). Library start-up on its
// background thread (runtime/startup.h): waited for from several threads, never from itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/compile.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "profiler/profiler.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "runtime/startup.h"
#include "runtime/status.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

// The kernel cache directory of this process: fresh, shared by every thread of every test, set
// during static initialisation (before any kernel cache use) and removed at exit.
struct ScratchCacheDir {
  std::string path = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                  "/kiln-threads-test-", getpid());
  ScratchCacheDir() {
    std::filesystem::create_directories(path);
    setenv("KILN_CACHE_DIR", path.c_str(), 1);
  }
  ~ScratchCacheDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
const ScratchCacheDir kCacheDir;
const std::string& CacheDir() { return kCacheDir.path; }

constexpr int kThreads = 4;

// Runs body(t) on kThreads threads at once; kiln::Error inside a thread becomes a failure.
void RunThreads(const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();  // start together
      try {
        body(t);
      } catch (const Error& e) {
        ADD_FAILURE() << "thread " << t << ": " << e.what();
      }
    });
  }
  for (std::thread& th : threads) th.join();
}

class Threads : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().is_cuda()) KILN_SKIP_WITHOUT_GPU();
  }
};

std::string DeviceName(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cuda() ? "Cuda" : "Cpu";
}

// matmul + elementwise on a shared weight: the workload that went wrong from 4 threads.
Tensor Step(const Tensor& x, const Tensor& w, const Tensor& b) {
  return gelu(matmul(x, t(w)) + b, "tanh") * 0.5 + relu(x);
}

enum class StreamUse { kDefault, kPerThread, kShared };

void EagerOpsShareWeights(Device device, DType dtype, StreamUse streams, int iterations) {
  Generator gen(11);
  const int64_t n = 256;
  const Tensor w = to(cast(randn({n, n}, gen), dtype), device);
  const Tensor b = to(cast(randn({n}, gen), dtype), device);
  std::vector<Tensor> inputs;
  std::vector<std::vector<double>> want;
  for (int i = 0; i < kThreads * 2; ++i) {
    inputs.push_back(to(cast(randn({64, n}, gen), dtype), device));
    want.push_back(to_vector(Step(inputs.back(), w, b)));  // single-threaded reference
  }
  std::unique_ptr<cuda::Stream> shared;
  if (device.is_cuda() && streams == StreamUse::kShared) shared = std::make_unique<cuda::Stream>();
  std::atomic<int> wrong{0};
  RunThreads([&](int t) {
    std::unique_ptr<cuda::Stream> own;
    if (device.is_cuda() && streams == StreamUse::kPerThread)
      own = std::make_unique<cuda::Stream>();
    cuda::StreamHandle stream = own ? own->get() : shared ? shared->get() : nullptr;
    std::unique_ptr<cuda::StreamGuard> guard;
    if (device.is_cuda()) guard = std::make_unique<cuda::StreamGuard>(stream);
    for (int it = 0; it < iterations; ++it) {
      const int k = (t + it) % static_cast<int>(inputs.size());
      const std::vector<double> got = to_vector(Step(inputs[k], w, b));
      const Tolerance tol = ToleranceFor(dtype);
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::fabs(got[i] - want[k][i]) > tol.atol + tol.rtol * std::fabs(want[k][i])) {
          wrong.fetch_add(1);
          break;
        }
      }
    }
  });
  EXPECT_EQ(wrong.load(), 0) << "results differing from the single-threaded run";
}

TEST_P(Threads, EagerOpsFromFourThreadsShareWeights) {
  const int iterations = GetParam().is_cuda() ? 500 : 8;
  EagerOpsShareWeights(GetParam(), DType::kFloat32, StreamUse::kDefault, iterations);
  EagerOpsShareWeights(GetParam(), DType::kBFloat16, StreamUse::kDefault, iterations);
}

TEST(ThreadsCuda, EagerOpsOnAStreamPerThread) {
  KILN_SKIP_WITHOUT_GPU();
  EagerOpsShareWeights(CUDA(0), DType::kFloat32, StreamUse::kPerThread, 500);
  EagerOpsShareWeights(CUDA(0), DType::kBFloat16, StreamUse::kPerThread, 500);
}

TEST(ThreadsCuda, EagerOpsOnOneSharedStream) {
  KILN_SKIP_WITHOUT_GPU();
  EagerOpsShareWeights(CUDA(0), DType::kBFloat16, StreamUse::kShared, 500);
}

TEST(ThreadsCuda, MemoryFreedByAnotherThreadIsNotReusedEarly) {
  // A worker allocates x on its own stream, queues long work reading it and hands the only
  // reference to the main thread, which drops it while that work runs and at once allocates and
  // overwrites memory of the same size on the default stream. x's block is freed on the
  // worker's stream (where it was allocated), so the queued reads still see x.
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(5);
  const Tensor host = randn({512, 1024}, gen);
  constexpr int kReads = 40;
  const std::vector<double> want = to_vector(tanh(host) * static_cast<double>(kReads));
  for (int round = 0; round < 10; ++round) {
    cuda::Stream stream;
    Tensor handed, result;
    std::atomic<bool> queued{false};
    std::thread worker([&] {
      cuda::StreamGuard guard(stream.get());
      Tensor x = to(host, CUDA(0));  // allocated on `stream`
      Tensor acc = zeros({512, 1024}, DType::kFloat32, CUDA(0));
      for (int i = 0; i < kReads; ++i) acc = acc + tanh(x);  // queued, not yet run
      result = acc;
      handed = x;
      x = Tensor();
      queued = true;
      stream.Synchronize();
    });
    while (!queued) std::this_thread::yield();
    handed = Tensor();  // the last reference: freed now, from this thread
    const Tensor clobber = full({512, 1024}, 1e9, DType::kFloat32, CUDA(0));
    worker.join();
    ExpectClose(to_vector(result), want, {1e-3, 1e-4}, absl::StrCat("round ", round));
  }
}

// Startup tasks. Device indices no machine here has (60, 61): the tasks run on their thread all
// the same (the registered cuBLASLt warm-up fails there and is swallowed).
std::atomic<int> g_startup_runs{0};
std::atomic<bool> g_startup_self_wait_returned{false};
void CountingStartupTask(int device) {
  if (device < 60) return;  // a real device's start-up: not this test's
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  cuda::WaitForStartup();  // on the startup thread itself: returns at once (no self-join)
  g_startup_self_wait_returned = true;
  g_startup_runs.fetch_add(1);
}
const bool kCountingTaskRegistered = (cuda::RegisterStartupTask(&CountingStartupTask), true);

TEST(ThreadsStartup, TasksRunOncePerDeviceInTheBackgroundAndEveryWaiterSeesThemDone) {
  const int before = g_startup_runs.load();
  const double ms_before = cuda::StartupMs();
  cuda::StartStartupTasks(60);
  std::vector<std::thread> starters;
  for (int i = 0; i < 4; ++i) starters.emplace_back([] { cuda::StartStartupTasks(60); });
  std::vector<std::thread> waiters;
  std::atomic<int> saw_done{0};
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&] {
      cuda::WaitForStartup();
      if (g_startup_runs.load() == before + 1) saw_done.fetch_add(1);
    });
  }
  for (std::thread& t : starters) t.join();
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(saw_done.load(), 4) << "a waiter returned before the task had run";
  EXPECT_EQ(g_startup_runs.load(), before + 1) << "device 60's tasks ran more than once";
  EXPECT_TRUE(g_startup_self_wait_returned.load());
  EXPECT_GE(cuda::StartupMs() - ms_before, 25.0) << "the task's time is not counted";
  EXPECT_FALSE(cuda::OnStartupThread());
}

// Exit while a task runs: the task ends before any static destructor (here one constructed after
// the startup threads, so destroyed before their holder joins them) runs.
std::atomic<bool> g_teardown_started{false};
struct TeardownMark {
  ~TeardownMark() { g_teardown_started = true; }
};
void SlowStartupTask(int device) {
  if (device != 59) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::fprintf(stderr, "%s\n",
               g_teardown_started ? "task ended in teardown" : "task ended before teardown");
}
const bool kSlowTaskRegistered = (cuda::RegisterStartupTask(&SlowStartupTask), true);

TEST(ThreadsStartup, ExitWaitsForARunningTaskBeforeAnyTeardown) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: no threads of other tests
  EXPECT_EXIT(
      {
        cuda::StartStartupTasks(59);
        static TeardownMark mark;
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "task ended before teardown");
}

// A background job runs off the calling thread, is no startup work, and exit waits for it too.
TEST(ThreadsBackground, JobsRunOffTheCallerAndAreWaitedFor) {
  std::atomic<int> done{0};
  std::atomic<bool> on_startup_thread{true};
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> elsewhere{false};
  for (int i = 0; i < 3; ++i) {
    cuda::RunInBackground([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      elsewhere = std::this_thread::get_id() != caller;
      on_startup_thread = cuda::OnStartupThread();
      done.fetch_add(1);
    });
  }
  cuda::WaitForBackgroundJobs();
  EXPECT_EQ(done.load(), 3) << "WaitForBackgroundJobs returned before its jobs ended";
  EXPECT_TRUE(elsewhere.load());
  EXPECT_FALSE(on_startup_thread.load()) << "a background job is not startup work";
  cuda::RunInBackground([] { throw std::runtime_error("swallowed: reported through its result"); });
  cuda::WaitForBackgroundJobs();
}

TEST(ThreadsBackground, ExitWaitsForARunningJobBeforeAnyTeardown) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        cuda::RunInBackground([] { SlowStartupTask(59); });
        static TeardownMark mark;
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "task ended before teardown");
}

TEST(ThreadsStartup, OffRunsNoTask) {
  const int before = g_startup_runs.load();
  ASSERT_EQ(setenv("KILN_STARTUP", "off", 1), 0);
  cuda::StartStartupTasks(61);
  unsetenv("KILN_STARTUP");
  cuda::WaitForStartup();
  cuda::StartStartupTasks(61);  // started once already (as off): nothing runs later either
  cuda::WaitForStartup();
  EXPECT_EQ(g_startup_runs.load(), before);
}

TEST_P(Threads, OneModuleRunFromThreads) {
  // A module shared by threads (CausalSelfAttention caches its mask in forward).
  Generator gen(13);
  CausalSelfAttention att(16, 4, gen, {DType::kFloat32, GetParam()});
  std::vector<Tensor> inputs;
  std::vector<std::vector<double>> want;
  for (int t = 0; t < kThreads; ++t) {
    inputs.push_back(to(randn({2, 3 + t, 16}, gen), GetParam()));  // a sequence length each
    want.push_back(to_vector(att(inputs.back())));
  }
  RunThreads([&](int t) {
    for (int i = 0; i < 10; ++i) {
      ExpectClose(to_vector(att(inputs[t])), want[t], {1e-5, 1e-5}, absl::StrCat("thread ", t));
    }
  });
}

// ---- Kernel caches. ---------------------------------------------------------------------------

TEST(ThreadsNvrtc, ConcurrentCompilesShareOneCacheDirectory) {
  KILN_SKIP_WITHOUT_NVRTC();
  ASSERT_EQ(cuda::KernelCacheDir(), CacheDir()) << "the disk cache must be on for this test";
  std::atomic<int> bad{0};
  RunThreads([&](int t) {
    for (int i = 0; i < 3; ++i) {
      // Threads compile the same source (i) and their own (t): both cache entries get written
      // by racing threads; every read must return a whole, valid payload.
      const std::string src = absl::StrCat("extern \"C\" __global__ void k(float* p) { p[0] = ", i,
                                           ".f; }\n// thread ", i % 2 == 0 ? 0 : t);
      absl::StatusOr<std::string> ptx = cuda::CompileSource(src, "k", "compute_90", false);
      if (!ptx.ok()) {
        ADD_FAILURE() << ptx.status();
        continue;
      }
      const uint64_t key = cuda::Fnv1a(src);
      cuda::WriteCacheFile(key, *ptx);
      std::string back;
      if (!cuda::ReadCacheFile(key, &back) || back != *ptx) bad.fetch_add(1);
    }
  });
  EXPECT_EQ(bad.load(), 0);
  for (const auto& entry : std::filesystem::directory_iterator(CacheDir())) {
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << "left " << entry.path();
  }
}

TEST(ThreadsCuda, GeneratedKernelsCompileOnceFromManyThreads) {
  // Elementwise kernels never built in this process, requested by every thread at once.
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(9);
  const Tensor a = to(cast(randn({33, 65}, gen), DType::kFloat16), CUDA(0));
  const std::vector<double> want = to_vector(sigmoid(silu(to(a, kCPU))) - 0.25);
  RunThreads([&](int t) {
    for (int i = 0; i < 20; ++i) {
      ExpectClose(to_vector(sigmoid(silu(a)) - 0.25), want, ToleranceFor(DType::kFloat16),
                  absl::StrCat("thread ", t));
    }
  });
}

// ---- Compiled functions and the profiler. ------------------------------------------------------

TEST_P(Threads, ThreadsCompilingAndRunningTheirOwnFunctions) {
  Generator gen(21);
  const Tensor w = to(randn({32, 32}, gen), GetParam());
  RunThreads([&](int t) {
    Generator g(100 + t);
    const Tensor x = to(randn({8, 32}, g), GetParam());
    const double s = 0.5 + t;  // a different function (and kernel) per thread
    ir::TensorFn fn = [&w, s](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{softmax(matmul(in[0], w) * s, -1) + gelu(in[0], "tanh")};
    };
    CompiledFn f = compile(fn, {x});
    for (int i = 0; i < 5; ++i) {
      ExpectClose(to_vector(f({x})[0]), to_vector(fn({x})[0]), {1e-4, 1e-4},
                  absl::StrCat("thread ", t));
    }
  });
}

TEST_P(Threads, OneCompiledFunctionCalledFromThreads) {
  Generator gen(31);
  const Tensor w = to(randn({16, 16}, gen), GetParam());
  ir::TensorFn fn = [&w](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{tanh(matmul(in[0], w)) * 2.0};
  };
  CompiledFn f = compile(fn, {to(randn({4, 16}, gen), GetParam())});
  RunThreads([&](int t) {
    Generator g(200 + t);
    for (int i = 0; i < 50; ++i) {
      const Tensor x = to(randn({1 + (i + t) % 3, 16}, g), GetParam());  // new signatures too
      ExpectClose(to_vector(f({x})[0]), to_vector(fn({x})[0]), {1e-4, 1e-4}, "shared fn");
    }
  });
}

TEST_P(Threads, ProfilerCollectsRangesFromEveryThread) {
  const Tensor x = to(ones({16, 16}), GetParam());
  profiler::Profiler prof(profiler::ProfilerOptions{.device = false});
  prof.Start();
  RunThreads([&](int) {
    for (int i = 0; i < 20; ++i) relu(x + 1.0);
  });
  const profiler::ProfileResult r = prof.Stop();
  int relus = 0;
  std::vector<uint32_t> tids;
  for (const profiler::HostEvent& e : r.host) {
    if (std::string(e.name) != "relu") continue;
    ++relus;
    if (std::find(tids.begin(), tids.end(), e.tid) == tids.end()) tids.push_back(e.tid);
  }
  EXPECT_EQ(relus, kThreads * 20);
  EXPECT_EQ(tids.size(), static_cast<size_t>(kThreads));
}

INSTANTIATE_TEST_SUITE_P(Devices, Threads, ::testing::Values(kCPU, CUDA(0)), DeviceName);

}  // namespace
}  // namespace kiln
