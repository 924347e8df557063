// Device side of the profiler: activity records (kernels, copies, memsets, the runtime/driver
// calls that launched them) behind a small interface, so the profiler's logic runs the same on
// CUPTI records and on synthetic ones (Kineto's MockCuptiActivities).
//
//   std::unique_ptr<ActivitySource> s = MakeCuptiSource();  // the GPU
//   auto fake = std::make_unique<FakeActivitySource>();     // tests
//   fake->Add(KernelRecord("gemm", /*correlation=*/7, t0, t1));
//
// Every record's times are on the host clock (NowNs): a source converts its own timestamps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"

namespace kiln::profiler {

enum class DeviceKind : uint8_t {
  kKernel,
  kMemcpy,
  kMemset,
  kRuntime,  // a CUDA runtime API call on the host (cudaLaunchKernel, cudaMemcpyAsync, ...)
  kDriver,   // a CUDA driver API call on the host (cuLaunchKernel, ...)
  kExternalCorrelation,  // maps correlation_id -> external_id; consumed by the profiler
};
const char* DeviceKindName(DeviceKind kind);

struct DeviceRecord {
  DeviceKind kind = DeviceKind::kKernel;
  std::string name;  // demangled kernel name, API call name; memcpy kind ("HtoD") for copies
  int64_t start_ns = 0, end_ns = 0;
  uint32_t device = 0, stream = 0;
  uint32_t correlation_id = 0;  // CUPTI's: shared by a launch call and the work it started
  uint64_t external_id = 0;     // the kiln range (op) that launched it, 0 if none
  uint32_t thread_id = 0;       // API calls: the system thread id
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
  int32_t registers_per_thread = 0;
  int32_t static_shared_bytes = 0, dynamic_shared_bytes = 0;
  uint64_t bytes = 0;  // copies and memsets
  int64_t duration_ns() const { return end_ns - start_ns; }
  bool is_activity() const {  // work on the device (as opposed to a host API call)
    return kind == DeviceKind::kKernel || kind == DeviceKind::kMemcpy ||
           kind == DeviceKind::kMemset;
  }
};

// Where device records come from. Start() begins collection; Flush() returns what has been
// collected so far; Stop() flushes everything still buffered, stops and returns the rest.
class ActivitySource {
 public:
  virtual ~ActivitySource() = default;
  virtual std::string name() const = 0;
  virtual absl::Status Start() = 0;
  virtual std::vector<DeviceRecord> Flush() = 0;
  virtual std::vector<DeviceRecord> Stop() = 0;
  // Records the source could not keep (CUPTI ran out of buffer space), since Start.
  virtual uint64_t dropped_records() const = 0;
  // Host ranges push their id while open: device work launched meanwhile is attributed to the
  // innermost one (an kExternalCorrelation record per launch call).
  virtual void PushExternalId(uint64_t id) {}
  virtual void PopExternalId() {}
};

// CUPTI's Activity API. Start() fails with kUnavailable without a GPU (cuda::IsAvailable()) and
// with the CUPTI error when CUPTI cannot be initialised; one CUPTI source runs at a time.
std::unique_ptr<ActivitySource> MakeCuptiSource();

// Synthetic records for tests: Add() queues records delivered by the next Flush/Stop. With
// `on_push` set, each PushExternalId calls it (e.g. to fabricate the launch of an op).
class FakeActivitySource : public ActivitySource {
 public:
  std::string name() const override { return "fake"; }
  absl::Status Start() override;
  std::vector<DeviceRecord> Flush() override;
  std::vector<DeviceRecord> Stop() override;
  uint64_t dropped_records() const override { return dropped_; }
  void PushExternalId(uint64_t id) override;
  void PopExternalId() override;

  void Add(DeviceRecord record);
  void set_dropped_records(uint64_t n) { dropped_ = n; }
  void set_start_status(absl::Status status) { start_status_ = std::move(status); }
  bool started() const { return started_; }
  std::vector<uint64_t> pushed_ids() const;  // every id pushed, in order
  uint64_t current_external_id() const;      // top of the pushed stack, 0 if empty
  std::function<void(uint64_t id)> on_push;

 private:
  mutable std::mutex mu_;
  std::vector<DeviceRecord> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> pushed_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> stack_ ABSL_GUARDED_BY(mu_);
  // Not guarded (set_dropped_records, set_start_status and started() touch them unlocked): a test
  // sets them up and reads them back on the thread that starts and stops the source.
  uint64_t dropped_ = 0;
  absl::Status start_status_;
  bool started_ = false;
};

// Synthetic record builders (tests, examples of the record shapes).
DeviceRecord KernelRecord(const std::string& name, uint32_t correlation_id, int64_t start_ns,
                          int64_t end_ns, uint32_t stream = 7);
DeviceRecord LaunchRecord(uint32_t correlation_id, int64_t start_ns, int64_t end_ns,
                          uint32_t thread_id, const std::string& name = "cudaLaunchKernel");
DeviceRecord ExternalCorrelationRecord(uint32_t correlation_id, uint64_t external_id);

// Demangles a C++ symbol ("_Z4gemmPfi" -> "gemm(float*, int)"); other names come back as is.
std::string Demangle(const char* name);

// A [start, end] span of host time that was recorded (an active step).
struct TimeWindow {
  int64_t start_ns, end_ns;
};

// Raw records of a session -> what a ProfileResult keeps:
//   - external_id of every record filled from the kExternalCorrelation records (then dropped);
//   - launch calls (runtime records, or driver records whose call no runtime record covers)
//     kept when they started device work or synchronise/allocate, and when they began inside a
//     window; everything else from host API tracing is dropped;
//   - device activity kept when its launch call was kept, or, without a launch record, when it
//     began inside a window.
struct SplitRecords {
  std::vector<DeviceRecord> calls;     // kRuntime / kDriver, by start time
  std::vector<DeviceRecord> activity;  // kKernel / kMemcpy / kMemset, by start time
};
SplitRecords SplitDeviceRecords(std::vector<DeviceRecord> records,
                                const std::vector<TimeWindow>& windows);

}  // namespace kiln::profiler
