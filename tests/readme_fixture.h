// What README.md's code blocks take as given, made for real so that readme_test runs every block
// (the test's source is generated from README.md by scripts/readme-snippets --emit-test). Public
// headers only, as a user's program has them. The fixture works in a fresh temporary directory
// holding the files the blocks open: a tiny Llama checkpoint in transformers' layout
// (model.safetensors, and its config.json as text), a GPT-2-named checkpoint
// (gpt2/model.safetensors, read into `gpt`) and a partial one for mlp (other.safetensors).
#pragma once

#include <kiln/kiln.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

// A block that makes CUDA tensors runs where a GPU is (KILN_REQUIRE_GPU=1: must be).
#define KILN_README_SKIP_WITHOUT_GPU()                                                   \
  do {                                                                                   \
    if (!kiln::cuda::IsAvailable()) {                                                    \
      const char* require = std::getenv("KILN_REQUIRE_GPU");                             \
      if (require != nullptr && std::string(require) == "1") FAIL() << "no CUDA device"; \
      GTEST_SKIP() << "the block makes CUDA tensors: no CUDA device here";               \
    }                                                                                    \
  } while (0)

namespace readme {

// A module named as GPT-2's checkpoint names its first and last parts (wte, ln_f).
class TinyGpt : public kiln::Module {
 public:
  explicit TinyGpt(kiln::Generator& gen) {
    RegisterModule("wte", std::make_unique<kiln::Embedding>(64, 32, gen));
    RegisterModule("ln_f", std::make_unique<kiln::LayerNorm>(32));
  }
};

inline std::string LlamaConfigJson() {
  return R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 20000, "hidden_size": 64,
             "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
             "rope_theta": 10000.0, "tie_word_embeddings": false})";
}

// Changes into a new temporary directory for its lifetime (removed afterwards).
class ScopedTempDir {
 public:
  ScopedTempDir() : previous_(std::filesystem::current_path()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kiln_readme_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    std::filesystem::current_path(dir_);
  }
  ~ScopedTempDir() {
    std::filesystem::current_path(previous_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

 private:
  std::filesystem::path previous_, dir_;
};

struct Fixture {
  ScopedTempDir dir;
  kiln::Generator gen{0};
  int64_t T = 16;
  int64_t eos = 2;
  kiln::Tensor q = kiln::randn({1, 2, T, 64}, gen), k = kiln::randn({1, 2, T, 64}, gen),
               v = kiln::randn({1, 2, T, 64}, gen);
  kiln::Tensor x = kiln::randn({4, 32}, gen);
  kiln::GeGLUMLP mlp{32, 64, gen};
  kiln::Module& model = mlp;
  TinyGpt gpt{gen};
  void* ptr = std::calloc(6, sizeof(float));  // a block's from_blob takes it over (nulled then)
  std::string config_json_text = LlamaConfigJson();

  Fixture() {
    kiln::LlamaForCausalLM llama(kiln::LlamaConfig::FromJson(config_json_text),
                                 {.generator = &gen});
    kiln::save_state_dict(llama, "model.safetensors", {.map = kiln::llama_save_mapping()});
    std::filesystem::create_directories("gpt2");
    kiln::save_state_dict(gpt, "gpt2/model.safetensors", {.map = kiln::gpt2_save_mapping()});
    // A partial checkpoint for a non-strict load: one of mlp's parameters (its shape) and a key
    // mlp does not have.
    const auto [name, param] = mlp.named_parameters().front();
    kiln::save_safetensors(
        "other.safetensors",
        {{name, kiln::randn(param.shape(), gen)}, {"unused.weight", kiln::randn({4}, gen)}}, {});
  }
  ~Fixture() { std::free(ptr); }
};

}  // namespace readme
