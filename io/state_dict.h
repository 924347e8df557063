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
//
// Loading copies each checkpoint tensor into the module's existing parameter memory (torch's
// param.copy_(t)): handles to the parameters, and functions compiled over them, see the new
// values (a write bumps the storage's version, so plans that froze the weights recompile);
// devices may differ (a file is read straight from its mapping, one tensor at a time);
// dtypes are converted unless LoadOptions::convert_dtype is false. Every key is matched and every
// shape checked before the first byte is copied, so an error leaves the module as it was. Errors
// (kiln::Error) name the module key, the checkpoint key, the expected and the found
// shape/dtype. Parameters must be contiguous and hold memory (not meta, not tracing
// placeholders). Not thread-safe against a concurrent forward of the same module.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "ops/modules.h"

namespace kiln {

// Where a tensor goes on the other side of a load (checkpoint name -> module name) or a save
// (module name -> checkpoint name).
struct KeyMapping {
  std::string name;
  bool transpose = false;  // a 2-D tensor stored transposed ([in, out] where kiln has [out, in])
};
// std::nullopt drops the tensor: it is neither loaded nor reported as unexpected (or not saved).
using KeyMapper = std::function<std::optional<KeyMapping>(const std::string& name)>;

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
};

LoadReport load_state_dict(Module& module, const SafetensorsFile& file,
                           const LoadOptions& options = {});
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

}  // namespace kiln
