// NVRTC compilation and the memory + disk kernel cache (see nvrtc.h).
#include "runtime/nvrtc.h"

#include <nvrtc.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "runtime/cuda.h"
#include "runtime/settings.h"
#include "runtime/status.h"

namespace kiln::cuda {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'B', 'I', 'N', '1'};

struct Cache {
  std::mutex mu;
  std::unordered_map<uint64_t, cudaLibrary_t> libraries ABSL_GUARDED_BY(mu);  // by source key
  std::unordered_map<std::string, cudaKernel_t> kernels ABSL_GUARDED_BY(mu);  // key + kernel name
  KernelCacheStats stats ABSL_GUARDED_BY(mu);
};
Cache& TheCache() {
  static auto* c = new Cache();
  return *c;
}

absl::Status NvrtcStatus(nvrtcResult r, const char* call, const std::string& name) {
  if (r == NVRTC_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(call, " failed for kernel source '", name, "': ", nvrtcGetErrorString(r)));
}

std::string ProgramLog(nvrtcProgram prog) {
  size_t size = 0;
  if (nvrtcGetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size <= 1) return "";
  std::string log(size, '\0');
  nvrtcGetProgramLog(prog, log.data());
  log.resize(size - 1);
  return log;
}

std::string NvrtcVersion() {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  return absl::StrCat(major, ".", minor);
}

std::string ArchOfCurrentDevice() {
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  const DeviceProps& p = Props(device);
  return absl::StrCat("sm_", p.major, p.minor);
}

// Disk cache: header (magic, payload length, payload hash) + payload.
std::string CachePath(uint64_t key, const char* extension) {
  const std::string dir = KernelCacheDir();
  return dir.empty() ? "" : absl::StrCat(dir, "/", absl::Hex(key, absl::kZeroPad16), extension);
}

}  // namespace

bool ReadCacheFile(uint64_t key, std::string* payload, const char* extension) {
  const std::string path = CachePath(key, extension);
  if (path.empty()) return false;
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  const size_t header = sizeof(kMagic) + 16;
  if (data.size() < header || data.compare(0, sizeof(kMagic), kMagic, sizeof(kMagic)) != 0) {
    return false;
  }
  uint64_t length = 0, hash = 0;
  std::memcpy(&length, data.data() + 8, 8);
  std::memcpy(&hash, data.data() + 16, 8);
  if (data.size() != header + length) return false;  // truncated or padded
  *payload = data.substr(header);
  return Fnv1a(*payload) == hash;  // corrupt otherwise: the caller rebuilds
}

void WriteCacheFile(uint64_t key, const std::string& payload, const char* extension) {
  const std::string path = CachePath(key, extension);
  if (path.empty()) return;
  // Unique per process and per write (threads of one process may write the same key at once).
  static std::atomic<uint64_t> writes{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", writes.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;  // unwritable directory: the memory cache still works
    const uint64_t length = payload.size(), hash = Fnv1a(payload);
    out.write(kMagic, sizeof(kMagic));
    out.write(reinterpret_cast<const char*>(&length), 8);
    out.write(reinterpret_cast<const char*>(&hash), 8);
    out.write(payload.data(), static_cast<std::streamsize>(payload.size()));
    if (!out) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

namespace {

// The CUBIN of `source`: from the disk cache, or compiled. Runs without the cache lock, so
// distinct kernels compile in parallel threads; `stats` counts what it did.
absl::StatusOr<std::string> CubinFor(const std::string& source, uint64_t key,
                                     const std::string& arch, KernelCacheStats* stats) {
  std::string cubin;
  if (ReadCacheFile(key, &cubin)) {
    ++stats->disk_hits;
    return cubin;
  }
  const auto t0 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(cubin, CompileSource(source, absl::StrCat(absl::Hex(key)), arch, true));
  stats->compile_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ++stats->compiles;
  WriteCacheFile(key, cubin);
  return cubin;
}

absl::StatusOr<cudaKernel_t> KernelOf(cudaLibrary_t lib, const std::string& kernel_name) {
  cudaKernel_t kernel = nullptr;
  KILN_RETURN_IF_ERROR(
      ToStatus(cudaLibraryGetKernel(&kernel, lib, kernel_name.c_str()), "cudaLibraryGetKernel"));
  return kernel;
}

}  // namespace

uint64_t Fnv1a(const std::string& data, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : data) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string KernelCacheDir() {
  static const std::string dir = [] {
    std::string d;
    if (const std::string dir = EnvPath("KILN_CACHE_DIR"); !dir.empty()) {
      d = dir;
    } else if (const char* xdg = std::getenv("XDG_CACHE_HOME")) {
      d = absl::StrCat(xdg, "/kiln");
    } else if (const char* home = std::getenv("HOME")) {
      d = absl::StrCat(home, "/.cache/kiln");
    }
    std::error_code ec;
    if (!d.empty()) std::filesystem::create_directories(d, ec);
    return ec || d.empty() || access(d.c_str(), W_OK) != 0 ? std::string() : d;
  }();
  return dir;
}

absl::StatusOr<std::string> CompileSource(const std::string& source, const std::string& name,
                                          const std::string& arch, bool cubin) {
  nvrtcProgram prog;
  KILN_RETURN_IF_ERROR(NvrtcStatus(
      nvrtcCreateProgram(&prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr),
      "nvrtcCreateProgram", name));
  const std::string arch_opt = "--gpu-architecture=" + arch;
  const char* opts[] = {arch_opt.c_str(), "--std=c++17", "--fmad=true"};
  const nvrtcResult r = nvrtcCompileProgram(prog, 3, opts);
  if (r != NVRTC_SUCCESS) {
    const std::string log = ProgramLog(prog);
    nvrtcDestroyProgram(&prog);
    return absl::InternalError(absl::StrCat("NVRTC failed to compile kernel source '", name,
                                            "' for ", arch, ":\n", log, "\n--- source ---\n",
                                            source));
  }
  size_t size = 0;
  std::string out;
  absl::Status s = cubin ? NvrtcStatus(nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize", name)
                         : NvrtcStatus(nvrtcGetPTXSize(prog, &size), "nvrtcGetPTXSize", name);
  if (s.ok()) {
    out.resize(size);
    s = cubin ? NvrtcStatus(nvrtcGetCUBIN(prog, out.data()), "nvrtcGetCUBIN", name)
              : NvrtcStatus(nvrtcGetPTX(prog, out.data()), "nvrtcGetPTX", name);
  }
  nvrtcDestroyProgram(&prog);
  KILN_RETURN_IF_ERROR(s);
  return out;
}

absl::StatusOr<cudaKernel_t> GetKernel(const std::string& source, const std::string& kernel_name) {
  Cache& cache = TheCache();
  const std::string arch = ArchOfCurrentDevice();
  const uint64_t key =
      Fnv1a(absl::StrCat(source, "|", arch, "|nvrtc ", NvrtcVersion(), "|--std=c++17 --fmad=true"));
  const std::string kernel_key = absl::StrCat(key, ":", kernel_name);
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    if (auto it = cache.kernels.find(kernel_key); it != cache.kernels.end()) {
      ++cache.stats.memory_hits;
      return it->second;
    }
    if (auto lib = cache.libraries.find(key); lib != cache.libraries.end()) {
      KILN_ASSIGN_OR_RETURN(cudaKernel_t kernel, KernelOf(lib->second, kernel_name));
      return cache.kernels.emplace(kernel_key, kernel).first->second;
    }
  }
  // Disk read or NVRTC compile outside the lock (two threads racing on one source both build
  // it; the first to load keeps its library).
  KernelCacheStats done;
  KILN_ASSIGN_OR_RETURN(const std::string cubin, CubinFor(source, key, arch, &done));
  std::lock_guard<std::mutex> lock(cache.mu);
  cache.stats.disk_hits += done.disk_hits;
  cache.stats.compiles += done.compiles;
  cache.stats.compile_ms += done.compile_ms;
  auto lib = cache.libraries.find(key);
  if (lib == cache.libraries.end()) {
    cudaLibrary_t loaded = nullptr;
    KILN_RETURN_IF_ERROR(ToStatus(
        cudaLibraryLoadData(&loaded, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
        "cudaLibraryLoadData"));
    lib = cache.libraries.emplace(key, loaded).first;
  }
  KILN_ASSIGN_OR_RETURN(cudaKernel_t kernel, KernelOf(lib->second, kernel_name));
  return cache.kernels.emplace(kernel_key, kernel).first->second;
}

KernelCacheStats GetKernelCacheStats() {
  Cache& cache = TheCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.stats;
}

std::string KernelFootprint::ToString() const {
  return absl::StrCat(name, ": ", registers, " registers, ", shared_bytes, " B shared, ",
                      local_bytes, " B local, <= ", max_threads, " threads");
}

absl::StatusOr<KernelFootprint> FootprintOf(cudaKernel_t kernel, const std::string& name) {
  cudaFuncAttributes a{};
  if (const cudaError_t e = cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(kernel));
      e != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(
        absl::StrCat("cudaFuncGetAttributes(", name, "): ", cudaGetErrorString(e)));
  }
  return KernelFootprint{name, a.numRegs, static_cast<int>(a.sharedSizeBytes),
                         static_cast<int>(a.localSizeBytes), a.maxThreadsPerBlock};
}

}  // namespace kiln::cuda
