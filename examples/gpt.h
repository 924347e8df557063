// A GPT-2-class decoder written with kiln modules, for examples/05_gpt.cc and its test: learned
// positions, pre-norm blocks (LayerNorm, causal self-attention, GELU(tanh) MLP 4x), a final
// LayerNorm and logits through the tied token embedding. Parameters carry Hugging Face GPT-2's
// names ("wte.weight", "h.0.attn.c_attn.weight", "ln_f.bias"), so gpt2_load_mapping() loads a
// real GPT-2 checkpoint and gpt2_save_mapping() writes one transformers can read.
//
//   Gpt model({.layers = 2, .dim = 64, .heads = 2, .vocab = 128, .ctx = 64}, gen);
//   KvCache cache = model.NewCache(batch);
//   std::vector<Tensor> in = model.PrefillInputs(prompt, cache, state);    // prompt [B, T]
//   model.Prefill(in);   // writes the caches, state.tokens (next ids), state.pos (= T)
//   model.Decode(model.DecodeInputs(cache, state));   // one token: pos advances by one
//
// The KV cache (design): one fixed-capacity cache per layer, k and v [B, H, ctx, Dh]. A decode
// step has the same shapes at every position, so it compiles once and replays one CUDA graph.
// The position is a tensor input (int64 [1]), not an attribute: inside the step
//   index_copy_(k_cache, 2, pos, k_new)    the token's key into row pos (value likewise)
//   visible = arange(ctx) <= pos           the keys it may attend to (SDPA's bool mask)
// and the step also writes its own next inputs in place (tokens = argmax of the logits, pos + 1,
// the id into the `ids` record [B, ctx] with index_copy_ too), so the host loop only calls the
// step. Compiled, the
// index_copy_ runs in place on the caller's cache (codegen/executable.h): one row moves per
// layer per token. The price of a fixed shape: attention reads all ctx slots (masked) instead of
// pos + 1. A slice write copy_(slice(k_cache, 2, pos, pos + 1), k_new) would make pos an
// attribute: one trace, plan and graph per position.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/distributed.h"
#include "ops/modules.h"

namespace examples {

using kiln::Tensor;

struct GptConfig {
  int64_t layers = 12;
  int64_t dim = 768;
  int64_t heads = 12;
  int64_t vocab = 50257;
  int64_t ctx = 1024;  // learned positions, and the KV cache's capacity
  double eps = 1e-5;
};

// Per layer: k and v caches [B, H, ctx, Dh].
struct KvCache {
  std::vector<Tensor> k, v;
};

// What the decode loop carries between steps, all on the model's device.
struct DecodeState {
  Tensor tokens;  // int64 [B, 1]: the next token to feed
  Tensor pos;     // int64 [1]: its position
  Tensor ids;     // int64 [B, ctx]: prompt and generated ids, written as they come
};

class GptBlock;

class Gpt : public kiln::Module {
 public:
  Gpt(const GptConfig& config, kiln::Generator& gen, kiln::ModuleOptions options = {});
  const GptConfig& config() const { return config_; }
  const char* type_name() const override { return "Gpt"; }

  // Logits [B, T, vocab] of tokens [B, T] at positions 0 .. T-1 (no cache).
  Tensor forward(const Tensor& tokens) override;

  // Tensor parallelism (ops/tensor_parallel.h): each block keeps this rank's heads and MLP
  // features (load the weights first), the tied LM head its rows of the vocabulary (the logits
  // gathered); the embeddings and ln_f stay whole. forward, Prefill and
  // Decode then run on every rank of `group` with the same inputs (eager or compiled) and give
  // every rank the same logits; NewCache holds this rank's heads. `group` must outlive the model.
  void ShardTensorParallel(kiln::ProcessGroup& group);

  KvCache NewCache(int64_t batch) const;
  DecodeState NewState(int64_t batch) const;

  // The step functions (traceable, so kiln::compile takes them as they are). Inputs, as the
  // *Inputs helpers order them:
  //   Prefill: {prompt [B, T], tokens, pos, ids, k_0, v_0, k_1, v_1, ...}
  //   Decode:  {tokens, pos, ids, k_0, v_0, ...}
  // Both return {logits [B, vocab]} of the last position and write, in place, the caches, the
  // next tokens (greedy), pos (the next token's position) and ids.
  std::vector<Tensor> Prefill(const std::vector<Tensor>& inputs);
  std::vector<Tensor> Decode(const std::vector<Tensor>& inputs);
  static std::vector<Tensor> PrefillInputs(const Tensor& prompt, const KvCache& cache,
                                           const DecodeState& state);
  static std::vector<Tensor> DecodeInputs(const KvCache& cache, const DecodeState& state);

 protected:
  void MaterialiseBuffers(kiln::Device device) override;  // to_empty: slots_ and one_ there

 private:
  // Final norm, tied-embedding logits of x [B, 1, dim], the greedy pick written to the state.
  Tensor Finish(const Tensor& x, const Tensor& tokens, const Tensor& pos, const Tensor& ids,
                const Tensor& next_pos);

  GptConfig config_;
  kiln::Embedding& wte_;
  kiln::Embedding& wpe_;
  std::vector<GptBlock*> blocks_;
  kiln::LayerNorm& ln_f_;
  Tensor slots_;                       // arange(ctx), int64, on the model's device
  Tensor one_;                         // int64 [1] holding 1
  kiln::GroupRef tp_;                  // the ranks the blocks are split over; none: not split
  Tensor Head(const Tensor& h) const;  // the logits of final hidden states (gathered when split)
};

// GPT-2's initialisation (transformers' _init_weights), drawn from `seed`: weights N(0, 0.02),
// wpe N(0, 0.01), LayerNorm weights 1 and biases 0; other biases get N(0, 0.02) as well (not
// zero as in GPT-2) so that a file written by --write-weights exercises every bias.
void InitGpt2Weights(Gpt& model, uint64_t seed);

}  // namespace examples
