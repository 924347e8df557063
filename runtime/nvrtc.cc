// NVRTC compilation, kernel loading and the memory kernel cache (see nvrtc.h; the disk cache
// is kernel_cache.cc). NVRTC itself is loaded at the first compile (dlopen), not linked: a
// process that only loads prebuilt kernels never maps it.
#include "runtime/nvrtc.h"

#include <cuda.h>
#include <nvrtc.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "runtime/cuda_api.h"
#include "runtime/dynamic_symbols.h"
#include "runtime/settings.h"
#include "runtime/sha256.h"
#include "runtime/startup.h"
#include "runtime/status.h"

namespace kiln::cuda {
namespace {

using CubinResult = absl::StatusOr<std::string>;

struct Cache {
  std::mutex mu;
  // Background compiles by source key, running or done and not yet loaded.
  std::unordered_map<uint64_t, std::shared_future<CubinResult>> background ABSL_GUARDED_BY(mu);
  std::unordered_map<uint64_t, cudaLibrary_t> libraries ABSL_GUARDED_BY(mu);  // by source key
  std::unordered_map<std::string, cudaKernel_t> kernels ABSL_GUARDED_BY(mu);  // key + kernel name
  KernelCacheStats stats ABSL_GUARDED_BY(mu);
};
Cache& TheCache() {
  static auto* c = new Cache();
  return *c;
}

// NVRTC's entry points, resolved from the library at the first compile. `error` says why it
// could not be loaded ("" when it was): compiling then fails with it, loading kernels does not.
struct NvrtcLib {
  decltype(&nvrtcGetErrorString) GetErrorString = nullptr;
  decltype(&nvrtcCreateProgram) CreateProgram = nullptr;
  decltype(&nvrtcCompileProgram) CompileProgram = nullptr;
  decltype(&nvrtcDestroyProgram) DestroyProgram = nullptr;
  decltype(&nvrtcGetProgramLogSize) GetProgramLogSize = nullptr;
  decltype(&nvrtcGetProgramLog) GetProgramLog = nullptr;
  decltype(&nvrtcGetCUBINSize) GetCUBINSize = nullptr;
  decltype(&nvrtcGetCUBIN) GetCUBIN = nullptr;
  decltype(&nvrtcGetPTXSize) GetPTXSize = nullptr;
  decltype(&nvrtcGetPTX) GetPTX = nullptr;
  std::string error;
};

// The library of the toolkit kiln was built with, by its soname (the executable's run path and
// the loader's search path), else by the path the build found it at.
NvrtcLib LoadNvrtc() {
  NvrtcLib lib;
  const std::string soname = absl::StrCat("libnvrtc.so.", CUDA_VERSION / 1000);
  std::string why;
  // KILN_NVRTC_PATH: where the build found NVRTC (CMakeLists.txt defines it).
  void* handle = OpenLibrary(soname, KILN_NVRTC_PATH, &why);
  if (handle == nullptr) {
    lib.error =
        absl::StrCat("NVRTC (", soname, ") could not be loaded: ", why,
                     "; kiln needs it to compile kernels (kernel packages load without it)");
    return lib;
  }
  std::string missing;
  ResolveSymbol(handle, "nvrtcGetErrorString", &lib.GetErrorString, &missing);
  ResolveSymbol(handle, "nvrtcCreateProgram", &lib.CreateProgram, &missing);
  ResolveSymbol(handle, "nvrtcCompileProgram", &lib.CompileProgram, &missing);
  ResolveSymbol(handle, "nvrtcDestroyProgram", &lib.DestroyProgram, &missing);
  ResolveSymbol(handle, "nvrtcGetProgramLogSize", &lib.GetProgramLogSize, &missing);
  ResolveSymbol(handle, "nvrtcGetProgramLog", &lib.GetProgramLog, &missing);
  ResolveSymbol(handle, "nvrtcGetCUBINSize", &lib.GetCUBINSize, &missing);
  ResolveSymbol(handle, "nvrtcGetCUBIN", &lib.GetCUBIN, &missing);
  ResolveSymbol(handle, "nvrtcGetPTXSize", &lib.GetPTXSize, &missing);
  ResolveSymbol(handle, "nvrtcGetPTX", &lib.GetPTX, &missing);
  if (!missing.empty()) {
    lib.error = absl::StrCat("NVRTC (", soname, ") is unusable: it has no ", missing);
  }
  return lib;  // the handle stays open for the process
}

const NvrtcLib& Nvrtc() {
  static const NvrtcLib* lib = new NvrtcLib(LoadNvrtc());
  return *lib;
}

absl::Status NvrtcStatus(nvrtcResult r, const char* call, const std::string& name) {
  if (r == NVRTC_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(call, " failed for kernel source '", name, "': ", Nvrtc().GetErrorString(r)));
}

std::string ProgramLog(nvrtcProgram prog) {
  size_t size = 0;
  if (Nvrtc().GetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size <= 1) return "";
  std::string log(size, '\0');
  Nvrtc().GetProgramLog(prog, log.data());
  log.resize(size - 1);
  return log;
}

std::string ArchOfCurrentDevice(KernelTarget target) {
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  const DeviceProps& p = Props(device);
  return absl::StrCat("sm_", p.major, p.minor, target.arch_specific ? "a" : "");
}

// NVRTC's compile of `source`; with `log`, ptxas reports each kernel's resources into it.
absl::StatusOr<std::string> Compile(const std::string& source, const std::string& name,
                                    const std::string& arch, bool cubin, std::string* log) {
  const NvrtcLib& nvrtc = Nvrtc();
  if (!nvrtc.error.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("compiling kernel source '", name, "': ", nvrtc.error));
  }
  nvrtcProgram prog;
  KILN_RETURN_IF_ERROR(NvrtcStatus(
      nvrtc.CreateProgram(&prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr),
      "nvrtcCreateProgram", name));
  const std::string arch_opt = "--gpu-architecture=" + arch;
  const char* opts[] = {arch_opt.c_str(), "--std=c++17", "--fmad=true", "--ptxas-options=-v"};
  const nvrtcResult r = nvrtc.CompileProgram(prog, log != nullptr ? 4 : 3, opts);
  if (log != nullptr) *log = ProgramLog(prog);
  if (r != NVRTC_SUCCESS) {
    const std::string errors = ProgramLog(prog);
    nvrtc.DestroyProgram(&prog);
    return absl::InternalError(absl::StrCat("NVRTC failed to compile kernel source '", name,
                                            "' for ", arch, ":\n", errors, "\n--- source ---\n",
                                            source));
  }
  size_t size = 0;
  std::string out;
  absl::Status s = cubin ? NvrtcStatus(nvrtc.GetCUBINSize(prog, &size), "nvrtcGetCUBINSize", name)
                         : NvrtcStatus(nvrtc.GetPTXSize(prog, &size), "nvrtcGetPTXSize", name);
  if (s.ok()) {
    out.resize(size);
    s = cubin ? NvrtcStatus(nvrtc.GetCUBIN(prog, out.data()), "nvrtcGetCUBIN", name)
              : NvrtcStatus(nvrtc.GetPTX(prog, out.data()), "nvrtcGetPTX", name);
  }
  nvrtc.DestroyProgram(&prog);
  KILN_RETURN_IF_ERROR(s);
  return out;
}

// Ahead of time (models/export.h): every source GetKernel has served (key -> source, arch), and
// CUBINs given for keys (an exported plan's kernels), taken before the disk cache and NVRTC.
struct Aot {
  std::mutex mu;
  std::map<uint64_t, std::pair<std::string, std::string>> served ABSL_GUARDED_BY(mu);
  std::unordered_map<uint64_t, std::string> prebuilt ABSL_GUARDED_BY(mu);
};
Aot& TheAot() {
  static auto* aot = new Aot();
  return *aot;
}

void NoteKernelUse(uint64_t key, const std::string& source, const std::string& arch) {
  Aot& aot = TheAot();
  std::lock_guard<std::mutex> lock(aot.mu);
  aot.served.try_emplace(key, source, arch);
}

bool Prebuilt(uint64_t key, std::string* cubin) {
  Aot& aot = TheAot();
  std::lock_guard<std::mutex> lock(aot.mu);
  auto it = aot.prebuilt.find(key);
  if (it == aot.prebuilt.end()) return false;
  *cubin = it->second;
  return true;
}

// The CUBIN of `source`: from the disk cache, or compiled. Runs without the cache lock, so
// distinct kernels compile in parallel threads; `stats` counts what it did.
absl::StatusOr<std::string> CubinFor(const std::string& source, uint64_t key,
                                     const std::string& arch, KernelCacheStats* stats) {
  std::string cubin;
  if (Prebuilt(key, &cubin) || ReadCacheFile(key, &cubin)) {
    ++stats->disk_hits;
    return cubin;
  }
  const auto t0 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(cubin, Compile(source, absl::StrCat(absl::Hex(key)), arch, true, nullptr));
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

absl::StatusOr<std::string> CompileSource(const std::string& source, const std::string& name,
                                          const std::string& arch, bool cubin) {
  return Compile(source, name, arch, cubin, nullptr);
}

absl::StatusOr<std::string> CompileSourceWithReport(const std::string& source,
                                                    const std::string& name,
                                                    const std::string& arch, std::string* log) {
  return Compile(source, name, arch, /*cubin=*/true, log);
}

namespace {

// The cache key of `source` compiled for `arch` by the NVRTC of the toolkit kiln was built with
// (its version as the toolkit's, so that a cached kernel loads without loading NVRTC).
uint64_t SourceKey(const std::string& source, const std::string& arch) {
  return Fnv1a(absl::StrCat(source, "|", arch, "|nvrtc ", CUDA_VERSION / 1000, ".",
                            CUDA_VERSION % 1000 / 10, "|--std=c++17 --fmad=true"));
}

// The library of `key`: the loaded one, or `cubin` loaded now.
absl::StatusOr<cudaLibrary_t> LibraryFor(Cache& cache, uint64_t key, const std::string& cubin)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache.mu) {
  if (auto lib = cache.libraries.find(key); lib != cache.libraries.end()) return lib->second;
  cudaLibrary_t loaded = nullptr;
  KILN_RETURN_IF_ERROR(
      ToStatus(cudaLibraryLoadData(&loaded, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
               "cudaLibraryLoadData"));
  return cache.libraries.emplace(key, loaded).first->second;
}

// Kernel `kernel_name` of library `lib` (the source of `key`), remembered by name.
absl::StatusOr<cudaKernel_t> KernelIn(Cache& cache, uint64_t key, cudaLibrary_t lib,
                                      const std::string& kernel_name)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache.mu) {
  KILN_ASSIGN_OR_RETURN(cudaKernel_t kernel, KernelOf(lib, kernel_name));
  return cache.kernels.emplace(absl::StrCat(key, ":", kernel_name), kernel).first->second;
}

// Loads `cubin` (or takes the library another thread loaded first) and returns its kernel.
absl::StatusOr<cudaKernel_t> Load(Cache& cache, uint64_t key, const std::string& kernel_name,
                                  const std::string& cubin)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache.mu) {
  KILN_ASSIGN_OR_RETURN(cudaLibrary_t lib, LibraryFor(cache, key, cubin));
  return KernelIn(cache, key, lib, kernel_name);
}

// The kernel from the memory cache (a loaded library, or a cubin a background compile left);
// nullptr when neither has it. `pending`: set to the running background compile of the source.
absl::StatusOr<cudaKernel_t> FromMemory(Cache& cache, uint64_t key, const std::string& kernel_name,
                                        std::shared_future<CubinResult>* pending)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache.mu) {
  if (auto it = cache.kernels.find(absl::StrCat(key, ":", kernel_name));
      it != cache.kernels.end()) {
    ++cache.stats.memory_hits;
    return it->second;
  }
  if (auto lib = cache.libraries.find(key); lib != cache.libraries.end()) {
    return KernelIn(cache, key, lib->second, kernel_name);
  }
  auto bg = cache.background.find(key);
  if (bg == cache.background.end()) return nullptr;
  if (bg->second.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    *pending = bg->second;
    return nullptr;
  }
  const CubinResult& cubin = bg->second.get();
  KILN_RETURN_IF_ERROR(cubin.status());  // the entry stays: every later call reports it
  absl::StatusOr<cudaKernel_t> kernel = Load(cache, key, kernel_name, *cubin);
  if (kernel.ok()) cache.background.erase(bg);  // the library holds the code now
  return kernel;
}

void AddStats(Cache& cache, const KernelCacheStats& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache.mu) {
  cache.stats.disk_hits += done.disk_hits;
  cache.stats.compiles += done.compiles;
  cache.stats.compile_ms += done.compile_ms;
}

}  // namespace

absl::StatusOr<cudaKernel_t> GetKernel(const std::string& source, const std::string& kernel_name,
                                       KernelTarget target) {
  Cache& cache = TheCache();
  const std::string arch = ArchOfCurrentDevice(target);
  const uint64_t key = SourceKey(source, arch);
  std::shared_future<CubinResult> pending;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    KILN_ASSIGN_OR_RETURN(cudaKernel_t kernel, FromMemory(cache, key, kernel_name, &pending));
    if (kernel != nullptr) return kernel;
  }
  NoteKernelUse(key, source, arch);  // a kernel in memory was noted when it was first loaded
  if (pending.valid()) {  // a background compile of this source runs: wait for it, not twice
    pending.wait();
    std::lock_guard<std::mutex> lock(cache.mu);
    std::shared_future<CubinResult> unused;
    return FromMemory(cache, key, kernel_name, &unused);
  }
  // Disk read or NVRTC compile outside the lock (two threads racing on one source both build
  // it; the first to load keeps its library).
  KernelCacheStats done;
  KILN_ASSIGN_OR_RETURN(const std::string cubin, CubinFor(source, key, arch, &done));
  std::lock_guard<std::mutex> lock(cache.mu);
  AddStats(cache, done);
  return Load(cache, key, kernel_name, cubin);
}

absl::StatusOr<cudaKernel_t> LoadKernelImage(const std::string& image,
                                             const std::string& kernel_name) {
  Cache& cache = TheCache();
  // Keyed by SHA-256 (its first 64 bits), not FNV-1a: a package's image must not be able to
  // collide with another's and get that one's code.
  const uint64_t key = std::stoull(Sha256Hex(image).substr(0, 16), nullptr, 16);
  std::lock_guard<std::mutex> lock(cache.mu);
  return Load(cache, key, kernel_name, image);  // the library loaded once, kept by its key
}

absl::StatusOr<std::vector<size_t>> KernelParamSizes(cudaKernel_t kernel) {
  using GetParamInfo = CUresult (*)(CUkernel, size_t, size_t*, size_t*);
  static const GetParamInfo get = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuKernelGetParamInfo", &fn, 12040,
                                                           cudaEnableDefault, &found);
    return e == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<GetParamInfo>(fn)
               : nullptr;
  }();
  if (get == nullptr) {
    return absl::UnavailableError("the driver has no cuKernelGetParamInfo (CUDA 12.4 or later)");
  }
  // The driver resolves the kernel in the current context: make the device's primary one current
  // (the runtime does so lazily, at its first call that needs it).
  int device = 0;
  KILN_RETURN_IF_ERROR(ToStatus(cudaGetDevice(&device), "cudaGetDevice"));
  KILN_RETURN_IF_ERROR(ToStatus(cudaSetDevice(device), "cudaSetDevice"));
  std::vector<size_t> sizes;
  for (size_t i = 0;; ++i) {
    size_t offset = 0, size = 0;
    const CUresult r = get(reinterpret_cast<CUkernel>(kernel), i, &offset, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
    if (r != CUDA_SUCCESS) {
      return absl::InternalError(absl::StrCat("cuKernelGetParamInfo failed (CUresult ", r, ")"));
    }
    sizes.push_back(size);
  }
  return sizes;
}

absl::Status LaunchKernel(cudaKernel_t kernel, const unsigned (&grid)[3],
                          const unsigned (&block)[3], int shared_bytes, void** args) {
  const void* fn = reinterpret_cast<const void*>(kernel);
  if (shared_bytes > 48 * 1024) {
    KILN_RETURN_IF_ERROR(ToStatus(
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes),
        "cudaFuncSetAttribute"));
  }
  return ToStatus(
      cudaLaunchKernel(fn, dim3(grid[0], grid[1], grid[2]), dim3(block[0], block[1], block[2]),
                       args, static_cast<size_t>(shared_bytes), CurrentStream()),
      "cudaLaunchKernel");
}

absl::StatusOr<cudaKernel_t> GetKernelOrCompileInBackground(const std::string& source,
                                                            const std::string& kernel_name,
                                                            KernelTarget target) {
  Cache& cache = TheCache();
  const std::string arch = ArchOfCurrentDevice(target);
  const uint64_t key = SourceKey(source, arch);
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    std::shared_future<CubinResult> pending;
    KILN_ASSIGN_OR_RETURN(cudaKernel_t kernel, FromMemory(cache, key, kernel_name, &pending));
    if (kernel != nullptr || pending.valid()) return kernel;
  }
  NoteKernelUse(key, source, arch);
  std::string cubin;
  if (Prebuilt(key, &cubin) || ReadCacheFile(key, &cubin)) {
    std::lock_guard<std::mutex> lock(cache.mu);
    ++cache.stats.disk_hits;
    return Load(cache, key, kernel_name, cubin);
  }
  auto promise = std::make_shared<std::promise<CubinResult>>();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    if (cache.background.count(key) != 0 || cache.libraries.count(key) != 0) return nullptr;
    cache.background.emplace(key, promise->get_future().share());
    ++cache.stats.background_compiles;
  }
  RunInBackground([promise, source, key, arch] {
    KernelCacheStats done;
    CubinResult cubin = [&]() -> CubinResult {
      try {
        return CubinFor(source, key, arch, &done);
      } catch (const std::exception& e) {  // the waiters get an error, never a broken promise
        return absl::InternalError(absl::StrCat("background compile: ", e.what()));
      }
    }();
    {
      Cache& cache = TheCache();
      std::lock_guard<std::mutex> lock(cache.mu);
      cache.stats.background_ms += done.compile_ms;
    }
    promise->set_value(std::move(cubin));
  });
  return nullptr;
}

KernelCacheStats GetKernelCacheStats() {
  Cache& cache = TheCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.stats;
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

absl::StatusOr<std::vector<KernelBinaryImage>> ServedKernelImages() {
  std::map<uint64_t, std::pair<std::string, std::string>> served;
  {
    Aot& aot = TheAot();
    std::lock_guard<std::mutex> lock(aot.mu);
    served = aot.served;
  }
  std::vector<KernelBinaryImage> images;
  for (const auto& [key, what] : served) {
    KernelCacheStats unused;
    KILN_ASSIGN_OR_RETURN(std::string cubin, CubinFor(what.first, key, what.second, &unused));
    images.push_back({key, what.second, std::move(cubin)});
  }
  return images;
}

void AddPrebuiltKernels(const std::vector<KernelBinaryImage>& kernels) {
  Aot& aot = TheAot();
  std::lock_guard<std::mutex> lock(aot.mu);
  for (const KernelBinaryImage& k : kernels) aot.prebuilt.emplace(k.key, k.cubin);
}

}  // namespace kiln::cuda
