// Ahead-of-time export and loading of compiled plans (see export.h): the manifest, the files and
// their checks, the kernels given to the kernel cache, the loaded plan's calls.
#include "models/export.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/cuda_graph.h"
#include "codegen/executable.h"
#include "codegen/fusion_template.h"
#include "io/files.h"
#include "io/json_text.h"
#include "io/safetensors.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "ops/ops.h"
#include "runtime/build_config.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "runtime/sha256.h"
#include "runtime/status.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr int kFormat = 2;  // 2: inputs' strides, output aliases
constexpr char kManifest[] = "manifest.json";
constexpr char kGraph[] = "graph.txt";
constexpr char kConstants[] = "constants.safetensors";

// What a loaded plan needs to know of the exporter's call.
struct InputSpec {
  TensorType type;
  Strides strides;  // empty: contiguous; else the strides the plan was traced with
};

struct Manifest {
  std::string kiln, arch;  // kiln's build; "sm_90" or "cpu"
  std::vector<InputSpec> inputs;
  std::vector<int> input_updates;
  std::vector<std::optional<ir::OutputAlias>> output_aliases;  // per output
  std::map<std::string, std::string> files;                    // relative path -> SHA-256
};

std::string ConstantName(int k) { return absl::StrCat("constant_", k); }

std::string KernelFile(const cuda::KernelBinaryImage& k) {
  return absl::StrCat("kernels/", absl::Hex(k.key, absl::kZeroPad16), ".", k.arch, ".cubin");
}

// The architecture a plan's kernels are for: the GPU of its CUDA inputs, or "cpu".
std::string ArchOf(const std::vector<TensorType>& inputs) {
  for (const TensorType& t : inputs) {
    if (!t.device.is_cuda()) continue;
    const cuda::DeviceProps& p = cuda::Props(t.device.index);
    return absl::StrCat("sm_", p.major, p.minor);
  }
  return "cpu";
}

std::vector<TensorType> TypesOf(const std::vector<InputSpec>& inputs) {
  std::vector<TensorType> types;
  for (const InputSpec& in : inputs) types.push_back(in.type);
  return types;
}

std::string ManifestJson(const Manifest& m) {
  Json inputs = Json::array();
  for (const InputSpec& in : m.inputs) {
    inputs.push_back({{"dtype", DTypeName(in.type.dtype)},
                      {"shape", in.type.shape},
                      {"device", in.type.device.str()},
                      {"strides", in.strides.empty() ? Json(nullptr) : Json(in.strides)}});
  }
  Json aliases = Json::array();
  for (const std::optional<ir::OutputAlias>& a : m.output_aliases) {
    aliases.push_back(a ? Json{{"input", a->input},
                               {"offset", a->offset},
                               {"shape", a->shape},
                               {"strides", a->strides},
                               {"whole_input", a->whole_input},
                               {"output", a->output}}
                        : Json(nullptr));
  }
  Json j = {{"format", kFormat},
            {"kiln", m.kiln},
            {"arch", m.arch},
            {"inputs", inputs},
            {"input_updates", m.input_updates},
            {"output_aliases", aliases},
            {"files", m.files}};
  return j.dump(2) + "\n";
}

DType DTypeNamed(const std::string& name) {
  for (int d = 0; d < kNumDTypes; ++d) {
    if (name == DTypeName(static_cast<DType>(d))) return static_cast<DType>(d);
  }
  KILN_FAIL("unknown dtype \"", name, "\"");
}

// A JSON integer (not a float, not a bool) that fits int64.
int64_t Integer(const Json& v, const char* what) {
  KILN_CHECK(v.is_number_integer() &&
                 (!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)),
             what, " must be an integer, got ", JsonForMessage(v));
  return v.get<int64_t>();
}

std::vector<int64_t> Integers(const Json& v, const char* what) {
  KILN_CHECK(v.is_array(), what, " must be a list of integers, got ", JsonForMessage(v));
  std::vector<int64_t> out;
  for (const Json& x : v) out.push_back(Integer(x, what));
  return out;
}

Manifest ParseManifest(const std::string& text) {
  Manifest m;
  const Json j = ValueOrThrow(ParseJsonStrictly(text, "the manifest"));
  KILN_CHECK(j.is_object(), "the manifest is not a JSON object");
  if (Integer(j.at("format"), "format") != kFormat) {
    KILN_FAIL("format ", JsonForMessage(j.at("format")), " (this kiln reads format ", kFormat, ")");
  }
  m.kiln = j.at("kiln").get<std::string>();
  m.arch = j.at("arch").get<std::string>();
  for (const Json& in : j.at("inputs")) {
    InputSpec s;
    s.type.dtype = DTypeNamed(in.at("dtype").get<std::string>());
    const std::vector<int64_t> shape = Integers(in.at("shape"), "an input's shape");
    s.type.shape = Shape(shape.begin(), shape.end());
    s.type.device = ParseDevice(in.at("device").get<std::string>());
    if (!in.at("strides").is_null()) {
      const std::vector<int64_t> strides = Integers(in.at("strides"), "an input's strides");
      s.strides = Strides(strides.begin(), strides.end());
      KILN_CHECK(s.strides.size() == s.type.shape.size(), "an input's strides ",
                 JsonForMessage(in.at("strides")), " do not match its shape");
    }
    m.inputs.push_back(s);
  }
  for (int64_t i : Integers(j.at("input_updates"), "input_updates")) {
    KILN_CHECK(i >= 0 && i < static_cast<int64_t>(m.inputs.size()), "input_updates names input ", i,
               " of ", m.inputs.size());
    KILN_CHECK(
        std::find(m.input_updates.begin(), m.input_updates.end(), i) == m.input_updates.end(),
        "input_updates names input ", i, " twice");
    m.input_updates.push_back(static_cast<int>(i));
  }
  for (const Json& a : j.at("output_aliases")) {
    if (a.is_null()) {
      m.output_aliases.emplace_back();
      continue;
    }
    ir::OutputAlias alias;
    // A window of another output (older manifests have no "output": none is).
    const int64_t output =
        a.contains("output") ? Integer(a.at("output"), "an output alias's output") : -1;
    const int64_t input = Integer(a.at("input"), "an output alias's input");
    KILN_CHECK(output >= -1 && output < static_cast<int64_t>(j.at("output_aliases").size()),
               "an output alias names output ", output, " of ", j.at("output_aliases").size());
    KILN_CHECK(
        output >= 0 ? input == -1 : input >= 0 && input < static_cast<int64_t>(m.inputs.size()),
        "an output alias names input ", input, " of ", m.inputs.size());
    alias.input = static_cast<int>(input);
    alias.output = static_cast<int>(output);
    alias.offset = Integer(a.at("offset"), "an output alias's offset");
    const std::vector<int64_t> shape = Integers(a.at("shape"), "an output alias's shape");
    const std::vector<int64_t> strides = Integers(a.at("strides"), "an output alias's strides");
    alias.shape = Shape(shape.begin(), shape.end());
    alias.strides = Strides(strides.begin(), strides.end());
    KILN_CHECK(a.at("whole_input").is_boolean(), "an output alias's whole_input must be a bool");
    alias.whole_input = a.at("whole_input").get<bool>();
    m.output_aliases.push_back(std::move(alias));
  }
  m.files = j.at("files").get<std::map<std::string, std::string>>();
  return m;
}

// The graph input an input of `spec` is: itself, or the flat tensor over what a strided one
// reaches (ir::Trace's input_strides).
TensorType GraphInputType(const InputSpec& spec) {
  if (spec.strides.empty()) return spec.type;
  return {Shape{SpanOf(spec.type.shape, spec.strides).span}, spec.type.dtype, spec.type.device};
}

// The graph's constants in value order (the text's order: ParseGraph numbers values as written).
std::vector<ir::ValueId> ConstantsOf(const ir::Graph& g) {
  std::vector<ir::ValueId> constants;
  for (ir::ValueId v = 0; v < g.num_values(); ++v) {
    if (g.node(v).kind == ir::NodeKind::kConstant) constants.push_back(v);
  }
  return constants;
}

// Parses `text` and gives constant k the tensor value(k, its type), checked against that type.
ir::Graph GraphWithConstants(const std::string& text,
                             const std::function<Tensor(int, const TensorType&)>& value,
                             const std::vector<int>& input_updates) {
  ir::Graph g = ValueOrThrow(ir::ParseGraph(text));
  const std::vector<ir::ValueId> constants = ConstantsOf(g);
  for (size_t k = 0; k < constants.size(); ++k) {
    ir::Node& n = g.mutable_node(constants[k]);
    n.constant = value(static_cast<int>(k), n.type);
    KILN_CHECK(n.constant.type() == n.type, "constant ", k, " (\"", n.name, "\") is ",
               Describe(n.constant.type()), " where the graph reads ", Describe(n.type));
  }
  g.mutable_input_updates() = input_updates;
  return g;
}

// The graph reads the manifest's inputs, and writes back only inputs it has, from its outputs.
void CheckSignature(const ir::Graph& g, const Manifest& m) {
  KILN_CHECK(g.inputs().size() == m.inputs.size(), "the graph takes ", g.inputs().size(),
             " inputs, the manifest lists ", m.inputs.size());
  for (size_t i = 0; i < m.inputs.size(); ++i) {
    const TensorType want = GraphInputType(m.inputs[i]);
    KILN_CHECK(g.type(g.inputs()[i]) == want, "input ", i, " is ", Describe(g.type(g.inputs()[i])),
               " in the graph, ", Describe(want), " by the manifest");
  }
  KILN_CHECK(m.output_aliases.size() <= g.outputs().size(), "the manifest places ",
             m.output_aliases.size(), " outputs of a graph of ", g.outputs().size());
  for (size_t k = 0; k < m.output_aliases.size(); ++k) {
    const std::optional<ir::OutputAlias>& a = m.output_aliases[k];
    if (!a) continue;
    // The alias must lie inside its input's graph value (the plan's memory for it), or inside
    // another output that is no alias itself.
    if (a->output >= 0) {
      KILN_CHECK(a->output != static_cast<int>(k) && !m.output_aliases[a->output].has_value(),
                 "output alias ", k, " is a window of output ", a->output, ", itself an alias");
    }
    const TensorType in =
        a->output >= 0 ? g.type(g.outputs()[a->output]) : g.type(g.inputs()[a->input]);
    const Tensor probe = Tensor::Empty(in.shape, in.dtype, kMeta);
    KILN_CHECK(a->offset >= 0 && a->shape.size() == a->strides.size(),
               "an output alias is malformed");
    probe.as_strided(a->shape, a->strides, a->offset);  // throws when outside
  }
  KILN_CHECK(m.input_updates.size() <= g.outputs().size(), "the manifest writes back ",
             m.input_updates.size(), " inputs from a graph of ", g.outputs().size(), " outputs");
}

std::vector<Tensor> ConstantValues(const ir::Graph& g) {
  std::vector<Tensor> values;
  for (ir::ValueId v : ConstantsOf(g)) values.push_back(g.node(v).constant);
  return values;
}

}  // namespace

void Export(const CompiledFn& fn, const std::vector<Tensor>& example_inputs,
            const std::string& dir) {
  const std::string where = absl::StrCat("Export(", dir, ")");
  KILN_CHECK(!dir.empty(), "Export: the folder name is empty");
  const codegen::Executable& exe = fn.executable(example_inputs);
  const ir::Graph& graph = exe.graph();
  KILN_CHECK(exe.symbols().empty(), where, ": the plan has symbolic dims (",
             exe.symbols().Describe(), "); compile with dynamic = kNone to export one signature");
  KILN_CHECK(graph.inputs().size() == example_inputs.size(), where, ": the function writes ",
             graph.inputs().size() - example_inputs.size(),
             " tensor(s) it captured in place (a KV cache?); pass them as inputs to export it");
  for (ir::ValueId v = 0; v < graph.num_values(); ++v) {
    const ir::Node& n = graph.node(v);
    KILN_CHECK(n.kind != ir::NodeKind::kOp || !GetOpDef(n.op).collective, where,
               ": the plan has a ", GetOpDef(n.op).name, " (%", v,
               "), whose process group lives in this process only; export a single-rank model");
  }
  Manifest m;
  m.kiln = KILN_BUILD_ID;
  for (const Tensor& x : example_inputs) m.inputs.push_back({x.type(), ir::InputStrides(x)});
  m.output_aliases = fn.output_aliases(example_inputs);
  m.arch = ArchOf(TypesOf(m.inputs));
  m.input_updates = graph.input_updates();
  const std::string text = ir::PrintGraph(graph);
  const std::vector<Tensor> constants = ConstantValues(graph);

  // The plan rebuilt from what is written and run once (the text round-trips; a kernel compiled
  // at its first call is loaded), then every kernel this process has loaded is written.
  auto constant = [&](int k, const TensorType&) { return constants.at(k); };
  std::unique_ptr<codegen::Executable> rebuilt =
      ValueOrThrow(codegen::Executable::Build(GraphWithConstants(text, constant, m.input_updates)));
  // The plan's inputs for the example call (a strided input as its flat tensor), copies of those
  // the function writes.
  std::vector<Tensor> run_inputs;
  for (size_t i = 0; i < example_inputs.size(); ++i) {
    const Tensor in =
        m.inputs[i].strides.empty() ? example_inputs[i] : ir::FlatInput(example_inputs[i]);
    const bool written = std::find(m.input_updates.begin(), m.input_updates.end(),
                                   static_cast<int>(i)) != m.input_updates.end();
    run_inputs.push_back(written ? clone(in) : in);
  }
  rebuilt->Run(run_inputs);
  if (rebuilt->on_cuda()) cuda::Synchronize();
  const std::vector<cuda::KernelBinaryImage> kernels = ValueOrThrow(cuda::ServedKernelImages());

  NamedTensors named;
  for (size_t k = 0; k < constants.size(); ++k) {
    named.emplace_back(ConstantName(static_cast<int>(k)), constants[k]);
  }
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "kernels", ec);
  KILN_CHECK(!ec, where, ": cannot create ", dir, ": ", ec.message());
  const fs::path root(dir);
  // An earlier export's manifest goes first: until the new one is written last, the folder is
  // an unfinished export (refused as such), never an old manifest over new files.
  fs::remove(root / kManifest, ec);
  KILN_CHECK(!ec, where, ": cannot replace the earlier export's manifest: ", ec.message());
  auto write = [&](const std::string& file, const std::string& bytes) {
    WriteFileAtomically(root / file, bytes, where);
    m.files[file] = Sha256Hex(bytes);
  };
  write(kGraph, text);
  write(kConstants, serialize_safetensors(named));
  for (const cuda::KernelBinaryImage& k : kernels) write(KernelFile(k), k.cubin);
  WriteFileAtomically(root / kManifest, ManifestJson(m), where);  // last: the folder is whole
}

struct LoadedFn::State {
  std::string dir, text;
  Manifest manifest;
  std::unique_ptr<codegen::Executable> exe;
  int kernels = 0;
  LoadCompiledOptions options;
  std::mutex graph_mu;  // serialises CUDA-graph replays
  std::shared_ptr<codegen::CudaGraphCache> graphs;

  // The plan's inputs for `inputs` (a strided one as its flat tensor), after checking them
  // against the exported signature and for memory a written input shares with another (an
  // exported plan has no eager fallback: that is an error).
  std::vector<Tensor> PlanInputs(const std::vector<Tensor>& inputs) const {
    const std::vector<InputSpec>& want = manifest.inputs;
    KILN_CHECK(inputs.size() == want.size(), "LoadedFn(", dir, "): expected ", want.size(),
               " inputs, got ", inputs.size());
    const auto layout = [](const Strides& st) {
      return st.empty() ? std::string("contiguous") : absl::StrCat("strides ", ShapeString(st));
    };
    std::vector<Tensor> plan_inputs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      KILN_CHECK(inputs[i].defined(), "LoadedFn(", dir, "): input ", i, " is undefined");
      KILN_CHECK(inputs[i].type() == want[i].type, "LoadedFn(", dir, "): input ", i, " is ",
                 Describe(inputs[i].type()), "; the plan was exported for ", Describe(want[i].type),
                 " (an exported plan serves its signature only)");
      const Strides strides = ir::InputStrides(inputs[i]);
      KILN_CHECK(strides == want[i].strides, "LoadedFn(", dir, "): input ", i, " is ",
                 layout(strides), "; the plan was exported for ", layout(want[i].strides));
      plan_inputs.push_back(strides.empty() ? inputs[i] : ir::FlatInput(inputs[i]));
    }
    // Judged on the caller's tensors (a strided input's flat span reaches others' elements).
    const std::string overlap = WrittenInputOverlap(manifest.input_updates, inputs);
    KILN_CHECK(overlap.empty(), "LoadedFn(", dir, "): ", overlap,
               "; an exported plan was traced with each input in memory of its own: pass ",
               "separate tensors");
    return plan_inputs;
  }
};

std::vector<Tensor> LoadedFn::operator()(const std::vector<Tensor>& inputs) const {
  State& s = *state_;
  const std::vector<Tensor> flat = s.PlanInputs(inputs);
  std::vector<Tensor> plan_inputs = flat;
  std::vector<Strides> strides;
  for (const InputSpec& in : s.manifest.inputs) strides.push_back(in.strides);
  const StridedWrites strided_writes(s.manifest.input_updates, strides, inputs, plan_inputs);
  std::vector<Tensor> outs;
  if (!s.options.cuda_graphs || !s.exe->on_cuda()) {
    outs = s.exe->Run(plan_inputs);
  } else if constexpr (kWithCuda) {
    std::lock_guard<std::mutex> lock(s.graph_mu);
    if (s.graphs == nullptr) s.graphs = std::make_shared<codegen::CudaGraphCache>(*s.exe);
    const cuda::ScopedGraphReplay for_graph;
    outs = s.graphs->Run(plan_inputs);
  } else {
    outs = s.exe->Run(plan_inputs);
  }
  strided_writes.CopyBack();
  ApplyOutputAliases(s.manifest.output_aliases, inputs, flat, outs);
  return outs;
}

const codegen::Executable& LoadedFn::executable() const { return *state_->exe; }
const std::string& LoadedFn::graph_text() const { return state_->text; }
int LoadedFn::kernels() const { return state_->kernels; }

LoadedFn LoadCompiled(const std::string& dir, LoadCompiledOptions options) {
  KILN_CHECK(!dir.empty(), "LoadCompiled: the folder name is empty");
  const fs::path root(dir);
  auto fail = [&](const std::string& why) { KILN_FAIL("LoadCompiled(", dir, "): ", why); };
  absl::StatusOr<std::string> manifest_text = ReadFileBytes(root / kManifest);
  if (!manifest_text.ok()) {
    fail(absl::StrCat(manifest_text.status().message(),
                      " (no export, or one that did not finish: Export writes the manifest last)"));
  }
  auto state = std::make_shared<LoadedFn::State>();
  state->dir = dir;
  state->options = options;
  try {
    state->manifest = ParseManifest(*manifest_text);
  } catch (const std::exception& e) {
    fail(absl::StrCat("manifest.json does not parse: ", e.what()));
  }
  const Manifest& m = state->manifest;
  if (m.kiln != KILN_BUILD_ID) {
    fail(absl::StrCat("exported by kiln ", m.kiln, "; this is kiln ", KILN_BUILD_ID,
                      " (a plan is read by the kiln that wrote it: export it again)"));
  }
  // The files: the graph, the constants and kernels/<16 hex digits>.<arch>.cubin, nothing else
  // (no path leaves the folder).
  static const std::regex kKernelFile("kernels/([0-9a-f]{16})\\.(sm_[0-9]+a?)\\.cubin");
  std::map<std::string, std::string> bytes;
  for (const auto& [file, sha] : m.files) {
    if (file != kGraph && file != kConstants && !std::regex_match(file, kKernelFile)) {
      fail(absl::StrCat("the manifest lists \"", file, "\", which is not ", kGraph, ", ",
                        kConstants, " or kernels/<key>.<arch>.cubin"));
    }
    absl::StatusOr<std::string> data = ReadFileBytes(root / file);
    if (!data.ok()) fail(std::string(data.status().message()));
    if (Sha256Hex(*data) != sha) fail(absl::StrCat(file, " fails its SHA-256 check (corrupted)"));
    bytes[file] = *std::move(data);
  }
  if (!bytes.count(kGraph) || !bytes.count(kConstants)) {
    fail(absl::StrCat("the manifest lists no ", kGraph, " or no ", kConstants));
  }
  // The architecture of the devices the plan's inputs name, on this machine.
  const std::string here =
      m.arch != "cpu" && !cuda::IsAvailable() ? "no CUDA GPU" : ArchOf(TypesOf(m.inputs));
  if (here != m.arch) fail(absl::StrCat("exported for ", m.arch, "; this machine has ", here));
  std::vector<cuda::KernelBinaryImage> kernels;
  for (const auto& [file, data] : bytes) {
    std::smatch match;
    if (!std::regex_match(file, match, kKernelFile)) continue;
    kernels.push_back({std::stoull(match[1].str(), nullptr, 16), match[2].str(), data});
  }
  try {
    const SafetensorsFile file = SafetensorsFile::FromBytes(bytes[kConstants], kConstants);
    int read = 0;
    auto constant = [&](int k, const TensorType& type) {
      ++read;
      return file.Load(ConstantName(k), type.device);  // to the device the plan reads it on
    };
    ir::Graph g = GraphWithConstants(bytes[kGraph], constant, m.input_updates);
    CheckSignature(g, m);
    ThrowIfError(ir::Verify(g, codegen::CheckFusionBody));
    KILN_CHECK(read == static_cast<int>(file.entries().size()), "the graph reads ", read,
               " constants, ", kConstants, " holds ", file.entries().size());
    cuda::AddPrebuiltKernels(kernels);
    state->exe = ValueOrThrow(codegen::Executable::Build(std::move(g)));
  } catch (const Error& e) {
    fail(e.what());
  }
  state->text = bytes[kGraph];
  state->kernels = static_cast<int>(kernels.size());
  LoadedFn fn;
  fn.state_ = std::move(state);
  return fn;
}

}  // namespace kiln
