// kiln::compile: trace a model function, optimise its graph, generate its kernels, and return a
// callable that replays the plan.
//
//   kiln::CompiledFn f = kiln::compile([&](const std::vector<Tensor>& in) {
//     return std::vector<Tensor>{mlp(in[0])};
//   }, {x});
//   Tensor y = f({x})[0];
//
// The compiled function is specialised on the input shapes, dtypes and devices of the examples.
// A call with another signature recompiles (cached per signature, up to max_signatures) or,
// with recompile = false, throws a kiln::Error naming the input that changed. Inputs may have
// any strides. The mode switch makes the same program run eagerly or compiled:
// options.mode, or KILN_COMPILE=0/1 in the environment when mode is kDefault.
//
// Dumps: options.dump_dir or KILN_DUMP=dir writes the traced graph and the graph after each pass
// (.txt and .dot), each fused kernel's .cu source and PTX, the fusion explain log and index.md.
// CUDA graphs: options.cuda_graphs replays the plan as one CUDA graph from the second call on
// (codegen/cuda_graph.h says how inputs and outputs are bound).
//
// KILN_DEBUG=1 prints a compile summary to stderr, 2 adds the explain log, 3 kernel sources,
// 4 the graph after every pass.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "codegen/cuda_graph.h"
#include "codegen/executable.h"
#include "ir/tracer.h"
#include "ops/modules.h"

namespace kiln {

struct CompileOptions {
  enum class Mode { kDefault, kEager, kCompiled };
  Mode mode = Mode::kDefault;
  bool fuse_elementwise = true;
  bool fuse_softmax = true;  // scale/mask before a last-dim softmax and a cast after it: 1 kernel
  bool merge_gemms = true;
  bool fuse_gemm_epilogues = true;  // linear + relu / tanh GELU -> one GEMM with that epilogue
  // Replay the plan as a CUDA graph after the first call (CUDA inputs; see cuda_graph.h). Also
  // KILN_CUDA_GRAPHS=1 in the environment.
  bool cuda_graphs = false;
  bool recompile = true;  // false: a new input signature is an error
  int max_signatures = 8;
  std::string dump_dir;  // "" = KILN_DUMP or none
};

// What compiling produced, for reports and tests.
struct CompileReport {
  std::string traced_graph, final_graph;
  std::vector<std::string> explain;
  int kernels_per_step = 0, fused_kernels = 0;
  double compile_ms = 0, nvrtc_ms = 0;
  int64_t planned_peak_bytes = 0;        // intermediates alive at once under liveness release
  int64_t total_intermediate_bytes = 0;  // all intermediates (no reuse)
  // "off", "pending (captured after the first call)", "on: N graph nodes", or "off: <why>".
  std::string cuda_graph = "off";
};

class CompiledFn {
 public:
  CompiledFn(ir::TensorFn fn, CompileOptions options);
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs);
  bool compiled() const { return compiled_; }  // false when running eagerly (the switch)
  // The report of the plan for the most recent signature (compiles it if needed).
  const CompileReport& report(const std::vector<Tensor>& inputs);
  const codegen::Executable& executable(const std::vector<Tensor>& inputs);

 private:
  struct Entry {
    std::vector<TensorType> types;  // the input signature
    std::unique_ptr<codegen::Executable> exe;
    CompileReport report;
    std::unique_ptr<codegen::CudaGraphCache> graphs;  // options.cuda_graphs on CUDA
  };
  Entry& EntryFor(const std::vector<Tensor>& inputs);

  ir::TensorFn fn_;
  CompileOptions options_;
  bool compiled_;
  std::vector<Tensor> RunWithCudaGraph(Entry& e, const std::vector<Tensor>& inputs);

  std::map<std::string, Entry> cache_;  // by input signature
  Entry* last_ = nullptr;               // the entry of the previous call (checked first)
  std::vector<TensorType> first_types_;
};

CompiledFn compile(ir::TensorFn fn, const std::vector<Tensor>& example_inputs,
                   CompileOptions options = {});
// A module with one input and one output.
CompiledFn compile(Module& module, const Tensor& example_input, CompileOptions options = {});

}  // namespace kiln
