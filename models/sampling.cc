// Greedy, temperature, top-k and top-p sampling on the host (see sampling.h).
#include "models/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/status.h"

namespace kiln {
namespace {

// Ids by decreasing logit, ties by lower id.
std::vector<int64_t> Ranked(const std::vector<float>& logits) {
  std::vector<int64_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  return ids;
}

// torch.argmax's pick: the first NaN if there is one, else the lowest id of the largest value
// (+inf included).
int64_t Argmax(const std::vector<float>& logits) {
  int64_t best = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) return static_cast<int64_t>(i);
    if (logits[i] > logits[best]) best = static_cast<int64_t>(i);
  }
  return best;
}

}  // namespace

void check_sampling_options(const SamplingOptions& o) {
  KILN_CHECK(o.temperature >= 0 && std::isfinite(o.temperature),
             "sampling: temperature must be finite and >= 0, got ", o.temperature);
  KILN_CHECK(o.top_k >= 0, "sampling: top_k must be >= 0, got ", o.top_k);
  KILN_CHECK(o.top_p > 0 && o.top_p <= 1, "sampling: top_p must be in (0, 1], got ", o.top_p);
}

namespace {

// The distribution, and the ids by decreasing logit it was built on (`ranked`).
std::vector<double> Distribution(const std::vector<float>& logits, const SamplingOptions& o,
                                 std::vector<int64_t>* ranked_out) {
  KILN_CHECK(!logits.empty(), "sample_token: no logits");
  check_sampling_options(o);
  std::vector<double> probs(logits.size(), 0.0);
  std::vector<int64_t>& ranked = *ranked_out;
  if (o.temperature == 0) {  // greedy, whatever top_k and top_p say
    const int64_t id = Argmax(logits);
    ranked.assign(1, id);
    probs[id] = 1;
    return probs;
  }
  for (size_t i = 0; i < logits.size(); ++i) {
    KILN_CHECK(!std::isnan(logits[i]), "sample_token: logit ", i, " is NaN");
  }
  ranked = Ranked(logits);
  const double top = logits[ranked[0]];
  KILN_CHECK(std::isfinite(top), "sample_token: the largest logit is ", top,
             ", not a finite number");
  size_t kept = o.top_k > 0 ? std::min<size_t>(o.top_k, ranked.size()) : ranked.size();
  double total = 0;
  for (size_t i = 0; i < kept; ++i) {
    const double p = std::exp((logits[ranked[i]] - top) / o.temperature);
    probs[ranked[i]] = p;
    total += p;
  }
  // top-p: keep ids while the mass before them is below p (at least one); p = 1 keeps every id
  // (the mass summed in double can reach 1 before the smallest ids are counted).
  double before = 0;
  size_t nucleus = o.top_p >= 1 ? kept : 0;
  while (nucleus < kept && (nucleus == 0 || before < o.top_p)) {
    before += probs[ranked[nucleus]] / total;
    ++nucleus;
  }
  double kept_mass = 0;
  for (size_t i = 0; i < kept; ++i) {
    if (i >= nucleus) probs[ranked[i]] = 0;
    kept_mass += probs[ranked[i]];
  }
  for (double& p : probs) p /= kept_mass;
  return probs;
}

}  // namespace

std::vector<double> sampling_distribution(const std::vector<float>& logits,
                                          const SamplingOptions& o) {
  std::vector<int64_t> ranked;
  return Distribution(logits, o, &ranked);
}

int64_t sample_token(const std::vector<float>& logits, const SamplingOptions& o, double uniform) {
  KILN_CHECK(uniform >= 0 && uniform < 1, "sample_token: uniform must be in [0, 1), got ", uniform);
  std::vector<int64_t> ranked;  // sorted once, for the distribution and the draw
  const std::vector<double> probs = Distribution(logits, o, &ranked);
  double cumulative = 0;
  int64_t last_kept = ranked[0];
  for (int64_t id : ranked) {
    if (probs[id] == 0) continue;
    last_kept = id;
    cumulative += probs[id];
    if (uniform < cumulative) return id;
  }
  return last_kept;  // rounding left the sum a hair under 1
}

}  // namespace kiln
