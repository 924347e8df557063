// kiln::compile (see compile.h): trace -> passes -> executable, with dumps and the mode switch.
#include "codegen/compile.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/fused_kernel.h"
#include "ir/printer.h"
#include "passes/pass.h"
#include "runtime/nvrtc.h"
#include "runtime/status.h"

namespace kiln {
namespace {

int DebugLevel() {
  const char* v = std::getenv("KILN_DEBUG");
  return v == nullptr ? 0 : std::atoi(v);
}

std::string Signature(const std::vector<Tensor>& inputs) {
  std::string s;
  for (const Tensor& t : inputs) absl::StrAppend(&s, t.defined() ? Describe(t.type()) : "-", ";");
  return s;
}

// Writes the compile artefacts under one directory and keeps an index of them.
class Dumper {
 public:
  explicit Dumper(std::string dir) : dir_(std::move(dir)) {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(dir_ + "/kernels", ec);
    if (ec) {
      std::cerr << "kiln: cannot create dump directory " << dir_ << ": " << ec.message() << "\n";
      dir_.clear();
    }
  }
  bool enabled() const { return !dir_.empty(); }

  void Graph(const std::string& stage, const ir::Graph& g) {
    if (DebugLevel() >= 4) std::cerr << "kiln: graph after " << stage << ":\n" << ir::PrintGraph(g);
    if (!enabled()) return;
    const std::string base = absl::StrCat(absl::Dec(index_++, absl::kZeroPad2), "_", stage);
    Write(base + ".txt", ir::PrintGraph(g), "graph after " + stage);
    Write(base + ".dot", ir::ToDot(g), "Graphviz of the same");
  }

  void Kernel(const ir::Node& fusion, const std::string& nodes) {
    const std::string src = codegen::FusionSource(fusion);
    if (DebugLevel() >= 3) std::cerr << "kiln: kernel " << fusion.name << ":\n" << src;
    if (!enabled()) return;
    const std::string header = absl::StrCat("// ", fusion.name, ": fused from ", nodes, "\n// ",
                                            codegen::FusionLaunchNote(fusion), "\n");
    Write("kernels/" + fusion.name + ".cu", header + src, "CUDA source (" + nodes + ")");
    auto ptx = cuda::CompileSource(src, fusion.name, "compute_90", /*cubin=*/false);
    Write("kernels/" + fusion.name + ".ptx", ptx.ok() ? *ptx : std::string(ptx.status().message()),
          "PTX for compute_90");
  }

  void Text(const std::string& name, const std::string& text, const std::string& what) {
    if (enabled()) Write(name, text, what);
  }

  void Finish() {
    if (enabled()) Write("index.md", absl::StrJoin(index_lines_, "\n") + "\n", "");
  }

 private:
  void Write(const std::string& name, const std::string& text, const std::string& what) {
    std::ofstream(dir_ + "/" + name) << text;
    if (!what.empty()) index_lines_.push_back(absl::StrCat("- `", name, "`: ", what));
  }

  std::string dir_;
  int index_ = 0;
  std::vector<std::string> index_lines_ = {"# kiln compile dump", ""};
};

std::string DumpDir(const CompileOptions& o) {
  if (!o.dump_dir.empty()) return o.dump_dir;
  const char* env = std::getenv("KILN_DUMP");
  return env == nullptr ? "" : env;
}

std::string FusedFrom(const ir::Graph& body) {
  std::vector<std::string> ops;
  for (const ir::Node& n : body.nodes()) {
    if (n.kind == ir::NodeKind::kOp) ops.push_back(GetOpDef(n.op).name);
  }
  return absl::StrJoin(ops, ", ");
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

bool CudaGraphsFromEnv() {
  const char* env = std::getenv("KILN_CUDA_GRAPHS");
  return env != nullptr && std::string(env) == "1";
}

}  // namespace

CompiledFn::CompiledFn(ir::TensorFn fn, CompileOptions options)
    : fn_(std::move(fn)), options_(std::move(options)) {
  const char* env = std::getenv("KILN_COMPILE");
  compiled_ = options_.mode == CompileOptions::Mode::kCompiled ||
              (options_.mode == CompileOptions::Mode::kDefault &&
               !(env != nullptr && std::string(env) == "0"));
  options_.cuda_graphs = options_.cuda_graphs || CudaGraphsFromEnv();
}

CompiledFn::Entry& CompiledFn::EntryFor(const std::vector<Tensor>& inputs) {
  if (last_ != nullptr && SameTypes(last_->types, inputs)) return *last_;  // no string building
  const std::string sig = Signature(inputs);
  if (auto it = cache_.find(sig); it != cache_.end()) {
    last_ = &it->second;
    return it->second;
  }
  if (!cache_.empty() && !options_.recompile) {
    for (size_t i = 0; i < inputs.size() && i < first_types_.size(); ++i) {
      KILN_CHECK(inputs[i].type() == first_types_[i], "compiled function: input ", i, " is ",
                 Describe(inputs[i].type()), " but the function was compiled for ",
                 Describe(first_types_[i]), " (recompile is off)");
    }
    KILN_CHECK(inputs.size() == first_types_.size(), "compiled function: called with ",
               inputs.size(), " inputs, compiled for ", first_types_.size());
  }
  KILN_CHECK(static_cast<int>(cache_.size()) < options_.max_signatures,
             "compiled function: more than ", options_.max_signatures,
             " input signatures; new one: ", sig);
  const auto t0 = std::chrono::steady_clock::now();
  Dumper dump(DumpDir(options_));
  ir::Graph graph = ValueOrThrow(ir::Trace(fn_, inputs));
  Entry entry;
  entry.report.traced_graph = ir::PrintGraph(graph);
  dump.Graph("traced", graph);
  passes::PassContext ctx;
  ctx.fuse_elementwise = options_.fuse_elementwise;
  ctx.fuse_softmax = options_.fuse_softmax;
  ctx.merge_gemms = options_.merge_gemms;
  ctx.fuse_gemm_epilogues = options_.fuse_gemm_epilogues;
  ctx.after_pass = [&](const std::string& pass, const ir::Graph& g) { dump.Graph(pass, g); };
  ThrowIfError(passes::DefaultPipeline().Run(graph, ctx));
  entry.report.final_graph = ir::PrintGraph(graph);
  entry.report.explain = ctx.explain;
  for (const ir::Node& n : graph.nodes()) {
    if (n.kind == ir::NodeKind::kFusion) dump.Kernel(n, FusedFrom(*n.body));
  }
  entry.exe = ValueOrThrow(codegen::Executable::Build(std::move(graph)));
  entry.report.kernels_per_step = entry.exe->kernels_per_step();
  entry.report.fused_kernels = entry.exe->fused_kernels();
  entry.report.nvrtc_ms = entry.exe->nvrtc_ms();
  for (const std::string& line : entry.exe->epilogue_choices()) {
    entry.report.explain.push_back(line);
    ctx.explain.push_back(line);  // into the dump's explain.txt too
  }
  entry.report.planned_peak_bytes = entry.exe->planned_peak_bytes();
  entry.report.total_intermediate_bytes = entry.exe->total_intermediate_bytes();
  entry.report.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  dump.Text("explain.txt", absl::StrJoin(ctx.explain, "\n") + "\n", "fusion explain log");
  dump.Finish();
  if (DebugLevel() >= 1) {
    std::cerr << "kiln: compiled " << sig << " in " << entry.report.compile_ms << " ms ("
              << entry.report.kernels_per_step << " kernels per step, "
              << entry.report.fused_kernels << " fused)\n";
  }
  if (DebugLevel() >= 2) std::cerr << absl::StrJoin(ctx.explain, "\n") << "\n";
  for (const Tensor& t : inputs) entry.types.push_back(t.type());
  if (cache_.empty()) first_types_ = entry.types;
  if (options_.cuda_graphs && entry.exe->on_cuda()) {
    entry.report.cuda_graph = "pending (captured after the first call)";
  }
  last_ = &cache_.emplace(sig, std::move(entry)).first->second;
  return *last_;
}

std::vector<Tensor> CompiledFn::operator()(const std::vector<Tensor>& inputs) {
  if (!compiled_) return fn_(inputs);
  Entry& e = EntryFor(inputs);
  if (options_.cuda_graphs && e.exe->on_cuda()) return RunWithCudaGraph(e, inputs);
  return e.exe->Run(inputs);
}

// Replays one of the entry's CUDA graphs (codegen/cuda_graph.h: by input address, or copy-in),
// capturing after a plain run when none fits; the report says which, or why none.
std::vector<Tensor> CompiledFn::RunWithCudaGraph(Entry& e, const std::vector<Tensor>& inputs) {
  if (e.graphs == nullptr) e.graphs = std::make_unique<codegen::CudaGraphCache>(*e.exe);
  std::vector<Tensor> out = e.graphs->Run(inputs);
  const std::string state = e.graphs->Describe();
  if (state != e.report.cuda_graph && DebugLevel() >= 1) {
    std::cerr << "kiln: CUDA graph " << state << "\n";
  }
  e.report.cuda_graph = state;
  return out;
}

const CompileReport& CompiledFn::report(const std::vector<Tensor>& inputs) {
  return EntryFor(inputs).report;
}

const codegen::Executable& CompiledFn::executable(const std::vector<Tensor>& inputs) {
  return *EntryFor(inputs).exe;
}

CompiledFn compile(ir::TensorFn fn, const std::vector<Tensor>& example_inputs,
                   CompileOptions options) {
  CompiledFn f(std::move(fn), std::move(options));
  if (f.compiled()) f.report(example_inputs);  // compile now: errors surface here
  return f;
}

CompiledFn compile(Module& module, const Tensor& example_input, CompileOptions options) {
  return compile(
      [&module](const std::vector<Tensor>& in) { return std::vector<Tensor>{module(in[0])}; },
      {example_input}, std::move(options));
}

}  // namespace kiln
