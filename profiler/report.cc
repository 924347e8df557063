// The op table and the kernel table (see report.h).
#include "profiler/report.h"

#include <algorithm>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "profiler/text_table.h"

namespace kiln::profiler {
namespace {

constexpr double kNsPerUs = 1e3;

bool IsRange(const HostEvent& e) { return e.kind == EventKind::kOp || e.kind == EventKind::kUser; }

// kiln range id -> index of its event in result.host.
std::unordered_map<uint64_t, int> RangeIndex(const ProfileResult& result) {
  std::unordered_map<uint64_t, int> index;
  for (size_t i = 0; i < result.host.size(); ++i) {
    if (IsRange(result.host[i])) index[result.host[i].correlation_id] = static_cast<int>(i);
  }
  return index;
}

// Per-event times in ns: device work launched by the event itself, with its nested ranges, and
// host time of its directly nested ranges.
struct EventTimes {
  std::vector<double> self_device, total_device, child_host;
  double unattributed_device = 0;
};

EventTimes ComputeEventTimes(const ProfileResult& result) {
  const size_t n = result.host.size();
  EventTimes t{std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
  const auto index = RangeIndex(result);
  for (const DeviceRecord& r : result.device) {
    auto it = index.find(r.external_id);
    if (r.external_id != 0 && it != index.end()) {
      t.self_device[it->second] += r.duration_ns();
    } else {
      t.unattributed_device += r.duration_ns();
    }
  }
  t.total_device = t.self_device;
  // Children follow their parents (SortAndNest), so a reverse sweep sees every child first.
  for (size_t i = n; i-- > 0;) {
    const HostEvent& e = result.host[i];
    if (e.parent < 0) continue;
    t.total_device[e.parent] += t.total_device[i];
    if (IsRange(e)) t.child_host[e.parent] += e.duration_ns();
  }
  return t;
}

double SortValue(const OpRow& r, SortKey key) {
  switch (key) {
    case SortKey::kName:
      return 0;
    case SortKey::kCalls:
      return static_cast<double>(r.calls);
    case SortKey::kSelfHost:
      return r.self_host_us;
    case SortKey::kTotalHost:
      return r.total_host_us;
    case SortKey::kSelfDevice:
      return r.self_device_us;
    case SortKey::kTotalDevice:
      return r.total_device_us;
    case SortKey::kDeviceAvg:
      return r.device_avg_us();
  }
  return 0;
}

}  // namespace

OpTable BuildOpTable(const ProfileResult& result) {
  OpTable table;
  table.device_status = result.device_status;
  const EventTimes t = ComputeEventTimes(result);
  std::unordered_map<std::string, size_t> row_of;
  for (size_t i = 0; i < result.host.size(); ++i) {
    const HostEvent& e = result.host[i];
    if (!IsRange(e)) continue;
    const std::string key = absl::StrCat(e.name, "\x1f", EventKindName(e.kind));
    auto [it, added] = row_of.try_emplace(key, table.rows.size());
    if (added) table.rows.push_back(OpRow{e.name, e.kind});
    OpRow& row = table.rows[it->second];
    const double self_host = std::max(0.0, e.duration_ns() - t.child_host[i]);
    row.calls += 1;
    row.total_host_us += e.duration_ns() / kNsPerUs;
    row.self_host_us += self_host / kNsPerUs;
    row.self_device_us += t.self_device[i] / kNsPerUs;
    row.total_device_us += t.total_device[i] / kNsPerUs;
  }
  for (const OpRow& r : table.rows) {
    table.self_host_total_us += r.self_host_us;
    table.self_device_total_us += r.self_device_us;
  }
  table.unattributed_device_us = t.unattributed_device / kNsPerUs;
  return table;
}

bool ParseSortKey(const std::string& text, SortKey* key) {
  static const std::map<std::string, SortKey> kKeys = {
      {"name", SortKey::kName},
      {"calls", SortKey::kCalls},
      {"count", SortKey::kCalls},
      {"self_host", SortKey::kSelfHost},
      {"self_cpu_time_total", SortKey::kSelfHost},
      {"total_host", SortKey::kTotalHost},
      {"cpu_time_total", SortKey::kTotalHost},
      {"self_device", SortKey::kSelfDevice},
      {"self_cuda_time_total", SortKey::kSelfDevice},
      {"total_device", SortKey::kTotalDevice},
      {"cuda_time_total", SortKey::kTotalDevice},
      {"device_avg", SortKey::kDeviceAvg},
      {"cuda_time_avg", SortKey::kDeviceAvg},
  };
  auto it = kKeys.find(text);
  if (it == kKeys.end()) return false;
  *key = it->second;
  return true;
}

void SortRows(std::vector<OpRow>& rows, SortKey key) {
  std::stable_sort(rows.begin(), rows.end(), [key](const OpRow& a, const OpRow& b) {
    if (key != SortKey::kName) {
      const double va = SortValue(a, key), vb = SortValue(b, key);
      if (va != vb) return va > vb;
    }
    return a.name < b.name;
  });
}

std::string FormatOpTable(const OpTable& table, const OpTableOptions& options) {
  std::vector<OpRow> rows = table.rows;
  SortRows(rows, options.sort);
  if (options.limit > 0 && rows.size() > static_cast<size_t>(options.limit)) {
    rows.resize(options.limit);
  }
  TextTable text({"Name", "Kind", "Calls", "Self host us", "Total host us", "Host avg us",
                  "Self device us", "Total device us", "Device avg us"},
                 {true, true});
  for (const OpRow& r : rows) {
    text.AddRow({Truncate(r.name, 60), EventKindName(r.kind), absl::StrCat(r.calls),
                 Fixed(r.self_host_us), Fixed(r.total_host_us), Fixed(r.host_avg_us()),
                 Fixed(r.self_device_us), Fixed(r.total_device_us), Fixed(r.device_avg_us())});
  }
  std::string out = text.Render();
  absl::StrAppend(&out, "Self CPU time total: ", Fixed(table.self_host_total_us), " us\n");
  absl::StrAppend(&out, "Self CUDA time total: ", Fixed(table.self_device_total_us), " us\n");
  if (table.unattributed_device_us > 0) {
    absl::StrAppend(&out, "Device time outside any range: ", Fixed(table.unattributed_device_us),
                    " us\n");
  }
  if (!table.device_status.empty()) absl::StrAppend(&out, table.device_status, "\n");
  return out;
}

}  // namespace kiln::profiler
