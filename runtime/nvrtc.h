// Run-time compilation of CUDA C++ with NVRTC, and the kernel cache.
//
// Sources are compiled for the exact architecture of the device (sm_90 on the H200) to CUBIN,
// loaded with the runtime's library API (cudaLibraryLoadData, so kiln never links the driver
// library) and cached twice: in memory per process, and on disk under $KILN_CACHE_DIR (default
// $XDG_CACHE_HOME/kiln or ~/.cache/kiln) keyed by a hash of the source, the options, the
// architecture and the NVRTC version. A cache file carries a header with its length and a
// checksum; a corrupt or truncated one is ignored and rebuilt. Writes go to a temporary file that
// is renamed into place, so processes sharing the directory never see half a file. An unwritable
// cache directory only disables the disk cache. Thread-safe: threads (and processes sharing the
// directory) may compile and load at once; two threads racing on one new source both compile it
// and the first to load keeps its library.
//
//   KILN_ASSIGN_OR_RETURN(cudaKernel_t k, cuda::GetKernel(source, "kiln_add_f32"));
//   cudaLaunchKernel(reinterpret_cast<const void*>(k), grid, block, args, 0, stream);
//
// The header needs no CUDA header (a kernel is CUDA's own handle type, declared by its struct
// name). Without CUDA (runtime/build_config.h) compiling and loading return an error saying so,
// the statistics are zero and the disk cache's files still work (runtime/kernel_cache.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/kernel_cache_stats.h"

struct CUkern_st;  // CUDA's kernel (cudaKernel_t)

namespace kiln::cuda {

using KernelHandle = ::CUkern_st*;  // the same type as cudaKernel_t

// Compiles `source` to PTX (arch like "compute_90") or CUBIN (arch like "sm_90"). Needs no GPU.
// Errors carry `name`, the compiler log and the source.
absl::StatusOr<std::string> CompileSource(const std::string& source, const std::string& name,
                                          const std::string& arch, bool cubin);

// CompileSource for a CUBIN with ptxas's resource report: `log` receives NVRTC's log, whose
// lines say each kernel's registers, shared memory and spill stores/loads ("0 bytes spill
// stores"). For checks that need no GPU (a kernel family's instances must not spill).
absl::StatusOr<std::string> CompileSourceWithReport(const std::string& source,
                                                    const std::string& name,
                                                    const std::string& arch, std::string* log);

// What GetKernel compiles for. `arch_specific`: the architecture-specific target of the current
// device ("sm_90a" on compute capability 9.0), which wgmma and setmaxnreg need; such code runs on
// that exact architecture only, so callers check the device first (cuda::Props).
struct KernelTarget {
  bool arch_specific = false;
};

// The kernel `kernel_name` of `source`, compiled for the current device and loaded (cached).
absl::StatusOr<KernelHandle> GetKernel(const std::string& source, const std::string& kernel_name,
                                       KernelTarget target = {});

// GetKernel for a caller with a fallback: the kernel when the memory or disk cache has it (or a
// background compile of it has finished), loaded; nullptr when it would have to be compiled, in
// which case its compile starts on a background thread (runtime/startup.h RunInBackground; once
// per source) and the caller runs its fallback meanwhile. A GetKernel of the same source waits
// for that compile instead of starting another. A failed background compile's error comes back
// from the next call.
absl::StatusOr<KernelHandle> GetKernelOrCompileInBackground(const std::string& source,
                                                            const std::string& kernel_name,
                                                            KernelTarget target = {});

// A kernel from a prebuilt image (kernel packages, io/kernel_package.h): a CUBIN for the current
// device's architecture or PTX the driver compiles, loaded once per image (by its SHA-256) and
// kept.
absl::StatusOr<KernelHandle> LoadKernelImage(const std::string& image,
                                             const std::string& kernel_name);

// The byte size of each parameter of a loaded kernel, as the driver reports it
// (cuKernelGetParamInfo): what a package's manifest says of its entry point is checked with it.
absl::StatusOr<std::vector<size_t>> KernelParamSizes(KernelHandle kernel);

// Launches `kernel` on the current stream: grid and block as {x, y, z}, `shared_bytes` of dynamic
// shared memory (the kernel's limit raised first when above 48 KiB), `args` one pointer per
// parameter.
absl::Status LaunchKernel(KernelHandle kernel, const unsigned (&grid)[3],
                          const unsigned (&block)[3], int shared_bytes, void** args);

// What one compiled kernel uses of the GPU, read from the loaded kernel (cudaFuncGetAttributes):
// registers per thread, static shared memory, local memory per thread (spills and stack arrays;
// 0 for a kernel that spills nothing), and the largest block it can launch.
struct KernelFootprint {
  std::string name;
  int registers = 0;
  int shared_bytes = 0;
  int local_bytes = 0;
  int max_threads = 0;
  std::string ToString() const;  // "kiln_x: 32 registers, 0 B shared, 0 B local, <= 1024 threads"
};
absl::StatusOr<KernelFootprint> FootprintOf(KernelHandle kernel, const std::string& name);

// Ahead-of-time export (models/export.h). ServedKernelImages: the CUBIN of every kernel GetKernel
// has served in this process (from the disk cache, or compiled again): kiln's kernel users keep
// the handles they got, so what a plan runs is known only as "everything loaded so far".
// AddPrebuiltKernels gives CUBINs for keys: GetKernel takes them before the disk cache and NVRTC,
// so a plan whose kernels are all given never compiles.
struct KernelBinaryImage {
  uint64_t key = 0;
  std::string arch;  // "sm_90", "sm_90a"
  std::string cubin;
};
absl::StatusOr<std::vector<KernelBinaryImage>> ServedKernelImages();
void AddPrebuiltKernels(const std::vector<KernelBinaryImage>& kernels);

KernelCacheStats GetKernelCacheStats();

// The disk cache directory in use ("" when disabled).
std::string KernelCacheDir();

// The disk layer of the cache: WriteCacheFile stores `payload` under `key` (temp file + rename,
// silently skipped when the directory is unwritable); ReadCacheFile returns false for a missing,
// truncated or corrupt file (bad magic, length or checksum). The file is <key><extension>:
// kernels are ".cubin", per-shape decisions (ops/cuda/device_timing.h) ".decision".
bool ReadCacheFile(uint64_t key, std::string* payload, const char* extension = ".cubin");
void WriteCacheFile(uint64_t key, const std::string& payload, const char* extension = ".cubin");

// A 64-bit FNV-1a hash, used for cache keys.
uint64_t Fnv1a(const std::string& data, uint64_t seed = 1469598103934665603ull);

}  // namespace kiln::cuda
