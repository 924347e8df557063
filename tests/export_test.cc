// Ahead-of-time export (models/export.h): a compiled plan written to a folder and loaded back runs
// with the compiled function's results, bit for bit; a function that writes its input in place
// still does; what is not exportable says why; a broken folder is refused with the rule named
// (checksum, manifest, kiln build, architecture) and a call with another signature too. On a GPU:
// another process (this binary again) compiles and exports a bf16 GeGLU MLP and a causal
// attention, this one loads them with NVRTC never mapped and gets that process's results exactly,
// plain and as a CUDA graph.
#include "models/export.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "codegen/executable.h"
#include "io/safetensors.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/cuda.h"
#include "tests/io_test_util.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

std::string Bits(const std::vector<Tensor>& out) {
  std::string b;
  for (const Tensor& t : out) b += Bytes(t);
  return b;
}

struct Mlp {
  Generator gen{7};
  GeGLUMLP mlp;
  Tensor x;
  explicit Mlp(Device device = kCPU, DType dtype = DType::kFloat32)
      : mlp(32, 64, gen, {dtype, device}), x(randn({16, 32}, gen, dtype, device)) {}
};

CompileOptions Frozen() {
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  o.freeze_weights = true;
  return o;
}

// `f` exported for `inputs` into a fresh temporary folder `name`.
std::string ExportedTo(const std::string& name, const CompiledFn& f,
                       const std::vector<Tensor>& inputs) {
  const std::string dir = TempPath(name);
  std::filesystem::remove_all(dir);
  Export(f, inputs, dir);
  return dir;
}

TEST(Export, ALoadedPlanComputesWhatTheCompiledOneDoes) {
  Mlp m;
  const CompiledFn f = compile(m.mlp, m.x, Frozen());
  const LoadedFn g = LoadCompiled(ExportedTo("export_mlp", f, {m.x}));
  EXPECT_EQ(Bits(g({m.x})), Bits(f({m.x})));
  EXPECT_EQ(g.graph_text(), f.report({m.x}).final_graph);
  EXPECT_EQ(g.kernels(), 0);  // a CPU plan
  Generator gen(3);
  const Tensor y = randn({16, 32}, gen);  // other values, same signature
  EXPECT_EQ(Bits(g({y})), Bits(f({y})));
  // Another signature is refused, naming both.
  ExpectThrowsWith(
      [&] {
        g({randn({8, 32}, gen)});
      },
      "input 0 is float32[8, 32]", "exported for float32[16, 32]");
  ExpectThrowsWith(
      [&] {
        g({transpose(randn({32, 16}, gen), 0, 1)});
      },
      "input 0 is strides [1, 16]", "exported for contiguous");
  ExpectThrowsWith([&] { g({m.x, m.x}); }, "expected 1 inputs, got 2");
}

TEST(Export, AFunctionThatWritesItsInputStillDoes) {
  auto fn = [](const std::vector<Tensor>& in) {
    add_(in[0], 1.0);
    return std::vector<Tensor>{mul(in[0], 2.0)};
  };
  const Tensor x = full({4, 4}, 1.0);
  const CompiledFn f = compile(fn, {x}, {.mode = CompileOptions::Mode::kCompiled});
  const Tensor example = full({4, 4}, 1.0);
  const std::string dir = ExportedTo("export_inplace", f, {example});
  EXPECT_EQ(to_vector(example), std::vector<double>(16, 1.0));  // exporting wrote nothing
  const LoadedFn g = LoadCompiled(dir);
  const Tensor a = full({4, 4}, 1.0);
  EXPECT_EQ(to_vector(g({a})[0]), std::vector<double>(16, 4.0));
  EXPECT_EQ(to_vector(a), std::vector<double>(16, 2.0));
}

// A strided input exports with its strides (the plan serves those), an output that is the
// written input is the caller's tensor, and written inputs sharing memory are refused (a loaded
// plan has no eager fallback).
TEST(Export, StridesAliasedOutputsAndOverlappingInputs) {
  auto fn = [](const std::vector<Tensor>& in) {
    add_(in[0], 1.0);
    return std::vector<Tensor>{in[0], in[1] * 2.0};
  };
  const auto strided = [] { return transpose(full({3, 2}, 1.0), 0, 1); };
  const CompiledFn f =
      compile(fn, {strided(), ones({2})}, {.mode = CompileOptions::Mode::kCompiled});
  const LoadedFn g = LoadCompiled(ExportedTo("export_strided", f, {strided(), ones({2})}));
  std::vector<Tensor> in = {strided(), ones({2})};
  const std::vector<Tensor> out = g(in);
  EXPECT_TRUE(out[0].is_same(in[0]));
  EXPECT_EQ(to_vector(in[0]), std::vector<double>(6, 2.0));
  EXPECT_EQ(to_vector(out[1]), std::vector<double>(2, 2.0));
  ExpectThrowsWith(
      [&] {
        g({full({2, 3}, 1.0), ones({2})});
      },
      "input 0 is contiguous", "exported for strides [1, 2]");
  const Tensor shared = full({6}, 1.0);
  const Tensor view = transpose(reshape(shared, {3, 2}), 0, 1);
  ExpectThrowsWith(
      [&] {
        g({view, slice(shared, 0, 0, 2)});
      },
      "input 0, which the function writes in place, overlaps input 1", "pass separate tensors");
}

// An output that is a window of another output (written through, both returned) is a view of it
// after loading too.
TEST(Export, AWindowOfAnotherOutputIsAViewOfIt) {
  auto fn = [](const std::vector<Tensor>& in) {
    const Tensor y = in[0] * 2.0;
    mul_(slice(y, 0, 1, 3), -1.0);
    return std::vector<Tensor>{y, slice(y, 0, 1, 3)};
  };
  const Tensor x = arange(4, DType::kFloat32);
  const CompiledFn f = compile(fn, {x}, {.mode = CompileOptions::Mode::kCompiled});
  const LoadedFn g = LoadCompiled(ExportedTo("export_output_window", f, {x}));
  const std::vector<Tensor> out = g({x});
  EXPECT_EQ(to_vector(out[0]), (std::vector<double>{0, -2, -4, 6}));
  EXPECT_TRUE(out[1].shares_storage(out[0]));
  EXPECT_EQ(to_vector(out[1]), (std::vector<double>{-2, -4}));
}

// Files are read only when regular (a FIFO would block), and no folder name means no folder.
TEST(Export, ReadsRegularFilesOnlyAndNeedsAFolderName) {
  const std::string dir = TempPath("export_fifo");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_EQ(mkfifo((dir + "/manifest.json").c_str(), 0600), 0);
  ExpectThrowsWith([&] { LoadCompiled(dir); }, "LoadCompiled(", "not a regular file");
  ExpectThrowsWith([&] { LoadCompiled(""); }, "LoadCompiled:", "the folder name is empty");
  std::filesystem::remove_all(dir);
}

TEST(Export, SaysWhatItCannotExport) {
  auto fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(in[0])}; };
  CompileOptions o{.mode = CompileOptions::Mode::kCompiled};
  o.dynamic = CompileOptions::Dynamic::kDims;
  o.dynamic_dims = {{0, 0}};
  const Tensor x = ones({8, 4});
  const CompiledFn f = compile(fn, {x}, o);
  ExpectThrowsWith([&] { Export(f, {x}, TempPath("export_symbolic")); }, "symbolic dims",
                   "dynamic = kNone");
}

TEST(Export, ABrokenFolderIsRefusedNamingTheRule) {
  Mlp m;
  const CompiledFn f = compile(m.mlp, m.x, Frozen());
  const std::string good = ExportedTo("export_good", f, {m.x});
  const std::string manifest = ReadText(good + "/manifest.json");
  // One break each: the file it rewrites, how, and the words the refusal must hold.
  struct Break {
    std::string name, file;
    std::function<std::string(const std::string&)> edit;
    std::string says;
  };
  auto in_manifest = [](std::string from, std::string to) {
    return [from, to](const std::string& text) { return absl::StrReplaceAll(text, {{from, to}}); };
  };
  const std::vector<Break> breaks = {
      {"graph", "graph.txt", [](const std::string& t) { return t + " "; },
       "graph.txt fails its SHA-256 check"},
      {"constants", "constants.safetensors",
       [](std::string t) {
         t.back() ^= 1;
         return t;
       },
       "constants.safetensors fails its SHA-256 check"},
      {"json", "manifest.json", [](const std::string& t) { return t.substr(0, t.size() / 2); },
       "manifest.json does not parse"},
      {"kiln", "manifest.json", in_manifest("\"kiln\": \"", "\"kiln\": \"0.0.1+old-"),
       "exported by kiln 0.0.1+old-"},
      {"arch", "manifest.json", in_manifest("\"arch\": \"cpu\"", "\"arch\": \"sm_75\""),
       "exported for sm_75; this machine has"},
      {"format", "manifest.json", in_manifest("\"format\": 2", "\"format\": 9"),
       "format 9 (this kiln reads format 2)"},
      {"path", "manifest.json", in_manifest("\"graph.txt\":", "\"../graph.txt\":"),
       "lists \"../graph.txt\", which is not graph.txt"},
      {"updates", "manifest.json", in_manifest("\"input_updates\": []", "\"input_updates\": [7]"),
       "input_updates names input 7 of 1"},
  };
  ASSERT_NE(manifest.find("\"input_updates\": []"), std::string::npos);  // the edits apply
  for (const Break& b : breaks) {
    const std::string dir = TempPath("export_broken_" + b.name);
    std::filesystem::remove_all(dir);
    std::filesystem::copy(good, dir, std::filesystem::copy_options::recursive);
    WriteText(dir + "/" + b.file, b.edit(ReadText(dir + "/" + b.file)));
    ExpectThrowsWith([&] { LoadCompiled(dir); }, absl::StrCat("LoadCompiled(", dir, ")"), b.says);
  }
  ExpectThrowsWith([&] { LoadCompiled(TempPath("export_none")); }, "cannot read", "manifest.json");
  EXPECT_EQ(Bits(LoadCompiled(good)({m.x})), Bits(f({m.x})));  // the original still loads
}

// ---- On a GPU, in a fresh process ----------------------------------------------------------

// The series' two rows at small sizes: a bf16 GeGLU MLP and naive causal attention.
std::vector<Tensor> Attention(const std::vector<Tensor>& in) {
  const Tensor s = mul(matmul(in[0], transpose(in[1], -2, -1)), 0.125);
  const Tensor mask = triu(ones({in[0].size(2), in[1].size(2)}, DType::kBool, in[0].device()), 1);
  return {matmul(softmax(masked_fill(s, mask, -INFINITY), -1), in[2])};
}

constexpr char kChildDir[] = "KILN_EXPORT_TEST_DIR";

// Compiles and exports both into `root`, saving inputs and results beside them.
void ExportBoth(const std::string& root) {
  Mlp m(CUDA(0), DType::kBFloat16);
  const CompiledFn f = compile(m.mlp, m.x, Frozen());
  Export(f, {m.x}, root + "/mlp");
  save_safetensors(root + "/mlp.io.safetensors", {{"x", m.x}, {"y", f({m.x})[0]}});
  Generator gen(5);
  std::vector<Tensor> qkv;
  for (int i = 0; i < 3; ++i) qkv.push_back(randn({2, 4, 256, 64}, gen, DType::kBFloat16, CUDA(0)));
  const CompiledFn a = compile(Attention, qkv, Frozen());
  Export(a, qkv, root + "/attention");
  save_safetensors(root + "/attention.io.safetensors",
                   {{"q", qkv[0]}, {"k", qkv[1]}, {"v", qkv[2]}, {"y", a(qkv)[0]}});
}

// The exporting process: this binary run again (fork, then exec at once: CUDA, which this process
// may have started, does not survive a fork), asked by kChildDir to run only ExportBoth.
void ExportInAFreshProcess(const std::string& root) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv(kChildDir, root.c_str(), 1);
    execl("/proc/self/exe", "export_test", "--gtest_filter=ExportOnGpu.ExportingProcess",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the exporting process failed";
}

// Not a test of its own: the exporting process of the test below (skipped when run otherwise).
TEST(ExportOnGpu, ExportingProcess) {
  const char* root = std::getenv(kChildDir);
  if (root == nullptr) GTEST_SKIP() << "the exporting process of AFreshProcessRuns... only";
  ExportBoth(root);
}

TEST(ExportOnGpu, AFreshProcessRunsExportedPlansWithoutNvrtc) {
  KILN_SKIP_WITHOUT_GPU();
  ASSERT_FALSE(NvrtcMapped());
  const std::string root = TempPath("export_gpu");
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  ExportInAFreshProcess(root);
  const std::vector<std::pair<std::string, std::vector<std::string>>> plans = {
      {"mlp", {"x"}}, {"attention", {"q", "k", "v"}}};
  for (const auto& [name, input_names] : plans) {
    const SafetensorsFile io = SafetensorsFile::Open(root + "/" + name + ".io.safetensors");
    std::vector<Tensor> inputs;
    for (const std::string& in : input_names) inputs.push_back(io.Load(in, CUDA(0)));
    const std::string want = Bytes(io.Load("y"));
    const auto t0 = std::chrono::steady_clock::now();
    const LoadedFn g = LoadCompiled(root + "/" + name);
    const std::string got = Bits(g(inputs));
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: LoadCompiled to first result %.1f ms, %d kernels in the folder\n",
                name.c_str(), ms, g.kernels());
    EXPECT_EQ(got, want) << name;
    EXPECT_GT(g.kernels(), 0) << name;
    const LoadedFn graphed = LoadCompiled(root + "/" + name, {.cuda_graphs = true});
    for (int call = 0; call < 3; ++call) EXPECT_EQ(Bits(graphed(inputs)), want) << name << call;
  }
  EXPECT_FALSE(NvrtcMapped()) << "loading and running exported plans mapped NVRTC";
}

}  // namespace
}  // namespace kiln
