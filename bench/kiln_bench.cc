// kiln_bench: kiln's side of the benchmark. bench/torch_baseline.py and
// bench/libtorch_baseline.cc are its twins (same workload keys, same method, same JSON rows);
// bench/compare.py puts the three side by side and ranks only rows whose correctness check
// passed. scripts/gpu-run drives all three in interleaved repetitions.
//
//   build/bench/kiln_bench --json kiln.json [--quick] [--reps 3] [--only mlp,block_2x256_d512]
//       [--check-dir DIR] [--sync-dir DIR] [--no-prequeue] [--no-kernels]
//   build/bench/kiln_bench --compile-latency        # one JSON line: compile + first call
//   build/bench/kiln_bench --write-check-sample DIR # CPU only: a known sample for the tests
//   build/bench/kiln_bench --list                   # workload/mode keys
//
// Workloads: bench/bench_workloads.h. Modes of each workload:
//   eager                   the ops one by one (attention also eager_inplace: masked_fill_)
//   compiled                kiln::compile of the step; weights are captured, so they become
//                           constants (constant folding, GEMM merge of gate/up)
//   compiled+graph          the same replayed as a CUDA graph (CompileOptions::cuda_graphs)
//   (compiled rows freeze the weights, CompileOptions::freeze_weights; the weights-as-inputs rows
//   pass them as inputs instead)
//   compiled_winputs        weights passed as inputs, GEMM merge off: no folding at all
//   compiled_winputs+graph  the same as a CUDA graph
// One input set per workload (seed 1234), built once; every row stays alive from set-up to the
// end so repetitions never recompile.
//
// Per row, at set-up: warm-up (compiles, captures), the outputs written for the correctness check
// (--check-dir: bench/bench_common.py's format; torch_baseline.py compares them with PyTorch), the
// kernel count (CUPTI, bench_harness.h), the plan's own count for compiled rows (plan_kernels,
// plan_memsets: must agree with the measured one), and the MiB a step allocates. Then
// --reps repetitions of the figures (bench_harness.h: device_us, latency_us, throughput_us,
// host_us), each repetition over every row; with --sync-dir each repetition waits for gpu-run's
// go (bench_harness.h LockStep), so kiln, PyTorch and libtorch take turns.
//
// JSON (--json PATH; rewritten after every repetition):
//   {"source": "kiln", "gpu", "date", "cuda_version", "quick", "repetitions", "method": {...},
//    "check_dir", "results": {"<workload>/<mode>": {"workload", "mode", "metric", "amount",
//    "device_us": [per repetition], "latency_us": [...], "throughput_us": [...],
//    "host_us": [...], "kernels", "memsets", "memcpys", "kernel_names": {name: per step},
//    "kernels_error", "plan_kernels", "plan_memsets", "cuda_graph", "peak_extra_mib",
//    "error"}}}   (missing values are null or absent)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_harness.h"
#include "bench/bench_workloads.h"
#include "codegen/compile.h"
#include "io/safetensors.h"
#include "models/export.h"
#include "ops/cuda/device_timing.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/cuda_api.h"
#include "runtime/nvrtc.h"
#include "runtime/startup.h"
#include "runtime/status.h"

namespace {

using kiln::Tensor;
using namespace kiln::bench;  // NOLINT: the driver of this one library
namespace cuda = kiln::cuda;

const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Row {
  std::string workload, mode, metric;
  double amount = 0;
  Step step;
  std::shared_ptr<kiln::CompiledFn> compiled;
  std::vector<Tensor> compiled_inputs;
  std::vector<Figures> reps;
  KernelCount count;
  double peak_extra_mib = kNaN;
  int plan_kernels = -1, plan_memsets = -1;
  std::string graph, error;
};

// The step of a compiled mode: weights captured (folded) or passed as inputs.
void MakeCompiledStep(const Workload& w, const std::shared_ptr<InputSet>& set, bool graph,
                      bool weights_as_inputs, Row* row) {
  kiln::CompileOptions o;
  o.mode = kiln::CompileOptions::Mode::kCompiled;
  o.cuda_graphs = graph;
  o.multi_output_fusion = !w.materialize_fanout;
  const StepFn fn = w.fn;
  const size_t n_acts = set->acts.size();
  kiln::ir::TensorFn traced;
  row->compiled_inputs = Tensors(set->acts);
  if (weights_as_inputs) {
    o.merge_gemms = false;
    for (const Tensor& t : Tensors(set->weights)) row->compiled_inputs.push_back(t);
    traced = [fn, n_acts](const std::vector<Tensor>& in) {
      return fn({in.begin(), in.begin() + n_acts}, {in.begin() + n_acts, in.end()});
    };
  } else {  // frozen weights, like torch.compile with freezing: GEMM merge may fold them
    o.freeze_weights = true;
    const std::vector<Tensor> weights = Tensors(set->weights);
    // Activations that are buffers (attention's causal mask) are frozen too: the compiler reads
    // the mask at compile time and finds it causal.
    const std::vector<int> frozen = w.frozen_acts;
    const std::vector<Tensor> acts = Tensors(set->acts);
    row->compiled_inputs.clear();
    for (size_t i = 0; i < acts.size(); ++i) {
      if (std::find(frozen.begin(), frozen.end(), int(i)) == frozen.end()) {
        row->compiled_inputs.push_back(acts[i]);
      }
    }
    traced = [fn, weights, frozen, acts](const std::vector<Tensor>& in) {
      std::vector<Tensor> full;
      for (size_t i = 0, next = 0; i < acts.size(); ++i) {
        const bool buffer = std::find(frozen.begin(), frozen.end(), int(i)) != frozen.end();
        full.push_back(buffer ? acts[i] : in[next++]);
      }
      return fn(full, weights);
    };
  }
  row->compiled =
      std::make_shared<kiln::CompiledFn>(kiln::compile(traced, row->compiled_inputs, o));
  kiln::WaitForBackgroundCompiles();  // timed as the plan runs from now on, not its fallback
  std::shared_ptr<kiln::CompiledFn> f = row->compiled;
  const std::vector<Tensor> inputs = row->compiled_inputs;
  row->step = [f, inputs, set] { return (*f)(inputs); };
}

std::vector<Row> RowsOf(const Workload& w, const std::shared_ptr<InputSet>& set) {
  std::vector<Row> rows;
  auto add = [&](const std::string& mode) -> Row& {
    rows.push_back(Row{w.key, mode, w.metric, w.amount});
    return rows.back();
  };
  auto eager = [set](const StepFn& fn) {
    return [fn, set, acts = Tensors(set->acts), weights = Tensors(set->weights)] {
      return fn(acts, weights);
    };
  };
  add("eager").step = eager(w.fn);
  for (const auto& [mode, fn] : w.extra_eager) add(mode).step = eager(fn);
  if (!w.compiled) return rows;
  add("compiled");
  add("compiled+graph");
  if (!set->weights.empty()) {
    add("compiled_winputs");
    add("compiled_winputs+graph");
  }
  return rows;
}

void SetUpRow(const Workload& w, const std::shared_ptr<InputSet>& set, const Config& cfg,
              CheckWriter& check, Row& row) {
  const bool graph = row.mode.find("+graph") != std::string::npos;
  if (row.mode.rfind("compiled", 0) == 0) {
    MakeCompiledStep(w, set, graph, row.mode.find("winputs") != std::string::npos, &row);
  }
  for (int i = 0; i < cfg.warmup; ++i) row.step();
  cuda::Synchronize();
  if (check.enabled() && !w.kiln_only && row.workload != "empty_launch") {
    Named inputs = set->acts;
    inputs.insert(inputs.end(), set->weights.begin(), set->weights.end());
    check.Write(row.workload, inputs, row.mode, row.step());
  }
  if (cfg.count_kernels) row.count = CountKernels(row.step, cfg.count_steps);
  if (!graph) row.peak_extra_mib = PeakExtraMiB(row.step);
  if (row.compiled) {
    const kiln::CompileReport& r = row.compiled->report(row.compiled_inputs);
    row.plan_kernels = r.kernels_per_step;
    row.plan_memsets = row.compiled->report(row.compiled_inputs).memsets_per_step;
    row.graph = graph ? r.cuda_graph : "";
  }
}

// Runs `what` on the row, turning an exception into the row's error (a failed row never ends
// the run).
template <typename F>
void Guarded(Row& row, F&& what) {
  try {
    what();
  } catch (const std::exception& e) {
    row.error = e.what();
    std::printf("  %s/%s FAILED: %s\n", row.workload.c_str(), row.mode.c_str(),
                row.error.substr(0, 300).c_str());
    cudaGetLastError();
  }
}

// Whether --only names the workload or one of its rows ("workload/mode").
bool Selected(const std::set<std::string>& only, const std::string& workload) {
  if (only.empty() || only.count(workload)) return true;
  for (const std::string& k : only) {
    if (k.rfind(workload + "/", 0) == 0) return true;
  }
  return false;
}

std::vector<Row> SetUp(const std::vector<Workload>& workloads, const std::set<std::string>& only,
                       const Config& cfg, CheckWriter& check) {
  std::vector<Row> all;
  for (const Workload& w : workloads) {
    if (!Selected(only, w.key)) continue;
    const auto t0 = std::chrono::steady_clock::now();
    std::shared_ptr<InputSet> set;
    std::vector<Row> rows;
    try {
      set = std::make_shared<InputSet>(w.build());
      rows = RowsOf(w, set);
    } catch (const std::exception& e) {
      std::printf("%s: building the inputs failed: %s\n", w.key.c_str(), e.what());
      continue;
    }
    for (Row& row : rows) {
      if (!only.empty() && !only.count(w.key) && !only.count(row.workload + "/" + row.mode)) {
        continue;
      }
      Guarded(row, [&] { SetUpRow(w, set, cfg, check, row); });
      all.push_back(std::move(row));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("set up %s (%.1f s)\n", w.key.c_str(), s);
    std::fflush(stdout);
  }
  return all;
}

// ---- Output -----------------------------------------------------------------------------------

std::vector<double> Figure(const Row& r, double Figures::*field) {
  std::vector<double> v;
  for (const Figures& f : r.reps) v.push_back(f.*field);
  return v;
}

std::string RowJson(const Row& r) {
  std::ostringstream o;
  o << "{\"workload\": " << JsonString(r.workload) << ", \"mode\": " << JsonString(r.mode)
    << ", \"metric\": " << (r.metric.empty() ? "null" : JsonString(r.metric))
    << ", \"amount\": " << JsonNumber(r.amount)
    << ", \"device_us\": " << JsonList(Figure(r, &Figures::device_us))
    << ", \"latency_us\": " << JsonList(Figure(r, &Figures::latency_us))
    << ", \"throughput_us\": " << JsonList(Figure(r, &Figures::throughput_us))
    << ", \"host_us\": " << JsonList(Figure(r, &Figures::host_us));
  const KernelCount& k = r.count;
  if (k.kernels >= 0) {
    o << ", \"kernels\": " << JsonNumber(k.kernels) << ", \"memsets\": " << JsonNumber(k.memsets)
      << ", \"memcpys\": " << JsonNumber(k.memcpys) << ", \"kernel_names\": {";
    bool first = true;
    for (const auto& [name, n] : k.names) {
      o << (first ? "" : ", ") << JsonString(name.substr(0, 300)) << ": " << JsonNumber(n);
      first = false;
    }
    o << "}";
  }
  if (!k.error.empty()) o << ", \"kernels_error\": " << JsonString(k.error);
  if (r.plan_kernels >= 0) {
    o << ", \"plan_kernels\": " << r.plan_kernels << ", \"plan_memsets\": " << r.plan_memsets;
  }
  if (!r.graph.empty()) o << ", \"cuda_graph\": " << JsonString(r.graph);
  o << ", \"peak_extra_mib\": " << JsonNumber(r.peak_extra_mib);
  if (!r.error.empty()) o << ", \"error\": " << JsonString(r.error.substr(0, 4000));
  o << "}";
  return o.str();
}

struct RunInfo {
  std::string gpu, cuda_version, check_dir;
  size_t l2 = 0;
};

std::string MethodJson(const Config& cfg) {
  std::ostringstream o;
  o << "{\"device_us\": "
    << JsonString(std::string("median CUDA-event time of single steps, L2 flushed before each") +
                  (cfg.prequeue ? ", GPU kept busy (steps queued behind a spin kernel)" : ""))
    << ", \"latency_us\": \"median of (L2 flush; sync; t0; step; sync; t1)\""
    << ", \"throughput_us\": \"(t1 - t0) / N over N back-to-back steps, one sync\""
    << ", \"host_us\": \"median time of the call that enqueues one step\""
    << ", \"kernels\": \"CUPTI kernel records of N steps / N (memsets, memcpys apart)\""
    << ", \"warmup\": " << cfg.warmup << ", \"latency_samples\": " << cfg.latency_samples
    << ", \"device_samples\": " << cfg.device_samples
    << ", \"throughput_steps\": " << cfg.throughput_steps
    << ", \"count_steps\": " << cfg.count_steps << ", \"l2_flush_bytes\": " << cfg.flush_bytes
    << "}";
  return o.str();
}

bool WriteJson(const std::string& path, const RunInfo& info, const Config& cfg,
               const std::vector<Row>& rows) {
  std::ostringstream o;
  o << "{\n  \"source\": \"kiln\",\n  \"gpu\": " << JsonString(info.gpu)
    << ",\n  \"date\": " << JsonString(IsoNow())
    << ",\n  \"cuda_version\": " << JsonString(info.cuda_version)
    << ",\n  \"quick\": " << (cfg.quick ? "true" : "false")
    << ",\n  \"repetitions\": " << cfg.repetitions << ",\n  \"l2_bytes\": " << info.l2
    << ",\n  \"check_dir\": " << (info.check_dir.empty() ? "null" : JsonString(info.check_dir))
    << ",\n  \"method\": " << MethodJson(cfg) << ",\n  \"results\": {";
  for (size_t i = 0; i < rows.size(); ++i) {
    o << (i ? ",\n" : "\n") << "    " << JsonString(rows[i].workload + "/" + rows[i].mode) << ": "
      << RowJson(rows[i]);
  }
  o << "\n  }\n}\n";
  std::ofstream f(path, std::ios::trunc);
  f << o.str();
  return f.good();
}

void PrintTable(const std::vector<Row>& rows) {
  std::printf("\n%-40s %11s %11s %11s %9s %8s %6s\n", "workload/mode", "device_us", "latency_us",
              "thruput_us", "host_us", "kernels", "plan");
  for (const Row& r : rows) {
    const std::string key = r.workload + "/" + r.mode;
    if (!r.error.empty()) {
      std::printf("%-40s ERROR: %s\n", key.c_str(), r.error.substr(0, 80).c_str());
      continue;
    }
    std::printf("%-40s %11.2f %11.2f %11.2f %9.2f %8.2f %6d\n", key.c_str(),
                Median(Figure(r, &Figures::device_us)), Median(Figure(r, &Figures::latency_us)),
                Median(Figure(r, &Figures::throughput_us)), Median(Figure(r, &Figures::host_us)),
                r.count.kernels, r.plan_kernels);
  }
  std::fflush(stdout);
}

// ---- Modes of the program besides the benchmark ------------------------------------------------

// --compile-latency: the MLP's compile to first result, broken down, in one JSON line. `process_t0`
// is main()'s start: process start to first result adds the CUDA context, the weights' set-up and
// library start-up to the compile.
int CompileLatency(std::chrono::steady_clock::time_point process_t0) {
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  const auto context_t0 = Clock::now();
  KILN_CUDA_CHECK(cudaFree(nullptr));  // the CUDA context (if nothing made it yet)
  const double context_ms = ms_since(context_t0);
  const auto setup_t0 = Clock::now();
  kiln::Generator gen(7);
  kiln::GeGLUMLP mlp(768, 3072, gen, kiln::ModuleOptions{kiln::DType::kBFloat16, kiln::CUDA()});
  const Tensor x = kiln::randn({8192, 768}, gen, kiln::DType::kBFloat16, kiln::CUDA());
  cuda::Synchronize();
  const double setup_ms = ms_since(setup_t0);
  const auto t0 = Clock::now();
  kiln::CompileOptions frozen;
  frozen.freeze_weights = true;
  kiln::CompiledFn f = kiln::compile(mlp, x, frozen);
  f({x});
  cuda::Synchronize();
  const double ms = ms_since(t0);
  const double process_ms = ms_since(process_t0);
  // Kernels left compiling in the background (the first calls ran their fallback): when the plan
  // runs its own kernels, from the compile call.
  kiln::WaitForBackgroundCompiles();
  const double final_kernels_ms = ms_since(t0);
  f({x});  // the first call with them (a kernel's module loads)
  cuda::Synchronize();
  const auto second_t0 = Clock::now();
  f({x});  // the steady state the first call's one-time costs are measured against
  cuda::Synchronize();
  const double second_ms = ms_since(second_t0);
  const kiln::CompileReport& r = f.report({x});
  const kiln::cuda::KernelCacheStats c = kiln::cuda::GetKernelCacheStats();
  std::printf(
      "{\"compile_ms\": %.2f, \"process_ms\": %.2f, \"context_ms\": %.2f, \"setup_ms\": %.2f, "
      "\"compile_report_ms\": %.2f, \"trace_ms\": %.2f, \"passes_ms\": %.2f, "
      "\"lowering_ms\": %.2f, \"nvrtc_ms\": %.2f, \"nvrtc_compiles\": %lld, \"disk_hits\": %lld, "
      "\"choices_ms\": %.2f, \"choices_timed\": %d, \"choices_stored\": %d, "
      "\"library_startup_ms\": %.2f, \"background_startup_ms\": %.2f, "
      "\"background_compiles\": %d, \"background_compile_ms\": %.2f, "
      "\"final_kernels_ms\": %.2f, "
      "\"first_call_ms\": %.2f, \"second_call_ms\": %.2f, \"cache_dir\": %s}\n",
      ms, process_ms, context_ms, setup_ms, r.compile_ms, r.trace_ms, r.passes_ms, r.lowering_ms,
      r.nvrtc_ms, static_cast<long long>(c.compiles), static_cast<long long>(c.disk_hits),
      r.timing_ms, r.timed_choices, r.stored_choices,
      kiln::cuda_ops::GetOneTimeCosts().library_startup_ms, kiln::cuda::StartupMs(),
      r.background_compiles, c.background_ms, final_kernels_ms, ms - r.compile_ms, second_ms,
      JsonString(kiln::cuda::KernelCacheDir()).c_str());
  return 0;
}

// The MLP of --compile-latency (seeded: an exporting and a loading process make the same input).
struct LatencyMlp {
  kiln::Generator gen{7};
  kiln::GeGLUMLP mlp{768, 3072, gen, kiln::ModuleOptions{kiln::DType::kBFloat16, kiln::CUDA()}};
  Tensor x = kiln::randn({8192, 768}, gen, kiln::DType::kBFloat16, kiln::CUDA());
};

// --export-plan DIR: the MLP compiled (frozen weights) and exported (models/export.h), with its
// input and result in DIR/io.safetensors for --load-latency's check.
int ExportPlan(const std::string& dir) {
  LatencyMlp m;
  kiln::CompileOptions frozen;
  frozen.freeze_weights = true;
  const kiln::CompiledFn f = kiln::compile(m.mlp, m.x, frozen);
  kiln::WaitForBackgroundCompiles();
  kiln::Export(f, {m.x}, dir);
  kiln::save_safetensors(dir + "/io.safetensors", {{"x", m.x}, {"y", f({m.x})[0]}});
  std::printf("exported the MLP's plan to %s\n", dir.c_str());
  return 0;
}

// --load-latency DIR: process start to the first result of the exported MLP in this fresh
// process (context, loading the folder, building the plan, the first call), whether it equals
// the exporter's result bit for bit, and whether NVRTC was ever mapped, as one JSON line.
// The mapped files whose path holds "nvrtc" (NVRTC and its builtins), as a JSON list.
std::string NvrtcMappings() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> files;
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash != std::string::npos && line.find("nvrtc", slash) != std::string::npos) {
      files.insert(line.substr(slash));
    }
  }
  std::string json = "[";
  for (const std::string& f : files) json += (json.size() > 1 ? ", " : "") + JsonString(f);
  return json + "]";
}

int LoadLatency(const std::string& dir, std::chrono::steady_clock::time_point process_t0) {
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  const auto context_t0 = Clock::now();
  KILN_CUDA_CHECK(cudaFree(nullptr));
  const double context_ms = ms_since(context_t0);
  const kiln::SafetensorsFile io = kiln::SafetensorsFile::Open(dir + "/io.safetensors");
  const Tensor x = io.Load("x", kiln::CUDA());
  cuda::Synchronize();
  const std::string after_setup = NvrtcMappings();
  const auto t0 = Clock::now();
  const kiln::LoadedFn g = kiln::LoadCompiled(dir);
  const double load_ms = ms_since(t0);
  const std::string after_load = NvrtcMappings();
  const Tensor y = g({x})[0];
  cuda::Synchronize();
  const double first_ms = ms_since(t0), process_ms = ms_since(process_t0);
  const std::string after_first = NvrtcMappings();
  const auto second_t0 = Clock::now();
  g({x});
  cuda::Synchronize();
  const double second_ms = ms_since(second_t0);
  // Compared on the host: an eager op on the GPU would compile a kernel (and map NVRTC).
  const Tensor got = kiln::to(y, kiln::kCPU), want = io.Load("y");
  const bool identical =
      got.type() == want.type() &&
      std::memcmp(got.data_ptr(), want.data_ptr(), got.numel() * got.element_size()) == 0;
  std::printf(
      "{\"process_ms\": %.2f, \"context_ms\": %.2f, \"load_ms\": %.2f, "
      "\"load_to_first_result_ms\": %.2f, \"second_call_ms\": %.2f, \"kernels\": %d, "
      "\"identical\": %s, \"nvrtc_after_setup\": %s, \"nvrtc_after_load\": %s, "
      "\"nvrtc_after_first_call\": %s}\n",
      process_ms, context_ms, load_ms, first_ms, second_ms, g.kernels(),
      identical ? "true" : "false", after_setup.c_str(), after_load.c_str(), after_first.c_str());
  return identical ? 0 : 1;
}

// A known sample in the correctness-file format, on the CPU (bench/compare_test.py reads it
// back): inputs x bf16 [2, 3], mask bool [2, 2], w f32 [3]; mode "eager" outputs x and w * 2,
// mode "compiled+graph" outputs x.
int WriteCheckSample(const std::string& dir) {
  using kiln::DType;
  const Tensor x = kiln::from_vector({0.5, -1.25, 2, 3.5, -4, 1024}, {2, 3}, DType::kBFloat16);
  const Tensor mask = kiln::triu(kiln::ones({2, 2}, DType::kBool), 1);
  const Tensor w = kiln::from_vector({1, 2, 3}, {3}, DType::kFloat32);
  CheckWriter check(dir);
  const Named inputs = {{"x", x}, {"mask", mask}, {"w", w}};
  check.Write("sample", inputs, "eager", {x, w * 2.0});
  check.Write("sample", inputs, "compiled+graph",
              {kiln::transpose(kiln::transpose(x, 0, 1), 0, 1)});
  return 0;
}

void Usage(const char* argv0) {
  std::printf(
      "usage: %s [--json PATH] [--quick] [--reps N] [--only KEY,...] [--check-dir DIR]\n"
      "          [--sync-dir DIR] [--no-prequeue] [--no-kernels]\n"
      "       %s --compile-latency | --export-plan DIR | --load-latency DIR\n"
      "          | --write-check-sample DIR | --list\n"
      "  kiln's benchmark (see the header of bench/kiln_bench.cc)\n",
      argv0, argv0);
}

struct Args {
  std::string json, only, check_dir, sync_dir, sample_dir, export_dir, load_dir;
  bool compile_latency = false, list = false;
  Config cfg;
};

// Returns false (after printing why) on a bad command line.
bool Parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const bool has_value = i + 1 < argc;
    if (s == "--json" && has_value) {
      a->json = argv[++i];
    } else if (s == "--only" && has_value) {
      a->only = argv[++i];
    } else if (s == "--check-dir" && has_value) {
      a->check_dir = argv[++i];
    } else if (s == "--sync-dir" && has_value) {
      a->sync_dir = argv[++i];
    } else if (s == "--write-check-sample" && has_value) {
      a->sample_dir = argv[++i];
    } else if (s == "--reps" && has_value) {
      a->cfg.repetitions = std::max(1, std::atoi(argv[++i]));
    } else if (s == "--quick") {
      a->cfg.quick = true;
    } else if (s == "--no-prequeue") {
      a->cfg.prequeue = false;
    } else if (s == "--no-kernels") {
      a->cfg.count_kernels = false;
    } else if (s == "--compile-latency") {
      a->compile_latency = true;
    } else if (s == "--export-plan" && has_value) {
      a->export_dir = argv[++i];
    } else if (s == "--load-latency" && has_value) {
      a->load_dir = argv[++i];
    } else if (s == "--list") {
      a->list = true;
    } else {
      std::fprintf(stderr, "unknown or incomplete argument: %s\n", s.c_str());
      Usage(argv[0]);
      return false;
    }
  }
  if (a->cfg.quick) {
    a->cfg.latency_samples = 10;
    a->cfg.device_samples = 20;
    a->cfg.throughput_steps = 20;
    a->cfg.chunk = 20;
  }
  return true;
}

std::set<std::string> SplitKeys(const std::string& csv) {
  std::set<std::string> keys;
  std::stringstream ss(csv);
  std::string k;
  while (std::getline(ss, k, ',')) {
    if (!k.empty()) keys.insert(k);
  }
  return keys;
}

bool ReadDevice(RunInfo* info) {
  try {
    const cuda::DeviceProps& props = cuda::Props(0);
    info->gpu = props.name;
    info->l2 = props.l2_bytes;
    int rt = 0;
    KILN_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
    info->cuda_version = std::to_string(rt / 1000) + "." + std::to_string((rt % 1000) / 10);
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_bench: %s\n", e.what());
    return false;
  }
}

void RunRepetitions(const Args& args, const RunInfo& info, std::vector<Row>& rows) {
  const LockStep lock(args.sync_dir, "kiln");
  lock.Ready();
  for (int rep = 0; rep < args.cfg.repetitions; ++rep) {
    if (!lock.WaitGo(rep)) {
      std::printf("no go for repetition %d: stopping\n", rep);
      break;
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (Row& row : rows) {
      if (row.error.empty()) Guarded(row, [&] { row.reps.push_back(Measure(row.step, args.cfg)); });
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("repetition %d: %zu rows in %.1f s\n", rep, rows.size(), s);
    std::fflush(stdout);
    if (!args.json.empty() && !WriteJson(args.json, info, args.cfg, rows)) {
      std::fprintf(stderr, "error: could not write %s\n", args.json.c_str());
    }
    lock.Done(rep);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const auto process_t0 = std::chrono::steady_clock::now();
  Args args;
  if (!Parse(argc, argv, &args)) return 2;
  if (!args.sample_dir.empty()) return WriteCheckSample(args.sample_dir);
  const std::vector<Workload> workloads = MakeWorkloads();
  if (args.list) {
    for (const Workload& w : workloads) std::printf("%s\n", w.key.c_str());
    return 0;
  }
  const std::set<std::string> only = SplitKeys(args.only);
  for (const std::string& k : only) {
    const std::string workload = k.substr(0, k.find('/'));
    bool known = false;
    for (const Workload& w : workloads) known = known || w.key == workload;
    if (!known) {
      std::fprintf(stderr, "error: unknown workload in --only: %s (see --list)\n", k.c_str());
      return 2;
    }
  }
  if (!cuda::IsAvailable()) {
    std::printf("kiln_bench: no CUDA device\n");
    return 1;
  }
  if (args.compile_latency) return CompileLatency(process_t0);
  if (!args.export_dir.empty()) return ExportPlan(args.export_dir);
  if (!args.load_dir.empty()) return LoadLatency(args.load_dir, process_t0);
  RunInfo info;
  if (!ReadDevice(&info)) return 1;
  info.check_dir = args.check_dir;
  std::printf("kiln (CUDA runtime %s) on %s, L2 %.0f MiB, %d repetitions%s, prequeue=%s\n",
              info.cuda_version.c_str(), info.gpu.c_str(), info.l2 / 1048576.0,
              args.cfg.repetitions, args.cfg.quick ? " (quick)" : "",
              args.cfg.prequeue ? "on" : "off");
  std::fflush(stdout);
  InitCupti();  // before any CUDA graph is captured
  CheckWriter check(args.check_dir);
  std::vector<Row> rows = SetUp(workloads, only, args.cfg, check);
  RunRepetitions(args, info, rows);
  PrintTable(rows);
  if (!args.json.empty()) {
    if (!WriteJson(args.json, info, args.cfg, rows)) return 1;
    std::printf("wrote %s\n", args.json.c_str());
  }
  return 0;
}
