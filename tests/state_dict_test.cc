// load_state_dict / save_state_dict: round trips into other modules, strict and non-strict key
// matching, errors that name the key and both shapes/dtypes (and leave the module untouched),
// dtype conversion, renaming, and a Hugging Face GPT-2 checkpoint (Conv1D weights [in, out])
// loaded into modules named like GPT-2's, and written back in HF's layout.
#include "io/state_dict.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "codegen/compile.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/status.h"
#include "tests/io_test_util.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

std::map<std::string, std::string> ParamBytes(const Module& m) {
  std::map<std::string, std::string> out;
  for (const auto& [name, p] : m.named_parameters()) out[name] = Bytes(p);
  return out;
}

TEST(StateDict, SaveThenLoadIntoAnotherModule) {
  Generator g0(0), g1(1);
  GeGLUMLP a(8, 16, g0), b(8, 16, g1);
  ASSERT_NE(ParamBytes(a), ParamBytes(b));
  const std::string path = TempPath("mlp.safetensors");
  save_state_dict(a, path);
  const Tensor before = b.gate().weight();
  const LoadReport r = load_state_dict(b, path);
  EXPECT_EQ(r.loaded, (std::vector<std::string>{"gate.weight", "up.weight", "down.weight"}));
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
  EXPECT_EQ(ParamBytes(a), ParamBytes(b));
  EXPECT_TRUE(before.is_same(b.gate().weight())) << "loaded in place, handles stay valid";
  Tensor x = randn({3, 8}, g0);
  EXPECT_EQ(to_vector(a(x)), to_vector(b(x)));
  EXPECT_EQ(SafetensorsFile::Open(path).metadata().at("format"), "pt");
  std::remove(path.c_str());
}

// Compiled functions see loaded weights, also when they froze them (merged gate/up GEMM).
TEST(StateDict, CompiledFunctionsSeeLoadedWeights) {
  Generator g0(11), g1(12);
  GeGLUMLP a(8, 16, g0), b(8, 16, g1);
  const Tensor x = randn({3, 8}, g0);
  for (bool freeze : {false, true}) {
    CompileOptions o;
    o.freeze_weights = freeze;
    CompiledFn f = compile(b, x, o);
    const std::vector<double> before = to_vector(f({x})[0]);
    load_state_dict(b, state_dict(a));
    const std::vector<double> want = to_vector(a(x));
    const std::vector<double> got = to_vector(f({x})[0]);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << freeze;
    EXPECT_NE(got, before);
    GeGLUMLP fresh(8, 16, g1);
    load_state_dict(b, state_dict(fresh));  // back to other weights for the next round
  }
}

TEST(StateDict, StrictNamesMissingAndUnexpectedKeysAndChangesNothing) {
  Generator gen(2);
  MLP mlp({4, 6, 2}, gen);  // fc0.weight, fc0.bias, fc1.weight, fc1.bias
  NamedTensors sd = state_dict(mlp);
  sd.erase(sd.begin() + 1);                      // no fc0.bias
  sd.emplace_back("fc9.weight", zeros({2, 6}));  // an extra key
  for (auto& [name, t] : sd) t = add(t, 1.0);    // different values
  const auto before = ParamBytes(mlp);
  const std::string err = ErrorOf([&] { load_state_dict(mlp, sd); });
  EXPECT_NE(err.find("(strict): missing keys [fc0.bias], unexpected keys [fc9.weight]"),
            std::string::npos)
      << err;
  EXPECT_EQ(ParamBytes(mlp), before) << "a failed load leaves the module as it was";
  const LoadReport r = load_state_dict(mlp, sd, /*strict=*/false);
  EXPECT_EQ(r.missing_keys, (std::vector<std::string>{"fc0.bias"}));
  EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"fc9.weight"}));
  EXPECT_EQ(r.loaded, (std::vector<std::string>{"fc0.weight", "fc1.weight", "fc1.bias"}));
  const auto after = ParamBytes(mlp);
  EXPECT_EQ(after.at("fc0.bias"), before.at("fc0.bias"));
  EXPECT_NE(after.at("fc0.weight"), before.at("fc0.weight"));
  EXPECT_EQ(after.at("fc1.weight"), Bytes(sd[1].second));
}

TEST(StateDict, SizeAndDtypeMismatchesNameTheKeyAndBothSides) {
  Generator gen(3);
  Linear fc(4, 3, true, gen);
  const auto before = ParamBytes(fc);
  NamedTensors sd = {{"weight", zeros({4, 3})}, {"bias", zeros({3})}};
  for (bool strict : {true, false}) {
    const std::string err =
        ErrorOf([&] { load_state_dict(fc, sd, LoadOptions{.strict = strict}); });
    EXPECT_NE(err.find("parameter 'weight' (checkpoint key 'weight'): size mismatch: the module "
                       "expects float32[3, 4], the checkpoint holds float32[4, 3]"),
              std::string::npos)
        << err;
  }
  sd[0].second = zeros({3, 4}, DType::kBFloat16);
  const std::string err =
      ErrorOf([&] { load_state_dict(fc, sd, LoadOptions{.convert_dtype = false}); });
  EXPECT_NE(err.find("dtype mismatch: the module expects float32[3, 4], the checkpoint holds "
                     "bfloat16[3, 4]"),
            std::string::npos)
      << err;
  EXPECT_EQ(ParamBytes(fc), before);
}

TEST(StateDict, ConvertsDtypesLikeTorchCopy) {
  Generator gen(4);
  Linear fc(5, 2, false, gen);
  const Tensor w = randn({2, 5}, gen, DType::kBFloat16);
  const std::string path = TempPath("bf16.safetensors");
  save_safetensors(path, {{"weight", w}});
  load_state_dict(fc, path);
  EXPECT_EQ(fc.weight().dtype(), DType::kFloat32);
  EXPECT_EQ(to_vector(fc.weight()), to_vector(w));  // bf16 values are exact in float32
  std::remove(path.c_str());
}

TEST(StateDict, MappingRenamesAndDrops) {
  Generator gen(5);
  GeGLUMLP mlp(4, 8, gen);
  NamedTensors sd;
  for (auto& [name, t] : state_dict(mlp)) sd.emplace_back("model." + name, zeros(t.shape()));
  sd.emplace_back("model.rotary.inv_freq", zeros({2}));
  LoadOptions o;
  o.map = [](const std::string& key) -> std::optional<KeyMapping> {
    if (key.find("rotary") != std::string::npos) return std::nullopt;
    return KeyMapping{key.substr(6)};
  };
  const LoadReport r = load_state_dict(mlp, sd, o);
  EXPECT_EQ(r.dropped_keys, (std::vector<std::string>{"model.rotary.inv_freq"}));
  EXPECT_EQ(to_vector(sum(mlp.up().weight()))[0], 0);
  o.map = [](const std::string&) { return KeyMapping{"up.weight"}; };
  EXPECT_NE(ErrorOf([&] { load_state_dict(mlp, sd, o); })
                .find("the checkpoint keys 'model.gate.weight' and 'model.up.weight' both map to "
                      "parameter 'up.weight'"),
            std::string::npos);
  sd = {{"model.w", zeros({3})}};
  Linear fc(3, 1, false, gen);
  o.map = [](const std::string&) { return KeyMapping{"weight", true}; };
  EXPECT_NE(ErrorOf([&] {
              load_state_dict(fc, sd, o);
            }).find("the mapping transposes it but the checkpoint holds float32[3], not a matrix"),
            std::string::npos);
}

// A sharded checkpoint (transformers' model.safetensors.index.json and its shards) loads as one;
// an index that names a tensor its shard lacks, a key in two shards or a shard outside the
// index's folder is an error naming the index.
TEST(StateDict, LoadsAShardedCheckpointThroughItsIndex) {
  Generator g0(21), g1(22);
  GeGLUMLP a(8, 16, g0), b(8, 16, g1);
  const NamedTensors all = state_dict(a);
  const std::string dir = TempPath("sharded");
  std::filesystem::create_directories(dir);
  save_safetensors(dir + "/model-00001-of-00002.safetensors", {all[0], all[1]});
  save_safetensors(dir + "/model-00002-of-00002.safetensors", {all[2]});
  auto write_index = [&](const std::string& weight_map) {
    std::ofstream(dir + "/model.safetensors.index.json")
        << R"({"metadata": {"total_size": 0}, "weight_map": {)" << weight_map << "}}";
    return dir + "/model.safetensors.index.json";
  };
  const std::string index =
      write_index(absl::StrCat("\"", all[0].first, "\": \"model-00001-of-00002.safetensors\", \"",
                               all[1].first, "\": \"model-00001-of-00002.safetensors\", \"",
                               all[2].first, "\": \"model-00002-of-00002.safetensors\""));
  const LoadReport r = load_state_dict(b, index);
  EXPECT_EQ(r.loaded.size(), 3u);
  EXPECT_EQ(ParamBytes(a), ParamBytes(b));
  const std::map<std::string, std::string> before = ParamBytes(b);
  for (const auto& [weight_map, words] : std::vector<std::pair<std::string, std::string>>{
           {absl::StrCat("\"", all[2].first, "\": \"model-00001-of-00002.safetensors\""),
            "which does not hold it"},
           {R"("x": "../model-00001-of-00002.safetensors")", "must lie in the index's folder"},
           {R"("x": 3)", "not a file name"},
           // nlohmann keeps the last of a key given twice; transformers' json.load too, but a
           // checkpoint's index naming one tensor twice is broken, not a choice.
           {R"("x": "a.safetensors", "x": "b.safetensors")", "holds the key 'x' twice"},
           // Nesting deep enough to exhaust the stack of a recursive printer: an error, no crash.
           {absl::StrCat(R"("x": )", std::string(100000, '['), std::string(100000, ']')),
            "nests deeper than 64 levels"},
           {absl::StrCat(R"("x": )", std::string(60, '['), std::string(60, ']')),
            "maps 'x' to [[...]], not a file name"}}) {
    EXPECT_NE(ErrorOf([&] { load_state_dict(b, write_index(weight_map)); }).find(words),
              std::string::npos)
        << weight_map;
  }
  save_safetensors(dir + "/again.safetensors", {{"x", all[0].second}, all[2]});
  EXPECT_NE(ErrorOf([&] {
              load_state_dict(
                  b, write_index(absl::StrCat("\"", all[2].first,
                                              "\": \"model-00002-of-00002.safetensors\", \"x\": "
                                              "\"again.safetensors\"")));
            }).find("is in two shards"),
            std::string::npos);
  EXPECT_EQ(ParamBytes(b), before);
  // One shard spelled two ways is one file, as transformers reads it.
  const LoadReport again = load_state_dict(
      b,
      write_index(absl::StrCat("\"", all[0].first, "\": \"./model-00001-of-00002.safetensors\", \"",
                               all[1].first, "\": \"model-00001-of-00002.safetensors\", \"",
                               all[2].first, "\": \"model-00002-of-00002.safetensors\"")));
  EXPECT_EQ(again.loaded.size(), 3u);
  std::filesystem::remove_all(dir);
}

TEST(StateDict, RefusesParametersWithoutMemory) {
  Generator gen(6);
  Linear fc(2, 2, false, gen, {DType::kFloat32, kMeta});
  EXPECT_NE(ErrorOf([&] {
              load_state_dict(fc, NamedTensors{{"weight", zeros({2, 2})}});
            }).find("the parameter float32[2, 2] on meta holds no memory"),
            std::string::npos);
  // A source without values is refused by its key before anything is written.
  Linear dst(3, 2, false, gen);
  const Tensor before = clone(dst.weight());
  EXPECT_NE(ErrorOf([&] {
              load_state_dict(dst, NamedTensors{{"weight", empty({2, 3}, DType::kFloat32, kMeta)}});
            }).find("load_state_dict: the tensor 'weight' (float32[2, 3] on meta) holds no values"),
            std::string::npos);
  EXPECT_EQ(to_vector(dst.weight()), to_vector(before));
}

// Row mappings whose ends pass int64's are out of range (no wrapped sum passes the check).
TEST(StateDict, RowMappingsNearInt64sEndAreOutOfRange) {
  Linear fc(2, 4, false);
  const int64_t big = std::numeric_limits<int64_t>::max() - 1;
  LoadOptions o;
  o.map = [big](const std::string&) { return KeyMapping{"weight", false, {big, 2}, {0, 2}}; };
  const std::vector<double> before = to_vector(fc.weight());
  EXPECT_NE(ErrorOf([&] {
              load_state_dict(fc, NamedTensors{{"w", ones({4, 2})}}, o);
            }).find("out of range"),
            std::string::npos);
  EXPECT_EQ(to_vector(fc.weight()), before);
}

// A module's own tensors loaded back through a mapping that moves rows: every row is read before
// any is written (as torch's copy_ from a clone).
TEST(StateDict, ASourceThatIsTheParameterIsReadBeforeItIsWritten) {
  Linear fc(2, 2, false);
  copy_(fc.weight(), from_vector({1, 2, 3, 4}, {2, 2}));
  LoadOptions o;
  o.map = [](const std::string&) {
    return KeyMappings(std::vector<KeyMapping>{{"weight", false, {0, 1}, {1, 1}},
                                               {"weight", false, {1, 1}, {0, 1}}});
  };
  load_state_dict(fc, NamedTensors{{"weight", fc.weight()}}, o);
  EXPECT_EQ(to_vector(fc.weight()), (std::vector<double>{3, 4, 1, 2}));
}

// A BOOL byte other than 0 or 1 is found before anything is written: the module is as it was.
TEST(StateDict, ABadValueLeavesTheModuleAsItWas) {
  class WithMask : public Module {
   public:
    WithMask()
        : w_(RegisterParameter("weight", zeros({2}))),
          m_(RegisterParameter("z_mask", zeros({2}, DType::kBool))) {}
    Tensor forward(const Tensor& x) override { return x; }
    const char* type_name() const override { return "WithMask"; }
    Tensor& w_;
    Tensor& m_;
  } module;
  std::string image =
      serialize_safetensors({{"weight", ones({2})}, {"z_mask", zeros({2}, DType::kBool)}});
  image.back() = 5;  // the mask's second byte
  const SafetensorsFile file = SafetensorsFile::FromBytes(image, "badbool");
  EXPECT_NE(ErrorOf([&] { load_state_dict(module, file); }).find("BOOL element 1 is the byte 5"),
            std::string::npos);
  EXPECT_EQ(to_vector(module.w_), (std::vector<double>{0, 0}));
}

// A two-layer GPT-2 built from kiln modules named like Hugging Face's GPT2Model.
class TinyGpt2 : public Module {
 public:
  TinyGpt2(int64_t vocab, int64_t dim, int layers, Generator& gen) {
    RegisterParameter("wte.weight", randn({vocab, dim}, gen));
    RegisterParameter("wpe.weight", randn({16, dim}, gen));
    for (int i = 0; i < layers; ++i) RegisterModule("h." + std::to_string(i), Block(dim, gen));
    RegisterParameter("ln_f.weight", randn({dim}, gen));
    RegisterParameter("ln_f.bias", randn({dim}, gen));
  }
  Tensor forward(const Tensor& x) override { return x; }

 private:
  struct Sub : Module {
    Tensor forward(const Tensor& x) override { return x; }
    using Module::RegisterModule;
    using Module::RegisterParameter;
  };
  static std::unique_ptr<Module> Block(int64_t dim, Generator& gen) {
    auto block = std::make_unique<Sub>();
    for (const char* ln : {"ln_1", "ln_2"}) {
      block->RegisterParameter(std::string(ln) + ".weight", randn({dim}, gen));
      block->RegisterParameter(std::string(ln) + ".bias", randn({dim}, gen));
    }
    auto attn = std::make_unique<Sub>();
    attn->RegisterModule("c_attn", std::make_unique<Linear>(dim, 3 * dim, true, gen));
    attn->RegisterModule("c_proj", std::make_unique<Linear>(dim, dim, true, gen));
    auto mlp = std::make_unique<Sub>();
    mlp->RegisterModule("c_fc", std::make_unique<Linear>(dim, 4 * dim, true, gen));
    mlp->RegisterModule("c_proj", std::make_unique<Linear>(4 * dim, dim, true, gen));
    block->RegisterModule("attn", std::move(attn));
    block->RegisterModule("mlp", std::move(mlp));
    return block;
  }
};

// What transformers' GPT2LMHeadModel.save_pretrained writes for `model`'s weights: the
// "transformer." prefix, Conv1D weights [in, out], the attention-mask buffers, the tied head.
NamedTensors HuggingFaceCheckpoint(const TinyGpt2& model, int64_t dim) {
  NamedTensors hf;
  for (const auto& [name, p] : model.named_parameters()) {
    const bool conv1d = name.find(".c_") != std::string::npos && p.dim() == 2;
    hf.emplace_back("transformer." + name, conv1d ? contiguous(transpose(p, 0, 1)) : p);
    if (name.find("attn.c_attn.weight") != std::string::npos) {
      const std::string block = name.substr(0, name.find(".attn."));
      hf.emplace_back("transformer." + block + ".attn.bias", ones({1, 1, 16, 16}));
      hf.emplace_back("transformer." + block + ".attn.masked_bias", full({}, -1e4));
    }
  }
  hf.emplace_back("lm_head.weight", model.named_parameters()[0].second);
  return hf;
}

TEST(StateDict, LoadsAHuggingFaceGpt2CheckpointAndWritesOneBack) {
  constexpr int64_t kDim = 8;
  Generator g0(7), g1(8);
  TinyGpt2 source(32, kDim, 2, g0), model(32, kDim, 2, g1);
  const std::string hf_path = TempPath("hf_gpt2.safetensors");
  save_safetensors(hf_path, HuggingFaceCheckpoint(source, kDim), {{"format", "pt"}});
  const SafetensorsFile hf = SafetensorsFile::Open(hf_path);
  EXPECT_EQ(hf.entry("transformer.h.0.attn.c_attn.weight").shape, (Shape{kDim, 3 * kDim}));
  const LoadReport r = load_state_dict(model, hf, {.map = gpt2_load_mapping()});
  EXPECT_EQ(r.dropped_keys.size(), 5u);  // 2 × (attn.bias, attn.masked_bias) + lm_head.weight
  EXPECT_EQ(r.loaded.size(), model.named_parameters().size());
  EXPECT_EQ(ParamBytes(model), ParamBytes(source));  // Conv1D weights came back [out, in]
  // Written back in HF's layout: the same bytes for every tensor the checkpoint had.
  const std::string out_path = TempPath("kiln_gpt2.safetensors");
  save_state_dict(model, out_path, {.map = gpt2_save_mapping()});
  const SafetensorsFile out = SafetensorsFile::Open(out_path);
  for (const std::string& key : out.keys()) {
    EXPECT_EQ(Bytes(out.Load(key)), Bytes(hf.Load("transformer." + key))) << key;
  }
  EXPECT_EQ(out.entry("h.1.mlp.c_fc.weight").shape, (Shape{kDim, 4 * kDim}));
  TinyGpt2 again(32, kDim, 2, g1);
  load_state_dict(again, out, {.map = gpt2_load_mapping()});
  EXPECT_EQ(ParamBytes(again), ParamBytes(source));
  std::remove(hf_path.c_str());
  std::remove(out_path.c_str());
}

TEST(StateDict, LoadsIntoCudaParameters) {
  KILN_SKIP_WITHOUT_GPU();
  Generator g0(9), g1(10);
  GeGLUMLP a(8, 16, g0), b(8, 16, g1, {DType::kBFloat16, CUDA()});
  const std::string path = TempPath("to_cuda.safetensors");
  save_state_dict(a, path);
  load_state_dict(b, path);  // float32 file into bfloat16 CUDA parameters
  for (const auto& [name, p] : b.named_parameters()) EXPECT_EQ(p.device(), CUDA()) << name;
  const auto want = a.named_parameters();
  const auto got = b.named_parameters();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(Bytes(got[i].second), Bytes(cast(want[i].second, DType::kBFloat16))) << want[i].first;
  }
  // And back: CUDA parameters saved, loaded into a CPU module.
  GeGLUMLP c(8, 16, g0, {DType::kBFloat16, kCPU});
  save_state_dict(b, path);
  load_state_dict(c, path);
  EXPECT_EQ(ParamBytes(c), ParamBytes(b));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kiln
