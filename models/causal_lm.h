// What kiln::generate (models/generate.h) needs of a decoder-only language model: a KV cache it
// can allocate and one step over it. kiln::LlamaForCausalLM (models/llama.h) is one; a model
// written by a user becomes one by implementing cache_spec() and Step().
//
//   struct MyModel : kiln::CausalLM {
//     CacheSpec cache_spec() const override { return {layers, kv_heads, head_dim, dtype, device,
//                                                     vocab, max_positions}; }
//     Tensor Step(const StepInputs& in) override { ... }   // logits [B, vocab] of the last token
//   };
//
// The step (design): T new tokens per row, written into the cache's slots `slots` (the same slots
// for every row: batches are left-padded), attending under a mask that hides each row's padding
// and the future. Decode steps (T = 1) have the same shapes at every position, so they compile
// once and replay as one CUDA graph; the price is attention over all S slots (masked).
#pragma once

#include <cstdint>
#include <vector>

#include "ops/modules.h"

namespace kiln {

// Per layer, k and v [B, kv_heads, S, head_dim].
struct KvCache {
  std::vector<Tensor> k, v;
  int64_t capacity() const { return k.empty() ? 0 : k[0].size(2); }
};

class CausalLM : public Module {
 public:
  struct CacheSpec {
    int64_t layers = 0, kv_heads = 0, head_dim = 0;
    DType dtype = DType::kFloat32;
    Device device = kCPU;
    int64_t vocab = 0;
    int64_t max_positions = 0;  // positions the model can encode (rotary tables, learned)
  };
  struct StepInputs {
    Tensor tokens;     // int64 [B, T]
    Tensor positions;  // int64 [B, T]: each token's position in its row (padding excluded)
    Tensor slots;      // int64 [T]: the cache rows the T tokens' keys and values go to
    Tensor mask;       // bool [B, 1, T, S]: true where a token may attend to a cache row
    KvCache cache;     // written in place
  };

  virtual CacheSpec cache_spec() const = 0;
  // Writes the tokens' keys and values into the cache and returns the logits [B, vocab] of the
  // last of the T tokens (the model's dtype). Traceable: compile() takes it as it is.
  virtual Tensor Step(const StepInputs& in) = 0;

  // cache_spec(), refused (a kiln::Error naming the model, `who` and the field) unless layers >=
  // 0, kv_heads, head_dim, vocab and max_positions > 0 and the dtype is a floating type.
  CacheSpec CheckedCacheSpec(const char* who) const;
  // A zeroed cache for `batch` rows of `capacity` slots, in the spec's dtype and device.
  KvCache NewCache(int64_t batch, int64_t capacity) const;
};

}  // namespace kiln
