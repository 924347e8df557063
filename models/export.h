// Ahead-of-time export of a compiled function, and loading it in another process without tracing
// and without NVRTC: a deployment ships one folder and needs neither the model's code nor a
// compiler nor a writable kernel cache.
//
//   kiln::CompiledFn f = kiln::compile(mlp, x, {.freeze_weights = true});
//   kiln::Export(f, {x}, "mlp_plan");                       // here: NVRTC, the GPU of the target
//   ...
//   kiln::LoadedFn g = kiln::LoadCompiled("mlp_plan");      // there: no trace, no NVRTC
//   std::vector<kiln::Tensor> y = g({x});
//
// The folder holds `manifest.json` (format, kiln's build, the GPU architecture, the signature:
// each input's dtype, shape, device and strides where it is not contiguous; which inputs the
// function writes in place; which outputs are views of inputs; a SHA-256 per file), `graph.txt`
// (the plan's final graph in kiln's IR text), `constants. safetensors` (every constant the graph
// reads: weights, folded values) and `kernels/` (the CUBIN of every kernel the exporting process
// has loaded through kiln's kernel cache, the plan's among them, named by its cache key: kiln's
// kernel users keep the handles they got, so which kernels a plan runs is known only as "everything
// loaded so far"; export from a process that compiled little else). Whatever depends on addresses
// (TMA descriptors, CUDA graphs, cuBLASLt plans and per-shape timings) is rebuilt at load time,
// never stored.
//
// LoadCompiled checks, with a kiln::Error naming the folder and the rule broken, before loading
// anything: the manifest, kiln's build (a plan is only read by the kiln that wrote it), every
// file's checksum, the GPU (same architecture as the exporter's), then the graph's text against
// the constants. Its kernels are then given to the kernel cache by key: lowering the graph finds
// each there and compiles none (a kernel missing from the folder would need NVRTC, and fails
// without it). Custom ops (ops/custom_op.h) in the graph must be registered before loading.
// Plans with symbolic dims, and functions that write a tensor they captured in place (a module's
// KV cache), are not exported: Export says so.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "codegen/compile.h"

namespace kiln {

// Writes the plan of `fn` serving `example_inputs` (compiled if needed) into `dir` (created;
// the manifest last). Builds the plan once more from the written text and runs it on the inputs
// (the text round-trips; a kernel compiled at a plan's first call is loaded; inputs the function
// writes in place are copied first, so exporting writes none). Throws kiln::Error.
void Export(const CompiledFn& fn, const std::vector<Tensor>& example_inputs,
            const std::string& dir);

struct LoadCompiledOptions {
  bool cuda_graphs = false;  // replay the plan as a CUDA graph after the first call
};

// A loaded plan: call it like the compiled function, with inputs of the exported signature.
class LoadedFn {
 public:
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs) const;
  const codegen::Executable& executable() const;
  const std::string& graph_text() const;
  int kernels() const;  // CUBINs the folder held
  struct State;

 private:
  friend LoadedFn LoadCompiled(const std::string& dir, LoadCompiledOptions options);
  std::shared_ptr<State> state_;
};

LoadedFn LoadCompiled(const std::string& dir, LoadCompiledOptions options = {});

}  // namespace kiln
