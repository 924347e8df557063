// Tests of the profiler, all on the CPU: host ranges (nesting, timing, ops under user ranges,
// threads), the schedule, the op/kernel tables' arithmetic, the Chrome trace (parsed back with
// a small JSON parser; every flow must join a launch to its kernel), dropped-record accounting,
// the "device activity unavailable" path and the eager-vs-compiled report. Device activity is
// synthetic, fed through FakeActivitySource (the way Kineto tests use MockCuptiActivities).
#include "profiler/profiler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <variant>
#include <vector>

#include "absl/strings/str_join.h"
#include "codegen/compare.h"
#include "codegen/compile.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "profiler/report.h"
#include "profiler/timer.h"
#include "runtime/build_config.h"
#include "runtime/cuda.h"
#include "runtime/startup.h"
#include "runtime/status.h"
#include "tests/test_util.h"
#if KILN_WITH_CUDA
#include "ops/cuda/gemv_kernels.h"
#include "runtime/cuda_api.h"
#endif

namespace kiln::profiler {
namespace {

constexpr int64_t kUs = 1000;

// ---- a minimal JSON parser: enough to prove the trace is JSON and to read it back ----

struct Json {
  std::variant<std::nullptr_t, bool, double, std::string, std::vector<Json>,
               std::map<std::string, Json>>
      v;
  const std::map<std::string, Json>& obj() const { return std::get<5>(v); }
  const std::vector<Json>& arr() const { return std::get<4>(v); }
  const std::string& str() const { return std::get<3>(v); }
  double num() const { return std::get<2>(v); }
  bool has(const std::string& k) const { return obj().count(k) > 0; }
  const Json& at(const std::string& k) const { return obj().at(k); }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}
  Json ParseDocument() {
    Json j = Value();
    Space();
    if (i_ != s_.size()) throw std::runtime_error("trailing characters at " + std::to_string(i_));
    return j;
  }

 private:
  [[noreturn]] void Fail(const char* what) {
    throw std::runtime_error(std::string(what) + " at offset " + std::to_string(i_));
  }
  void Space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void Expect(char c) {
    Space();
    if (i_ >= s_.size() || s_[i_] != c) Fail("unexpected character");
    ++i_;
  }
  bool Literal(const char* word) {
    const std::string w = word;
    if (s_.compare(i_, w.size(), w) != 0) return false;
    i_ += w.size();
    return true;
  }
  Json Value() {
    Space();
    if (i_ >= s_.size()) Fail("unexpected end");
    const char c = s_[i_];
    if (c == '{') return Object();
    if (c == '[') return Array();
    if (c == '"') return Json{String()};
    if (Literal("true")) return Json{true};
    if (Literal("false")) return Json{false};
    if (Literal("null")) return Json{nullptr};
    return Number();
  }
  Json Object() {
    Expect('{');
    std::map<std::string, Json> m;
    Space();
    if (s_[i_] == '}') return ++i_, Json{m};
    do {
      Space();
      std::string key = String();
      Expect(':');
      m[key] = Value();
      Space();
    } while (i_ < s_.size() && s_[i_] == ',' && ++i_);
    Expect('}');
    return Json{m};
  }
  Json Array() {
    Expect('[');
    std::vector<Json> a;
    Space();
    if (s_[i_] == ']') return ++i_, Json{a};
    do {
      a.push_back(Value());
      Space();
    } while (i_ < s_.size() && s_[i_] == ',' && ++i_);
    Expect(']');
    return Json{a};
  }
  std::string String() {
    if (s_[i_] != '"') Fail("expected a string");
    std::string out;
    for (++i_; i_ < s_.size() && s_[i_] != '"'; ++i_) {
      const char c = s_[i_];
      if (static_cast<unsigned char>(c) < 0x20) Fail("raw control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      const char e = s_[++i_];
      if (e == 'u') {
        out += static_cast<char>(std::stoi(s_.substr(i_ + 1, 4), nullptr, 16));
        i_ += 4;
      } else {
        const std::string from = "\"\\/bfnrt", to = "\"\\/\b\f\n\r\t";
        const size_t k = from.find(e);
        if (k == std::string::npos) Fail("bad escape");
        out += to[k];
      }
    }
    if (i_ >= s_.size()) Fail("unterminated string");
    ++i_;
    return out;
  }
  Json Number() {
    const size_t start = i_;
    while (i_ < s_.size() && std::string("+-0123456789.eE").find(s_[i_]) != std::string::npos) {
      ++i_;
    }
    if (start == i_) Fail("expected a value");
    return Json{std::stod(s_.substr(start, i_ - start))};
  }

  const std::string& s_;
  size_t i_ = 0;
};

// ---- helpers ----

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

std::vector<const HostEvent*> Named(const ProfileResult& r, const std::string& name) {
  std::vector<const HostEvent*> out;
  for (const HostEvent& e : r.host) {
    if (name == e.name) out.push_back(&e);
  }
  return out;
}

const HostEvent& One(const ProfileResult& r, const std::string& name) {
  auto events = Named(r, name);
  EXPECT_EQ(events.size(), 1u) << name;
  if (events.empty()) throw std::runtime_error("no event " + name);
  return *events[0];
}

std::string ParentName(const ProfileResult& r, const HostEvent& e) {
  return e.parent < 0 ? "" : r.host[e.parent].name;
}

ProfilerOptions HostOnly() {
  ProfilerOptions o;
  o.device = false;
  return o;
}

// Options with a fake source the test keeps a pointer to.
ProfilerOptions WithFake(FakeActivitySource** fake) {
  ProfilerOptions o;
  auto source = std::make_unique<FakeActivitySource>();
  *fake = source.get();
  o.source = std::move(source);
  return o;
}

// Fabricates what CUPTI reports for one kernel launch made now, inside the current range: the
// runtime call (timed now), its kernel (later, on stream 7) and the external correlation.
void FakeLaunch(FakeActivitySource* fake, uint32_t correlation, const std::string& kernel,
                int64_t kernel_ns) {
  const int64_t t0 = NowNs();
  const int64_t t1 = NowNs() + 1;
  fake->Add(LaunchRecord(correlation, t0, t1, CurrentThreadId()));
  fake->Add(KernelRecord(kernel, correlation, t1 + 2 * kUs, t1 + 2 * kUs + kernel_ns));
  fake->Add(ExternalCorrelationRecord(correlation, fake->current_external_id()));
}

HostEvent Event(const char* name, EventKind kind, int64_t start_us, int64_t end_us, uint64_t id) {
  HostEvent e;
  e.name = name;
  e.kind = kind;
  e.tid = 1;
  e.start_ns = start_us * kUs;
  e.end_ns = end_us * kUs;
  e.correlation_id = id;
  return e;
}

DeviceRecord Kernel(const char* name, uint64_t external_id, int64_t start_us, int64_t end_us) {
  DeviceRecord r = KernelRecord(name, 0, start_us * kUs, end_us * kUs);
  r.external_id = external_id;
  return r;
}

// block [0,100] > A#1 [10,40] > B [15,25]; A#2 [50,70]; kernels: B 5 us, A#1 3 us, A#2 4 us,
// and 2 us launched outside every range.
ProfileResult SyntheticResult() {
  ProfileResult r;
  r.host = {Event("block", EventKind::kUser, 0, 100, 1), Event("A", EventKind::kOp, 10, 40, 2),
            Event("B", EventKind::kOp, 15, 25, 3), Event("A", EventKind::kOp, 50, 70, 4)};
  r.device = {Kernel("kB", 3, 20, 25), Kernel("kA", 2, 30, 33), Kernel("kA", 4, 60, 64),
              Kernel("stray", 0, 80, 82)};
  r.device_available = true;
  r.steps_recorded = 1;
  SortAndNest(r.host);
  return r;
}

const OpRow& Row(const OpTable& t, const std::string& name) {
  for (const OpRow& row : t.rows) {
    if (row.name == name) return row;
  }
  throw std::runtime_error("no row " + name);
}

// ---- host ranges ----

TEST(ProfilerHost, NestAndTime) {
  Profiler prof(HostOnly());
  prof.Start();
  {
    Range outer("outer");
    SleepMs(20);
    {
      Range inner(std::string("inner"));
      SleepMs(10);
    }
  }
  ProfileResult r = prof.Stop();
  const HostEvent& outer = One(r, "outer");
  const HostEvent& inner = One(r, "inner");
  EXPECT_EQ(outer.kind, EventKind::kUser);
  EXPECT_EQ(ParentName(r, inner), "outer");
  EXPECT_EQ(ParentName(r, outer), "ProfilerStep#0");
  EXPECT_EQ(inner.depth, outer.depth + 1);
  EXPECT_EQ(inner.tid, outer.tid);
  EXPECT_LE(outer.start_ns, inner.start_ns);
  EXPECT_LE(inner.end_ns, outer.end_ns);
  EXPECT_GE(outer.duration_ns(), 30'000'000);
  EXPECT_GE(inner.duration_ns(), 10'000'000);
  EXPECT_LT(outer.duration_ns(), 2'000'000'000);  // generous: a loaded CI machine
  EXPECT_EQ(r.steps_recorded, 1);
}

// A range's name is copied (the caller's buffer may change), and a range closed before one
// opened after it closes its own entry with its own times.
TEST(ProfilerHost, NamesAreCopiedAndOutOfOrderRangesKeepTheirTimes) {
  Profiler prof(HostOnly());
  prof.Start();
  char name[16];
  for (int i = 0; i < 2; ++i) {
    std::snprintf(name, sizeof name, "layer%d", i);
    Range r(name);
  }
  std::snprintf(name, sizeof name, "CLOBBERED");
  auto outer = std::make_unique<Range>("outer");
  auto inner = std::make_unique<Range>("inner");
  outer.reset();  // closed first, though opened first
  SleepMs(10);
  inner.reset();
  ProfileResult r = prof.Stop();
  One(r, "layer0");
  One(r, "layer1");
  EXPECT_LT(One(r, "outer").duration_ns(), 10'000'000);
  EXPECT_GE(One(r, "inner").duration_ns(), 10'000'000);
  EXPECT_THROW(Profiler(ProfilerOptions{.active = 0}), Error);
  EXPECT_THROW(Profiler(ProfilerOptions{.wait = -1}), Error);
}

TEST(ProfilerHost, OpsNestUnderUserRange) {
  ProfilerOptions o = HostOnly();
  o.record_shapes = true;
  Profiler prof(std::move(o));
  Tensor a = ones({16});
  prof.Start();
  {
    Range block("block");
    Tensor b = add(a, a);
    Tensor c = mul(b, a);
  }
  ProfileResult r = prof.Stop();
  const HostEvent& add_event = One(r, "add");
  const HostEvent& mul_event = One(r, "mul");
  EXPECT_EQ(add_event.kind, EventKind::kOp);
  EXPECT_EQ(ParentName(r, add_event), "block");
  EXPECT_EQ(ParentName(r, mul_event), "block");
  EXPECT_LE(add_event.end_ns, mul_event.start_ns);
  EXPECT_EQ(add_event.shapes, "[[16], [16]]");
  EXPECT_NE(add_event.correlation_id, mul_event.correlation_id);
}

TEST(ProfilerHost, EveryThreadHasItsLane) {
  Profiler prof(HostOnly());
  prof.Start();
  std::thread worker([] {
    Range r("worker");
    Tensor x = ones({4});
    Tensor y = add(x, x);
  });
  worker.join();  // the thread is gone before Stop: its events must survive it
  { Range r("main"); }
  ProfileResult res = prof.Stop();
  const HostEvent& w = One(res, "worker");
  EXPECT_NE(w.tid, One(res, "main").tid);
  EXPECT_EQ(ParentName(res, One(res, "add")), "worker");
}

TEST(ProfilerHost, CompiledFusionIsOneOpRange) {
  auto fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(in[0]) * in[1]}; };
  Generator gen(1);
  const Tensor x = randn({8, 8}, gen), u = randn({8, 8}, gen);
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  CompiledFn f = compile(fn, {x, u}, o);
  f({x, u});  // compiled before profiling
  Profiler prof(HostOnly());
  prof.Start();
  f({x, u});
  const ProfileResult r = prof.Stop();
  std::vector<std::string> ops;
  for (const HostEvent& e : r.host) {
    if (e.kind == EventKind::kOp) ops.push_back(e.name);
  }
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].rfind("kiln_fused_", 0), 0u) << ops[0];
}

TEST(ProfilerHost, FlagPathWhenOff) {
  EXPECT_FALSE(IsActive());
  Tensor x = ones({16});
  for (int i = 0; i < 100; ++i) x = add(x, x);  // dispatch with the profiler off
  Range* opened_off = new Range("opened_while_off");
  Profiler prof(HostOnly());
  prof.Start();
  EXPECT_TRUE(IsActive());
  EXPECT_EQ(Profiler::Current(), &prof);
  delete opened_off;  // closes while on, but was never armed
  ProfileResult r = prof.Stop();
  EXPECT_FALSE(IsActive());
  EXPECT_EQ(Profiler::Current(), nullptr);
  EXPECT_TRUE(Named(r, "add").empty());
  EXPECT_TRUE(Named(r, "opened_while_off").empty());
  // Nothing recorded: the step is not counted either.
  EXPECT_EQ(r.steps_recorded, 0);
  EXPECT_EQ(r.host.size(), 0u);
}

TEST(ProfilerHost, OneProfilerAtATime) {
  Profiler a(HostOnly()), b(HostOnly());
  a.Start();
  EXPECT_THROW(b.Start(), Error);
  a.Stop();
  EXPECT_THROW(a.Step(), Error);
}

// ---- schedule ----

TEST(ProfilerSchedule, Actions) {
  ProfilerOptions o;
  o.wait = 1, o.warmup = 1, o.active = 2, o.repeat = 2;
  const StepAction N = StepAction::kNone, W = StepAction::kWarmup, R = StepAction::kRecord;
  const std::vector<StepAction> want = {N, W, R, R, N, W, R, R, N, N};
  for (int s = 0; s < static_cast<int>(want.size()); ++s) {
    EXPECT_EQ(ScheduleAction(o, s), want[s]) << "step " << s;
  }
  o.repeat = 0;
  EXPECT_EQ(ScheduleAction(o, 100 * 4 + 3), R);
}

TEST(ProfilerSchedule, SkipsWaitAndWarmupSteps) {
  FakeActivitySource* fake = nullptr;
  ProfilerOptions o = WithFake(&fake);
  o.wait = 1, o.warmup = 1, o.active = 2;
  Profiler prof(std::move(o));
  prof.Start();
  std::vector<bool> started;
  for (int i = 0; i < 6; ++i) {
    started.push_back(fake->started());
    { Range r(std::string("work") + std::to_string(i)); }
    prof.Step();
  }
  ProfileResult r = prof.Stop();
  EXPECT_EQ(started, (std::vector<bool>{false, true, true, true, true, true}));
  EXPECT_EQ(r.steps_recorded, 2);
  ASSERT_EQ(r.windows.size(), 2u);
  for (int i : {0, 1, 4, 5}) EXPECT_TRUE(Named(r, "work" + std::to_string(i)).empty()) << i;
  EXPECT_EQ(ParentName(r, One(r, "work2")), "ProfilerStep#2");
  EXPECT_EQ(ParentName(r, One(r, "work3")), "ProfilerStep#3");
  EXPECT_TRUE(Named(r, "ProfilerStep#4").empty());
}

// ---- op table ----

TEST(ProfilerOpTable, SelfAndTotalTimes) {
  const OpTable t = BuildOpTable(SyntheticResult());
  ASSERT_EQ(t.rows.size(), 3u);
  const OpRow &block = Row(t, "block"), &a = Row(t, "A"), &b = Row(t, "B");
  EXPECT_EQ(block.kind, EventKind::kUser);
  EXPECT_EQ(a.calls, 2);
  EXPECT_DOUBLE_EQ(block.total_host_us, 100);
  EXPECT_DOUBLE_EQ(block.self_host_us, 50);  // minus A (30) and A (20)
  EXPECT_DOUBLE_EQ(a.total_host_us, 50);
  EXPECT_DOUBLE_EQ(a.self_host_us, 40);  // minus B
  EXPECT_DOUBLE_EQ(b.self_host_us, 10);
  EXPECT_DOUBLE_EQ(a.self_device_us, 7);
  EXPECT_DOUBLE_EQ(a.total_device_us, 12);  // with B's kernel
  EXPECT_DOUBLE_EQ(a.device_avg_us(), 6);
  EXPECT_DOUBLE_EQ(block.self_device_us, 0);
  EXPECT_DOUBLE_EQ(block.total_device_us, 12);
  EXPECT_DOUBLE_EQ(t.unattributed_device_us, 2);
}

TEST(ProfilerOpTable, SumsAreConsistent) {
  const OpTable t = BuildOpTable(SyntheticResult());
  double self_host = 0, self_device = 0;
  for (const OpRow& r : t.rows) {
    EXPECT_LE(r.self_host_us, r.total_host_us) << r.name;
    EXPECT_LE(r.self_device_us, r.total_device_us) << r.name;
    self_host += r.self_host_us;
    self_device += r.self_device_us;
  }
  EXPECT_DOUBLE_EQ(t.self_host_total_us, self_host);
  EXPECT_DOUBLE_EQ(t.self_host_total_us, 100);  // = the outermost range
  EXPECT_DOUBLE_EQ(t.self_device_total_us, self_device);
  EXPECT_DOUBLE_EQ(t.self_device_total_us, 12);  // every attributed kernel once
  const std::string text = FormatOpTable(t, {.sort = SortKey::kSelfDevice, .limit = 1});
  EXPECT_NE(text.find("Self CPU time total: 100.000 us"), std::string::npos) << text;
  EXPECT_NE(text.find("Self CUDA time total: 12.000 us"), std::string::npos) << text;
  EXPECT_NE(text.find("Device time outside any range: 2.000 us"), std::string::npos) << text;
  EXPECT_EQ(text.find("block"), std::string::npos) << "limit 1 shows only A:\n" << text;
}

TEST(ProfilerOpTable, SortKeys) {
  std::vector<OpRow> rows = BuildOpTable(SyntheticResult()).rows;
  SortKey key;
  ASSERT_TRUE(ParseSortKey("self_cuda_time_total", &key));
  SortRows(rows, key);
  EXPECT_EQ(rows[0].name, "A");
  ASSERT_TRUE(ParseSortKey("cpu_time_total", &key));
  SortRows(rows, key);
  EXPECT_EQ(rows[0].name, "block");
  ASSERT_TRUE(ParseSortKey("self_host", &key));
  SortRows(rows, key);
  EXPECT_EQ(rows[0].name, "block");  // 50 > 40 > 10
  SortRows(rows, SortKey::kName);
  EXPECT_EQ(rows[0].name, "A");
  SortRows(rows, SortKey::kCalls);
  EXPECT_EQ(rows[0].name, "A");
  EXPECT_FALSE(ParseSortKey("bogus", &key));
}

TEST(ProfilerOpTable, RealOpsAddUp) {
  Profiler prof(HostOnly());
  Tensor x = ones({16, 16});
  prof.Start();
  {
    Range r("model");
    for (int i = 0; i < 10; ++i) x = gelu(add(matmul(x, x), x));
  }
  const ProfileResult res = prof.Stop();
  const OpTable t = BuildOpTable(res);
  EXPECT_EQ(Row(t, "matmul").calls, 10);
  EXPECT_EQ(Row(t, "gelu").calls, 10);
  double self = 0;
  for (const OpRow& r : t.rows) {
    EXPECT_LE(r.self_host_us, r.total_host_us + 1e-9) << r.name;
    self += r.self_host_us;
  }
  EXPECT_NEAR(self, Row(t, "model").total_host_us, 1e-6);
}

// ---- device records, trace ----

TEST(ProfilerDevice, ExternalCorrelationMapsKernelsToRanges) {
  FakeActivitySource* fake = nullptr;
  Profiler prof(WithFake(&fake));
  prof.Start();
  {
    Range outer("layer");
    FakeLaunch(fake, 1, "outer_kernel", 3 * kUs);
    Range inner("gemm");
    FakeLaunch(fake, 2, "gemm_kernel", 5 * kUs);
  }
  const ProfileResult r = prof.Stop();
  EXPECT_TRUE(r.device_available);
  EXPECT_EQ(r.device_status, "device activity: fake");
  ASSERT_EQ(r.device.size(), 2u);
  const OpTable t = BuildOpTable(r);
  EXPECT_DOUBLE_EQ(Row(t, "gemm").self_device_us, 5);
  EXPECT_DOUBLE_EQ(Row(t, "layer").self_device_us, 3);
  EXPECT_DOUBLE_EQ(Row(t, "layer").total_device_us, 8);
  // The launch calls became host events nested in the range that made them.
  int launches = 0;
  for (const HostEvent& e : r.host) {
    if (e.kind != EventKind::kLaunch) continue;
    ++launches;
    EXPECT_EQ(std::string(e.name), "cudaLaunchKernel");
    EXPECT_EQ(ParentName(r, e), e.correlation_id == 1 ? "layer" : "gemm");
  }
  EXPECT_EQ(launches, 2);
}

TEST(ProfilerDevice, SplitKeepsWindowedWorkAndOneCallPerLaunch) {
  std::vector<DeviceRecord> in;
  in.push_back(LaunchRecord(1, 100, 110, 9));
  DeviceRecord driver = LaunchRecord(1, 102, 108, 9, "cuLaunchKernel");
  driver.kind = DeviceKind::kDriver;
  in.push_back(driver);                                 // same call, seen by the driver: dropped
  in.push_back(KernelRecord("k1", 1, 5000, 6000));      // its launch is in the window: kept
  in.push_back(KernelRecord("k_before", 0, 10, 20));    // no launch record, outside: dropped
  in.push_back(KernelRecord("k_inside", 0, 300, 400));  // no launch record, inside: kept
  in.push_back(LaunchRecord(2, 2000, 2010, 9));         // launch outside the window: dropped
  in.push_back(KernelRecord("k2", 2, 2100, 2200));      // ... with its kernel
  in.push_back(LaunchRecord(3, 200, 210, 9, "cudaGetLastError"));  // no work: dropped
  in.push_back(ExternalCorrelationRecord(1, 77));
  const SplitRecords s = SplitDeviceRecords(in, {{50, 1000}});
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].name, "cudaLaunchKernel");
  ASSERT_EQ(s.activity.size(), 2u);
  EXPECT_EQ(s.activity[0].name, "k_inside");
  EXPECT_EQ(s.activity[1].name, "k1");
  EXPECT_EQ(s.activity[1].external_id, 77u);
}

TEST(ProfilerDevice, DroppedRecordsAreReported) {
  FakeActivitySource* fake = nullptr;
  Profiler prof(WithFake(&fake));
  prof.Start();
  fake->set_dropped_records(42);
  { Range r("x"); }
  const ProfileResult r = prof.Stop();
  EXPECT_EQ(r.dropped_records, 42u);
  const Json doc = JsonParser(ChromeTraceJson(r)).ParseDocument();
  EXPECT_EQ(doc.at("otherData").at("dropped_records").num(), 42);
}

TEST(ProfilerDevice, UnavailableWithoutGpu) {
  if (cuda::IsAvailable()) GTEST_SKIP() << "a GPU is present: CUPTI is used";
  Profiler prof;  // default: CUPTI when available
  prof.Start();
  { Range r("host_only"); }
  const ProfileResult r = prof.Stop();
  EXPECT_FALSE(r.device_available);
  EXPECT_EQ(r.device_status.rfind("device activity unavailable: ", 0), 0u) << r.device_status;
  EXPECT_EQ(Named(r, "host_only").size(), 1u);
  EXPECT_NE(FormatOpTable(BuildOpTable(r)).find("device activity unavailable"), std::string::npos);
}

// On the GPU (CUPTI): the GeGLU MLP's kernels per step and their names are what the compile
// tests assert (eager: 3 GEMMs + gelu + mul; compiled: 3, one of them the fused gelu·mul, or on
// an sm_90 GPU 2, gelu·mul inside the first GEMM), and
// device times are positive and add up to no more than the recorded steps' wall time.
TEST(ProfilerCupti, MlpKernelsMatchTheFusionTests) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(21);
  GeGLUMLP mlp(768, 3072, gen, ModuleOptions{DType::kBFloat16, CUDA(0)});
  const Tensor x = randn({8192, 768}, gen, DType::kBFloat16, CUDA(0));
  CompileOptions frozen;
  frozen.freeze_weights = true;  // GEMM merge: gate and up in one GEMM
  CompiledFn compiled = compile(mlp, x, frozen);
  WaitForBackgroundCompiles();  // the Hopper GEMM, not the fallback its first calls may run
  const int steps = 3;
  auto profile = [&](const std::function<void()>& step) {
    step();  // warm: kernels compiled, GEMMs planned
    cuda::Synchronize();
    ProfilerOptions o;
    o.active = steps;
    Profiler p(std::move(o));
    p.Start();
    for (int i = 0; i < steps; ++i) {
      step();
      cuda::Synchronize();
      p.Step();
    }
    return p.Stop();
  };
  const ProfileResult eager = profile([&] { mlp(x); });
  const ProfileResult comp = profile([&] { compiled({x}); });
  for (const ProfileResult* r : {&eager, &comp}) {
    ASSERT_TRUE(r->device_available) << r->device_status;
    EXPECT_EQ(r->dropped_records, 0u);
    int64_t busy = 0, wall = 0;
    for (const TimeWindow& w : r->windows) wall += w.end_ns - w.start_ns;
    for (const DeviceRecord& d : r->device) {
      if (!d.is_activity()) continue;
      EXPECT_GT(d.duration_ns(), 0) << d.name;
      busy += d.duration_ns();
    }
    EXPECT_GT(busy, 0);
    EXPECT_LE(busy, wall);
  }
  auto kernels = [&](const ProfileResult& r) {
    std::map<std::string, int> names;
    int total = 0;
    for (const DeviceRecord& d : r.device) {
      if (d.kind != DeviceKind::kKernel) continue;
      ++names[d.name];
      ++total;
    }
    return std::make_pair(total, names);
  };
  const auto [eager_total, eager_names] = kernels(eager);
  const auto [comp_total, comp_names] = kernels(comp);
  EXPECT_EQ(eager_total, 5 * steps);
  EXPECT_EQ(comp_total, compiled.report({x}).kernels_per_step * steps);
  // On an sm_90 GPU the gemm family computes gelu(gate) * up in the merged GEMM's epilogue (two
  // kernels); elsewhere cuBLASLt's GEMM and a generated gelu·mul kernel follow each other.
  const bool sm90 = cuda::Props(0).major == 9 && cuda::Props(0).minor == 0;
  EXPECT_EQ(compiled.report({x}).kernels_per_step, sm90 ? 2 : 3);
  auto has = [](const std::map<std::string, int>& names, const std::string& part) {
    int n = 0;
    for (const auto& [name, count] : names) n += name.find(part) != std::string::npos ? count : 0;
    return n;
  };
  EXPECT_EQ(has(eager_names, "kiln_gelu_"), steps);
  EXPECT_EQ(has(eager_names, "kiln_mul_"), steps);
  EXPECT_EQ(has(comp_names, "gelu_mul_0"), sm90 ? 0 : steps);
  EXPECT_EQ(has(comp_names, "kiln_gemm_sm90_bf16"), sm90 ? steps : 0);
  EXPECT_EQ(has(comp_names, "kiln_gelu_") + has(comp_names, "kiln_mul_"), 0);
}

// Library start-up runs on a background thread from the device's first allocation
// (runtime/startup.h) and does host work only: a profile started at once shows the program's
// kernel and nothing of it.
TEST(ProfilerCupti, BackgroundStartupShowsNoKernel) {
  KILN_SKIP_WITHOUT_GPU();
  const Tensor x = ones({256}, DType::kFloat32, CUDA(0));
  ProfilerOptions o;
  o.active = 1;
  Profiler p(std::move(o));
  p.Start();
  const Tensor y = x + x;
  cuda::Synchronize();
  p.Step();
  const ProfileResult r = p.Stop();
  cuda::WaitForStartup();
  ASSERT_TRUE(r.device_available) << r.device_status;
  std::vector<std::string> kernels;
  for (const DeviceRecord& d : r.device) {
    if (d.kind == DeviceKind::kKernel) kernels.push_back(d.name);
  }
  ASSERT_EQ(kernels.size(), 1u) << "kernels: " << absl::StrJoin(kernels, ", ");
  EXPECT_NE(kernels[0].find("add"), std::string::npos) << kernels[0];
}

TEST(ProfilerDevice, SourceThatFailsToStart) {
  FakeActivitySource* fake = nullptr;
  Profiler prof(WithFake(&fake));
  fake->set_start_status(absl::UnavailableError("CUPTI_ERROR_NOT_INITIALIZED"));
  prof.Start();
  { Range r("still_recorded"); }
  const ProfileResult r = prof.Stop();
  EXPECT_EQ(r.device_status, "device activity unavailable: CUPTI_ERROR_NOT_INITIALIZED");
  EXPECT_EQ(Named(r, "still_recorded").size(), 1u);
}

TEST(ProfilerTrace, ParsesBackAndEveryFlowLinksALaunchToAKernel) {
  FakeActivitySource* fake = nullptr;
  Profiler prof(WithFake(&fake));
  prof.Start();
  {
    Range odd("odd \"name\"\\ with\nnewline\x01");
    for (uint32_t c = 1; c <= 3; ++c) {
      Range op("op");
      FakeLaunch(fake, c, "void kernel<float>(float*)", 2 * kUs);
    }
  }
  const ProfileResult r = prof.Stop();
  const std::string path = ::testing::TempDir() + "/kiln_trace.json";
  ASSERT_TRUE(ExportChromeTrace(r, path).ok());
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  Json doc;
  ASSERT_NO_THROW(doc = JsonParser(text.str()).ParseDocument()) << text.str();
  std::map<double, const Json*> launches, kernels, starts, finishes;
  bool saw_odd = false;
  for (const Json& e : doc.at("traceEvents").arr()) {
    const std::string ph = e.at("ph").str();
    if (ph == "X" && e.at("cat").str() == "cuda_runtime") {
      launches[e.at("args").at("correlation").num()] = &e;
      EXPECT_EQ(e.at("pid").num(), 0);
    }
    if (ph == "X" && e.at("cat").str() == "kernel") {
      kernels[e.at("args").at("correlation").num()] = &e;
      EXPECT_EQ(e.at("pid").num(), 1);
      EXPECT_EQ(e.at("tid").num(), 7);  // the stream
    }
    if (ph == "s") starts[e.at("id").num()] = &e;
    if (ph == "f") finishes[e.at("id").num()] = &e;
    if (ph == "X") saw_odd |= e.at("name").str() == "odd \"name\"\\ with\nnewline\x01";
  }
  EXPECT_TRUE(saw_odd);
  EXPECT_EQ(launches.size(), 3u);
  EXPECT_EQ(starts.size(), 3u);
  EXPECT_EQ(finishes.size(), 3u);
  for (const auto& [id, s] : starts) {
    ASSERT_TRUE(finishes.count(id)) << id;
    ASSERT_TRUE(launches.count(id) && kernels.count(id)) << id;
    EXPECT_EQ(s->at("cat").str(), "ac2g");
    EXPECT_EQ(s->at("tid").num(), launches[id]->at("tid").num());
    EXPECT_EQ(s->at("ts").num(), launches[id]->at("ts").num());
    EXPECT_EQ(finishes[id]->at("ts").num(), kernels[id]->at("ts").num());
    EXPECT_EQ(finishes[id]->at("pid").num(), 1);
  }
  std::remove(path.c_str());
}

TEST(ProfilerTrace, BadPathIsAnError) {
  EXPECT_FALSE(ExportChromeTrace(SyntheticResult(), "/nonexistent-dir/x/trace.json").ok());
}

// ---- kernel table ----

TEST(ProfilerKernelTable, GroupsKernelsAndComputesThroughput) {
  ProfileResult r = SyntheticResult();
  r.device[1].grid[0] = 64;  // the two "kA" calls differ in grid
  KernelTableOptions o;
  o.work["A"] = Work{.bytes = 1e6, .flops = 2e6};
  o.peak_bytes_per_s = 1e12;
  const std::vector<KernelRow> rows = BuildKernelTable(r, o);
  ASSERT_EQ(rows.size(), 3u);
  const KernelRow& ka = rows[0];  // 7 us, the largest
  EXPECT_EQ(ka.name, "kA");
  EXPECT_EQ(ka.op, "A");
  EXPECT_EQ(ka.calls, 2);
  EXPECT_DOUBLE_EQ(ka.avg_us(), 3.5);
  EXPECT_TRUE(ka.varied_launch);
  EXPECT_DOUBLE_EQ(ka.bytes_per_s, 2e6 / 7e-6);
  EXPECT_DOUBLE_EQ(ka.flops_per_s, 4e6 / 7e-6);
  EXPECT_EQ(rows[1].name, "kB");
  EXPECT_EQ(rows[1].bytes_per_s, 0);
  EXPECT_EQ(rows[2].op, "");  // the stray kernel
  const std::string text = FormatKernelTable(rows, o);
  EXPECT_NE(text.find("GB/s"), std::string::npos) << text;
  EXPECT_NE(text.find("(29%)"), std::string::npos) << text;  // 285.7 GB/s of 1 TB/s
}

// ---- eager vs compiled ----

ProfileResult ModeResult(int kernels, int64_t kernel_us, int64_t step_us, int64_t host_us,
                         int steps) {
  ProfileResult r;
  r.device_available = true;
  r.steps_recorded = steps;
  for (int s = 0; s < steps; ++s) {
    const int64_t t0 = s * step_us;
    r.windows.push_back({t0 * kUs, (t0 + step_us) * kUs});
    r.host.push_back(Event("op", EventKind::kOp, t0, t0 + host_us, s + 1));
    for (int k = 0; k < kernels; ++k) {  // back to back, the first two overlapping by 1 us
      const int64_t start = t0 + k * kernel_us - (k == 1 ? 1 : 0);
      r.device.push_back(Kernel("k", s + 1, start, start + kernel_us));
    }
  }
  SortAndNest(r.host);
  return r;
}

TEST(ProfilerCompare, SummariesAndReport) {
  const ModeSummary eager = Summarize("eager", ModeResult(6, 10, 100, 80, 4), 4, 3 << 20);
  const ModeSummary compiled = Summarize("compiled", ModeResult(3, 10, 50, 20, 4), 0, 2 << 20);
  EXPECT_DOUBLE_EQ(eager.kernels_per_step, 6);
  EXPECT_DOUBLE_EQ(eager.host_us_per_step, 80);
  EXPECT_DOUBLE_EQ(eager.wall_us_per_step, 100);
  EXPECT_DOUBLE_EQ(eager.device_busy_us_per_step, 59);  // the overlap counts once
  EXPECT_DOUBLE_EQ(eager.idle_share, 1 - 59.0 / 100);
  EXPECT_DOUBLE_EQ(compiled.kernels_per_step, 3);
  EXPECT_DOUBLE_EQ(compiled.device_busy_us_per_step, 29);
  CompareDetails details;
  details.fused.push_back({.kernel = "fused_gelu_mul",
                           .eager_ops = {"gelu", "mul"},
                           .launches_saved = 1,
                           .device_us_before = 20,
                           .device_us_after = 11,
                           .intermediate_bytes_saved = 1 << 20});
  details.has_compile_cost = true;
  details.compile.nvrtc_ms = 120;
  details.compile.kernels = 2;
  details.compile.cache.compiles = 2;
  details.compile.cache.disk_hits = 1;
  const std::string text = CompareReport(eager, {compiled}, details);
  EXPECT_NE(text.find("compiled"), std::string::npos) << text;
  EXPECT_NE(text.find("2.00x"), std::string::npos) << text;  // wall 100 -> 50
  EXPECT_NE(text.find("4.00x"), std::string::npos) << text;  // host 80 -> 20
  EXPECT_NE(text.find("gelu + mul"), std::string::npos) << text;
  EXPECT_NE(text.find("NVRTC 120.0 ms for 2 kernels"), std::string::npos) << text;
  EXPECT_NE(text.find("2 misses"), std::string::npos) << text;
  // A CPU plan: no NVRTC figures that suggest compiles which never ran.
  CompareDetails cpu;
  cpu.has_compile_cost = true;
  cpu.compile.kernels = 1;
  const std::string cpu_text = CompareReport(eager, {compiled}, cpu);
  EXPECT_NE(cpu_text.find("1 fused kernels; no NVRTC compile"), std::string::npos) << cpu_text;
  EXPECT_EQ(cpu_text.find("ms/kernel"), std::string::npos) << cpu_text;
}

TEST(ProfilerCompare, DeviceTimeOfOpsAndKernels) {
  const ProfileResult r = SyntheticResult();
  EXPECT_DOUBLE_EQ(DeviceUsPerStepOfOps(r, {"A", "B"}), 12);
  EXPECT_DOUBLE_EQ(DeviceUsPerStepOfKernels(r, "kA", 2), 3.5);
}

// A run without a device (the CPU) shows wall and host time only: no kernel, device-time or
// peak-memory column, in the modes table or the fused-kernel table.
TEST(ProfilerCompare, HostOnlyModesLeaveTheDeviceColumnsOut) {
  ProfileResult r = ModeResult(0, 10, 100, 80, 2);
  r.device_available = false;
  const ModeSummary m = Summarize("eager", r);
  EXPECT_FALSE(m.has_device);
  CompareDetails details;
  details.fused.push_back({.kernel = "fused_gelu_mul", .eager_ops = {"gelu", "mul"}});
  const std::string text = CompareReport(m, {m}, details);
  for (const char* column : {"Kernels/step", "Device busy", "Device idle", "Peak MiB",
                             "Device us before", "Device us after", "n/a"}) {
    EXPECT_EQ(text.find(column), std::string::npos) << column << "\n" << text;
  }
  EXPECT_NE(text.find("Wall us/step"), std::string::npos) << text;
  EXPECT_NE(text.find("gelu + mul"), std::string::npos) << text;
  // With a device the columns are there.
  const ModeSummary gpu = Summarize("eager", ModeResult(6, 10, 100, 80, 4), 4, 3 << 20);
  EXPECT_NE(CompareReport(gpu, {}).find("Peak MiB"), std::string::npos);
}

// The report as one library call: a GeGLU-style function run eagerly and compiled on the CPU; the
// fused kernel is listed with the ops it replaced, the columns are the CPU's (no device ones), the
// JSON holds the same modes; on CUDA (when present) the device columns and a graph mode appear.
TEST(CompareEagerAndCompiled, OneCallReportsModesFusedKernelsAndCost) {
  for (Device device : {kCPU, CUDA(0)}) {
    if (device.is_cuda() && !cuda::IsAvailable()) continue;
    Generator gen(3);
    const Tensor x = to(randn({16, 64}, gen), device), u = to(randn({16, 64}, gen), device);
    auto fn = [](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{gelu(in[0] * 1.5 + 0.5, "tanh") * in[1]};
    };
    kiln::CompareOptions o;
    o.cuda_graphs = true;  // ignored on the CPU
    o.steps = 2;
    const kiln::ComparisonReport r = kiln::CompareEagerAndCompiled(fn, {x, u}, o);
    const bool gpu = device.is_cuda();
    EXPECT_EQ(r.eager.name, "eager");
    ASSERT_EQ(r.others.size(), gpu ? 2u : 1u);
    EXPECT_EQ(r.others[0].name, "compiled");
    EXPECT_GT(r.eager.wall_us_per_step, 0);
    ASSERT_EQ(r.details.fused.size(), 1u);
    const std::vector<std::string> ops = {"mul_scalar", "add_scalar", "gelu", "mul"};
    EXPECT_EQ(r.details.fused[0].eager_ops, ops);
    EXPECT_EQ(r.details.fused[0].launches_saved, 3);
    const std::string text = r.ToString();
    EXPECT_NE(text.find("gelu + mul"), std::string::npos) << text;
    EXPECT_EQ(text.find("Peak MiB") != std::string::npos, gpu) << text;
    EXPECT_EQ(text.find("n/a"), std::string::npos) << text;
    // Without device columns the report says why (a CPU run, even on a machine with a GPU).
    EXPECT_EQ(text.find("(no device columns: the inputs are on the CPU)") != std::string::npos,
              !gpu)
        << text;
    const std::string json = r.ToJson();
    EXPECT_EQ(json.front(), '{');
    EXPECT_EQ(std::count(json.begin(), json.end(), '{'), std::count(json.begin(), json.end(), '}'));
    EXPECT_NE(json.find(R"("mode":"compiled")"), std::string::npos) << json;
    EXPECT_NE(json.find(R"("replaces":["mul_scalar","add_scalar","gelu","mul"])"),
              std::string::npos)
        << json;
    EXPECT_EQ(json.find("peak_bytes") != std::string::npos, gpu) << json;
  }
}

TEST(CompareEagerAndCompiled, StepsWithoutACompiledStepAreRefused) {
  const Tensor x = ones({2, 2});
  const CompiledFn f =
      compile([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] + 1.0}; }, {x});
  const std::string e = ErrorOf([&] { kiln::CompareSteps({.eager = [] {}}, f, {x}); });
  EXPECT_NE(e.find("CompareSteps: needs an eager and a compiled step"), std::string::npos) << e;
}

// The public device timer: laps on the host clock on the CPU, misuse named in the error.
TEST(DeviceTimer, CpuLapsAccumulateAndMisuseIsAnError) {
  DeviceTimer timer;
  EXPECT_NE(ErrorOf([&] { timer.MedianMs(); }).find("no lap was timed"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { timer.Stop(); }).find("no lap is running"), std::string::npos);
  for (int ms : {20, 5, 10}) {
    timer.Start();
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    timer.Stop();
  }
  ASSERT_EQ(timer.laps(), 3);
  const std::vector<double> laps = timer.LapsMs();
  EXPECT_GE(laps[0], 19.5);
  EXPECT_GE(laps[1], 4.5);
  EXPECT_LT(laps[1], laps[0]);
  EXPECT_GE(timer.MedianMs(), 9.5);
  EXPECT_LT(timer.MedianMs(), laps[0]);
  EXPECT_NEAR(timer.TotalMs(), laps[0] + laps[1] + laps[2], 1e-9);
  timer.Start();
  EXPECT_NE(ErrorOf([&] { timer.Start(); }).find("already running"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { timer.Reset(); }).find("a lap is running"), std::string::npos);
  timer.Stop();
  timer.Reset();
  EXPECT_EQ(timer.laps(), 0);
  EXPECT_NE(ErrorOf([] { DeviceTimer t(kMeta); }).find("meta device"), std::string::npos);
  if (!cuda::IsAvailable()) {
    EXPECT_NE(ErrorOf([] { DeviceTimer t(CUDA(0)); }).find("no CUDA device"), std::string::npos);
  }
}

#if KILN_WITH_CUDA  // the delay kernel is the CUDA backend's
// On CUDA the timer times the device: a 200 µs device delay queued behind a 20 ms one measures
// about 200 µs, although the host recorded both events within microseconds of each other.
TEST(DeviceTimer, CudaLapsAreDeviceTime) {
  KILN_SKIP_WITHOUT_GPU();
  DeviceTimer timer(CUDA(0));
  KILN_CUDA_CHECK(cuda_kernels::DeviceDelay(20'000'000, cuda::CurrentStream()));
  timer.Start();
  KILN_CUDA_CHECK(cuda_kernels::DeviceDelay(200'000, cuda::CurrentStream()));
  timer.Stop();
  const double ms = timer.MedianMs();  // waits for the stop event
  EXPECT_GE(ms, 0.19);
  EXPECT_LT(ms, 5.0) << "the 20 ms delay before Start is not in the lap";
}
#endif

}  // namespace
}  // namespace kiln::profiler
