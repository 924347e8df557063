// CUDA runtime layer (see cuda.h): discovery, streams, checks, the stream-ordered caching
// allocator (cudaMallocAsync on the device's pool with an unlimited release threshold, so freed
// blocks stay cached and no cudaMalloc/cudaFree happens on the per-op path; freed blocks are also
// kept on the host per stream and size, so eager ops allocate with no CUDA call) and copies.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "runtime/capture_arena.h"
#include "runtime/cuda_api.h"
#include "runtime/settings.h"
#include "runtime/startup.h"
#include "runtime/status.h"
#include "runtime/storage.h"

namespace kiln::cuda {
namespace {

thread_local cudaStream_t g_stream = nullptr;

std::string Bytes(size_t n) {
  if (n >= (size_t{1} << 30)) return absl::StrCat(n / double(1 << 30), " GiB");
  if (n >= (size_t{1} << 20)) return absl::StrCat(n / double(1 << 20), " MiB");
  return absl::StrCat(n, " bytes");
}

// Freed blocks are cached on the host per (stream, size): the next allocation of that size on that
// stream takes one without a CUDA call (cudaMallocAsync + cudaFreeAsync cost about 0.8 µs a pair
// on the H200's VM, a sixth of a small eager op's host time, and eager attention allocates four
// 256 MiB blocks a call). Small blocks (at most kSmallBlock) are rounded up to 512 bytes and
// cached up to kMaxCached bytes in all; large ones are rounded up to 2 MiB (the pool's own
// granularity, so rounding costs no memory) and cached up to LargeCacheLimit(). A large block that
// does not fit first sends the cached blocks of other sizes back to the pool (the sizes a
// workload stopped using), then goes back itself if it still does not fit. The pool behind the
// cache is the driver's stream-ordered allocator; when it runs out, the cache is emptied and the
// allocation retried (Malloc).
constexpr size_t kSmallBlock = size_t{1} << 20;
constexpr size_t kMaxCached = size_t{64} << 20;
constexpr size_t kLargeRound = size_t{2} << 20;

size_t BlockBytes(size_t nbytes) {
  return nbytes <= kSmallBlock ? (nbytes + 511) / 512 * 512
                               : (nbytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

// An eighth of the device's memory, at most 4 GiB.
size_t LargeCacheLimit(int device) {
  return std::min(Props(device).total_memory / 8, size_t{4} << 30);
}

// cudaMallocAsync from the device's pool on the allocating thread's current stream. A block is
// freed on the stream it was allocated on (torch's rule), whichever thread drops it: the pool (or
// the host cache, which only hands a block to later work on that same stream) reuses it in that
// stream's order, after every kernel queued there has read it. A block handed to another
// stream's work without synchronisation is the caller's to order, as in torch. While the stream
// is being captured into a CUDA graph, allocations and frees go to the driver (graph memory
// nodes) and never touch the host cache.
class CachingAllocator final : public Allocator {
 public:
  void* Allocate(size_t nbytes, Device device) override {
    if (nbytes == 0) return nullptr;
    CheckDevice(device);
    EnsurePool(device.index);
    StartStartupTasks(device.index);  // library start-up in the background (startup.h)
    const cudaStream_t stream = CurrentStream();
    const bool capturing = Capturing(stream);
    if (capturing) {  // the eager path never reads the arena's thread-local
      const std::shared_ptr<CaptureArena>& arena = CurrentCaptureArena();
      if (arena != nullptr && arena->device() == device) {
        return AllocateInArena(arena, nbytes, stream);
      }
    }
    const size_t bytes = capturing ? nbytes : BlockBytes(nbytes);
    void* p = capturing ? nullptr : TakeCached(stream, bytes);
    if (p == nullptr) {
      p = Malloc(bytes, nbytes, stream, device);
      std::lock_guard<std::mutex> lock(mu_);
      live_[p] = {bytes, stream, capturing};
    }
    Count(nbytes);
    return p;
  }

  void Adopted(void* ptr, size_t nbytes, Device) override {
    Count(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    live_[ptr] = {nbytes, CurrentStream(), /*graph=*/true};  // a CUDA graph's output
  }
  void Released(void* ptr, size_t nbytes, Device) override {
    allocated_.fetch_sub(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(ptr);
  }

  void Free(void* ptr, size_t nbytes, Device) override {
    if (ptr == nullptr) return;
    allocated_.fetch_sub(nbytes);
    Block block{nbytes, CurrentStream(), /*graph=*/true};  // unknown blocks go to the driver
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = live_.find(ptr); it != live_.end()) {
        block = std::move(it->second);
        live_.erase(it);
      }
      if (!block.graph && !Capturing(block.stream) && MakeRoomLocked(block.bytes)) {
        free_[{block.stream, block.bytes}].push_back(ptr);
        CachedLocked(block.bytes) += block.bytes;
        return;
      }
    }
    if (block.arena != nullptr) {  // its range goes back to the arena's books
      const bool inside = block.arena->Contains(ptr);
      block.arena->Free(ptr);
      if (inside) return;
    }
    cudaFreeAsync(ptr, block.stream);  // errors at exit (driver shutting down) are ignored
  }

  // `stream` is about to be destroyed: waits for its work, returns its cached blocks to the
  // pool, and frees its live blocks on the legacy default stream from now on.
  void ForgetStream(cudaStream_t stream) {
    cudaStreamSynchronize(stream);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [ptr, block] : live_) {
      if (block.stream == stream) block.stream = nullptr;
    }
    for (auto it = free_.begin(); it != free_.end();) {
      if (it->first.first == stream) {
        ReleaseLocked(it->first, it->second);
        free_.erase(it++);
      } else {
        ++it;
      }
    }
  }

  // Every cached block back to the pool (torch.cuda.empty_cache()).
  void EmptyCache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, blocks] : free_) ReleaseLocked(key, blocks);
    free_.clear();
  }

  size_t allocated() const { return allocated_.load(); }
  size_t peak() const { return peak_.load(); }
  size_t cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_small_ + cached_large_;
  }
  void ResetPeak() { peak_.store(allocated_.load()); }

 private:
  struct Block {
    size_t bytes;
    cudaStream_t stream;
    bool graph;  // allocated while its stream was captured (graph memory), or adopted from a graph
    std::shared_ptr<CaptureArena> arena = nullptr;  // allocated under a ScopedCaptureArena
  };

  // A capture's allocation from its arena (capture_arena.h), or from the driver (a graph memory
  // node) booked in the arena when it does not fit there. (Allocations on another device than
  // the arena's take the driver's path.)
  void* AllocateInArena(const std::shared_ptr<CaptureArena>& arena, size_t nbytes,
                        cudaStream_t stream) {
    void* p = arena->Allocate(nbytes);
    if (p == nullptr) {
      p = Malloc(nbytes, nbytes, stream, arena->device());
      arena->Booked(p, nbytes);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_[p] = {nbytes, stream, /*graph=*/true, arena};
    }
    Count(nbytes);
    return p;
  }
  using FreeKey = std::pair<cudaStream_t, size_t>;

  // A cached block of `bytes` for `stream`, registered live; nullptr when there is none.
  void* TakeCached(cudaStream_t stream, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(FreeKey{stream, bytes});
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    CachedLocked(bytes) -= bytes;
    live_[p] = {bytes, stream, /*graph=*/false};
    return p;
  }

  // The cached-bytes count of blocks of `bytes` (small or large).
  size_t& CachedLocked(size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return bytes <= kSmallBlock ? cached_small_ : cached_large_;
  }

  // Whether a freed block of `bytes` may join the cache, after sending the cached large blocks of
  // other sizes back to the pool when a large one would not fit.
  bool MakeRoomLocked(size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (bytes <= kSmallBlock) return cached_small_ + bytes <= kMaxCached;
    if (cached_large_ + bytes <= large_limit_) return true;
    for (auto it = free_.begin(); it != free_.end();) {
      if (it->first.second > kSmallBlock && it->first.second != bytes) {
        ReleaseLocked(it->first, it->second);
        free_.erase(it++);
      } else {
        ++it;
      }
    }
    return cached_large_ + bytes <= large_limit_;
  }

  void ReleaseLocked(const FreeKey& key, std::vector<void*>& blocks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (void* p : blocks) cudaFreeAsync(p, key.first);
    CachedLocked(key.second) -= key.second * blocks.size();
    blocks.clear();
  }

  // A new block from the pool; when the device is full, the cache is emptied and the device
  // synchronised (so the pool can reuse what was freed on other streams), then tried once more.
  void* Malloc(size_t bytes, size_t nbytes, cudaStream_t stream, Device device) {
    void* p = nullptr;
    cudaError_t err = cudaMallocAsync(&p, bytes, stream);
    if (err == cudaErrorMemoryAllocation && cached() > 0 && !Capturing(stream)) {
      cudaGetLastError();
      EmptyCache();
      cudaDeviceSynchronize();
      err = cudaMallocAsync(&p, bytes, stream);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky-free error state
      const MemoryStats s = GetMemoryStats();
      throw Error(absl::ResourceExhaustedError(absl::StrCat(
          "CUDA out of memory: tried to allocate ", Bytes(nbytes), " on ", device.str(),
          "; kiln tensors hold ", Bytes(s.allocated), ", the pool reserves ", Bytes(s.reserved),
          ", the device has ", Bytes(Props(device.index).total_memory), " in total")));
    }
    Check(err, "cudaMallocAsync", __FILE__, __LINE__);
    return p;
  }

  void Count(size_t nbytes) {
    const size_t now = allocated_.fetch_add(nbytes) + nbytes;
    size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }

  // Memory comes from the current device's pool on its current stream: a tensor must not claim
  // another device than the one it really lives on.
  static void CheckDevice(Device device) {
    KILN_CHECK(device.index >= 0 && device.index < DeviceCount(), "cuda: no device ", device.str(),
               " (", DeviceCount(), " present)");
    int current = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&current));
    KILN_CHECK(device.index == current, "cuda: cannot allocate on ", device.str(),
               " while cuda:", current, " is the current device (cudaSetDevice first)");
  }

  void EnsurePool(int device) {
    std::call_once(pool_once_, [this, device] {
      cudaMemPool_t pool;
      KILN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
      uint64_t threshold = UINT64_MAX;  // keep freed memory cached in the pool
      KILN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
      std::lock_guard<std::mutex> lock(mu_);
      large_limit_ = LargeCacheLimit(device);
    });
  }

  std::once_flag pool_once_;
  std::atomic<size_t> allocated_{0}, peak_{0};
  std::mutex mu_;
  absl::flat_hash_map<void*, Block> live_ ABSL_GUARDED_BY(mu_);  // live block -> size, stream
  absl::flat_hash_map<FreeKey, std::vector<void*>> free_ ABSL_GUARDED_BY(mu_);  // the host cache
  // Bytes in free_ (small, large blocks).
  size_t cached_small_ ABSL_GUARDED_BY(mu_) = 0;
  size_t cached_large_ ABSL_GUARDED_BY(mu_) = 0;
  size_t large_limit_ ABSL_GUARDED_BY(mu_) = 0;  // LargeCacheLimit of the pool's device
};

CachingAllocator& TheAllocator() {
  static auto* a = new CachingAllocator();  // never destroyed: tensors may outlive statics
  return *a;
}

}  // namespace

int DeviceCount() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

bool IsAvailable() { return DeviceCount() > 0; }

const DeviceProps& Props(int device) {
  static std::once_flag once;
  static std::vector<DeviceProps> props;
  std::call_once(once, [] {
    for (int d = 0; d < DeviceCount(); ++d) {
      cudaDeviceProp p{};
      KILN_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
      props.push_back({p.name, p.major, p.minor, p.multiProcessorCount, p.totalGlobalMem,
                       static_cast<size_t>(p.l2CacheSize),
                       static_cast<int>(p.sharedMemPerBlockOptin)});
    }
  });
  KILN_CHECK(device >= 0 && device < static_cast<int>(props.size()), "cuda: no device ", device,
             " (", props.size(), " present)");
  return props[device];
}

cudaStream_t CurrentStream() { return g_stream; }
void SetCurrentStream(cudaStream_t stream) { g_stream = stream; }
void Synchronize() { KILN_CUDA_CHECK(cudaDeviceSynchronize()); }

bool Capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it so that later checks do not report it
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

namespace {
thread_local bool t_for_graph_replay = false;

bool ComputeDependentLaunch(int device) {
  if (!EnvBool("KILN_PDL")) return false;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 9;
}
}  // namespace

bool DependentLaunchEnabled(int device) {
  static constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  static bool enabled[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return false;
  std::call_once(once[device], [device] { enabled[device] = ComputeDependentLaunch(device); });
  return enabled[device];
}

namespace {
thread_local ScopedPlanRun* t_plan_run = nullptr;
}  // namespace

ScopedPlanRun::ScopedPlanRun(const std::vector<ByteRange>& ranges)
    : read_only(ranges), previous_(t_plan_run) {
  t_plan_run = this;
}
ScopedPlanRun::~ScopedPlanRun() { t_plan_run = previous_; }

bool ReadOnlyDuringRun(const void* p, size_t bytes) {
  if (t_plan_run == nullptr || p == nullptr) return false;
  const auto begin = reinterpret_cast<uintptr_t>(p);
  for (const ByteRange& r : t_plan_run->read_only) {
    const auto rb = reinterpret_cast<uintptr_t>(r.begin);
    if (begin >= rb && begin - rb <= r.bytes && bytes <= r.bytes - (begin - rb)) return true;
  }
  return false;
}

bool UseDependentLaunch(int device, cudaStream_t stream) {
  if (t_plan_run != nullptr && t_plan_run->first_launch_pending) {
    t_plan_run->first_launch_pending = false;  // the run's first launch: a plain one
    return false;
  }
  if (!DependentLaunchEnabled(device)) return false;
  // Into a capture only with KILN_PDL_GRAPHS (a programmatic edge of the graph).
  static const bool in_graphs = EnvBool("KILN_PDL_GRAPHS");
  return in_graphs || !Capturing(stream);
}

cudaError_t LaunchDependent(const void* kernel, dim3 grid, dim3 block, void** args,
                            size_t shared_bytes, cudaStream_t stream, dim3 cluster) {
  cudaLaunchAttribute attrs[2] = {};
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attrs;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return cudaGetLastError();
  if (UseDependentLaunch(device, stream)) {
    attrs[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[config.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attrs[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attrs[config.numAttrs].val.clusterDim.x = cluster.x;
    attrs[config.numAttrs].val.clusterDim.y = cluster.y;
    attrs[config.numAttrs++].val.clusterDim.z = cluster.z;
  }
  return cudaLaunchKernelExC(&config, kernel, args);
}

bool ForGraphReplay() { return t_for_graph_replay || Capturing(); }
ScopedGraphReplay::ScopedGraphReplay() : previous_(t_for_graph_replay) {
  t_for_graph_replay = true;
}
ScopedGraphReplay::~ScopedGraphReplay() { t_for_graph_replay = previous_; }

absl::Status ToStatus(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg =
      absl::StrCat(call, " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  return err == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(msg)
                                          : absl::InternalError(msg);
}

void Check(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  const absl::Status s = ToStatus(err, call);
  throw Error(absl::Status(s.code(), absl::StrCat(s.message(), " (", file, ":", line, ")")));
}

MemoryStats GetMemoryStats() {
  MemoryStats s;
  s.allocated = TheAllocator().allocated();
  s.peak_allocated = TheAllocator().peak();
  s.cached = TheAllocator().cached();
  cudaMemPool_t pool;
  uint64_t reserved = 0;
  if (IsAvailable() && cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess &&
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess) {
    s.reserved = reserved;
  }
  return s;
}

void ResetPeakMemoryStats() { TheAllocator().ResetPeak(); }

void EmptyCache() {
  if (IsAvailable()) TheAllocator().EmptyCache();
}

void Copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  const cudaStream_t s = CurrentStream();
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s));
  if (dst_device.is_cpu() || src_device.is_cpu()) KILN_CUDA_CHECK(cudaStreamSynchronize(s));
}

void CopyRows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
              size_t rows) {
  if (rows == 0 || row_bytes == 0) return;
  KILN_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                    cudaMemcpyDeviceToDevice, CurrentStream()));
}

PointerInfo DescribePointer(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();  // a pointer the runtime does not know: plain host memory
    return {};
  }
  switch (attr.type) {
    case cudaMemoryTypeHost:
      return {PointerInfo::Kind::kPinnedHost, attr.device};
    case cudaMemoryTypeDevice:
      return {PointerInfo::Kind::kDevice, attr.device};
    case cudaMemoryTypeManaged:
      return {PointerInfo::Kind::kManaged, attr.device};
    default:
      return {};
  }
}

Allocator* DeviceAllocator() { return IsAvailable() ? &TheAllocator() : nullptr; }

Event::Event() { KILN_CUDA_CHECK(cudaEventCreate(&event_)); }
Event::~Event() { cudaEventDestroy(event_); }
void Event::Record(cudaStream_t stream) { KILN_CUDA_CHECK(cudaEventRecord(event_, stream)); }
void Event::Synchronize() { KILN_CUDA_CHECK(cudaEventSynchronize(event_)); }
float Event::ElapsedMs(const Event& since) const {
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, since.event_, event_));
  return ms;
}

void RelaxCaptureModeForThisThread() {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) cudaGetLastError();
}

Stream::Stream() { KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
void Stream::Synchronize() { KILN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
Stream::~Stream() {
  TheAllocator().ForgetStream(stream_);  // blocks allocated on it must not be freed on a dead one
  cudaStreamDestroy(stream_);
}

}  // namespace kiln::cuda
