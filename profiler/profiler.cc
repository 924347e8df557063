// The profiler's schedule and the assembly of a ProfileResult (see profiler.h).
#include "profiler/profiler.h"

#include <algorithm>
#include <atomic>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace kiln::profiler {
namespace {

std::atomic<Profiler*> g_current{nullptr};

// Launch calls carry no recorded depth; this sorts them after ranges with the same start.
constexpr int32_t kUnknownDepth = 1 << 20;

HostEvent LaunchEvent(const DeviceRecord& call) {
  HostEvent e;
  e.name = Intern(call.name);
  e.kind = EventKind::kLaunch;
  e.depth = kUnknownDepth;
  e.tid = call.thread_id;
  e.start_ns = call.start_ns;
  e.end_ns = call.end_ns;
  e.correlation_id = call.correlation_id;
  return e;
}

bool Contains(const HostEvent& outer, const HostEvent& inner) {
  return outer.tid == inner.tid && outer.start_ns <= inner.start_ns && inner.end_ns <= outer.end_ns;
}

}  // namespace

StepAction ScheduleAction(const ProfilerOptions& o, int step) {
  const int cycle = o.wait + o.warmup + o.active;
  if (cycle <= 0 || o.active <= 0) return StepAction::kNone;
  if (o.repeat > 0 && step >= o.repeat * cycle) return StepAction::kNone;
  const int pos = step % cycle;
  if (pos < o.wait) return StepAction::kNone;
  if (pos < o.wait + o.warmup) return StepAction::kWarmup;
  return StepAction::kRecord;
}

void SortAndNest(std::vector<HostEvent>& events) {
  std::stable_sort(events.begin(), events.end(), [](const HostEvent& a, const HostEvent& b) {
    return std::make_tuple(a.tid, a.start_ns, -a.end_ns, a.depth) <
           std::make_tuple(b.tid, b.start_ns, -b.end_ns, b.depth);
  });
  std::vector<int32_t> open;
  for (size_t i = 0; i < events.size(); ++i) {
    HostEvent& e = events[i];
    while (!open.empty() && !Contains(events[open.back()], e)) open.pop_back();
    e.parent = open.empty() ? -1 : open.back();
    e.depth = open.empty() ? 0 : events[e.parent].depth + 1;
    open.push_back(static_cast<int32_t>(i));
  }
}

Profiler::Profiler() : Profiler(Options{}) {}

Profiler::Profiler(Options options) : options_(std::move(options)) {
  const Options& o = options_;
  KILN_CHECK(o.wait >= 0 && o.warmup >= 0 && o.active > 0 && o.repeat >= 0,
             "Profiler: the schedule needs wait >= 0, warmup >= 0, active > 0 and repeat >= 0 ",
             "(torch's schedule), got wait=", o.wait, " warmup=", o.warmup, " active=", o.active,
             " repeat=", o.repeat);
}

Profiler::~Profiler() {
  if (running_) Stop();
}

Profiler* Profiler::Current() { return g_current.load(std::memory_order_acquire); }

void Profiler::Start() {
  Profiler* expected = nullptr;
  KILN_CHECK(!running_ && g_current.compare_exchange_strong(expected, this),
             "Profiler::Start: a profiler is already running");
  running_ = true;
  step_ = 0;
  step_events_.clear();
  windows_.clear();
  device_status_ = "device activity unavailable: the schedule recorded no step";
  if (options_.source == nullptr && options_.device) options_.source = MakeCuptiSource();
  if (options_.source == nullptr) device_status_ = "device activity unavailable: disabled";
  internal::BeginSession(options_.record_shapes);
  EnterStep(NowNs());
}

void Profiler::Step() {
  KILN_CHECK(running_, "Profiler::Step: the profiler is not running");
  const int64_t now = NowNs();
  CloseStep(now);
  ++step_;
  EnterStep(now);
}

void Profiler::EnterStep(int64_t now_ns) {
  action_ = ScheduleAction(options_, step_);
  step_start_ns_ = now_ns;
  if (action_ != StepAction::kNone && !source_started_) StartSource();
  g_active.store(action_ == StepAction::kRecord, std::memory_order_relaxed);
}

void Profiler::CloseStep(int64_t now_ns) {
  if (action_ != StepAction::kRecord) return;
  HostEvent e;
  e.name = Intern(absl::StrCat("ProfilerStep#", step_));
  e.kind = EventKind::kStep;
  e.depth = -1;  // outside every range of its thread
  e.tid = CurrentThreadId();
  e.start_ns = step_start_ns_;
  e.end_ns = now_ns;
  step_events_.push_back(e);
  windows_.push_back({step_start_ns_, now_ns});
}

void Profiler::StartSource() {
  if (options_.source == nullptr) return;
  source_started_ = true;
  const absl::Status status = options_.source->Start();
  if (!status.ok()) {
    source_started_ = false;
    options_.source.reset();
    device_status_ = absl::StrCat("device activity unavailable: ", status.message());
    return;
  }
  device_status_ = absl::StrCat("device activity: ", options_.source->name());
  internal::SetActivitySource(options_.source.get());
}

ProfileResult Profiler::Stop() {
  KILN_CHECK(running_, "Profiler::Stop: the profiler is not running");
  const int64_t now = NowNs();
  g_active.store(false, std::memory_order_relaxed);
  std::vector<HostEvent> host = internal::EndSession();
  // The step in progress counts only if something was recorded in it (a loop that calls Step()
  // after its last iteration leaves an empty one).
  if (action_ == StepAction::kRecord &&
      std::any_of(host.begin(), host.end(),
                  [&](const HostEvent& e) { return e.start_ns >= step_start_ns_; })) {
    CloseStep(now);
  }
  ProfileResult result;
  CollectDevice(result, host);
  host.insert(host.end(), step_events_.begin(), step_events_.end());
  SortAndNest(host);
  result.host = std::move(host);
  result.steps_recorded = static_cast<int>(windows_.size());
  result.windows = windows_;
  result.device_status = device_status_;
  running_ = false;
  action_ = StepAction::kNone;
  g_current.store(nullptr, std::memory_order_release);
  return result;
}

void Profiler::CollectDevice(ProfileResult& result, std::vector<HostEvent>& host) {
  if (!source_started_) return;
  source_started_ = false;
  std::vector<DeviceRecord> records = options_.source->Stop();
  result.device_available = true;
  result.dropped_records = options_.source->dropped_records();
  SplitRecords split = SplitDeviceRecords(std::move(records), windows_);
  for (const DeviceRecord& call : split.calls) host.push_back(LaunchEvent(call));
  result.device = std::move(split.activity);
}

}  // namespace kiln::profiler
