// Device timing of alternatives (see device_timing.h).
#include "ops/cuda/device_timing.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "ops/cuda/cublaslt_lib.h"
#include "ops/cuda/gemv_chain.h"
#include "ops/cuda/gemv_kernels.h"
#include "runtime/cuda_api.h"
#include "runtime/nvrtc.h"
#include "runtime/settings.h"
#include "runtime/status.h"
#include "runtime/storage.h"

namespace kiln::cuda_ops {
namespace {

constexpr int64_t kDelayNs = 50'000;  // longer than the host takes to queue one call

// Twice the L2 of the device, or nullptr when there is no memory for it.
std::unique_ptr<Storage> FlushBuffer(Device device) {
  const size_t bytes = 2 * cuda::Props(device.index).l2_bytes;
  if (bytes == 0) return nullptr;
  try {
    return std::make_unique<Storage>(bytes, device);
  } catch (const Error& e) {
    if (e.code() != absl::StatusCode::kResourceExhausted) throw;
    return nullptr;
  }
}

// What runs before each timed call: a write of the flush buffer, else a delay.
void Separate(const Storage* flush, cudaStream_t stream) {
  if (flush != nullptr) {
    KILN_CUDA_CHECK(cudaMemsetAsync(flush->data(), 0, flush->nbytes(), stream));
  } else {
    KILN_CUDA_CHECK(cuda_kernels::DeviceDelay(kDelayNs, stream));
  }
}

// A stored decision's file: this header line, the full key (checked on load: a hash collision or
// an older format reads as "none stored"), then the value.
constexpr char kDecisionHeader[] = "kiln decision v1\n";

struct Costs {
  std::mutex mu;
  OneTimeCosts costs ABSL_GUARDED_BY(mu);
};
Costs& TheCosts() {
  static auto* c = new Costs;  // never destroyed: choices may be made during static teardown
  return *c;
}

template <typename F>
void UpdateCosts(F&& f) {
  Costs& c = TheCosts();
  std::lock_guard<std::mutex> lock(c.mu);
  f(c.costs);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::vector<double> MedianDeviceUs(Device device, absl::Span<const std::function<void()>> paths,
                                   int samples) {
  const GemvChainPause no_chains;  // every path launches for real, nothing pending first
  // One measurement at a time in the process: a plan lowers its nodes in parallel threads, and
  // two timings interleaved on the device measure each other (a GEMV choice saw cuBLASLt at
  // 1.5-2.3 ms instead of 8 µs). Recursive: a path's first call may make a choice of its own
  // (the epilogue timing's warm-up meets a new GEMV problem), timed in full before ours starts.
  static std::recursive_mutex mu;
  std::lock_guard<std::recursive_mutex> lock(mu);
  thread_local int depth = 0;  // a nested timing's time is inside the outer one's
  const auto t0 = std::chrono::steady_clock::now();
  ++depth;
  struct Count {
    int& depth;
    std::chrono::steady_clock::time_point t0;
    ~Count() {
      if (--depth > 0) return;
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      UpdateCosts([ms](OneTimeCosts& c) {
        c.timing_ms += ms;
        ++c.timed;
      });
    }
  } count{depth, t0};
  const cudaStream_t stream = cuda::CurrentStream();
  const std::unique_ptr<Storage> flush = FlushBuffer(device);
  for (const auto& path : paths) path();  // warm-up
  const size_t n = paths.size();
  std::vector<cuda::Event> events(2 * n * samples);  // (start, stop) per path per sample
  for (int i = 0; i < samples; ++i) {
    for (size_t p = 0; p < n; ++p) {
      Separate(flush.get(), stream);
      events[2 * (i * n + p)].Record(stream);
      paths[p]();
      events[2 * (i * n + p) + 1].Record(stream);
    }
  }
  events.back().Synchronize();
  std::vector<double> medians;
  for (size_t p = 0; p < n; ++p) {
    std::vector<double> us;
    for (int i = 0; i < samples; ++i) {
      const size_t e = 2 * (i * n + p);
      us.push_back(events[e + 1].ElapsedMs(events[e]) * 1000.0);
    }
    medians.push_back(Median(std::move(us)));
  }
  return medians;
}

std::string DeviceIdentity(Device device) {
  const cuda::DeviceProps& p = cuda::Props(device.index);
  int driver = 0;
  KILN_CUDA_CHECK(cudaDriverGetVersion(&driver));
  return absl::StrCat(p.name, " sm_", p.major, p.minor, " driver ", driver, " cublasLt ",
                      CublasLt().GetVersion(), " kiln ", KILN_BUILD_ID);
}

OneTimeCosts GetOneTimeCosts() {
  Costs& c = TheCosts();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.costs;
}

void AddLibraryStartup(double ms) {
  UpdateCosts([ms](OneTimeCosts& c) { c.library_startup_ms += ms; });
}

std::optional<std::string> LoadDecision(const std::string& key) {
  if (EnvBool("KILN_RETIME")) return std::nullopt;
  std::string payload;
  if (!cuda::ReadCacheFile(cuda::Fnv1a(key), &payload, ".decision")) return std::nullopt;
  const std::string head = absl::StrCat(kDecisionHeader, key, "\n");
  if (payload.compare(0, head.size(), head) != 0) return std::nullopt;
  UpdateCosts([](OneTimeCosts& c) { ++c.stored; });
  return payload.substr(head.size());
}

void StoreDecision(const std::string& key, const std::string& value) {
  cuda::WriteCacheFile(cuda::Fnv1a(key), absl::StrCat(kDecisionHeader, key, "\n", value),
                       ".decision");
}
}  // namespace kiln::cuda_ops
