// Reports over a ProfileResult: the op table, the kernel table, a Chrome/Perfetto trace and the
// eager-vs-compiled comparison.
//
//   OpTable t = BuildOpTable(result);
//   std::cout << FormatOpTable(t, {.sort = SortKey::kTotalDevice, .limit = 15});
//   std::cout << FormatKernelTable(BuildKernelTable(result));
//   KILN_RETURN_IF_ERROR(ExportChromeTrace(result, "trace.json"));  // open in ui.perfetto.dev
//
//   ModeSummary eager = Summarize("eager", eager_result, steps, eager_peak_bytes);
//   ModeSummary comp = Summarize("compiled", compiled_result, steps, compiled_peak_bytes);
//   std::cout << CompareReport(eager, {comp}, details);
//
// Host times come from op and user ranges; device times from kernels, copies and memsets,
// attributed to the innermost range open when their launch call ran (external correlation).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "profiler/profiler.h"
#include "runtime/kernel_cache_stats.h"

namespace kiln::profiler {

// ---- Op table (torch.profiler's key_averages().table()) ----

struct OpRow {
  std::string name;
  EventKind kind = EventKind::kOp;  // kOp or kUser
  int64_t calls = 0;
  double self_host_us = 0, total_host_us = 0;      // self: minus nested op/user ranges
  double self_device_us = 0, total_device_us = 0;  // self: work launched by this range itself
  double device_avg_us() const { return calls ? total_device_us / calls : 0; }
  double host_avg_us() const { return calls ? total_host_us / calls : 0; }
};

struct OpTable {
  std::vector<OpRow> rows;            // one per (name, kind), by first appearance
  double self_host_total_us = 0;      // sum of self_host_us over all rows
  double self_device_total_us = 0;    // sum of self_device_us over all rows
  double unattributed_device_us = 0;  // device work launched outside every range
  std::string device_status;
};

OpTable BuildOpTable(const ProfileResult& result);

enum class SortKey {
  kName,
  kCalls,
  kSelfHost,
  kTotalHost,
  kSelfDevice,
  kTotalDevice,
  kDeviceAvg,
};
// Accepts the enum's names ("self_host", "total_device", ...) and torch's sort_by keys
// ("self_cpu_time_total", "cpu_time_total", "self_cuda_time_total", "cuda_time_total",
// "cuda_time_avg", "count"). Returns false for anything else.
bool ParseSortKey(const std::string& text, SortKey* key);

// Names ascend; numbers descend (ties by name).
void SortRows(std::vector<OpRow>& rows, SortKey key);

struct OpTableOptions {
  SortKey sort = SortKey::kTotalHost;
  int limit = 0;  // rows shown; 0 = all (the footers always sum every row)
};
std::string FormatOpTable(const OpTable& table, const OpTableOptions& options = {});

// ---- Kernel table ----

// Work of one call of an op or kernel, for achieved throughput.
struct Work {
  double bytes = 0, flops = 0;
};

struct KernelRow {
  std::string name, op;  // op: the range that launched it most often ("" if none)
  int64_t calls = 0;
  double total_us = 0;
  double avg_us() const { return calls ? total_us / calls : 0; }
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};  // of the first call
  int32_t registers = 0, shared_bytes = 0;            // static + dynamic
  bool varied_launch = false;                         // calls differ in grid/block
  double bytes_per_s = 0, flops_per_s = 0;            // 0 when unknown
};

struct KernelTableOptions {
  // Work per call keyed by kernel name, else by the launching op's name (then each of the op's
  // calls is assumed to launch the kernel once).
  std::map<std::string, Work> work;
  double peak_bytes_per_s = 0, peak_flops_per_s = 0;  // ceilings measured on the device
  int limit = 0;
};

// Kernel rows by total device time, descending; copies and memsets get rows too.
std::vector<KernelRow> BuildKernelTable(const ProfileResult& result,
                                        const KernelTableOptions& options = {});
std::string FormatKernelTable(const std::vector<KernelRow>& rows,
                              const KernelTableOptions& options = {});

// ---- Chrome / Perfetto trace ----

// The trace as JSON text: pid 0 holds one host lane per thread (steps, user ranges, ops, launch
// calls as "X" events), pid 1+device one lane per stream (kernels, copies, memsets), and an
// "s"/"f" flow pair (cat "ac2g", id = CUPTI correlation id) from each launch to its work.
std::string ChromeTraceJson(const ProfileResult& result);
absl::Status ExportChromeTrace(const ProfileResult& result, const std::string& path);
// Escapes `s` for a JSON string literal (no quotes added).
std::string JsonEscape(const std::string& s);

// ---- Eager vs compiled ----

struct ModeSummary {
  std::string name;
  double host_us_per_step = 0;  // time inside outermost op/user ranges
  double kernels_per_step = 0;
  double device_busy_us_per_step = 0;  // union of kernel/copy/memset intervals
  double idle_share = 0;               // 1 - busy / wall (0 without device activity)
  size_t peak_bytes = 0;               // caller's: cuda::GetMemoryStats().peak_allocated
  double wall_us_per_step = 0;         // recorded step length (or the span of the ranges)
  bool has_device = false;
  std::string device_status;  // the profiler's: why device activity is missing, when it is
};

// `steps` 0 = result.steps_recorded.
ModeSummary Summarize(const std::string& name, const ProfileResult& result, int steps = 0,
                      size_t peak_bytes = 0);

struct FusedKernelInfo {
  std::string kernel;                                // the fused kernel's name
  std::vector<std::string> eager_ops;                // the eager ops it replaced
  int launches_saved = 0;                            // per step
  double device_us_before = 0, device_us_after = 0;  // per step
  size_t intermediate_bytes_saved = 0;  // per step, no longer written to and read from memory
};

struct CompileCost {
  double nvrtc_ms = 0;
  int kernels = 0;
  cuda::KernelCacheStats cache;  // cuda::GetKernelCacheStats()
};

struct CompareDetails {
  std::vector<FusedKernelInfo> fused;
  bool has_compile_cost = false;
  CompileCost compile;
};

// Device time per step of the work launched by ranges named `names` (for FusedKernelInfo).
double DeviceUsPerStepOfOps(const ProfileResult& result, const std::vector<std::string>& names,
                            int steps = 0);
// Device time per step of kernels whose name contains `fragment`.
double DeviceUsPerStepOfKernels(const ProfileResult& result, const std::string& fragment,
                                int steps = 0);

// A table with one row per mode and its speedup over `eager` (wall and host), then the fused
// kernels and the compile cost when `details` has them.
std::string CompareReport(const ModeSummary& eager, const std::vector<ModeSummary>& others,
                          const CompareDetails& details = {});

}  // namespace kiln::profiler
