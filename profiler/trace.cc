// Chrome / Perfetto trace export (see report.h). The format is the Trace Event Format's JSON
// object form: "X" complete events with microsecond ts/dur, "M" metadata naming processes and
// threads, and "s"/"f" flow events (Kineto's "ac2g" launch-to-GPU arrows).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "profiler/report.h"
#include "profiler/text_table.h"

namespace kiln::profiler {
namespace {

constexpr int kHostPid = 0;

int DevicePid(const DeviceRecord& r) { return 1 + static_cast<int>(r.device); }

const char* HostCategory(EventKind kind) {
  switch (kind) {
    case EventKind::kOp:
      return "cpu_op";
    case EventKind::kUser:
      return "user_annotation";
    case EventKind::kStep:
      return "step";
    case EventKind::kLaunch:
      return "cuda_runtime";
  }
  return "?";
}

const char* DeviceCategory(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kMemcpy:
      return "gpu_memcpy";
    case DeviceKind::kMemset:
      return "gpu_memset";
    default:
      return "kernel";
  }
}

// Writes events as one JSON array body, relative to `base_ns`.
class TraceWriter {
 public:
  explicit TraceWriter(int64_t base_ns) : base_ns_(base_ns) {}
  std::string Us(int64_t ns) const { return Fixed((ns - base_ns_) / 1e3, 3); }
  void Add(const std::string& event) {
    if (!out_.empty()) out_ += ",\n";
    out_ += event;
  }
  void Meta(const char* what, int pid, int64_t tid, const std::string& name) {
    Add(absl::StrCat(R"({"ph":"M","name":")", what, R"(","pid":)", pid, R"(,"tid":)", tid,
                     R"(,"args":{"name":")", JsonEscape(name), "\"}}"));
  }
  std::string Complete(const std::string& name, const char* cat, int pid, int64_t tid,
                       int64_t start_ns, int64_t end_ns) const {
    return absl::StrCat(R"({"ph":"X","name":")", JsonEscape(name), R"(","cat":")", cat,
                        R"(","pid":)", pid, R"(,"tid":)", tid, R"(,"ts":)", Us(start_ns),
                        R"(,"dur":)", Fixed(std::max<int64_t>(0, end_ns - start_ns) / 1e3, 3));
  }
  const std::string& body() const { return out_; }

 private:
  int64_t base_ns_;
  std::string out_;
};

std::string HostArgs(const HostEvent& e) {
  if (e.kind == EventKind::kStep) return "}";
  std::string args =
      absl::StrCat(R"(,"args":{")", e.kind == EventKind::kLaunch ? "correlation" : "External id",
                   R"(":)", e.correlation_id);
  if (!e.shapes.empty()) absl::StrAppend(&args, R"(,"Input Dims":")", JsonEscape(e.shapes), "\"");
  return args + "}}";
}

std::string DeviceArgs(const DeviceRecord& r) {
  std::string args = absl::StrCat(R"(,"args":{"correlation":)", r.correlation_id,
                                  R"(,"External id":)", r.external_id, R"(,"stream":)", r.stream);
  if (r.kind == DeviceKind::kKernel) {
    absl::StrAppend(&args, R"(,"grid":[)", r.grid[0], ",", r.grid[1], ",", r.grid[2],
                    R"(],"block":[)", r.block[0], ",", r.block[1], ",", r.block[2],
                    R"(],"registers per thread":)", r.registers_per_thread, R"(,"shared memory":)",
                    r.static_shared_bytes + r.dynamic_shared_bytes);
  } else {
    absl::StrAppend(&args, R"(,"bytes":)", r.bytes);
  }
  return args + "}}";
}

int64_t BaseNs(const ProfileResult& result) {
  int64_t base = INT64_MAX;
  for (const HostEvent& e : result.host) base = std::min(base, e.start_ns);
  for (const DeviceRecord& r : result.device) base = std::min(base, r.start_ns);
  return base == INT64_MAX ? 0 : base;
}

void WriteLanes(const ProfileResult& result, TraceWriter& w) {
  w.Meta("process_name", kHostPid, 0, "kiln host");
  std::set<uint32_t> threads;
  for (const HostEvent& e : result.host) threads.insert(e.tid);
  for (uint32_t tid : threads) w.Meta("thread_name", kHostPid, tid, absl::StrCat("thread ", tid));
  std::set<std::pair<int, uint32_t>> streams;
  for (const DeviceRecord& r : result.device) streams.insert({DevicePid(r), r.stream});
  std::set<int> devices;
  for (const auto& [pid, stream] : streams) {
    if (devices.insert(pid).second) w.Meta("process_name", pid, 0, absl::StrCat("GPU ", pid - 1));
    w.Meta("thread_name", pid, stream, absl::StrCat("stream ", stream));
  }
}

// One arrow per launch call: from the call to the first work it started.
void WriteFlows(const ProfileResult& result, TraceWriter& w) {
  std::unordered_map<uint32_t, const DeviceRecord*> work;
  for (const DeviceRecord& r : result.device) work.try_emplace(r.correlation_id, &r);
  for (const HostEvent& e : result.host) {
    if (e.kind != EventKind::kLaunch) continue;
    auto it = work.find(static_cast<uint32_t>(e.correlation_id));
    if (it == work.end()) continue;
    const DeviceRecord& r = *it->second;
    w.Add(absl::StrCat(R"({"ph":"s","id":)", e.correlation_id,
                       R"(,"name":"ac2g","cat":"ac2g","pid":)", kHostPid, R"(,"tid":)", e.tid,
                       R"(,"ts":)", w.Us(e.start_ns), "}"));
    w.Add(absl::StrCat(R"({"ph":"f","bp":"e","id":)", e.correlation_id,
                       R"(,"name":"ac2g","cat":"ac2g","pid":)", DevicePid(r), R"(,"tid":)",
                       r.stream, R"(,"ts":)", w.Us(r.start_ns), "}"));
  }
}

}  // namespace

std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string ChromeTraceJson(const ProfileResult& result) {
  TraceWriter w(BaseNs(result));
  WriteLanes(result, w);
  for (const HostEvent& e : result.host) {
    w.Add(w.Complete(e.name, HostCategory(e.kind), kHostPid, e.tid, e.start_ns, e.end_ns) +
          HostArgs(e));
  }
  for (const DeviceRecord& r : result.device) {
    w.Add(w.Complete(r.name, DeviceCategory(r.kind), DevicePid(r), r.stream, r.start_ns, r.end_ns) +
          DeviceArgs(r));
  }
  WriteFlows(result, w);
  return absl::StrCat(R"({"displayTimeUnit":"ms","otherData":{"device_status":")",
                      JsonEscape(result.device_status), R"(","dropped_records":)",
                      result.dropped_records, R"(,"steps_recorded":)", result.steps_recorded,
                      "},\n\"traceEvents\":[\n", w.body(), "\n]}\n");
}

absl::Status ExportChromeTrace(const ProfileResult& result, const std::string& path) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return absl::InvalidArgumentError(absl::StrCat("cannot open trace file ", path));
  file << ChromeTraceJson(result);
  file.close();
  if (!file) return absl::InternalError(absl::StrCat("failed writing trace file ", path));
  return absl::OkStatus();
}

}  // namespace kiln::profiler
