// kiln's profiler: a torch.profiler-style schedule over steps that records host ranges (ops,
// user ranges, steps, CUDA launch calls) and device activity (CUPTI) into one ProfileResult.
//
//   kiln::profiler::Profiler prof({.wait = 1, .warmup = 1, .active = 3});
//   prof.Start();
//   for (int i = 0; i < 5; ++i) {
//     y = model(x);
//     prof.Step();            // steps 0 (wait) and 1 (warm-up) are not recorded
//   }
//   ProfileResult r = prof.Stop();
//   std::cout << FormatOpTable(BuildOpTable(r), {.sort = SortKey::kSelfDevice, .limit = 10});
//   ExportChromeTrace(r, "trace.json");
//
// Without a GPU, or when CUPTI cannot start, host ranges are still recorded and
// ProfileResult::device_status says "device activity unavailable: <why>". The device source
// starts with the first warm-up or active step, so its own start-up cost lands in warm-up.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "profiler/device.h"
#include "profiler/host.h"

namespace kiln::profiler {

struct ProfilerOptions {
  // The schedule: each cycle has `wait` skipped steps, `warmup` steps run with the profiler on
  // but discarded, then `active` recorded steps; `repeat` cycles (0 = cycle until Stop).
  int wait = 0, warmup = 0, active = 1, repeat = 1;
  bool record_shapes = false;              // input shapes on op ranges
  bool device = true;                      // false: host ranges only, no device source
  std::unique_ptr<ActivitySource> source;  // null: CUPTI when a GPU is present
};

enum class StepAction { kNone, kWarmup, kRecord };
StepAction ScheduleAction(const ProfilerOptions& options, int step);

struct ProfileResult {
  std::vector<HostEvent> host;       // by (thread, start); parent and depth filled in
  std::vector<DeviceRecord> device;  // kernels, copies and memsets, by start
  uint64_t dropped_records = 0;      // device records the source could not keep
  int steps_recorded = 0;
  std::vector<TimeWindow> windows;  // the recorded steps
  bool device_available = false;
  std::string device_status;  // "device activity: cupti" or "device activity unavailable: ..."
};

// Sorts events by (thread, start, longest first) and fills parent and depth from containment.
void SortAndNest(std::vector<HostEvent>& events);

class Profiler {
 public:
  using Options = ProfilerOptions;
  Profiler();
  explicit Profiler(Options options);
  ~Profiler();  // stops (discarding the result) if still running
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  void Start();  // throws kiln::Error if a profiler is already running
  void Step();   // ends the current step and applies the schedule to the next one
  ProfileResult Stop();

  bool running() const { return running_; }
  bool recording() const { return running_ && action_ == StepAction::kRecord; }
  int step() const { return step_; }
  // The running profiler, or nullptr (so library code can call Current()->Step()).
  static Profiler* Current();

 private:
  void EnterStep(int64_t now_ns);
  void CloseStep(int64_t now_ns);
  void StartSource();
  void CollectDevice(ProfileResult& result, std::vector<HostEvent>& host);

  Options options_;
  bool running_ = false, source_started_ = false;
  int step_ = 0;
  StepAction action_ = StepAction::kNone;
  int64_t step_start_ns_ = 0;
  std::vector<HostEvent> step_events_;
  std::vector<TimeWindow> windows_;
  std::string device_status_;
};

}  // namespace kiln::profiler
