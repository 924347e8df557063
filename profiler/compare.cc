// The eager-vs-compiled report (see report.h): per-mode step summaries side by side with
// speedups, what each fused kernel replaced, and what compiling cost.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "profiler/report.h"
#include "profiler/text_table.h"

namespace kiln::profiler {
namespace {

int StepsOf(const ProfileResult& result, int steps) {
  return steps > 0 ? steps : std::max(1, result.steps_recorded);
}

// Time inside ranges that no other op/user range encloses.
double OutermostRangeNs(const ProfileResult& result) {
  double ns = 0;
  for (const HostEvent& e : result.host) {
    if (e.kind != EventKind::kOp && e.kind != EventKind::kUser) continue;
    const HostEvent* p = e.parent >= 0 ? &result.host[e.parent] : nullptr;
    if (p == nullptr || p->kind == EventKind::kStep) ns += e.duration_ns();
  }
  return ns;
}

// Length of the union of device work intervals, per device, summed.
double BusyNs(const ProfileResult& result) {
  std::vector<DeviceRecord> work = result.device;
  std::sort(work.begin(), work.end(), [](const DeviceRecord& a, const DeviceRecord& b) {
    return a.device != b.device ? a.device < b.device : a.start_ns < b.start_ns;
  });
  double busy = 0;
  for (size_t i = 0; i < work.size();) {
    int64_t start = work[i].start_ns, end = work[i].end_ns;
    size_t j = i + 1;
    for (; j < work.size() && work[j].device == work[i].device && work[j].start_ns <= end; ++j) {
      end = std::max(end, work[j].end_ns);
    }
    busy += end - start;
    i = j;
  }
  return busy;
}

double WallNs(const ProfileResult& result) {
  double ns = 0;
  for (const TimeWindow& w : result.windows) ns += w.end_ns - w.start_ns;
  if (ns > 0 || result.host.empty()) return ns;
  int64_t first = INT64_MAX, last = INT64_MIN;
  for (const HostEvent& e : result.host) {
    first = std::min(first, e.start_ns);
    last = std::max(last, e.end_ns);
  }
  return last - first;
}

std::string Speedup(double base, double value) {
  return value > 0 && base > 0 ? Fixed(base / value, 2) + "x" : "-";
}

// With no device in any mode (a CPU run) the device columns (kernels, busy time, idle share, peak
// memory) are left out rather than printed as n/a or 0.
std::string ModeTable(const ModeSummary& eager, const std::vector<ModeSummary>& others) {
  std::vector<ModeSummary> modes = {eager};
  modes.insert(modes.end(), others.begin(), others.end());
  const bool device =
      std::any_of(modes.begin(), modes.end(), [](const ModeSummary& m) { return m.has_device; });
  std::vector<std::string> header = {"Mode", "Wall us/step", "Host us/step"};
  if (device) {
    header.insert(header.end(), {"Kernels/step", "Device busy us/step", "Device idle", "Peak MiB"});
  }
  header.insert(header.end(), {"Speedup (wall)", "Speedup (host)"});
  TextTable t(header, {true});
  for (const ModeSummary& m : modes) {
    std::vector<std::string> row = {m.name, Fixed(m.wall_us_per_step, 1),
                                    Fixed(m.host_us_per_step, 1)};
    if (device) {
      row.insert(row.end(), {m.has_device ? Fixed(m.kernels_per_step, 1) : "n/a",
                             m.has_device ? Fixed(m.device_busy_us_per_step, 1) : "n/a",
                             m.has_device ? Fixed(100 * m.idle_share, 1) + "%" : "n/a",
                             m.has_device ? Fixed(m.peak_bytes / (1024.0 * 1024.0), 1) : "n/a"});
    }
    row.insert(row.end(), {Speedup(eager.wall_us_per_step, m.wall_us_per_step),
                           Speedup(eager.host_us_per_step, m.host_us_per_step)});
    t.AddRow(row);
  }
  return t.Render();
}

// Without a device the per-kernel device times are left out.
std::string FusedTable(const std::vector<FusedKernelInfo>& fused, bool device) {
  std::vector<std::string> header = {"Fused kernel", "Replaces", "Launches saved"};
  if (device) header.insert(header.end(), {"Device us before", "Device us after"});
  header.push_back("Intermediates saved MiB");
  TextTable t(header, {true, true});
  for (const FusedKernelInfo& f : fused) {
    std::vector<std::string> row = {Truncate(f.kernel, 50), absl::StrJoin(f.eager_ops, " + "),
                                    absl::StrCat(f.launches_saved)};
    if (device) {
      row.insert(row.end(), {Fixed(f.device_us_before, 1), Fixed(f.device_us_after, 1)});
    }
    row.push_back(Fixed(f.intermediate_bytes_saved / (1024.0 * 1024.0), 2));
    t.AddRow(row);
  }
  return t.Render();
}

std::string CompileCostText(const CompileCost& c) {
  const int64_t hits = c.cache.memory_hits + c.cache.disk_hits;
  // A CPU plan, or a CUDA plan of library calls and prebuilt kernels only: nothing for NVRTC.
  if (c.nvrtc_ms == 0 && hits == 0 && c.cache.compiles == 0) {
    return absl::StrCat("Compile cost: ", c.kernels,
                        " fused kernels; no NVRTC compile or cached kernel in this process\n");
  }
  return absl::StrCat("Compile cost: NVRTC ", Fixed(c.nvrtc_ms, 1), " ms for ", c.kernels,
                      " kernels (", Fixed(c.kernels ? c.nvrtc_ms / c.kernels : 0, 1),
                      " ms/kernel); kernel cache: ", hits, " hits (", c.cache.memory_hits,
                      " memory, ", c.cache.disk_hits, " disk), ", c.cache.compiles,
                      " misses compiled in ", Fixed(c.cache.compile_ms, 1), " ms\n");
}

}  // namespace

ModeSummary Summarize(const std::string& name, const ProfileResult& result, int steps,
                      size_t peak_bytes) {
  const double n = StepsOf(result, steps);
  ModeSummary m;
  m.name = name;
  m.peak_bytes = peak_bytes;
  m.has_device = result.device_available;
  m.device_status = result.device_status;
  m.host_us_per_step = OutermostRangeNs(result) / 1e3 / n;
  m.kernels_per_step =
      std::count_if(result.device.begin(), result.device.end(),
                    [](const DeviceRecord& r) { return r.kind == DeviceKind::kKernel; }) /
      n;
  const double busy = BusyNs(result), wall = WallNs(result);
  m.device_busy_us_per_step = busy / 1e3 / n;
  m.wall_us_per_step = wall / 1e3 / n;
  m.idle_share = m.has_device && wall > 0 ? std::max(0.0, 1 - busy / wall) : 0;
  return m;
}

double DeviceUsPerStepOfOps(const ProfileResult& result, const std::vector<std::string>& names,
                            int steps) {
  double us = 0;
  for (const OpRow& row : BuildOpTable(result).rows) {
    if (std::find(names.begin(), names.end(), row.name) != names.end()) us += row.self_device_us;
  }
  return us / StepsOf(result, steps);
}

double DeviceUsPerStepOfKernels(const ProfileResult& result, const std::string& fragment,
                                int steps) {
  double ns = 0;
  for (const DeviceRecord& r : result.device) {
    if (r.name.find(fragment) != std::string::npos) ns += r.duration_ns();
  }
  return ns / 1e3 / StepsOf(result, steps);
}

std::string CompareReport(const ModeSummary& eager, const std::vector<ModeSummary>& others,
                          const CompareDetails& details) {
  std::string out = "Eager vs compiled, per step\n" + ModeTable(eager, others);
  // No device columns: say why (no GPU, or the profiler's device source failed to start).
  const bool any_device =
      eager.has_device ||
      std::any_of(others.begin(), others.end(), [](const ModeSummary& m) { return m.has_device; });
  if (!any_device && !eager.device_status.empty()) {
    out += absl::StrCat("(no device columns: ", eager.device_status, ")\n");
  }
  if (!details.fused.empty()) {
    out += "Fused kernels, per step\n" + FusedTable(details.fused, eager.has_device);
  }
  if (details.has_compile_cost) out += CompileCostText(details.compile);
  return out;
}

}  // namespace kiln::profiler
