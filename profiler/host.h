// Host side of the profiler: the ranges that ops, user code and the step schedule record.
//
// A process-wide collector with one buffer per thread. While a Profiler records (see
// profiler.h), every op the dispatcher runs opens an OpRange and user code can mark regions:
//
//   {
//     kiln::profiler::Range r("attn_fwd");   // like torch's record_function
//     y = attention(x);                       // its ops nest under "attn_fwd"
//   }
//
// When nothing records, a Range costs one load and one predictable branch, and the dispatcher
// pays the same (`if (KILN_PREDICT_FALSE(profiler::IsActive()))`). Every range gets a fresh
// correlation id that is pushed to the device activity source (CUPTI's external correlation
// id) for its lifetime, so the kernels it launches map back to it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "runtime/tensor.h"

#ifndef KILN_PREDICT_FALSE
#define KILN_PREDICT_FALSE(x) (__builtin_expect(!!(x), 0))
#endif

namespace kiln::profiler {

class ActivitySource;

// True while a profiler records a step. Written only by Profiler; read on every op.
inline std::atomic<bool> g_active{false};
inline bool IsActive() { return g_active.load(std::memory_order_relaxed); }

enum class EventKind : uint8_t { kOp, kUser, kStep, kLaunch };
const char* EventKindName(EventKind kind);  // "op", "user", "step", "launch"

// One closed host range.
struct HostEvent {
  const char* name = "";  // static or interned: lives for the whole process
  EventKind kind = EventKind::kOp;
  int32_t depth = 0;    // nesting depth on its thread (0 = outermost)
  int32_t parent = -1;  // index of the enclosing event in ProfileResult::host, -1 for none
  uint32_t tid = 0;     // system thread id (the one CUPTI reports for API calls)
  int64_t start_ns = 0, end_ns = 0;  // NowNs() clock
  // kOp/kUser: the kiln range id (the external correlation id of its device work);
  // kLaunch: the CUPTI correlation id shared with the kernel or copy it started.
  uint64_t correlation_id = 0;
  std::string shapes;  // input shapes, "[[16], [16]]", when Options::record_shapes
  int64_t duration_ns() const { return end_ns - start_ns; }
};

// The one clock of both lanes: std::chrono::steady_clock in nanoseconds.
int64_t NowNs();
// The calling thread's system id (gettid).
uint32_t CurrentThreadId();
// A process-lifetime copy of `name` (equal names share one copy).
const char* Intern(const std::string& name);

// A user range. Records only if a profiler is recording when it opens.
class Range {
 public:
  explicit Range(const char* name);  // the name is copied
  explicit Range(const std::string& name);
  ~Range();  // closes this range, also when ranges opened after it are still open
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  bool armed_;
  uint64_t id_ = 0;
};

// The range the dispatcher opens around one op. Construct it only when IsActive().
class OpRange {
 public:
  OpRange(const char* name, absl::Span<const Tensor> inputs);
  ~OpRange();
  OpRange(const OpRange&) = delete;
  OpRange& operator=(const OpRange&) = delete;
};

namespace internal {
// Collector control, for Profiler only. Ranges still open from an earlier session are dropped
// when they close.
void BeginSession(bool record_shapes);
// The source that receives the external correlation ids of ranges opened from now on (null:
// none). It must stay alive until every range opened meanwhile has closed.
void SetActivitySource(ActivitySource* source);
// Ends the session and returns every range closed since BeginSession, all threads.
std::vector<HostEvent> EndSession();
}  // namespace internal

}  // namespace kiln::profiler
