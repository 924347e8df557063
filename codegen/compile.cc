// kiln::compile (see compile.h): trace -> passes -> executable, with dumps, symbolic dims, the
// mode switch and the signature cache.
#include "codegen/compile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "codegen/cuda_graph.h"
#include "codegen/dump.h"
#include "codegen/executable.h"
#include "codegen/fusion_template.h"
#include "codegen/symbolic.h"
#include "ir/printer.h"
#include "ops/cuda/device_timing.h"
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "runtime/build_config.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "runtime/settings.h"
#include "runtime/startup.h"
#include "runtime/status.h"

namespace kiln {
namespace {

int DebugLevel() { return EnvLevel("KILN_DEBUG"); }

std::vector<TensorType> TypesOf(const std::vector<Tensor>& inputs) {
  std::vector<TensorType> types;
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_CHECK(inputs[i].defined(), "compiled function: input ", i, " is an undefined tensor");
    types.push_back(inputs[i].type());
  }
  return types;
}

std::string Signature(const std::vector<TensorType>& types) {
  return absl::StrJoin(types, "; ",
                       [](std::string* o, const TensorType& t) { o->append(Describe(t)); });
}

bool SameTypes(const std::vector<TensorType>& types, const std::vector<Tensor>& inputs) {
  if (types.size() != inputs.size()) return false;
  for (size_t i = 0; i < types.size(); ++i) {
    if (!inputs[i].defined() || inputs[i].dtype() != types[i].dtype ||
        inputs[i].device() != types[i].device || inputs[i].shape() != types[i].shape) {
      return false;
    }
  }
  return true;
}

}  // namespace

// One compiled plan and what it serves.
struct Entry {
  std::vector<TensorType> types;  // the traced signature
  // and each input's layout: empty for a contiguous input (contiguous() of it is itself), else
  // its strides (traced as a view of a flat input: ir::Trace's input_strides)
  std::vector<Strides> strides;
  codegen::SymbolicShapes symbols;  // empty: exactly `types`
  // A symbolic plan: the graph as traced (sym_dims, sym_attrs), and the symbol values traces
  // showed to be this program; a call at other values is checked by tracing there
  // (VerifiedFor), which adds them to `served` or to `refused`.
  std::optional<ir::Graph> symbolic_graph;
  std::set<std::vector<int64_t>> served, refused;
  std::unique_ptr<codegen::Executable> exe;
  CompileReport report;
  std::mutex graph_mu;  // serialises CUDA-graph replays (CudaGraphCache is not thread-safe)
  // Shared, not unique: its deleter is bound where it is made (a CUDA build's replay path), so a
  // build without CUDA never needs CudaGraphCache's code (codegen/cuda_graph.cc).
  std::shared_ptr<codegen::CudaGraphCache> graphs;
  int64_t graph_changes_reported = -1;  // graphs->changes() when report.cuda_graph was last set
  std::once_flag counted;  // report.kernels/memsets_per_step, filled on the first report()
  // freeze_weights: the user's tensors the plan read at compile time, with their versions then;
  // a later write through the op API makes the plan stale (recompiled on the next call).
  std::vector<std::pair<std::shared_ptr<Storage>, uint64_t>> frozen;
  // Every user tensor the plan reads (weights, buffers, captured tensors), and whether its storage
  // was already retired when traced: one a module has replaced since (Module::to) makes the plan
  // stale, so the function is traced again and reads the module's new tensor.
  struct Captured {
    Tensor tensor;
    std::string name;
    bool retired_when_traced = false;
    bool is_input = false;  // a captured tensor written in place: one of the plan's inputs
  };
  std::vector<Captured> captured;
  std::vector<int> written_inputs;  // inputs the function writes in place
  // Per output: where it lies in an input's memory (ir::OutputAlias), to hand the caller that
  // view of its own tensor, as eager does (a symbolic plan: only outputs that are an input whole).
  std::vector<std::optional<ir::OutputAlias>> output_aliases;

  // Tensors the function writes in place without receiving them (a module's KV cache): the
  // graph's inputs after the caller's (ir/tracer.h), passed on every call.
  std::vector<Tensor> captured_inputs;

  // The graph's inputs for a call: the caller's (a non-contiguous one as the flat tensor over
  // what it reaches), then the captured tensors written in place.
  std::vector<Tensor> PlanInputs(const std::vector<Tensor>& inputs) const {
    std::vector<Tensor> all = inputs;
    for (size_t i = 0; i < all.size(); ++i) {
      if (!strides[i].empty()) all[i] = ir::FlatInput(all[i]);
    }
    all.insert(all.end(), captured_inputs.begin(), captured_inputs.end());
    return all;
  }
  std::atomic<bool> stale{false};

  // Why the plan no longer serves its function ("" when it does): a frozen weight was written, or
  // a captured tensor was replaced in its module.
  std::string StaleReason() const {
    for (const auto& [storage, version] : frozen) {
      if (storage->version() != version) return "a frozen weight was written in place";
    }
    for (const Captured& c : captured) {
      if (c.tensor.storage()->retired() && !c.retired_when_traced) {
        return absl::StrCat("the captured tensor ", c.name.empty() ? "(unnamed)" : c.name, " (",
                            Describe(c.tensor.type()), ") was replaced in its module");
      }
    }
    return "";
  }

  // Why the plan cannot run these inputs as traced ("" when it can): an input the function writes
  // in place shares memory with another input or with a captured tensor, so eager would read its
  // new values where the plan reads old ones (the trace gave each input memory of its own).
  std::string AliasingConflict(const std::vector<Tensor>& inputs) const {
    if (std::string why = WrittenInputOverlap(written_inputs, inputs); !why.empty()) return why;
    for (int w : written_inputs) {
      const Tensor& x = inputs[w];
      for (const Captured& c : captured) {
        if (c.is_input) continue;  // checked as an input above
        if (c.tensor.storage() == x.storage() && GetMemOverlap(x, c.tensor) != MemOverlap::kNo) {
          return absl::StrCat("input ", w, ", which the function writes in place, overlaps the ",
                              "captured tensor ", c.name.empty() ? "(unnamed)" : c.name);
        }
      }
    }
    return "";
  }

  bool Serves(const std::vector<Tensor>& inputs) const {
    if (stale) return false;
    if (!(symbols.empty() ? SameTypes(types, inputs) : symbols.Admits(types, inputs))) return false;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (ir::InputStrides(inputs[i]) != strides[i]) return false;
    }
    return true;
  }

  // Whether a symbolic plan serves the sizes of `inputs` (which it admits): sizes a trace has
  // shown to be this program do; at any others `fn` is traced again and must be the same program
  // there (a branch on a size, a size-1 dim squeezed, a slice bound that turns negative all change
  // it). Only the sizes traced count: a C++ branch on a size is invisible to the trace, so no
  // range between two traces is known to be one program (a plan that served 4..12 after traces
  // at 4 and 12 would give `n == 9 ? a : b` the wrong branch at 9). A pass is remembered, a
  // failure too (the call compiles a plan of its own).
  bool VerifiedFor(const std::vector<Tensor>& inputs, const ir::TensorFn& fn) {
    if (symbols.empty()) return true;
    const std::vector<int64_t> values = symbols.Values(inputs);
    if (served.contains(values)) return true;
    if (refused.contains(values)) return false;
    if (codegen::SameProgramAt(fn, *symbolic_graph, types, symbols, values).ok()) {
      served.insert(values);
      return true;
    }
    refused.insert(values);
    return false;
  }
};

std::string WrittenInputOverlap(const std::vector<int>& written,
                                const std::vector<Tensor>& inputs) {
  for (int w : written) {
    const Tensor& x = inputs[w];
    for (size_t j = 0; j < inputs.size(); ++j) {
      if (static_cast<int>(j) == w || inputs[j].storage() != x.storage()) continue;
      if (GetMemOverlap(x, inputs[j]) != MemOverlap::kNo) {
        return absl::StrCat("input ", w, ", which the function writes in place, overlaps input ",
                            j);
      }
    }
  }
  return "";
}

void ApplyOutputAliases(const std::vector<std::optional<ir::OutputAlias>>& aliases,
                        const std::vector<Tensor>& inputs, const std::vector<Tensor>& plan_inputs,
                        std::vector<Tensor>& outs) {
  for (size_t k = 0; k < aliases.size() && k < outs.size(); ++k) {
    if (!aliases[k].has_value()) continue;
    const ir::OutputAlias& a = *aliases[k];
    if (a.output >= 0) {  // a window of another output, which the plan computed whole
      const Tensor& whole = outs[a.output];
      if (whole.is_contiguous())
        outs[k] = whole.as_strided(a.shape, a.strides, whole.offset() + a.offset);
      continue;
    }
    const Tensor& caller = inputs[a.input];
    if (a.whole_input) {
      outs[k] = caller;
      continue;
    }
    const Tensor& base = plan_inputs[a.input];
    outs[k] = base.as_strided(a.shape, a.strides, base.offset() + a.offset);
  }
}

StridedWrites::StridedWrites(const std::vector<int>& written, const std::vector<Strides>& strides,
                             const std::vector<Tensor>& inputs, std::vector<Tensor>& plan_inputs) {
  for (int w : written) {
    if (w >= static_cast<int>(inputs.size()) || strides[w].empty()) continue;
    const Tensor& caller = inputs[w];
    Tensor copy = clone(plan_inputs[w]);
    plan_inputs[w] = copy;
    copies_.emplace_back(caller, copy.as_strided(caller.shape(), caller.strides(),
                                                 SpanOf(caller.shape(), caller.strides()).offset));
  }
}

void StridedWrites::CopyBack() const {
  for (const auto& [caller, written] : copies_) copy_(caller, written);
}

std::string CompileReport::Summary() const {
  auto ms = [](double v) { return absl::StrFormat("%.1f", v); };
  return absl::StrCat("in ", ms(compile_ms), " ms: trace ", ms(trace_ms), ", passes ",
                      ms(passes_ms), ", lowering ", ms(lowering_ms), " (NVRTC ", ms(nvrtc_ms),
                      " ms, ", nvrtc_compiles, " compiles, ", cache_hits, " cached, ",
                      background_compiles, " in the background; choices ", ms(timing_ms), " ms, ",
                      timed_choices, " timed, ", stored_choices, " stored; library start-up ",
                      ms(library_startup_ms), " ms); ", steps, " steps, ", fused_kernels,
                      " fused kernels; symbolic dims: ", symbolic_dims);
}

std::string CompileReport::CostsJson() const {
  return absl::StrFormat(
      R"({"compile_ms":%.3f,"trace_ms":%.3f,"passes_ms":%.3f,"lowering_ms":%.3f,)"
      R"("nvrtc_ms":%.3f,"nvrtc_compiles":%d,"cache_hits":%d,"background_compiles":%d,)"
      R"("choices_ms":%.3f,)"
      R"("choices_timed":%d,"choices_stored":%d,"library_startup_ms":%.3f,"steps":%d,)"
      R"("fused_kernels":%d})",
      compile_ms, trace_ms, passes_ms, lowering_ms, nvrtc_ms, nvrtc_compiles, cache_hits,
      background_compiles, timing_ms, timed_choices, stored_choices, library_startup_ms, steps,
      fused_kernels);
}

struct CompiledFn::State {
  ir::TensorFn fn;
  CompileOptions options;
  bool compiled = true;
  std::function<void()> before_call;  // compile(Module&): refuses a call once the module is gone
  mutable std::mutex mu;
  std::vector<std::unique_ptr<Entry>> entries;  // guarded by mu; most recent last
  int compilations = 0;                         // guarded by mu
  std::atomic<int> eager_fallbacks{0};
  enum class Fallback { kAliasing, kSignatures, kNumKinds };
  std::once_flag warned[static_cast<int>(Fallback::kNumKinds)];

  // Counts a call the plan cannot serve as traced (run eagerly instead) and warns once per kind
  // of reason.
  void RunEagerlyOnce(Fallback kind, const std::string& why) {
    ++eager_fallbacks;
    std::call_once(warned[static_cast<int>(kind)], [&] {
      std::cerr << "kiln: compiled function: " << why
                << "; such calls run eagerly (CompiledFn::eager_fallbacks() counts them)\n";
    });
  }

  // The plan serving `inputs`, compiled if needed; nullptr when max_signatures plans exist
  // already (the call runs eagerly, as torch past its cache_size_limit).
  Entry* EntryFor(const std::vector<Tensor>& inputs);
  // The same where a plan is required (report, executable): the limit is an error there.
  Entry& RequiredEntryFor(const std::vector<Tensor>& inputs);
  std::unique_ptr<Entry> Compile(const std::vector<TensorType>& types,
                                 const std::vector<Strides>& strides);
  std::optional<codegen::SymbolicShapes> SymbolsFor(const std::vector<TensorType>& types,
                                                    const std::vector<Strides>& strides,
                                                    std::string* why) const;
  void CheckRecompileAllowed(const std::vector<TensorType>& types,
                             const std::vector<Strides>& strides) const;
  bool AtSignatureLimit() const;  // max_signatures live plans: new signatures run eagerly
};

namespace {

// The one-time costs the CUDA backend has paid so far (none without it).
cuda_ops::OneTimeCosts OneTimeCostsSoFar() {
  if constexpr (kWithCuda) return cuda_ops::GetOneTimeCosts();
  return {};
}

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The plan of one graph: passes, lowering, report, dumps. `trace_ms`: what tracing it took.
void BuildPlan(ir::Graph graph, codegen::SymbolicShapes symbols, const CompileOptions& o,
               double trace_ms, Entry& entry) {
  const auto t0 = std::chrono::steady_clock::now();
  codegen::Dumper dump(o.dump_dir);
  if (o.tensor_names) ir::NameConstants(&graph, o.tensor_names());
  entry.report.traced_graph = ir::PrintGraph(graph);
  for (const ir::Node& n : graph.nodes()) {
    if (n.kind != ir::NodeKind::kConstant || n.local) continue;
    entry.captured.push_back({n.constant, n.name, n.constant.storage()->retired()});
    if (o.freeze_weights) {
      entry.frozen.emplace_back(n.constant.storage(), n.constant.storage()->version());
    }
  }
  entry.written_inputs = graph.input_updates();
  for (const Tensor& t : entry.captured_inputs) {
    KILN_CHECK(!o.freeze_weights, "compile: the function writes ", Describe(t.type()),
               ", a tensor it captured (not an input), in place; with freeze_weights the plan "
               "may fold captured tensors, so such writes are refused: compile without "
               "freeze_weights or pass the tensor as an input");
    entry.captured.push_back({t, "(written in place)", t.storage()->retired(), true});
  }
  dump.Graph("traced", graph);
  passes::PassContext ctx;
  ctx.disabled_families = o.disabled_families;
  ctx.multi_output = o.multi_output_fusion;
  ctx.horizontal_fusion = o.horizontal_fusion;
  ctx.gated_gemv = o.gated_gemv;
  ctx.kv_rope = o.kv_rope;
  ctx.cuda_cat_sinking = o.cuda_cat_sinking;
  ctx.merge_gemms = o.merge_gemms;  // over frozen weights only (fold_constants)
  ctx.fold_constants = o.freeze_weights;
  ctx.check_fusion_body = codegen::CheckFusionBody;
  ctx.after_pass = [&](const std::string& pass, const ir::Graph& g, bool changed) {
    dump.Graph(pass, g, changed);
  };
  const auto passes_start = std::chrono::steady_clock::now();
  ThrowIfError(codegen::CompilePipeline().Run(graph, ctx));
  entry.report.passes_ms = MsSince(passes_start);
  entry.report.final_graph = ir::PrintGraph(graph);
  const cuda::KernelCacheStats cache_before = cuda::GetKernelCacheStats();
  const cuda_ops::OneTimeCosts costs_before = OneTimeCostsSoFar();
  entry.exe = ValueOrThrow(codegen::Executable::Build(std::move(graph), std::move(symbols)));
  const cuda::KernelCacheStats cache_after = cuda::GetKernelCacheStats();
  const cuda_ops::OneTimeCosts costs_after = OneTimeCostsSoFar();
  const codegen::Executable& exe = *entry.exe;
  std::set<const codegen::FusedKernel*> dumped;  // a kernel fusions share is dumped once
  for (ir::ValueId v = 0; v < exe.graph().num_values(); ++v) {
    const codegen::FusedKernel* k = exe.kernel_of(v);
    if (k == nullptr || dumped.insert(k).second) dump.Kernel(exe.graph().node(v), k);
  }
  for (const std::string& line : exe.lowering_notes()) {
    ctx.explain.push_back("[lowering; %N as in the final graph] " + line);
  }
  CompileReport& r = entry.report;
  r.explain = ctx.explain;
  r.fused_kernels = exe.fused_kernels();
  r.steps = exe.num_steps();
  r.lowering_ms = exe.lowering_ms();
  r.nvrtc_ms = cache_after.compile_ms - cache_before.compile_ms;
  r.nvrtc_compiles = static_cast<int>(cache_after.compiles - cache_before.compiles);
  r.cache_hits = static_cast<int>(cache_after.memory_hits + cache_after.disk_hits -
                                  cache_before.memory_hits - cache_before.disk_hits);
  r.background_compiles =
      static_cast<int>(cache_after.background_compiles - cache_before.background_compiles);
  r.timing_ms = costs_after.timing_ms - costs_before.timing_ms;
  r.timed_choices = costs_after.timed - costs_before.timed;
  r.stored_choices = costs_after.stored - costs_before.stored;
  r.library_startup_ms = costs_after.library_startup_ms - costs_before.library_startup_ms;
  r.trace_ms = trace_ms;
  r.planned_peak_bytes = exe.planned_peak_bytes();
  r.total_intermediate_bytes = exe.total_intermediate_bytes();
  if (!exe.symbols().empty()) r.symbolic_dims = exe.symbols().Describe();
  r.compile_ms = trace_ms + MsSince(t0);
  dump.Text("explain.txt", absl::StrJoin(ctx.explain, "\n") + "\n", "fusion explain log");
  dump.Finish();
  r.dump_dir = dump.dir();
  r.kernel_sources_rendered = dump.sources_rendered();
  if (DebugLevel() >= 2) std::cerr << absl::StrJoin(ctx.explain, "\n") << "\n";
}

}  // namespace

// Symbols for a new signature: the named dims (kDims), or the dims in which it differs from the
// first compiled signature (kAuto); nullopt for a static compile (`why` says why, if tried).
std::optional<codegen::SymbolicShapes> CompiledFn::State::SymbolsFor(
    const std::vector<TensorType>& types, const std::vector<Strides>& strides,
    std::string* why) const {
  for (size_t i = 0; i < strides.size(); ++i) {
    if (strides[i].empty()) continue;
    KILN_CHECK(options.dynamic != CompileOptions::Dynamic::kDims, "compile: input ", i, " (",
               Describe(types[i]), ") is not contiguous; dynamic dims need contiguous inputs ",
               "(a plan follows a non-contiguous input's strides)");
    if (options.dynamic == CompileOptions::Dynamic::kAuto && !entries.empty()) {
      *why = absl::StrCat("input ", i, " is not contiguous (a plan follows its strides)");
    }
    return std::nullopt;
  }
  if (options.dynamic == CompileOptions::Dynamic::kDims) {
    return ValueOrThrow(codegen::NamedSymbols(types, options.dynamic_dims));
  }
  if (options.dynamic != CompileOptions::Dynamic::kAuto || entries.empty()) return std::nullopt;
  // Against the earliest plan of the same dtypes, devices and ranks (with its own layouts), so
  // that calls alternating two dtypes get a symbolic plan for each.
  for (const auto& e : entries) {
    if (e->strides != strides) continue;
    if (std::optional<codegen::SymbolicShapes> s = codegen::SymbolsBetween(e->types, types)) {
      return s;
    }
  }
  *why = "the signatures differ in more than sizes";
  return std::nullopt;
}

std::unique_ptr<Entry> CompiledFn::State::Compile(const std::vector<TensorType>& types,
                                                  const std::vector<Strides>& strides) {
  auto entry = std::make_unique<Entry>();
  entry->types = types;
  entry->strides = strides;
  std::string not_symbolic;
  if (std::optional<codegen::SymbolicShapes> s = SymbolsFor(types, strides, &not_symbolic)) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<ir::Graph> g = codegen::TraceSymbolic(fn, types, *s, &entry->output_aliases);
    if (g.ok()) {
      entry->symbolic_graph = *g;
      for (const std::vector<int64_t>& traced : codegen::TracedValues(types, *s)) {
        entry->served.insert(traced);
      }
      BuildPlan(*std::move(g), *std::move(s), options, MsSince(t0), *entry);
      entry->symbols = entry->exe->symbols();
      return entry;
    }
    if (options.dynamic == CompileOptions::Dynamic::kDims) ThrowIfError(g.status());
    not_symbolic = std::string(g.status().message());
  }
  const auto t0 = std::chrono::steady_clock::now();
  ir::Graph traced =
      ValueOrThrow(ir::Trace(fn, types, strides, &entry->captured_inputs, &entry->output_aliases));
  BuildPlan(std::move(traced), {}, options, MsSince(t0), *entry);
  if (!not_symbolic.empty()) entry->report.symbolic_dims = "not symbolic: " + not_symbolic;
  return entry;
}

void CompiledFn::State::CheckRecompileAllowed(const std::vector<TensorType>& types,
                                              const std::vector<Strides>& strides) const {
  if (entries.empty()) return;
  // The input count is the function's arity: a call with another count is refused, as torch
  // refuses a call with the wrong number of arguments (tracing the user's function with fewer
  // inputs than it reads would index past the end of its vector).
  const Entry& first = *entries.front();
  KILN_CHECK(types.size() == first.types.size(), "compiled function: called with ", types.size(),
             " inputs, compiled for ", first.types.size(),
             " (the input count is fixed; compile the function again for another)");
  if (!options.recompile) {
    const auto layout = [](const Strides& s) {
      return s.empty() ? std::string("contiguous") : absl::StrCat("strides ", ShapeString(s));
    };
    for (size_t i = 0; i < types.size(); ++i) {
      KILN_CHECK(types[i] == first.types[i], "compiled function: input ", i, " is ",
                 Describe(types[i]), " but the function was compiled for ",
                 Describe(first.types[i]), " (recompile is off)");
      KILN_CHECK(strides[i] == first.strides[i], "compiled function: input ", i, " is ",
                 layout(strides[i]), " but the function was compiled for ",
                 layout(first.strides[i]), " (recompile is off)");
    }
  }
}

bool CompiledFn::State::AtSignatureLimit() const {
  int live = 0;
  for (const auto& e : entries) live += !e->stale;
  return live >= options.max_signatures;
}

Entry* CompiledFn::State::EntryFor(const std::vector<Tensor>& inputs) {
  // A call made while this thread compiles this function (by a custom op folded at compile time,
  // a tensor_names callback) would wait for itself: an error instead.
  thread_local std::vector<const State*> compiling;
  KILN_CHECK(std::find(compiling.begin(), compiling.end(), this) == compiling.end(),
             "compiled function: called while this thread is compiling it (from code that runs "
             "at compile time: a custom op folded into a constant, tensor_names); call it after "
             "compile returns");
  compiling.push_back(this);
  struct Done {
    std::vector<const State*>& list;
    ~Done() { list.pop_back(); }
  } done{compiling};
  std::lock_guard<std::mutex> lock(mu);
  std::string recompile_reason;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    if (!(*it)->Serves(inputs) || !(*it)->VerifiedFor(inputs, fn)) continue;
    recompile_reason = (*it)->StaleReason();
    if (recompile_reason.empty()) return it->get();
    (*it)->stale = true;  // compile again (the old plan stays, idle)
  }
  const std::vector<TensorType> types = TypesOf(inputs);
  std::vector<Strides> strides;
  for (const Tensor& t : inputs) strides.push_back(ir::InputStrides(t));
  CheckRecompileAllowed(types, strides);
  if (AtSignatureLimit()) return nullptr;
  std::unique_ptr<Entry> entry = Compile(types, strides);
  ++compilations;
  if (!recompile_reason.empty()) {
    entry->report.recompiled_because = recompile_reason;
    entry->report.explain.push_back("recompiled: " + recompile_reason);
  }
  if (DebugLevel() >= 1) {
    std::cerr << "kiln: compiled " << Signature(types) << " " << entry->report.Summary() << "\n";
  }
  if (options.cuda_graphs && entry->exe->on_cuda()) {
    entry->report.cuda_graph = "pending (captured after the first call)";
  }
  entries.push_back(std::move(entry));
  return entries.back().get();
}

Entry& CompiledFn::State::RequiredEntryFor(const std::vector<Tensor>& inputs) {
  Entry* e = EntryFor(inputs);
  KILN_CHECK(e != nullptr, "compiled function: more than ", options.max_signatures,
             " input signatures, so these inputs run eagerly and have no plan; new one: ",
             Signature(TypesOf(inputs)));
  return *e;
}

CompiledFn::CompiledFn(ir::TensorFn fn, CompileOptions options)
    : state_(std::make_shared<State>()) {
  state_->fn = std::move(fn);
  state_->options = std::move(options);
  const CompileOptions& o = state_->options;
  state_->compiled = o.mode == CompileOptions::Mode::kCompiled ||
                     (o.mode == CompileOptions::Mode::kDefault && EnvBool("KILN_COMPILE"));
  state_->options.cuda_graphs = o.cuda_graphs || EnvBool("KILN_CUDA_GRAPHS");
  for (std::string& family : EnvNames("KILN_DISABLED_FAMILIES")) {
    std::vector<std::string>& off = state_->options.disabled_families;
    if (std::find(off.begin(), off.end(), family) == off.end()) off.push_back(std::move(family));
  }
  KILN_CHECK(o.max_signatures >= 1, "compile: options.max_signatures must be at least 1, got ",
             o.max_signatures);
  for (const std::string& family : o.disabled_families) {
    KILN_CHECK(codegen::TemplateNamed(family) != nullptr,
               "compile: options.disabled_families names \"", family,
               "\", which is no kernel family (the families: ", codegen::FamilyNames(), ")");
  }
  if (state_->options.dump_dir.empty()) {
    state_->options.dump_dir = EnvPath("KILN_DUMP");
  }
}

bool CompiledFn::compiled() const { return state_->compiled; }

int CompiledFn::eager_fallbacks() const { return state_->eager_fallbacks.load(); }

int CompiledFn::compilations() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->compilations;
}

namespace {

// One call of entry `e` of `state`: its plan (or its CUDA graph), or eagerly where inputs alias
// in a way the trace did not see.
std::vector<Tensor> RunEntry(CompiledFn::State& state, Entry& e,
                             const std::vector<Tensor>& inputs) {
  const std::vector<Tensor> flat = e.PlanInputs(inputs);  // over the caller's memory
  std::vector<Tensor> plan_inputs = flat;
  if (!e.written_inputs.empty()) {
    // Overlap is judged on the caller's tensors (a strided input's flat span reaches elements
    // that are not its own).
    std::vector<Tensor> check = plan_inputs;
    for (size_t i = 0; i < inputs.size(); ++i) check[i] = inputs[i];
    if (const std::string why = e.AliasingConflict(check); !why.empty()) {
      state.RunEagerlyOnce(CompiledFn::State::Fallback::kAliasing, why);
      return state.fn(inputs);
    }
  }
  const StridedWrites strided_writes(e.written_inputs, e.strides, inputs, plan_inputs);
  std::vector<Tensor> outs = [&]() -> std::vector<Tensor> {
    if (!state.options.cuda_graphs || !e.exe->on_cuda()) return e.exe->Run(plan_inputs);
    if constexpr (kWithCuda) {  // (a plan on CUDA exists only there)
      // Replays one of the entry's CUDA graphs (by input address, or copy-in), capturing after a
      // plain run when none fits; the report says which, or why none.
      std::lock_guard<std::mutex> lock(e.graph_mu);
      if (e.graphs == nullptr) e.graphs = std::make_shared<codegen::CudaGraphCache>(*e.exe);
      const cuda::ScopedGraphReplay for_graph;  // the plain run before a capture chooses for it
      std::vector<Tensor> out = e.graphs->Run(plan_inputs);
      if (e.graphs->changes() == e.graph_changes_reported) return out;
      e.graph_changes_reported = e.graphs->changes();
      std::string described = e.graphs->Describe();
      if (described != e.report.cuda_graph) {
        if (DebugLevel() >= 1) std::cerr << "kiln: CUDA graph " << described << "\n";
        e.report.cuda_graph = std::move(described);
      }
      return out;
    }
    return e.exe->Run(plan_inputs);
  }();
  strided_writes.CopyBack();
  ApplyOutputAliases(e.output_aliases, inputs, flat, outs);
  return outs;
}

}  // namespace

std::vector<Tensor> CompiledFn::operator()(const std::vector<Tensor>& inputs) const {
  if (state_->before_call) state_->before_call();
  // Called inside a function being traced (a compiled function calling another): its ops are
  // recorded into the outer trace, as torch inlines a nested compiled function.
  if (!state_->compiled || CurrentDispatchHook() != nullptr) return state_->fn(inputs);
  // Meta inputs carry shapes and no data: eagerly, every op propagates them (nothing to run).
  for (const Tensor& t : inputs) {
    if (t.defined() && t.device().is_meta()) return state_->fn(inputs);
  }
  Entry* entry = state_->EntryFor(inputs);
  if (entry == nullptr) {
    state_->RunEagerlyOnce(
        State::Fallback::kSignatures,
        absl::StrCat("more than ", state_->options.max_signatures,
                     " input signatures (dims that vary are "
                     "made symbolic only when nothing but sizes change; set options.dynamic or "
                     "max_signatures); new one: ",
                     Signature(TypesOf(inputs))));
    return state_->fn(inputs);
  }
  return RunEntry(*state_, *entry, inputs);
}

const CompileReport& CompiledFn::report(const std::vector<Tensor>& inputs) const {
  Entry& e = state_->RequiredEntryFor(inputs);
  std::call_once(e.counted, [&] {  // counting runs each GEMM once on CUDA: not at compile
    std::optional<cuda::ScopedGraphReplay> for_graph;
    if (state_->options.cuda_graphs) for_graph.emplace();
    e.report.memsets_per_step = e.exe->memsets_per_step();
  });
  // Less what the last call's GEMV chains saved (Executable::kernels_per_step): read every time.
  static std::mutex count_mu;
  std::lock_guard<std::mutex> lock(count_mu);
  e.report.kernels_per_step = e.exe->kernels_per_step();
  return e.report;
}

std::vector<std::optional<ir::OutputAlias>> CompiledFn::output_aliases(
    const std::vector<Tensor>& inputs) const {
  return state_->RequiredEntryFor(inputs).output_aliases;
}

const codegen::Executable& CompiledFn::executable(const std::vector<Tensor>& inputs) const {
  return *state_->RequiredEntryFor(inputs).exe;
}

CompiledFn compile(ir::TensorFn fn, const std::vector<Tensor>& example_inputs,
                   CompileOptions options) {
  CompiledFn f(std::move(fn), std::move(options));
  if (f.compiled()) f.state_->RequiredEntryFor(example_inputs);  // compile now: errors here
  return f;
}

namespace {

void CheckModuleAlive(const std::weak_ptr<const bool>& alive) {
  KILN_CHECK(!alive.expired(),
             "compiled function: the module it was compiled from has been destroyed; compile "
             "the new module instead");
}

}  // namespace

CompiledFn compile(Module& module, const Tensor& example_input, CompileOptions options) {
  std::weak_ptr<const bool> alive = module.alive_token();
  options.tensor_names = [&module, alive, given = std::move(options.tensor_names)] {
    std::vector<std::pair<std::string, Tensor>> names;
    if (given) names = given();
    if (alive.expired()) return names;
    for (auto& named : module.named_tensors()) names.push_back(std::move(named));
    return names;
  };
  CompiledFn f = compile(
      [&module, alive](const std::vector<Tensor>& in) {
        CheckModuleAlive(alive);
        KILN_CHECK(in.size() == 1, "compiled module: takes one input, got ", in.size());
        return std::vector<Tensor>{module(in[0])};
      },
      {example_input}, std::move(options));
  // Every call, not only one that traces: a plan would still hold the destroyed module's weights.
  f.state_->before_call = [alive] { CheckModuleAlive(alive); };
  return f;
}

void WaitForBackgroundCompiles() { cuda::WaitForBackgroundJobs(); }

}  // namespace kiln
