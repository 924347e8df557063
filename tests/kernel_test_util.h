// Helpers of the tests about generated kernels: what ptxas said about a kernel's spills (no GPU
// needed), and which kernels a piece of device work launched (CUPTI, through the profiler).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "profiler/profiler.h"
#include "runtime/cuda.h"

namespace kiln {

// ptxas's "N bytes spill stores, M bytes spill loads" in a compile log
// (cuda::CompileSourceWithReport), as N + M; -1 when the log has no such line.
inline int SpillBytes(const std::string& log) {
  const std::regex spill(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  std::smatch m;
  if (!std::regex_search(log, m, spill)) return -1;
  return std::stoi(m[1]) + std::stoi(m[2]);
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
