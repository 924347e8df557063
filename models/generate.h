// Text generation for any CausalLM (models/causal_lm.h): a batch of prompts of any lengths,
// greedy or sampled, with stop tokens, eagerly or compiled (+ CUDA graphs).
//
//   GenerateOptions o;
//   o.max_new_tokens = 64;
//   o.sampling = {.temperature = 0.7, .top_k = 50, .top_p = 0.9};
//   o.seed = 1;
//   o.stop_tokens = {eos_id};
//   o.mode = GenerateOptions::Mode::kCudaGraph;
//   GenerateResult r = generate(model, {{1, 15043, 29892}, {1, 450}}, o);
//   r.tokens[0]   // the ids generated for the first prompt (its stop token last, if it stopped)
//
// How (design): the prompts are left-padded to the longest; one preallocated KV cache holds
// max_len + max_new_tokens slots. Each row's positions count its own tokens only (padding is
// masked out of attention and takes no position), so a prompt gives the same ids alone or in a
// batch. The prefill writes all prompt slots at once; each decode step writes one slot, the same
// for every row, so its shapes never change: compiled once, replayed as one CUDA graph. After
// each step the chosen ids come to the host (stop tokens and on_step need them); greedy picks
// on the device (argmax), sampling on the host (models/sampling.h) with a Philox stream seeded
// by `seed`, one draw per row per step, so the ids depend on the seed, not the device.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "models/causal_lm.h"
#include "models/sampling.h"

namespace kiln {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  SamplingOptions sampling;  // greedy unless a temperature is set
  uint64_t seed = 0;
  std::vector<int64_t> stop_tokens;  // a row ends after generating one of these
  int64_t pad_token = 0;             // fed to the model where a row is padding or has ended
  enum class Mode : uint8_t {
    kEager,
    kCompiled,   // prefill and decode step compiled (weights frozen for the call)
    kCudaGraph,  // and the decode step replayed as a CUDA graph (CUDA models)
  };
  Mode mode = Mode::kEager;
  // Called after every step with the ids just chosen, one per row (-1 for rows already ended);
  // returning false ends generation early.
  std::function<bool(int64_t step, const std::vector<int64_t>& ids)> on_step;
};

struct GenerateResult {
  std::vector<std::vector<int64_t>> tokens;  // per prompt: generated ids, a stop token included
  std::vector<bool> stopped;                 // per prompt: ended on a stop token
  Tensor prefill_logits;                     // float32 [B, vocab]: each prompt's last position
  int64_t steps = 0;                         // model steps run (the prefill included)
  int kernels_per_decode_step = 0;           // compiled modes: from the decode step's report
};

// Prompts: ids in [0, vocab), each non-empty; the longest prompt plus max_new_tokens must fit
// the model's positions. Bad input is an error naming the prompt and the rule.
GenerateResult generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& options = {});

}  // namespace kiln
