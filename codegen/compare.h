// The eager-vs-compiled report as one library call: what the examples' --compare prints. It runs a
// function eagerly and compiled (and, on CUDA when asked, replayed as a CUDA graph) under the
// profiler, and returns per step and mode: wall and host time, kernels, device busy time and peak
// device memory; what each fused kernel replaced and what it saved; the compile cost.
//
//   kiln::ComparisonReport r = kiln::CompareEagerAndCompiled(
//       [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{mlp(in[0])}; }, {x});
//   std::cout << r.ToString();  // the tables; JSON: r.ToJson()
//
// Functions with state between steps (a decode step that appends to a KV cache) give their
// steps instead: CompareSteps({.eager = ..., .compiled = ...}, compiled_fn, inputs), where
// compiled_fn is the CompiledFn behind the compiled step and inputs its inputs.
//
// Columns that do not apply to the device are left out: a CPU run has no kernels, device time or
// device memory, so its report shows wall and host time only (and says that no NVRTC compile ran).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "codegen/compile.h"
#include "profiler/report.h"

namespace kiln {

struct CompareOptions {
  CompileOptions compile;    // for the compiled modes (mode and cuda_graphs are set per mode)
  bool cuda_graphs = false;  // a third mode, the plan replayed as a CUDA graph (CUDA inputs only)
  int steps = 3;             // profiled steps per mode, after two unprofiled warm-up steps
};

struct ComparisonReport {
  profiler::ModeSummary eager;
  std::vector<profiler::ModeSummary> others;  // "compiled", then "compiled+graph" when run
  profiler::CompareDetails details;           // fused kernels and compile cost
  std::string ToString() const;               // the tables (profiler::CompareReport)
  std::string ToJson() const;                 // the same figures as one JSON object
};

// Runs `fn` on `inputs` eagerly, compiles it with options.compile and runs the plan, each mode
// under the profiler; see the file comment.
ComparisonReport CompareEagerAndCompiled(const ir::TensorFn& fn, const std::vector<Tensor>& inputs,
                                         const CompareOptions& options = {});

// The steps one comparison runs; `graphed` may be empty.
struct CompareStepFns {
  std::function<void()> eager, compiled, graphed;
};
// The same report over caller-made steps: `compiled_fn` (called on `inputs` by the compiled step)
// supplies the fused kernels and the compile cost.
ComparisonReport CompareSteps(const CompareStepFns& steps, const CompiledFn& compiled_fn,
                              const std::vector<Tensor>& inputs, int profiled_steps = 3);

}  // namespace kiln
