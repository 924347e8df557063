// kiln::compile: trace a model function, optimise its graph, generate its kernels, and return a
// callable that replays the plan.
//
//   kiln::CompiledFn f = kiln::compile([&](const std::vector<Tensor>& in) {
//     return std::vector<Tensor>{mlp(in[0])};
//   }, {x});
//   Tensor y = f({x})[0];
//
// Signatures. The function is compiled for the input dtypes, devices, ranks and sizes of the
// first call. With options.dynamic = kAuto (the default, like torch's automatic dynamic shapes) a
// call whose inputs differ only in some sizes makes those dims symbolic and compiles once more:
// the new plan serves every size of them (codegen/symbolic.h). kDims names the symbolic dims up
// front (for contiguous inputs: a call with strided ones is refused, naming the input); kNone
// compiles each signature separately. A symbolic plan called at sizes no trace has shown it (each
// new set of sizes, once) traces the function once more there and serves them only if it is the
// same program (a branch on a size, a size-1 dim squeezed get a plan of their own: no range of
// sizes is assumed to be one program, since a C++ branch on a size is invisible to the trace).
// Other changes recompile (cached per signature; past max_signatures plans a new signature runs
// eagerly with one warning, as torch past its cache_size_limit), or, with recompile = false,
// throw a kiln::Error naming the input that changed. Inputs may have any non-negative strides:
// a non-contiguous input is traced with its strides (reshape and contiguous() copy where eager
// copies, view() refuses as eager does) and its plan serves those strides. Outputs that are an
// input or views of it are the caller's tensor or those views of it, as eager returns them.
// Called inside a function being traced, a CompiledFn runs its function there (inlined); with
// meta inputs it runs eagerly (shapes propagate, nothing runs).
// Values the function reads from the host (a captured double, a tensor handle re-bound after
// compiling, a generator's draw) are read once, at trace time: C++ closures cannot be guarded.
// An explicit as_strided on an input counts its offset from the input's first element (eager:
// from the start of the input's storage; they differ for an input with a storage offset).
// compilations() counts the plans built.
//
// Semantics (torch's, see DESIGN.md "Round 2"): results equal eager's for the same inputs and
// state, or the call raises. Guards checked on every call: a weight (or other captured tensor)
// that its module replaced (Module::to) makes the function trace again and read the new one
// (report.recompiled_because says why); a call whose in-place-written input shares memory with
// another input or a captured tensor runs eagerly (eager_fallbacks()), since the plan was traced
// with every input in memory of its own. In-place ops on inputs (and on views of them) are applied
// to the caller's tensors after the plan runs. Weights (tensors the function reads that are not
// inputs) are read at call time, so in-place updates of them are seen; with options.freeze_weights
// they may be folded into the plan (GEMM merge concatenates them) and a later in-place change of a
// folded weight is detected by its version counter and recompiles. Outputs never share memory
// with weights or folded constants, nor with each other where eager returns separate tensors.
// One exception, as torch.compile's SDPA rewrite has it: attention written naively that the
// attention family runs as one SDPA node gives SDPA's answer where softmax is undefined, zeros
// (not NaN) for a row a mask known only at run time hides whole, and a finite row where a score
// overflows to +inf (attention_fusion.h; disabled_families = {"attention"} keeps eager's).
//
// Threads: a CompiledFn may be called from several threads at once (the signature cache is
// guarded; plans keep no per-call state; CUDA-graph replays of one signature are serialised).
// Copies of a CompiledFn share their compiled plans.
//
// The mode switch makes the same program run eagerly or compiled: options.mode, or
// KILN_COMPILE=0/1 in the environment when mode is kDefault.
//
// Dumps: options.dump_dir or KILN_DUMP=dir writes, into a folder of its own per compile
// (dir/compile_NNN, report.dump_dir), the traced graph and the graph after each pass (.txt and
// .dot), each fused kernel's kernel IR, .cu source and PTX, the fusion explain log and index.md
// (codegen/dump.h); a dump directory that cannot be written is an error. CUDA graphs:
// options.cuda_graphs replays the plan as one CUDA graph from the second call on
// (codegen/cuda_graph.h says how inputs and outputs are bound).
//
// KILN_DEBUG=1 prints a compile summary to stderr, 2 adds the explain log, 3 kernel sources,
// 4 the graph after every pass.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ir/tracer.h"
#include "ops/modules.h"
#include "runtime/settings.h"

namespace kiln {
namespace codegen {
class Executable;
}

struct CompileOptions {
  enum class Mode { kDefault, kEager, kCompiled };
  enum class Dynamic { kNone, kAuto, kDims };
  Mode mode = Mode::kDefault;
  // Kernel families switched off, by name (codegen/fusion_template.h): "attention" (q·kᵀ ->
  // scale -> mask -> softmax -> ·v as one attention kernel), "gemm_epilogue" (linear + relu /
  // tanh GELU / residual as one GEMM), "norm_linear" (a layer/RMS norm and the linear reading it
  // as one GEMV, few rows on CUDA), "softmax" (scale/mask before a last-dim softmax and a cast
  // after it: one kernel), "pointwise" (elementwise groups as one kernel). KILN_DISABLED_FAMILIES
  // adds names. An unknown name is an error naming the families there are.
  std::vector<std::string> disabled_families;
  // A value needed inside a fused group and outside it is stored by the group's kernel (off: it
  // is materialised by a kernel of its own, which the group then reads; measured in the bench's
  // fanout rows).
  bool multi_output_fusion = true;
  // Small independent pointwise kernels next to each other in the plan (a decode step's RoPE of q
  // and of k) run as one combo kernel (codegen/families/pointwise/horizontal_fusion.h); default
  // KILN_EW_COMBINE (on).
  bool horizontal_fusion = EnvBool("KILN_EW_COMBINE");
  // A GLU MLP's gate/up projection after a norm and act(gate) * up, for at most 8 rows, are one
  // gated GEMV (codegen/families/norm_linear/README.md); default KILN_GEMV_GLU (off: on the H100
  // it loses its per-shape timing, docs/BENCHMARKS.md).
  bool gated_gemv = EnvBool("KILN_GEMV_GLU");
  // A decode step's rotary embedding of the query and the new keys runs inside the attention kernel
  // that appends the keys to the cache (codegen/families/attention/attention_fusion.h); default
  // KILN_KV_ROPE (off: the kernel has not run on a GPU).
  bool kv_rope = EnvBool("KILN_KV_ROPE");
  // An elementwise op reading a cat computes on the cat's parts on CUDA too (passes/cat_sinking.h;
  // on the CPU always); default KILN_CAT_SINK_CUDA (on).
  bool cuda_cat_sinking = EnvBool("KILN_CAT_SINK_CUDA");
  // Linears sharing an input: one GEMM (over frozen weights only; without freeze_weights the
  // explain log names the linears that would have merged).
  bool merge_gemms = true;
  // Fold weights into the plan (constant folding over them, GEMM merge); a later in-place
  // change of a folded weight recompiles. Off: weights are read at call time.
  bool freeze_weights = false;
  // Names of tensors the function captures, asked for at each trace (so replaced parameters are
  // named too and none is kept alive): the graphs, dumps and guard errors call a captured tensor
  // by its name ("h.0.mlp.up.weight"; a view of it "h.0.mlp.up.weight (view)"), not "const3".
  //   o.tensor_names = [&model] { return model.named_tensors(); };
  // compile(Module&) names the module's parameters and buffers itself.
  std::function<std::vector<std::pair<std::string, Tensor>>()> tensor_names;
  Dynamic dynamic = Dynamic::kAuto;
  std::vector<std::pair<int, int>> dynamic_dims;  // kDims: (input, dim) pairs
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
  // Kernels and memsets one step launches, as they run (a reshape that copies counts; on CUDA so
  // do cuBLASLt's split-K kernels and memsets, measured on the first report() of a plan).
  int kernels_per_step = 0, memsets_per_step = 0, fused_kernels = 0;
  // Where the compile's time went: compile_ms = trace_ms + passes_ms + lowering_ms + the rest
  // (capture bookkeeping, memory planning, dumps). lowering_ms is the families' lowering, NVRTC
  // included; nvrtc_ms and nvrtc_compiles are the NVRTC compiles it needed (0 when every kernel
  // came from the kernel cache: cache_hits), read from the process-wide kernel cache counters,
  // so compiles another thread runs meanwhile count too.
  double compile_ms = 0, trace_ms = 0, passes_ms = 0, lowering_ms = 0, nvrtc_ms = 0;
  int nvrtc_compiles = 0, cache_hits = 0;
  // With KILN_BACKGROUND_COMPILE=on (off by default: compiled here), kernels that no cache had
  // and whose family has a fallback (the gemm family's Hopper GEMM): they compile on a
  // background thread while the plan's calls run the fallback, and a CUDA graph capture of the
  // plan waits for them.
  int background_compiles = 0;
  // The one-time costs inside lowering (ops/cuda/device_timing.h), process-wide counters too:
  // per-shape choices timed (and their ms) or read back from the cache directory, and library
  // start-up (the cuBLASLt handle of a device's first GEMM).
  double timing_ms = 0, library_startup_ms = 0;
  int timed_choices = 0, stored_choices = 0;
  int steps = 0;  // the plan's steps (kernels, library calls, views), known before it runs
  int64_t planned_peak_bytes = 0;        // intermediates alive at once under liveness release
  int64_t total_intermediate_bytes = 0;  // all intermediates (no reuse)
  std::string symbolic_dims = "none";    // "s0 = input0[1] = input1[1]", or why not symbolic
  // "off", "pending (captured after the first call)", "on: N graph nodes", or "off: <why>".
  std::string cuda_graph = "off";
  // The folder this compile's dumps went to (dump_dir/compile_NNN; "" with dumps off), and how
  // many kernel sources were rendered for dumps or KILN_DEBUG (0 when neither asked).
  std::string dump_dir;
  int kernel_sources_rendered = 0;
  // Why this plan replaced an earlier one of the same signature ("" for a first compile): a
  // frozen weight written in place, or a captured tensor replaced in its module (Module::to).
  std::string recompiled_because;

  // "in 12.3 ms: trace 1.0, passes 2.1, lowering 8.9 (NVRTC 8.1 ms, 3 compiles, 2 cached;
  // choices 0.0 ms, 0 timed, 2 stored; library start-up 0.0 ms); 19 steps, 5 fused kernels;
  // symbolic dims: none" (KILN_DEBUG=1 prints it for every compile).
  std::string Summary() const;
  // The same figures as one JSON object: {"compile_ms":12.3,"trace_ms":1.0,"passes_ms":2.1,
  // "lowering_ms":8.9,"nvrtc_ms":8.1,"nvrtc_compiles":3,"cache_hits":2,"choices_ms":0.0,
  // "choices_timed":0,"choices_stored":2,"library_startup_ms":0.0,"steps":19,"fused_kernels":5}
  std::string CostsJson() const;
};

class CompiledFn {
 public:
  CompiledFn(ir::TensorFn fn, CompileOptions options);
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs) const;
  bool compiled() const;  // false when running eagerly (the switch)
  // The report of the plan serving these inputs (compiles it if needed). The reference stays
  // valid as long as the CompiledFn.
  const CompileReport& report(const std::vector<Tensor>& inputs) const;
  const codegen::Executable& executable(const std::vector<Tensor>& inputs) const;
  // Per output of that plan: where it lies in an input's memory (returned as that view of the
  // caller's tensor), or nullopt (a symbolic plan records none).
  std::vector<std::optional<ir::OutputAlias>> output_aliases(
      const std::vector<Tensor>& inputs) const;
  int compilations() const;  // plans built so far
  // Calls run eagerly because the plan could not serve them as traced: an input the function
  // writes in place overlapped another input or a captured tensor (aliasing the trace did not
  // see), or a new signature came past max_signatures plans. The first such call prints one
  // warning.
  int eager_fallbacks() const;

  struct State;  // shared by copies; compile.cc

 private:
  friend CompiledFn compile(ir::TensorFn, const std::vector<Tensor>&, CompileOptions);
  friend CompiledFn compile(Module&, const Tensor&, CompileOptions);
  std::shared_ptr<State> state_;
};

CompiledFn compile(ir::TensorFn fn, const std::vector<Tensor>& example_inputs,
                   CompileOptions options = {});
// A module with one input and one output. The compiled function refers to the module: calling
// it after the module is destroyed raises an error (its plans would still read the destroyed
// module's weights).
CompiledFn compile(Module& module, const Tensor& example_input, CompileOptions options = {});

// "" when no input of `written` (inputs a plan writes in place) shares memory with another of
// `inputs`, else which: the plan, traced with each input in memory of its own, would read old
// values where eager reads new ones.
std::string WrittenInputOverlap(const std::vector<int>& written, const std::vector<Tensor>& inputs);

// A plan writes a strided input back as its whole flat span (ir::FlatInput), which reaches
// elements that are not the input's (a neighbour's column, another thread's slice). So the plan
// gets a private copy of the span of each strided input it writes, and CopyBack writes the
// caller's elements, and only them, from it after the run (as eager writes through the view).
class StridedWrites {
 public:
  StridedWrites(const std::vector<int>& written, const std::vector<Strides>& strides,
                const std::vector<Tensor>& inputs, std::vector<Tensor>& plan_inputs);
  void CopyBack() const;

 private:
  std::vector<std::pair<Tensor, Tensor>> copies_;  // the caller's tensor, its view of the copy
};

// Replaces each output `aliases` places in an input's memory with that view of the caller's
// tensor (the tensor itself where the function returned what it received), and each window of
// another output with that view of it. `plan_inputs`: the plan's inputs for `inputs` (a strided
// input's flat tensor, ir::FlatInput).
void ApplyOutputAliases(const std::vector<std::optional<ir::OutputAlias>>& aliases,
                        const std::vector<Tensor>& inputs, const std::vector<Tensor>& plan_inputs,
                        std::vector<Tensor>& outs);

// Blocks until the kernels compiled functions left compiling in the background (see
// CompileReport::background_compiles) are compiled; the next call of such a function runs them.
// For timing a plan, or profiling it, as it runs from then on.
void WaitForBackgroundCompiles();

}  // namespace kiln
