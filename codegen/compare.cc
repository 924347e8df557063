// The eager-vs-compiled report as one call (see compare.h).
#include "codegen/compare.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "codegen/executable.h"
#include "ir/graph.h"
#include "ops/op_def.h"
#include "profiler/profiler.h"
#include "runtime/cuda.h"
#include "runtime/kernel_cache_stats.h"
#include "runtime/status.h"

namespace kiln {
namespace {

bool OnCuda(const std::vector<Tensor>& inputs) {
  return std::any_of(inputs.begin(), inputs.end(),
                     [](const Tensor& t) { return t.defined() && t.device().is_cuda(); });
}

// Two warm-up calls (a CUDA-graph plan captures on its second), then `steps` profiled ones (each
// a profiler step, the device drained). Device activity is recorded only for inputs on a GPU: a
// CPU run on a machine with one would otherwise show device columns of zeros.
profiler::ProfileResult ProfileSteps(const std::function<void()>& step, bool gpu, int steps) {
  for (int i = 0; i < 2; ++i) step();
  if (gpu) cuda::Synchronize();
  profiler::Profiler::Options o;
  o.active = steps;
  o.record_shapes = true;
  o.device = gpu;
  profiler::Profiler p(std::move(o));
  p.Start();
  for (int i = 0; i < steps; ++i) {
    step();
    if (gpu) cuda::Synchronize();
    p.Step();
  }
  return p.Stop();
}

// Peak device memory allocated during one step (0 off CUDA).
size_t PeakBytesOf(const std::function<void()>& step, bool gpu) {
  if (!gpu) return 0;
  cuda::Synchronize();
  cuda::ResetPeakMemoryStats();
  step();
  cuda::Synchronize();
  return cuda::GetMemoryStats().peak_allocated;
}

// What each fused kernel of the plan replaced, and its device time per step in both modes.
std::vector<profiler::FusedKernelInfo> FusedInfo(const codegen::Executable& exe,
                                                 const profiler::ProfileResult& eager,
                                                 const profiler::ProfileResult& compiled) {
  std::vector<profiler::FusedKernelInfo> out;
  for (const ir::Node& n : exe.graph().nodes()) {
    if (n.kind != ir::NodeKind::kFusion) continue;
    profiler::FusedKernelInfo info;
    info.kernel = n.name;
    const int body_ops =
        static_cast<int>(n.body->nodes().size()) - static_cast<int>(n.body->inputs().size());
    int ops = 0;
    for (const ir::Node& b : n.body->nodes()) {
      if (b.kind != ir::NodeKind::kOp) continue;
      info.eager_ops.push_back(GetOpDef(b.op).name);
      // Every value but the last was written by one eager op and read by the next.
      if (++ops < body_ops)
        info.intermediate_bytes_saved += 2 * b.type.numel() * DTypeSize(b.type.dtype);
    }
    info.launches_saved = ops - 1;
    info.device_us_before = profiler::DeviceUsPerStepOfOps(eager, info.eager_ops);
    info.device_us_after = profiler::DeviceUsPerStepOfKernels(compiled, n.name);
    out.push_back(std::move(info));
  }
  return out;
}

std::string ModeJson(const profiler::ModeSummary& m) {
  std::string s =
      absl::StrFormat(R"({"mode":"%s","wall_us_per_step":%.3f,"host_us_per_step":%.3f)",
                      profiler::JsonEscape(m.name), m.wall_us_per_step, m.host_us_per_step);
  if (m.has_device) {
    absl::StrAppendFormat(&s,
                          R"(,"kernels_per_step":%.2f,"device_busy_us_per_step":%.3f,)"
                          R"("device_idle_share":%.4f,"peak_bytes":%d)",
                          m.kernels_per_step, m.device_busy_us_per_step, m.idle_share,
                          static_cast<int64_t>(m.peak_bytes));
  }
  return s + "}";
}

std::string FusedJson(const profiler::FusedKernelInfo& f, bool device) {
  std::vector<std::string> ops;
  for (const std::string& op : f.eager_ops) ops.push_back("\"" + profiler::JsonEscape(op) + "\"");
  std::string s = absl::StrFormat(
      R"({"kernel":"%s","replaces":[%s],"launches_saved":%d,"intermediate_bytes_saved":%d)",
      profiler::JsonEscape(f.kernel), absl::StrJoin(ops, ","), f.launches_saved,
      static_cast<int64_t>(f.intermediate_bytes_saved));
  if (device) {
    absl::StrAppendFormat(&s, R"(,"device_us_before":%.3f,"device_us_after":%.3f)",
                          f.device_us_before, f.device_us_after);
  }
  return s + "}";
}

}  // namespace

std::string ComparisonReport::ToString() const {
  return profiler::CompareReport(eager, others, details);
}

std::string ComparisonReport::ToJson() const {
  std::vector<std::string> modes = {ModeJson(eager)};
  for (const profiler::ModeSummary& m : others) modes.push_back(ModeJson(m));
  std::vector<std::string> fused;
  for (const profiler::FusedKernelInfo& f : details.fused) {
    fused.push_back(FusedJson(f, eager.has_device));
  }
  const profiler::CompileCost& c = details.compile;
  return absl::StrFormat(
      R"({"modes":[%s],"fused_kernels":[%s],"compile":{"fused_kernels":%d,"nvrtc_ms":%.3f,)"
      R"("nvrtc_compiles":%d,"cache_memory_hits":%d,"cache_disk_hits":%d}})",
      absl::StrJoin(modes, ","), absl::StrJoin(fused, ","), c.kernels, c.nvrtc_ms,
      static_cast<int64_t>(c.cache.compiles), static_cast<int64_t>(c.cache.memory_hits),
      static_cast<int64_t>(c.cache.disk_hits));
}

ComparisonReport CompareSteps(const CompareStepFns& steps, const CompiledFn& compiled_fn,
                              const std::vector<Tensor>& inputs, int profiled_steps) {
  KILN_CHECK(
      steps.eager && steps.compiled && profiled_steps >= 1,
      "CompareSteps: needs an eager and a compiled step and at least one profiled step, got ",
      steps.eager ? "an" : "no", " eager step, ", steps.compiled ? "a" : "no",
      " compiled step and ", profiled_steps, " profiled steps");
  const bool gpu = OnCuda(inputs);
  const profiler::ProfileResult eager = ProfileSteps(steps.eager, gpu, profiled_steps);
  const profiler::ProfileResult compiled = ProfileSteps(steps.compiled, gpu, profiled_steps);
  ComparisonReport r;
  r.eager = profiler::Summarize("eager", eager, 0, PeakBytesOf(steps.eager, gpu));
  r.others.push_back(
      profiler::Summarize("compiled", compiled, 0, PeakBytesOf(steps.compiled, gpu)));
  if (steps.graphed) {
    const profiler::ProfileResult graphed = ProfileSteps(steps.graphed, gpu, profiled_steps);
    r.others.push_back(
        profiler::Summarize("compiled+graph", graphed, 0, PeakBytesOf(steps.graphed, gpu)));
  }
  if (!gpu) r.eager.device_status = "the inputs are on the CPU";  // the report's note says so
  r.details.fused = FusedInfo(compiled_fn.executable(inputs), eager, compiled);
  const CompileReport& report = compiled_fn.report(inputs);
  r.details.has_compile_cost = true;
  r.details.compile.nvrtc_ms = report.nvrtc_ms;
  r.details.compile.kernels = report.fused_kernels;
  r.details.compile.cache = cuda::GetKernelCacheStats();
  return r;
}

ComparisonReport CompareEagerAndCompiled(const ir::TensorFn& fn, const std::vector<Tensor>& inputs,
                                         const CompareOptions& options) {
  CompileOptions o = options.compile;
  o.mode = CompileOptions::Mode::kCompiled;
  o.cuda_graphs = false;
  const CompiledFn compiled = compile(fn, inputs, o);
  std::optional<CompiledFn> graphed;
  CompareStepFns steps{.eager = [&] { fn(inputs); }, .compiled = [&] { compiled(inputs); }};
  if (options.cuda_graphs && OnCuda(inputs)) {
    o.cuda_graphs = true;
    graphed.emplace(compile(fn, inputs, o));
    steps.graphed = [&] { (*graphed)(inputs); };
  }
  return CompareSteps(steps, compiled, inputs, options.steps);
}

}  // namespace kiln
