// The kernel table (see report.h): device work grouped by kernel name, with its launch
// configuration, the op that launched it and, where the caller knows the work, throughput.
#include <algorithm>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "profiler/report.h"
#include "profiler/text_table.h"

namespace kiln::profiler {
namespace {

struct Group {
  KernelRow row;
  std::map<std::string, int64_t> ops;  // launching range name -> calls
};

bool SameLaunch(const KernelRow& row, const DeviceRecord& r) {
  return std::equal(row.grid, row.grid + 3, r.grid) &&
         std::equal(row.block, row.block + 3, r.block);
}

void AddRecord(Group& g, const DeviceRecord& r, const char* op) {
  KernelRow& row = g.row;
  if (row.calls == 0) {
    std::copy(r.grid, r.grid + 3, row.grid);
    std::copy(r.block, r.block + 3, row.block);
    row.registers = r.registers_per_thread;
    row.shared_bytes = r.static_shared_bytes + r.dynamic_shared_bytes;
  } else if (!SameLaunch(row, r)) {
    row.varied_launch = true;
  }
  row.calls += 1;
  row.total_us += r.duration_ns() / 1e3;
  if (op != nullptr) g.ops[op] += 1;
}

std::string MostFrequent(const std::map<std::string, int64_t>& counts) {
  std::string best;
  int64_t n = 0;
  for (const auto& [name, c] : counts) {
    if (c > n) best = name, n = c;
  }
  return best;
}

void SetThroughput(KernelRow& row, const KernelTableOptions& options) {
  auto it = options.work.find(row.name);
  if (it == options.work.end()) it = options.work.find(row.op);
  if (it == options.work.end() || row.total_us <= 0) return;
  const double seconds = row.total_us * 1e-6;
  row.bytes_per_s = it->second.bytes * row.calls / seconds;
  row.flops_per_s = it->second.flops * row.calls / seconds;
}

std::string Dim3(const int32_t d[3]) { return absl::StrCat("[", d[0], ",", d[1], ",", d[2], "]"); }

std::string Rate(double value, double unit, double peak) {
  if (value <= 0) return "-";
  std::string s = Fixed(value / unit, 1);
  if (peak > 0) absl::StrAppend(&s, " (", Fixed(100 * value / peak, 0), "%)");
  return s;
}

}  // namespace

std::vector<KernelRow> BuildKernelTable(const ProfileResult& result,
                                        const KernelTableOptions& options) {
  std::unordered_map<uint64_t, const char*> op_of;
  for (const HostEvent& e : result.host) {
    if (e.kind == EventKind::kOp || e.kind == EventKind::kUser) op_of[e.correlation_id] = e.name;
  }
  std::unordered_map<std::string, Group> groups;
  for (const DeviceRecord& r : result.device) {
    Group& g = groups[r.name];
    g.row.name = r.name;
    auto it = r.external_id ? op_of.find(r.external_id) : op_of.end();
    AddRecord(g, r, it == op_of.end() ? nullptr : it->second);
  }
  std::vector<KernelRow> rows;
  for (auto& [name, g] : groups) {
    g.row.op = MostFrequent(g.ops);
    SetThroughput(g.row, options);
    rows.push_back(std::move(g.row));
  }
  std::sort(rows.begin(), rows.end(), [](const KernelRow& a, const KernelRow& b) {
    return a.total_us != b.total_us ? a.total_us > b.total_us : a.name < b.name;
  });
  if (options.limit > 0 && rows.size() > static_cast<size_t>(options.limit)) {
    rows.resize(options.limit);
  }
  return rows;
}

std::string FormatKernelTable(const std::vector<KernelRow>& rows,
                              const KernelTableOptions& options) {
  const bool rates = std::any_of(rows.begin(), rows.end(), [](const KernelRow& r) {
    return r.bytes_per_s > 0 || r.flops_per_s > 0;
  });
  std::vector<std::string> headers = {"Kernel", "Calls", "Total us", "Avg us", "Grid",
                                      "Block",  "Regs",  "Shared B", "Op"};
  if (rates) headers.insert(headers.end(), {"GB/s", "TFLOP/s"});
  TextTable text(headers, {true, false, false, false, false, false, false, false, true});
  for (const KernelRow& r : rows) {
    const std::string star = r.varied_launch ? "*" : "";
    std::vector<std::string> cells = {
        Truncate(r.name, 70),      absl::StrCat(r.calls),        Fixed(r.total_us),
        Fixed(r.avg_us()),         Dim3(r.grid) + star,          Dim3(r.block) + star,
        absl::StrCat(r.registers), absl::StrCat(r.shared_bytes), r.op.empty() ? "-" : r.op};
    if (rates) {
      cells.push_back(Rate(r.bytes_per_s, 1e9, options.peak_bytes_per_s));
      cells.push_back(Rate(r.flops_per_s, 1e12, options.peak_flops_per_s));
    }
    text.AddRow(std::move(cells));
  }
  std::string out = text.Render();
  if (std::any_of(rows.begin(), rows.end(), [](const KernelRow& r) { return r.varied_launch; })) {
    out += "* launch configuration varies between calls; the first call's is shown\n";
  }
  return out;
}

}  // namespace kiln::profiler
