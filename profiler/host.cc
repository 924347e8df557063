// The host range collector (see host.h).
//
// Each thread keeps its open ranges on a thread-local stack and appends closed ones to its own
// buffer; the buffer's mutex is only ever contended by EndSession, which moves every buffer's
// events out. Buffers are owned jointly by their thread and a registry, so the events of a
// thread that exits before the session ends are still collected.
#include "profiler/host.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <unordered_set>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "profiler/device.h"

namespace kiln::profiler {
namespace {

struct ThreadBuffer {
  std::mutex mu;
  std::vector<HostEvent> events ABSL_GUARDED_BY(mu);
};

struct OpenRange {
  const char* name;
  EventKind kind;
  uint32_t session;
  uint64_t id;
  int64_t start_ns;
  ActivitySource* pushed_to;  // the source holding this range's external correlation id
  std::string shapes;
  bool closed = false;  // closed out of order: recorded, its external id popped once on top
};

struct ThreadState {
  std::shared_ptr<ThreadBuffer> buffer;
  std::vector<OpenRange> open;
  uint32_t tid = 0;
};

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;  // never destroyed: threads may outlive statics
  return *registry;
}

std::atomic<uint32_t> g_session{0};       // the session being collected, 0 = none
std::atomic<uint32_t> g_last_session{0};  // the last session number handed out
std::atomic<uint64_t> g_next_id{1};
std::atomic<bool> g_record_shapes{false};
std::atomic<ActivitySource*> g_source{nullptr};

ThreadState& State() {
  thread_local ThreadState state;
  if (state.buffer == nullptr) {
    state.buffer = std::make_shared<ThreadBuffer>();
    state.tid = CurrentThreadId();
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.buffers.push_back(state.buffer);
  }
  return state;
}

std::string ShapesString(absl::Span<const Tensor> inputs) {
  std::string s = "[";
  for (size_t i = 0; i < inputs.size(); ++i) {
    absl::StrAppend(&s, i ? ", " : "", inputs[i].defined() ? inputs[i].shape_string() : "[]");
  }
  return s + "]";
}

uint64_t Begin(const char* name, EventKind kind, const absl::Span<const Tensor>* inputs) {
  ThreadState& t = State();
  OpenRange& r = t.open.emplace_back();
  r.name = name;
  r.kind = kind;
  r.session = g_session.load(std::memory_order_relaxed);
  r.id = g_next_id.fetch_add(1, std::memory_order_relaxed);
  if (inputs != nullptr && g_record_shapes.load(std::memory_order_relaxed)) {
    r.shapes = ShapesString(*inputs);
  }
  r.pushed_to = g_source.load(std::memory_order_acquire);
  if (r.pushed_to != nullptr) r.pushed_to->PushExternalId(r.id);
  r.start_ns = NowNs();
  return r.id;
}

// Appends the closed range to the thread's buffer if its session is still being collected. The
// session is read under the buffer lock: EndSession clears it before draining any buffer.
void Commit(ThreadState& t, OpenRange& r, int32_t depth, int64_t end_ns) {
  std::lock_guard<std::mutex> lock(t.buffer->mu);
  if (r.session != g_session.load(std::memory_order_relaxed)) return;
  HostEvent& e = t.buffer->events.emplace_back();
  e.name = r.name;
  e.kind = r.kind;
  e.depth = depth;
  e.tid = t.tid;
  e.start_ns = r.start_ns;
  e.end_ns = end_ns;
  e.correlation_id = r.id;
  e.shapes = std::move(r.shapes);
}

// Closes the open range `id` (0: the innermost). A user's Range may close out of order (one
// destroyed before a range opened after it): it still closes its own entry, with its own times.
void End(uint64_t id = 0) {
  const int64_t end_ns = NowNs();
  ThreadState& t = State();
  if (t.open.empty()) return;
  size_t at = t.open.size() - 1;
  while (id != 0 && t.open[at].id != id) {
    if (at == 0) return;  // not open on this thread (its session ended)
    --at;
  }
  OpenRange& r = t.open[at];
  if (r.session != 0) Commit(t, r, static_cast<int32_t>(at), end_ns);
  r.closed = true;
  // The external correlation ids are a stack: only the innermost is popped; a range closed out of
  // order waits, closed, until the ranges above it close.
  while (!t.open.empty() && t.open.back().closed) {
    OpenRange& top = t.open.back();
    if (top.pushed_to != nullptr && top.pushed_to == g_source.load(std::memory_order_acquire)) {
      top.pushed_to->PopExternalId();
    }
    t.open.pop_back();
  }
}

}  // namespace

const char* EventKindName(EventKind kind) {
  switch (kind) {
    case EventKind::kOp:
      return "op";
    case EventKind::kUser:
      return "user";
    case EventKind::kStep:
      return "step";
    case EventKind::kLaunch:
      return "launch";
  }
  return "?";
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint32_t CurrentThreadId() {
  thread_local const uint32_t tid = static_cast<uint32_t>(::syscall(SYS_gettid));
  return tid;
}

const char* Intern(const std::string& name) {
  static std::mutex* mu = new std::mutex;                    // guards `names`
  static auto* names = new std::unordered_set<std::string>;  // nodes: pointers stay valid
  std::lock_guard<std::mutex> lock(*mu);
  return names->insert(name).first->c_str();
}

// The name is interned (copied once): the caller's buffer may change or go before the report.
Range::Range(const char* name) : armed_(IsActive()) {
  if (KILN_PREDICT_FALSE(armed_)) {
    id_ = Begin(Intern(name != nullptr ? name : "(null)"), EventKind::kUser, nullptr);
  }
}

Range::Range(const std::string& name) : armed_(IsActive()) {
  if (KILN_PREDICT_FALSE(armed_)) id_ = Begin(Intern(name), EventKind::kUser, nullptr);
}

Range::~Range() {
  if (KILN_PREDICT_FALSE(armed_)) End(id_);
}

OpRange::OpRange(const char* name, absl::Span<const Tensor> inputs) {
  Begin(name, EventKind::kOp, &inputs);
}

OpRange::~OpRange() { End(); }

namespace internal {

void BeginSession(bool record_shapes) {
  g_record_shapes.store(record_shapes, std::memory_order_relaxed);
  g_session.store(g_last_session.fetch_add(1) + 1, std::memory_order_relaxed);
}

void SetActivitySource(ActivitySource* source) {
  g_source.store(source, std::memory_order_release);
}

std::vector<HostEvent> EndSession() {
  g_session.store(0, std::memory_order_relaxed);
  g_source.store(nullptr, std::memory_order_release);
  std::vector<HostEvent> all;
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& buffer : r.buffers) {
    std::lock_guard<std::mutex> buffer_lock(buffer->mu);
    for (HostEvent& e : buffer->events) all.push_back(std::move(e));
    buffer->events.clear();
  }
  // Forget the buffers of threads that have exited (only the registry holds them now).
  std::erase_if(r.buffers, [](const auto& b) { return b.use_count() == 1; });
  return all;
}

}  // namespace internal
}  // namespace kiln::profiler
