// Shared plumbing of the example programs: flag parsing with a usage message, running a step
// eagerly or compiled, timing (host enqueue time and device time with CUDA events, or wall time
// on the CPU), and the answer check between the two modes.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "codegen/compare.h"
#include "codegen/compile.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "profiler/profiler.h"
#include "profiler/report.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "runtime/settings.h"
#include "runtime/status.h"

namespace examples {

using kiln::Tensor;

// --name value or --name=value flags with defaults; --flag alone for booleans. Unknown flags are
// usage errors; --help lists every flag with its default and the KILN_* variables.
class Flags {
 public:
  Flags(std::string program, std::string usage)
      : program_(std::move(program)), usage_(std::move(usage)) {}
  void Define(const std::string& name, const std::string& default_value, bool boolean = false) {
    values_[name] = default_value;
    if (boolean) booleans_.push_back(name);
  }
  void Parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") Help();
      const size_t eq = a.find('=');
      const std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (a.rfind("--", 0) != 0 || !values_.count(name)) Usage("unknown flag " + a);
      const bool boolean = std::find(booleans_.begin(), booleans_.end(), name) != booleans_.end();
      if (eq != std::string::npos) {
        const std::string v = a.substr(eq + 1);
        if (boolean && v != "0" && v != "1") Usage("--" + name + " takes no value (or =0/=1)");
        values_[name] = v;
      } else if (boolean) {
        values_[name] = "1";
      } else if (i + 1 < argc) {
        values_[name] = argv[++i];
      } else {
        Usage("missing value for " + a);
      }
    }
  }
  // Every flag with its default, then the environment variables, and exits 0.
  [[noreturn]] void Help() const {
    std::printf("usage: %s %s\n\nflags (default in brackets; booleans take no value):\n",
                program_.c_str(), usage_.c_str());
    for (const auto& [name, value] : defaults_or_values()) {
      const bool boolean = std::find(booleans_.begin(), booleans_.end(), name) != booleans_.end();
      std::printf("  --%-16s %s\n", name.c_str(),
                  boolean ? "(boolean)" : ("[" + (value.empty() ? "none" : value) + "]").c_str());
    }
    std::printf("\nenvironment:\n");
    for (const kiln::Setting& s : kiln::Settings()) std::printf("  %-22s %s\n", s.name, s.meaning);
    std::exit(0);
  }
  std::string Str(const std::string& name) const { return values_.at(name); }
  bool Bool(const std::string& name) const { return values_.at(name) == "1"; }
  bool Given(const std::string& name) const { return !values_.at(name).empty(); }
  bool Defined(const std::string& name) const { return values_.count(name) > 0; }
  int64_t Int(const std::string& name) const {
    const std::string& s = values_.at(name);
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v <= 0) Usage("--" + name + " must be a positive integer");
    return v;
  }
  [[noreturn]] void Usage(const std::string& why) const {
    if (!why.empty()) std::fprintf(stderr, "error: %s\n", why.c_str());
    std::fprintf(stderr, "usage: %s %s\n", program_.c_str(), usage_.c_str());
    std::exit(why.empty() ? 0 : 2);
  }

 private:
  const std::map<std::string, std::string>& defaults_or_values() const { return values_; }

  std::string program_, usage_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> booleans_;
};

inline kiln::DType ParseDType(const Flags& f, const std::string& s) {
  if (s == "float32") return kiln::DType::kFloat32;
  if (s == "float16") return kiln::DType::kFloat16;
  if (s == "bfloat16") return kiln::DType::kBFloat16;
  f.Usage("--dtype must be float32, float16 or bfloat16");
}

inline kiln::Device ParseDeviceFlag(const Flags& f) {
  try {
    const kiln::Device d = kiln::ParseDevice(f.Str("device"));
    if (d.is_cuda() && !kiln::cuda::IsAvailable()) f.Usage("--device cuda: no CUDA device here");
    return d;
  } catch (const kiln::Error& e) {
    f.Usage(e.what());
  }
}

// The common flags whose values are checked before any work (DefineCommonFlags): --sort names a
// key of the op table, --warmup and --iters are integers.
inline void CheckCommonFlags(const Flags& f) {
  if (!f.Defined("warmup")) return;  // an example without them (06_llama)
  kiln::profiler::SortKey key;
  if (f.Given("sort") && !kiln::profiler::ParseSortKey(f.Str("sort"), &key)) {
    f.Usage("--sort: unknown key " + f.Str("sort"));
  }
  f.Int("warmup");
  f.Int("iters");
}

// --device (default: cuda when a GPU is present, else cpu) and --dtype (default: bfloat16 on a
// GPU, float32 on the CPU), as the series runs them, after the other common flags' check.
inline std::pair<kiln::Device, kiln::DType> DeviceAndDType(Flags& f) {
  CheckCommonFlags(f);
  if (!f.Given("device")) f.Define("device", kiln::cuda::IsAvailable() ? "cuda" : "cpu");
  const kiln::Device device = ParseDeviceFlag(f);
  const std::string dtype = f.Given("dtype")   ? f.Str("dtype")
                            : device.is_cuda() ? "bfloat16"
                                               : "float32";
  return {device, ParseDType(f, dtype)};
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Timing {
  double host_us = 0;    // enqueue time of one step (the whole step on the CPU)
  double device_us = 0;  // CUDA events around one step (0 on the CPU)
  double wall_us = 0;    // sync, step, sync
};

// Times `step` after `warmup` untimed runs; medians over `iters`.
inline Timing TimeSteps(const std::function<void()>& step, bool gpu, int warmup, int iters) {
  using Clock = std::chrono::steady_clock;
  auto us = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  for (int i = 0; i < warmup; ++i) step();
  if (gpu) kiln::cuda::Synchronize();
  std::vector<double> host, device, wall;
  for (int i = 0; i < iters; ++i) {
    if (gpu) {
      kiln::cuda::Event start, stop;
      kiln::cuda::Synchronize();
      const auto t0 = Clock::now();
      start.Record(kiln::cuda::CurrentStream());
      step();
      stop.Record(kiln::cuda::CurrentStream());
      const auto t1 = Clock::now();
      stop.Synchronize();
      const auto t2 = Clock::now();
      host.push_back(us(t0, t1));
      wall.push_back(us(t0, t2));
      device.push_back(stop.ElapsedMs(start) * 1000.0);
    } else {
      const auto t0 = Clock::now();
      step();
      const auto t1 = Clock::now();
      host.push_back(us(t0, t1));
      wall.push_back(us(t0, t1));
    }
  }
  return {Median(host), Median(device), Median(wall)};
}

// Max |a - b| over all elements of two tensor lists, with the max |b| for scale.
inline std::pair<double, double> MaxError(const std::vector<Tensor>& a,
                                          const std::vector<Tensor>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto va = kiln::to_vector(a[i]), vb = kiln::to_vector(b[i]);
    for (size_t j = 0; j < va.size(); ++j) {
      if (std::isinf(vb[j]) && va[j] == vb[j]) continue;
      err = std::max(err, std::fabs(va[j] - vb[j]));
      scale = std::max(scale, std::fabs(vb[j]));
    }
  }
  return {err, scale};
}

inline double Tolerance(kiln::DType t) { return t == kiln::DType::kFloat32 ? 1e-4 : 4e-2; }

inline void PrintTiming(const char* label, const Timing& t, bool gpu) {
  if (gpu) {
    std::printf("%-22s host %9.1f us/step   device %9.1f us/step   wall %9.1f us/step\n", label,
                t.host_us, t.device_us, t.wall_us);
  } else {
    std::printf("%-22s %9.1f us/step (CPU wall)\n", label, t.wall_us);
  }
}

}  // namespace examples

namespace examples {

// One example workload: a function over inputs, run eagerly and compiled.
struct Example {
  std::string title;
  kiln::ir::TensorFn fn;
  std::vector<Tensor> inputs;
  double flops = 0;  // per step, for a FLOP/s figure (0 = none)
  // Names of the weights fn captures (a module's named_tensors()): the dumps and the explain log
  // call them "gate.weight", not "const0" (CompileOptions::tensor_names).
  std::function<std::vector<std::pair<std::string, Tensor>>()> tensor_names;
};

struct ModeResult {
  Timing timing;
  double peak_mib = 0;
  int kernels = 0;  // kernel steps per call of the compiled plan (eager: not counted here)
};

struct Results {
  ModeResult eager, compiled, graphed;
  std::vector<std::string> explain;  // the compiled plan's explain log (why fused or not)
  bool ran_compiled = false, ran_graphed = false;
  double cold_first_step_us = 0;
};

inline void DefineCommonFlags(Flags& f) {
  f.Define("device", "");
  f.Define("dtype", "");
  f.Define("compile", "0", true);
  f.Define("cuda-graphs", "0", true);
  f.Define("dump", "");
  f.Define("warmup", "3");
  f.Define("iters", "10");
  f.Define("profile", "0", true);
  f.Define("sort", "");
  f.Define("trace", "");
  f.Define("compare", "0", true);
}

// Profiles `steps` calls of `step` with the series' schedule (wait 1, warm-up 1, active 3).
inline kiln::profiler::ProfileResult Profile(const std::function<void()>& step, bool gpu) {
  kiln::profiler::Profiler::Options o;
  o.wait = 1;
  o.warmup = 1;
  o.active = 3;
  o.record_shapes = true;
  kiln::profiler::Profiler p(std::move(o));
  p.Start();
  for (int i = 0; i < 5; ++i) {
    step();
    if (gpu) kiln::cuda::Synchronize();
    p.Step();
  }
  return p.Stop();
}

inline void PrintTables(const Flags& f, const char* mode, const kiln::profiler::ProfileResult& r,
                        bool gpu) {
  namespace prof = kiln::profiler;
  prof::OpTableOptions o;
  o.sort = gpu ? prof::SortKey::kTotalDevice : prof::SortKey::kTotalHost;
  if (f.Given("sort") && !prof::ParseSortKey(f.Str("sort"), &o.sort)) {
    f.Usage("--sort: unknown key " + f.Str("sort"));
  }
  o.limit = 15;
  std::printf("\n-- %s: op table (%d recorded steps) --\n%s", mode, r.steps_recorded,
              prof::FormatOpTable(prof::BuildOpTable(r), o).c_str());
  if (r.device_available) {
    std::printf("\n-- %s: kernel table --\n%s", mode,
                prof::FormatKernelTable(prof::BuildKernelTable(r)).c_str());
  }
}

// Writes the trace; a path it cannot write ends the program with an error (exit code 1).
inline void WriteTrace(const std::string& path, const kiln::profiler::ProfileResult& r) {
  const absl::Status s = kiln::profiler::ExportChromeTrace(r, path);
  if (!s.ok()) {
    std::fprintf(stderr, "error: --trace %s: %s\n", path.c_str(), std::string(s.message()).c_str());
    std::exit(1);
  }
  std::printf("trace: %s (open in ui.perfetto.dev)\n", path.c_str());
}

// --profile / --trace / --compare for one example. --compare is the library's report
// (kiln::CompareSteps, codegen/compare.h) over the example's steps; `compiled_fn` is the function
// behind the compiled step and `inputs` its inputs.
inline void ProfileExample(const Flags& f, const std::function<void()>& eager_step,
                           const std::function<void()>& compiled_step,
                           const std::function<void()>& graphed_step,
                           const kiln::CompiledFn& compiled_fn,
                           const std::vector<kiln::Tensor>& inputs, bool gpu) {
  namespace prof = kiln::profiler;
  const bool want_compiled = f.Bool("compile") || f.Bool("compare");
  if (f.Bool("profile") || f.Given("trace")) {
    const prof::ProfileResult eager = Profile(eager_step, gpu);
    if (f.Bool("profile")) PrintTables(f, "eager", eager, gpu);
    prof::ProfileResult comp, graph;
    if (want_compiled) {
      comp = Profile(compiled_step, gpu);
      if (f.Bool("profile")) PrintTables(f, "compiled", comp, gpu);
    }
    const bool want_graph = want_compiled && graphed_step;
    if (want_graph) {  // the replay's kernels, and the device's idle time between them
      graph = Profile(graphed_step, gpu);
      if (f.Bool("profile")) PrintTables(f, "compiled+graph", graph, gpu);
    }
    if (f.Given("trace")) {
      WriteTrace(f.Str("trace"), eager);
      if (want_compiled) WriteTrace(f.Str("trace") + ".compiled.json", comp);
      if (want_graph) WriteTrace(f.Str("trace") + ".graph.json", graph);
    }
  }
  if (f.Bool("compare")) {
    const kiln::ComparisonReport r =
        kiln::CompareSteps({eager_step, compiled_step, graphed_step}, compiled_fn, inputs);
    std::printf("\n-- eager vs compiled --\n%s", r.ToString().c_str());
  }
}

inline double PeakMiB(bool gpu, const std::function<void()>& step) {
  if (!gpu) return 0;
  kiln::cuda::Synchronize();
  kiln::cuda::ResetPeakMemoryStats();
  const size_t base = kiln::cuda::GetMemoryStats().allocated;
  step();
  kiln::cuda::Synchronize();
  return (kiln::cuda::GetMemoryStats().peak_allocated - base) / double(1 << 20);
}

// Prints the answer check (eager vs compiled), then the timings; returns the exit code.
inline int RunExample(const Flags& f, const Example& ex, Results* results) {
  const bool gpu = ex.inputs[0].device().is_cuda();
  const int warmup = static_cast<int>(f.Int("warmup")), iters = static_cast<int>(f.Int("iters"));
  std::printf("== %s ==\n", ex.title.c_str());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Tensor> eager_out = ex.fn(ex.inputs);
  if (gpu) kiln::cuda::Synchronize();
  results->cold_first_step_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  kiln::CompileOptions options;
  options.mode = kiln::CompileOptions::Mode::kCompiled;
  // The series' models never change their weights (or masks) after compiling: freezing lets
  // the compiler fold them (GEMM merge, the causal mask read at compile time).
  options.freeze_weights = true;
  options.dump_dir = f.Str("dump");
  options.tensor_names = ex.tensor_names;
  kiln::CompiledFn compiled = kiln::compile(ex.fn, ex.inputs, options);
  // A kernel no cache had may still be compiling (its plan's calls run a fallback meanwhile):
  // what is checked, profiled and timed below is the plan as it runs from then on.
  kiln::WaitForBackgroundCompiles();
  const auto [err, scale] = MaxError(compiled(ex.inputs), eager_out);
  const bool ok = err <= Tolerance(ex.inputs[0].dtype()) * std::max(1.0, scale);
  bool ok_graph = true;
  std::printf("check: max |compiled - eager| = %.3g (max |eager| %.3g) %s\n", err, scale,
              ok ? "OK" : "MISMATCH");
  const auto& report = compiled.report(ex.inputs);
  results->compiled.kernels = report.kernels_per_step;
  results->explain = report.explain;
  auto eager_step = [&] { ex.fn(ex.inputs); };
  auto compiled_step = [&] { compiled(ex.inputs); };
  // --cuda-graphs: a second compiled function that replays its plan as a CUDA graph.
  std::optional<kiln::CompiledFn> graphed;
  std::function<void()> graphed_step;
  if (f.Bool("cuda-graphs") && !gpu) {
    std::printf("note: --cuda-graphs applies to CUDA devices only; not run on %s\n",
                ex.inputs[0].device().str().c_str());
  }
  if (f.Bool("cuda-graphs") && gpu) {
    kiln::CompileOptions g = options;
    g.cuda_graphs = true;
    graphed.emplace(kiln::compile(ex.fn, ex.inputs, g));
    graphed->operator()(ex.inputs);  // the first call captures
    const auto [gerr, gscale] = MaxError((*graphed)(ex.inputs), eager_out);
    const bool gok = gerr <= Tolerance(ex.inputs[0].dtype()) * std::max(1.0, gscale);
    std::printf("check: max |compiled+graph - eager| = %.3g %s (CUDA graph %s)\n", gerr,
                gok ? "OK" : "MISMATCH", graphed->report(ex.inputs).cuda_graph.c_str());
    ok_graph = gok;
    graphed_step = [&] { (*graphed)(ex.inputs); };
  }
  results->eager.timing = TimeSteps(eager_step, gpu, warmup, iters);
  results->eager.peak_mib = PeakMiB(gpu, eager_step);
  PrintTiming("eager", results->eager.timing, gpu);
  if (f.Bool("compile")) {
    results->ran_compiled = true;
    results->compiled.timing = TimeSteps(compiled_step, gpu, warmup, iters);
    results->compiled.peak_mib = PeakMiB(gpu, compiled_step);
    PrintTiming("compiled", results->compiled.timing, gpu);
    if (graphed_step) {
      results->ran_graphed = true;
      results->graphed.timing = TimeSteps(graphed_step, gpu, warmup, iters);
      PrintTiming("compiled+graph", results->graphed.timing, gpu);
    }
    std::printf("compiled plan: %d kernels per step (%d fused), compile %.1f ms (NVRTC %.1f ms)\n",
                report.kernels_per_step, report.fused_kernels, report.compile_ms, report.nvrtc_ms);
    std::printf("memory plan: %.2f MiB of intermediates alive at peak (%.2f MiB without reuse)\n",
                report.planned_peak_bytes / double(1 << 20),
                report.total_intermediate_bytes / double(1 << 20));
  }
  ProfileExample(f, eager_step, compiled_step, graphed_step, compiled, ex.inputs, gpu);
  if (gpu) {
    std::printf("peak device memory per step: eager %.1f MiB", results->eager.peak_mib);
    if (results->ran_compiled) std::printf(", compiled %.1f MiB", results->compiled.peak_mib);
    std::printf("\n");
  }
  if (ex.flops > 0) {
    const double us = gpu ? results->eager.timing.device_us : results->eager.timing.wall_us;
    if (gpu) {
      std::printf("eager throughput: %.1f TFLOP/s\n", ex.flops / us / 1e6);
    } else {
      std::printf("eager throughput: %.1f GFLOP/s\n", ex.flops / us / 1e3);
    }
  }
  if (!f.Str("dump").empty()) std::printf("dump: %s/index.md\n", f.Str("dump").c_str());
  return ok && ok_graph ? 0 : 1;
}

}  // namespace examples
