// A Llama-style decoder-only language model (Hugging Face's LlamaForCausalLM and the families
// that share its layout: Mistral, Qwen2 with attention_bias, Qwen3 with q/k norms, Gemma with
// its scaled embeddings and (1 + weight) norms, Phi-3 with its fused projections in the
// checkpoint, TinyLlama, SmolLM): token
// embedding, pre-norm layers of RMSNorm, grouped-query attention with rotary embeddings (one
// table shared by all layers) and a gated MLP, a final RMSNorm and the LM head (or the tied
// embedding). Parameters carry HF's names without "model." (llama_load_mapping() adds nothing
// else; llama_load_mapping(c) also splits Phi-3's fused projections), so a transformers
// checkpoint loads as it is:
//
//   LlamaConfig c = LlamaConfig::FromJson(ReadFile("config.json"));
//   LlamaForCausalLM model(c, {.dtype = DType::kBFloat16, .device = CUDA(),
//                              .init = Init::kNone});            // no random draws
//   load_state_dict(model, "model.safetensors", {.map = llama_load_mapping(c)});
//   Tensor logits = model(tokens);                               // [B, T, vocab]
//   GenerateResult r = generate(model, prompts, {.max_new_tokens = 64});   // models/generate.h
#pragma once

#include <string>
#include <vector>

#include "io/state_dict.h"
#include "models/causal_lm.h"

namespace kiln {

struct LlamaConfig {
  int64_t vocab = 32000;                      // vocab_size
  int64_t dim = 4096;                         // hidden_size
  int64_t hidden = 11008;                     // intermediate_size
  int64_t layers = 32;                        // num_hidden_layers
  int64_t heads = 32;                         // num_attention_heads
  int64_t kv_heads = 0;                       // num_key_value_heads (0: heads)
  int64_t head_dim = 0;                       // head_dim (0: dim / heads)
  double eps = 1e-5;                          // rms_norm_eps
  RopeOptions rope;                           // rope_theta, max_position_embeddings, rope_scaling
  Activation activation = Activation::kSilu;  // hidden_act
  bool qkv_bias = false;  // q_proj, k_proj, v_proj biases (attention_bias; Qwen2: always)
  bool out_bias = false;  // o_proj's (attention_bias; Qwen2: never)
  bool mlp_bias = false;
  bool qk_norm = false;  // q_norm, k_norm over each head (Qwen3), epsilon eps
  // No lm_head: logits through embed_tokens.weight. A checkpoint's "lm_head.weight", where
  // present, loads as the embedding and must equal it (Module::named_ties).
  bool tie_word_embeddings = false;
  // sliding_window (Mistral; Qwen2 with use_sliding_window), 0: none. kiln does not mask by
  // window: it runs sequences and KV caches up to this length (where the window changes
  // nothing) and refuses longer ones (AttentionConfig::sliding_window).
  int64_t sliding_window = 0;
  // Gemma: the embeddings are multiplied by sqrt(dim) (rounded to the model's dtype, as
  // transformers' normalizer), and every RMSNorm is a GemmaRMSNorm (weights stored as w - 1).
  bool gemma = false;
  // Phi-3: checkpoints hold q, k, v as one self_attn.qkv_proj and gate, up as one
  // mlp.gate_up_proj (rows in that order); llama_load_mapping(c) splits them into kiln's
  // modules and llama_save_mapping(c) joins them back.
  bool fused_projections = false;

  // From the text of a Hugging Face config.json (fields named as in the comments above;
  // rope_scaling of type "linear", "llama3", "yarn" or "dynamic"); a missing field takes
  // transformers' default (rms_norm_eps 1e-6). model_type, where given, must be llama, mistral,
  // qwen2, qwen3, gemma or phi3 (partial_rotary_factor 1 only). A field of the wrong type, an
  // unknown model type, rope scaling or hidden_act, or a scaling without its parameters is an error
  // naming it.
  static LlamaConfig FromJson(const std::string& json_text);
};

// Gemma's RMSNorm: x normalised and multiplied by (1 + weight), all in float32 and rounded once
// to x's dtype (transformers' GemmaRMSNorm); the weight starts at zeros.
class GemmaRMSNorm : public Module {
 public:
  explicit GemmaRMSNorm(int64_t dim, double eps = 1e-6, ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  const char* type_name() const override { return "GemmaRMSNorm"; }

 private:
  double eps_;
  Tensor& weight_;
};

// input_layernorm, self_attn, post_attention_layernorm, mlp (HF's names).
class LlamaDecoderLayer : public Module {
 public:
  LlamaDecoderLayer(const LlamaConfig& c, const RotaryEmbedding& rotary, ModuleOptions o);
  // x [B, T, dim] at positions `positions` ([T] or [B, T]): causal, or the attention pattern
  // `mask` (bool [B, 1, T, T], true = attend) when defined.
  Tensor Forward(const Tensor& x, const Tensor& positions, const Tensor& mask = {});
  // With the KV cache (CausalLM::StepInputs): k and v of x into rows `slots` of k, v.
  Tensor Cached(const Tensor& x, const Tensor& positions, const Attention::Cache& cache,
                const Tensor& slots, const Tensor& mask);
  Tensor forward(const Tensor& x) override;
  const char* type_name() const override { return "LlamaDecoderLayer"; }
  // Its attention's heads and its MLP's hidden features split over `group` (ops/tensor_parallel.h).
  void ShardTensorParallel(ProcessGroup& group);

 private:
  Module& input_layernorm_;  // RMSNorm, or GemmaRMSNorm
  Attention& self_attn_;
  Module& post_attention_layernorm_;
  FeedForward& mlp_;
};

// Hugging Face's checkpoint names for a model of config `c` (io/state_dict.h's
// llama_load_mapping() / llama_save_mapping(), which serve every config but Phi-3's), with
// Phi-3's fused projections split on load and joined on save.
KeyMapper llama_load_mapping(const LlamaConfig& c);
KeyMapper llama_save_mapping(const LlamaConfig& c);

class LlamaForCausalLM : public CausalLM {
 public:
  explicit LlamaForCausalLM(const LlamaConfig& config, ModuleOptions options = {});
  const LlamaConfig& config() const { return config_; }

  // Logits [B, T, vocab] of tokens [B, T] at positions 0 .. T-1 (no cache, causal).
  Tensor forward(const Tensor& tokens) override;
  // {tokens}, {tokens, positions [B, T]} or {tokens, positions, attention_mask [B, T]} (HF's:
  // nonzero = token, 0 = padding). Positions alone do not hide padding from attention: a
  // left-padded batch needs its attention_mask (generate() builds it).
  std::vector<Tensor> forward_many(const std::vector<Tensor>& inputs) override;
  CacheSpec cache_spec() const override;
  Tensor Step(const StepInputs& in) override;
  const char* type_name() const override { return "LlamaForCausalLM"; }
  // Tensor parallelism (ops/tensor_parallel.h): every layer keeps this rank's heads and MLP
  // features of the full weights it holds (load the checkpoint first), and its rows of the LM head
  // (by vocabulary, ops/tensor_parallel.h's PaddedRowShard; tied: a view of the embedding's rows);
  // the embeddings and norms stay whole. forward, Step and generate() then run on every rank of
  // `group` (each rank calls them with the same inputs and gets the same logits), with two
  // all-reduces a layer, one gather of the logits and a KV cache of this rank's kv_heads. Eager or
  // compiled (the all-reduces are ops in the traced graph); `group` must outlive the model and its
  // compiled steps.
  void ShardTensorParallel(ProcessGroup& group);

 private:
  Tensor Logits(const Tensor& x);      // norm, then lm_head or the tied embedding
  Tensor Embed(const Tensor& tokens);  // embed_tokens (Gemma: scaled)

  LlamaConfig config_;
  ModuleOptions options_;
  Embedding& embed_tokens_;
  RotaryEmbedding& rotary_;  // "rotary_emb": its tables are buffers, shared by the layers
  std::vector<LlamaDecoderLayer*> layers_;
  Module& norm_;
  Linear* lm_head_ = nullptr;
  GroupRef tp_;  // the ranks the model is split over; none: not split
};

}  // namespace kiln
