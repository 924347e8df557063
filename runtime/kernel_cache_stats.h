// Counters of the NVRTC kernel cache (runtime/nvrtc.h: cuda::GetKernelCacheStats()), in a header
// of their own so that reports (profiler/report.h) carry them without CUDA's headers.
#pragma once

#include <cstdint>

namespace kiln::cuda {

struct KernelCacheStats {
  int64_t memory_hits = 0, disk_hits = 0, compiles = 0;
  double compile_ms = 0;
  // Compiles started on a background thread (GetKernelOrCompileInBackground) and the time they
  // took, off the caller's path (not in compiles / compile_ms).
  int64_t background_compiles = 0;
  double background_ms = 0;
};

}  // namespace kiln::cuda
