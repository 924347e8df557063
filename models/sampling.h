// Picking the next token from a row of logits: greedy, or a draw from the softmax at a
// temperature, restricted to the top k and to the top p of the mass (Hugging Face's order:
// temperature, top-k, top-p). Runs on the host, on float32 logits, with one uniform number per
// draw from kiln's Philox Generator: the same seed gives the same ids on every device (up to
// logits that differ across devices by less than a rounding, near a boundary of the draw).
//
//   SamplingOptions s{.temperature = 0.8, .top_k = 50, .top_p = 0.95};
//   int64_t id = sample_token(logits_row, s, gen.Uniform());
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (torch.argmax: the lowest id among ties, the first NaN),
                           // top_k and top_p then change nothing
  int64_t top_k = 0;       // > 0: only the k most likely ids (ties by lower id)
  double top_p = 1;        // < 1: the smallest set of most likely ids whose mass reaches p
};

// Throws unless the options are valid: temperature finite and >= 0, top_k >= 0, top_p in (0, 1].
void check_sampling_options(const SamplingOptions& options);
// The distribution a draw is made from: probabilities over the vocabulary, zero outside the
// kept set, summing to 1 (greedy: 1 at the argmax). Throws for empty logits, a negative
// temperature or top_k, a top_p outside (0, 1], or (when sampling, not greedy) a NaN logit or
// logits without a finite maximum.
std::vector<double> sampling_distribution(const std::vector<float>& logits,
                                          const SamplingOptions& options);
// The id whose cumulative probability (ids in order of decreasing probability) first exceeds
// `uniform` in [0, 1).
int64_t sample_token(const std::vector<float>& logits, const SamplingOptions& options,
                     double uniform);

}  // namespace kiln
