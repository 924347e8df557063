// The CUPTI activity source (see device.h): CUPTI's Activity API with buffer callbacks.
//
// CUPTI hands filled buffers to BufferCompleted on its own thread; they are converted to
// DeviceRecords right away (kernel names are copied and demangled, timestamps moved onto the
// host clock with the offset measured at Start) and queued until Flush/Stop. Records CUPTI had
// to drop for lack of buffer space are counted from cuptiActivityGetNumDroppedRecords.
// libcupti needs no driver to load; no CUPTI function runs unless a GPU is present.
#include <cupti.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "profiler/device.h"
#include "profiler/host.h"
#include "runtime/cuda.h"
#include "runtime/status.h"

namespace kiln::profiler {
namespace {

constexpr size_t kBufferBytes = 8 << 20;
constexpr size_t kBufferAlign = 8;
constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_RUNTIME,
    CUPTI_ACTIVITY_KIND_DRIVER,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
};

// Shared with CUPTI's callbacks, which are plain functions. Never destroyed: CUPTI may deliver
// buffers while the process exits.
struct CuptiState {
  std::mutex mu;
  std::vector<DeviceRecord> records ABSL_GUARDED_BY(mu);
  uint64_t dropped ABSL_GUARDED_BY(mu) = 0;
  std::atomic<int64_t> offset_ns{0};  // host clock - CUPTI clock
  bool callbacks_registered = false;  // only the source that holds in_use touches it
  std::atomic<bool> in_use{false};
};

CuptiState& State() {
  static CuptiState* state = new CuptiState;
  return *state;
}

absl::Status CuptiError(CUptiResult result, const char* call) {
  const char* text = nullptr;
  if (cuptiGetResultString(result, &text) != CUPTI_SUCCESS || text == nullptr) text = "?";
  return absl::UnavailableError(absl::StrCat(call, " failed: ", text));
}

#define KILN_CUPTI_RETURN_IF_ERROR(call)            \
  do {                                              \
    CUptiResult kiln_cupti_result_ = (call);        \
    if (kiln_cupti_result_ != CUPTI_SUCCESS) {      \
      return CuptiError(kiln_cupti_result_, #call); \
    }                                               \
  } while (0)

int64_t HostNs(uint64_t cupti_ns) {
  return static_cast<int64_t>(cupti_ns) + State().offset_ns.load(std::memory_order_relaxed);
}

// "cudaLaunchKernel_v7000" -> "cudaLaunchKernel".
std::string CallName(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  const char* raw = nullptr;
  if (cuptiGetCallbackName(domain, cbid, &raw) != CUPTI_SUCCESS || raw == nullptr) {
    return absl::StrCat("cuda_api_", cbid);
  }
  std::string name = raw;
  const size_t v = name.rfind("_v");
  if (v != std::string::npos && v + 2 < name.size() &&
      name.find_first_not_of("0123456789", v + 2) == std::string::npos) {
    name.resize(v);
  }
  return name;
}

const char* CopyKindName(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "Memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "Memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "Memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "Memcpy PtoP";
    default:
      return "Memcpy";
  }
}

DeviceRecord FromKernel(const CUpti_ActivityKernel10& k) {
  DeviceRecord r;
  r.kind = DeviceKind::kKernel;
  r.name = Demangle(k.name);
  r.start_ns = HostNs(k.start);
  r.end_ns = HostNs(k.end);
  r.device = k.deviceId;
  r.stream = k.streamId;
  r.correlation_id = k.correlationId;
  r.grid[0] = k.gridX, r.grid[1] = k.gridY, r.grid[2] = k.gridZ;
  r.block[0] = k.blockX, r.block[1] = k.blockY, r.block[2] = k.blockZ;
  r.registers_per_thread = k.registersPerThread;
  r.static_shared_bytes = k.staticSharedMemory;
  r.dynamic_shared_bytes = k.dynamicSharedMemory;
  return r;
}

DeviceRecord FromMemcpy(const CUpti_ActivityMemcpy6& m) {
  DeviceRecord r;
  r.kind = DeviceKind::kMemcpy;
  r.name = CopyKindName(m.copyKind);
  r.start_ns = HostNs(m.start);
  r.end_ns = HostNs(m.end);
  r.device = m.deviceId;
  r.stream = m.streamId;
  r.correlation_id = m.correlationId;
  r.bytes = m.bytes;
  return r;
}

DeviceRecord FromMemset(const CUpti_ActivityMemset4& m) {
  DeviceRecord r;
  r.kind = DeviceKind::kMemset;
  r.name = "Memset";
  r.start_ns = HostNs(m.start);
  r.end_ns = HostNs(m.end);
  r.device = m.deviceId;
  r.stream = m.streamId;
  r.correlation_id = m.correlationId;
  r.bytes = m.bytes;
  return r;
}

DeviceRecord FromApi(const CUpti_ActivityAPI& a, bool runtime) {
  DeviceRecord r;
  r.kind = runtime ? DeviceKind::kRuntime : DeviceKind::kDriver;
  r.name = CallName(runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, a.cbid);
  r.start_ns = HostNs(a.start);
  r.end_ns = HostNs(a.end);
  r.correlation_id = a.correlationId;
  r.thread_id = a.threadId;
  return r;
}

std::optional<DeviceRecord> Convert(const CUpti_Activity* a) {
  switch (a->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL:
      return FromKernel(*reinterpret_cast<const CUpti_ActivityKernel10*>(a));
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      return FromMemcpy(*reinterpret_cast<const CUpti_ActivityMemcpy6*>(a));
    case CUPTI_ACTIVITY_KIND_MEMSET:
      return FromMemset(*reinterpret_cast<const CUpti_ActivityMemset4*>(a));
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER:
      return FromApi(*reinterpret_cast<const CUpti_ActivityAPI*>(a),
                     a->kind == CUPTI_ACTIVITY_KIND_RUNTIME);
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto& e = *reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(a);
      return ExternalCorrelationRecord(e.correlationId, e.externalId);
    }
    default:
      return std::nullopt;
  }
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlign, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;  // no buffer: CUPTI drops and counts
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext context, uint32_t stream, uint8_t* buffer, size_t size,
                              size_t valid_size) {
  std::vector<DeviceRecord> converted;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) {
    if (std::optional<DeviceRecord> r = Convert(record)) converted.push_back(*std::move(r));
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) != CUPTI_SUCCESS) dropped = 0;
  std::free(buffer);
  CuptiState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  for (DeviceRecord& r : converted) s.records.push_back(std::move(r));
  s.dropped += dropped;
}

// Host clock minus CUPTI clock, read back to back (the smallest bracket of three).
absl::Status MeasureOffset() {
  int64_t best_gap = INT64_MAX;
  for (int i = 0; i < 3; ++i) {
    uint64_t cupti_ns = 0;
    const int64_t before = NowNs();
    KILN_CUPTI_RETURN_IF_ERROR(cuptiGetTimestamp(&cupti_ns));
    const int64_t after = NowNs();
    if (after - before < best_gap) {
      best_gap = after - before;
      State().offset_ns.store(before + (after - before) / 2 - static_cast<int64_t>(cupti_ns));
    }
  }
  return absl::OkStatus();
}

class CuptiSource : public ActivitySource {
 public:
  ~CuptiSource() override {
    if (started_) Stop();
  }
  std::string name() const override { return "cupti"; }
  absl::Status Start() override;
  std::vector<DeviceRecord> Flush() override;
  std::vector<DeviceRecord> Stop() override;
  uint64_t dropped_records() const override { return dropped_; }
  void PushExternalId(uint64_t id) override {
    cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id);
  }
  void PopExternalId() override {
    uint64_t last = 0;
    cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
  }

 private:
  absl::Status Enable();
  std::vector<DeviceRecord> Take();

  bool started_ = false;
  uint64_t dropped_ = 0;
};

absl::Status CuptiSource::Start() {
  if (!cuda::IsAvailable()) return absl::UnavailableError("no usable CUDA device");
  if (State().in_use.exchange(true)) {
    return absl::FailedPreconditionError("another CUPTI activity source is running");
  }
  absl::Status status = Enable();
  if (!status.ok()) {
    for (CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
    State().in_use.store(false);
    return status;
  }
  started_ = true;
  dropped_ = 0;
  return absl::OkStatus();
}

// Records are read with the structs of the cupti.h kiln was built with (CUpti_ActivityKernel10,
// ...); an older libcupti may lay them out differently.
absl::Status CheckVersion() {
  uint32_t version = 0;
  KILN_CUPTI_RETURN_IF_ERROR(cuptiGetVersion(&version));
  if (version < CUPTI_API_VERSION) {
    return absl::UnavailableError(absl::StrCat("libcupti API version ", version,
                                               " is older than the one kiln was built with (",
                                               CUPTI_API_VERSION, ")"));
  }
  return absl::OkStatus();
}

absl::Status CuptiSource::Enable() {
  CuptiState& s = State();
  KILN_RETURN_IF_ERROR(CheckVersion());
  if (!s.callbacks_registered) {
    KILN_CUPTI_RETURN_IF_ERROR(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted));
    s.callbacks_registered = true;
  }
  // System thread ids, the ones host ranges carry (CurrentThreadId).
  cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);
  KILN_RETURN_IF_ERROR(MeasureOffset());
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.records.clear();
    s.dropped = 0;
  }
  for (CUpti_ActivityKind kind : kKinds) KILN_CUPTI_RETURN_IF_ERROR(cuptiActivityEnable(kind));
  return absl::OkStatus();
}

std::vector<DeviceRecord> CuptiSource::Take() {
  CuptiState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  dropped_ += std::exchange(s.dropped, 0);
  return std::exchange(s.records, {});
}

std::vector<DeviceRecord> CuptiSource::Flush() {
  if (!started_) return {};
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  return Take();
}

std::vector<DeviceRecord> CuptiSource::Stop() {
  if (!started_) return {};
  (void)cudaDeviceSynchronize();  // work still in flight would otherwise miss the flush
  for (CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) {
    std::lock_guard<std::mutex> lock(State().mu);
    State().dropped += dropped;
  }
  started_ = false;
  std::vector<DeviceRecord> out = Take();
  State().in_use.store(false);
  return out;
}

}  // namespace

std::unique_ptr<ActivitySource> MakeCuptiSource() { return std::make_unique<CuptiSource>(); }

}  // namespace kiln::profiler
