// Device records: the fake source, record builders and the correlation logic shared by every
// source (see device.h). CUPTI itself lives in cupti.cc.
#include "profiler/device.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <unordered_map>
#include <unordered_set>

namespace kiln::profiler {

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kKernel:
      return "kernel";
    case DeviceKind::kMemcpy:
      return "memcpy";
    case DeviceKind::kMemset:
      return "memset";
    case DeviceKind::kRuntime:
      return "cuda_runtime";
    case DeviceKind::kDriver:
      return "cuda_driver";
    case DeviceKind::kExternalCorrelation:
      return "external_correlation";
  }
  return "?";
}

absl::Status FakeActivitySource::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!start_status_.ok()) return start_status_;
  started_ = true;
  return absl::OkStatus();
}

std::vector<DeviceRecord> FakeActivitySource::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(pending_, {});
}

std::vector<DeviceRecord> FakeActivitySource::Stop() {
  std::vector<DeviceRecord> out = Flush();
  std::lock_guard<std::mutex> lock(mu_);
  started_ = false;
  return out;
}

void FakeActivitySource::PushExternalId(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pushed_.push_back(id);
    stack_.push_back(id);
  }
  if (on_push) on_push(id);
}

void FakeActivitySource::PopExternalId() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!stack_.empty()) stack_.pop_back();
}

void FakeActivitySource::Add(DeviceRecord record) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.push_back(std::move(record));
}

std::vector<uint64_t> FakeActivitySource::pushed_ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pushed_;
}

uint64_t FakeActivitySource::current_external_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stack_.empty() ? 0 : stack_.back();
}

DeviceRecord KernelRecord(const std::string& name, uint32_t correlation_id, int64_t start_ns,
                          int64_t end_ns, uint32_t stream) {
  DeviceRecord r;
  r.kind = DeviceKind::kKernel;
  r.name = name;
  r.correlation_id = correlation_id;
  r.start_ns = start_ns;
  r.end_ns = end_ns;
  r.stream = stream;
  r.grid[0] = r.grid[1] = r.grid[2] = 1;
  r.block[0] = 128;
  r.block[1] = r.block[2] = 1;
  r.registers_per_thread = 32;
  return r;
}

DeviceRecord LaunchRecord(uint32_t correlation_id, int64_t start_ns, int64_t end_ns,
                          uint32_t thread_id, const std::string& name) {
  DeviceRecord r;
  r.kind = DeviceKind::kRuntime;
  r.name = name;
  r.correlation_id = correlation_id;
  r.start_ns = start_ns;
  r.end_ns = end_ns;
  r.thread_id = thread_id;
  return r;
}

DeviceRecord ExternalCorrelationRecord(uint32_t correlation_id, uint64_t external_id) {
  DeviceRecord r;
  r.kind = DeviceKind::kExternalCorrelation;
  r.correlation_id = correlation_id;
  r.external_id = external_id;
  return r;
}

std::string Demangle(const char* name) {
  if (name == nullptr) return "";
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || demangled == nullptr) return name;
  std::string out = demangled;
  std::free(demangled);
  return out;
}

namespace {

bool InWindows(int64_t t, const std::vector<TimeWindow>& windows) {
  for (const TimeWindow& w : windows) {
    if (t >= w.start_ns && t <= w.end_ns) return true;
  }
  return false;
}

// API calls worth a place on the host lane although they started no device work.
bool NotableCall(const std::string& name) {
  for (const char* key : {"Synchronize", "Malloc", "Free", "Memcpy", "Memset"}) {
    if (name.find(key) != std::string::npos) return true;
  }
  return false;
}

bool ByStart(const DeviceRecord& a, const DeviceRecord& b) { return a.start_ns < b.start_ns; }

}  // namespace

SplitRecords SplitDeviceRecords(std::vector<DeviceRecord> records,
                                const std::vector<TimeWindow>& windows) {
  std::unordered_map<uint32_t, uint64_t> external;
  std::unordered_set<uint32_t> has_activity, has_runtime_call, any_call;
  for (const DeviceRecord& r : records) {
    if (r.kind == DeviceKind::kExternalCorrelation) external[r.correlation_id] = r.external_id;
    if (r.is_activity()) has_activity.insert(r.correlation_id);
    if (r.kind == DeviceKind::kRuntime) has_runtime_call.insert(r.correlation_id);
    if (r.kind == DeviceKind::kRuntime || r.kind == DeviceKind::kDriver) {
      any_call.insert(r.correlation_id);
    }
  }
  SplitRecords out;
  std::unordered_set<uint32_t> kept_calls;
  for (DeviceRecord& r : records) {
    if (auto it = external.find(r.correlation_id); it != external.end() && r.external_id == 0) {
      r.external_id = it->second;
    }
    if (r.kind != DeviceKind::kRuntime && r.kind != DeviceKind::kDriver) continue;
    const bool launched = has_activity.count(r.correlation_id) > 0;
    if (r.kind == DeviceKind::kDriver && (!launched || has_runtime_call.count(r.correlation_id))) {
      continue;
    }
    if (!(launched || NotableCall(r.name)) || !InWindows(r.start_ns, windows)) continue;
    kept_calls.insert(r.correlation_id);
    out.calls.push_back(std::move(r));
  }
  for (DeviceRecord& r : records) {
    if (!r.is_activity()) continue;
    const bool keep = any_call.count(r.correlation_id) ? kept_calls.count(r.correlation_id) > 0
                                                       : InWindows(r.start_ns, windows);
    if (keep) out.activity.push_back(std::move(r));
  }
  std::stable_sort(out.calls.begin(), out.calls.end(), ByStart);
  std::stable_sort(out.activity.begin(), out.activity.end(), ByStart);
  return out;
}

}  // namespace kiln::profiler
