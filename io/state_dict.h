// Module weights in and out: load_state_dict / save_state_dict over safetensors files or named
// tensors, with torch's semantics, and a name mapping for checkpoints written by other code.
//
//   GeGLUMLP mlp(768, 3072, gen);
//   save_state_dict(mlp, "mlp.safetensors");                  // keys "gate.weight", ...
//   load_state_dict(mlp, "mlp.safetensors");                  // strict: every key must match
//   LoadReport r = load_state_dict(mlp, "other.safetensors", /*strict=*/false);
//   r.missing_keys, r.unexpected_keys                         // what did not match
//
//   // A Hugging Face GPT-2 checkpoint into kiln modules named like GPT-2's (h.0.attn.c_attn...):
//   load_state_dict(gpt, "model.safetensors", {.map = gpt2_load_mapping()});
//   save_state_dict(gpt, "gpt2.safetensors", {.map = gpt2_save_mapping()});   // HF's layout
//   // A Hugging Face Llama-style checkpoint into kiln::LlamaForCausalLM (models/llama.h):
//   load_state_dict(llama, "model.safetensors", {.map = llama_load_mapping()});
//
//   // Joining and splitting: a mapping may send one checkpoint tensor to several parameters, or
//   // several to one, by rows (dim 0, in kiln's [out, in] orientation):
//   o.map = [](const std::string& key) -> KeyMappings {
//     if (key == "attn.c_attn.weight")                  // [3 dim, dim] -> q_proj, k_proj, v_proj
//       return std::vector<KeyMapping>{{"attn.q_proj.weight", false, {0, dim}},
//                                      {"attn.k_proj.weight", false, {dim, dim}},
//                                      {"attn.v_proj.weight", false, {2 * dim, dim}}};
//     return KeyMapping{key};
//   };
//
// Loading copies each checkpoint tensor into the module's existing parameter memory (torch's
// param.copy_(t)): handles to the parameters, and functions compiled over them, see the new
// values (a write bumps the storage's version, so plans that froze the weights recompile);
// devices may differ (a file is read straight from its mapping, one tensor at a time);
// dtypes are converted unless LoadOptions::convert_dtype is false. Every key is matched, every
// shape checked and every parameter's rows found covered exactly once before the first byte is
// copied, so an error leaves the module as it was (nothing half-loaded). Errors
// (kiln::Error) name the module key, the checkpoint key, the expected and the found
// shape/dtype. Parameters must be contiguous and hold memory (not meta, not tracing
// placeholders). Not thread-safe against a concurrent forward of the same module.
//
// A module split for tensor parallelism (ShardTensorParallel records each split parameter,
// Module::named_shards) is loaded from the whole checkpoint: the shapes are checked against the
// whole tensors, and each split parameter receives only this rank's part of its tensor (read one
// tensor at a time on the host); a checkpoint tensor of the part's own shape (what a split model
// saves) is loaded as it is. With Module::to_empty no rank ever holds a whole model:
//
//   LlamaForCausalLM model(config, {.dtype = DType::kBFloat16, .device = kMeta});  // no memory
//   model.ShardTensorParallel(group);                    // this rank's shapes
//   model.to_empty(CUDA(group.rank()));                  // memory for this rank's part only
//   load_state_dict(model, "model.safetensors", {.map = llama_load_mapping()});

#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "ops/modules.h"

namespace kiln {

// Rows [start, start + length) along dim 0; length 0 means all of them.
struct Rows {
  int64_t start = 0;
  int64_t length = 0;
};

// Where a tensor goes on the other side of a load (checkpoint name -> module name) or a save
// (module name -> checkpoint name). Rows are counted in kiln's orientation (after `transpose`).
struct KeyMapping {
  std::string name;
  bool transpose = false;  // a 2-D tensor stored transposed ([in, out] where kiln has [out, in])
  Rows from;               // the rows of the tensor being read that go there (default: all)
  Rows to;                 // the rows of `name` they fill (default: as many, from row 0)
};

// What a mapper returns for one name: nothing (the tensor is dropped: neither loaded nor reported
// as unexpected, or not saved), one target, or several (a split; several names that fill rows
// of one target are a join).
class KeyMappings {
 public:
  KeyMappings() = default;
  KeyMappings(std::nullopt_t) {}                      // NOLINT: implicit, as std::optional's
  KeyMappings(KeyMapping m) : list_{std::move(m)} {}  // NOLINT
  KeyMappings(std::optional<KeyMapping> m) {          // NOLINT
    if (m) list_.push_back(std::move(*m));
  }
  KeyMappings(std::vector<KeyMapping> list) : list_(std::move(list)) {}  // NOLINT
  bool dropped() const { return list_.empty(); }
  const std::vector<KeyMapping>& list() const { return list_; }

 private:
  std::vector<KeyMapping> list_;
};
using KeyMapper = std::function<KeyMappings(const std::string& name)>;

struct LoadOptions {
  bool strict = true;         // missing or unexpected keys are an error, else only reported
  KeyMapper map;              // checkpoint name -> module name; none: the same name
  bool convert_dtype = true;  // a checkpoint dtype other than the parameter's is converted
};

struct LoadReport {
  std::vector<std::string> loaded;           // module names, in the module's order
  std::vector<std::string> missing_keys;     // parameters no checkpoint tensor maps to
  std::vector<std::string> unexpected_keys;  // checkpoint keys that map to no parameter
  std::vector<std::string> dropped_keys;     // checkpoint keys the mapping dropped
  // One line per list that is not empty ("missing keys (2): [a, b]"), or "all N keys loaded".
  std::string str() const;
};

LoadReport load_state_dict(Module& module, const SafetensorsFile& file,
                           const LoadOptions& options = {});
// `path`: a safetensors file, or a sharded checkpoint's index (a path ending in ".json", as
// transformers' model.safetensors.index.json: its "weight_map" names each tensor's file in the
// index's folder; the shards load as one checkpoint).
LoadReport load_state_dict(Module& module, const std::string& path,
                           const LoadOptions& options = {});
LoadReport load_state_dict(Module& module, const NamedTensors& tensors,
                           const LoadOptions& options = {});
LoadReport load_state_dict(Module& module, const SafetensorsFile& file, bool strict);
LoadReport load_state_dict(Module& module, const std::string& path, bool strict);
LoadReport load_state_dict(Module& module, const NamedTensors& tensors, bool strict);

struct SaveOptions {
  KeyMapper map;  // module name -> checkpoint name; none: the same name
  std::map<std::string, std::string> metadata = {{"format", "pt"}};  // as transformers expects
};

// The module's parameters (named_parameters(), mapped), written as a safetensors file.
void save_state_dict(const Module& module, const std::string& path,
                     const SaveOptions& options = {});
// The same, as named tensors (transposed ones are contiguous copies).
NamedTensors state_dict(const Module& module, const KeyMapper& map = {});

// Hugging Face GPT-2 checkpoints (GPT2Model or GPT2LMHeadModel) into kiln modules that use
// GPT-2's names ("wte.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.weight", "ln_f.bias"):
// strips a leading "transformer.", drops the attention-mask buffers (".attn.bias",
// ".attn.masked_bias") and the tied "lm_head.weight", and transposes the Conv1D weights
// (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj), which HF stores [in, out].
KeyMapper gpt2_load_mapping();
// The inverse for save_state_dict: a kiln GPT-2 written in HF's layout (Conv1D weights
// [in, out], names unchanged), loadable by transformers and by gpt2_load_mapping().
KeyMapper gpt2_save_mapping();

// Hugging Face Llama-style checkpoints (LlamaForCausalLM and the families sharing its names:
// Mistral, Qwen2, ...) into kiln::LlamaForCausalLM (models/llama.h), whose parameters carry HF's
// names without the leading "model." ("embed_tokens.weight", "layers.0.self_attn.q_proj.weight",
// "layers.0.mlp.gate_proj.weight", "norm.weight", "lm_head.weight"): strips "model." and drops
// the rotary buffers ("rotary_emb.inv_freq"). A checkpoint with tied embeddings has no
// lm_head.weight: build the model with tie_word_embeddings and it expects none.
KeyMapper llama_load_mapping();
// The inverse: kiln's names with "model." put back (lm_head.weight stays as it is).
KeyMapper llama_save_mapping();

}  // namespace kiln
