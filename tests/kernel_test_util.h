// Helpers of the tests about generated kernels: what ptxas said about a kernel's spills (no GPU
// needed), and which kernels a piece of device work launched (CUPTI, through the profiler).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "profiler/profiler.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"

namespace kiln {

// ptxas's "N bytes spill stores, M bytes spill loads" in a compile log
// (cuda::CompileSourceWithReport), as N + M; -1 when the log has no such line.
inline int SpillBytes(const std::string& log) {
  const std::regex spill(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  std::smatch m;
  if (!std::regex_search(log, m, spill)) return -1;
  return std::stoi(m[1]) + std::stoi(m[2]);
}

// cuda::CompileSourceWithReport for a resource check: the source gets a global variable of a name
// no other compile used (process, counter, time), so that no compile cache on the way can serve
// it without ptxas's report. (On the GPU machine a second compile of the same source in a later
// process came back in milliseconds with an empty log.)
inline absl::StatusOr<std::string> CompileForReport(const std::string& source,
                                                    const std::string& name,
                                                    const std::string& arch, std::string* log) {
  static std::atomic<int> count{0};
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  const std::string nonce = absl::StrCat("\nextern \"C\" __device__ int kiln_report_", getpid(),
                                         "_", count++, "_", now, " = 1;\n");
  return cuda::CompileSourceWithReport(source + nonce, name, arch, log);
}

// Kernel names of the device work `run` launches, recorded by the profiler (CUPTI).
inline std::vector<std::string> KernelNames(const std::function<void()>& run) {
  profiler::ProfilerOptions o;
  o.active = 1;
  profiler::Profiler p(std::move(o));
  p.Start();
  run();
  cuda::Synchronize();
  p.Step();
  const profiler::ProfileResult r = p.Stop();
  EXPECT_TRUE(r.device_available) << r.device_status;
  std::vector<std::string> names;
  for (const profiler::DeviceRecord& d : r.device) {
    if (d.kind == profiler::DeviceKind::kKernel) names.push_back(d.name);
  }
  return names;
}

}  // namespace kiln
