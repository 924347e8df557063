// An independent double-precision reference of scaled_dot_product_attention for the tests,
// written apart from ops/cpu/attention.cc: plain row-major vectors (tests/reference.h), indices
// by div/mod, the math form spelled out. Semantics are torch's: scores q·kᵀ·scale; is_causal
// keeps key j for query i iff j <= i; a bool mask keeps where true, an additive one adds;
// grouped-query heads map q head h to k/v head h / (Hq / Hk); a row of all -inf scores is zeros.
#pragma once

#include <cmath>
#include <limits>
#include <vector>

#include "tests/reference.h"

namespace kiln::ref {

struct SdpaRefArgs {
  const RefTensor* mask = nullptr;  // broadcast to [..., L, S]
  bool mask_is_bool = false;
  bool causal = false;
  double scale = 0;
};

inline RefTensor Sdpa(const RefTensor& q, const RefTensor& k, const RefTensor& v,
                      const SdpaRefArgs& a) {
  const size_t r = q.shape.size();
  const int64_t s = k.shape[r - 2], e = q.shape[r - 1], ev = v.shape[r - 1];
  const int64_t group = r >= 3 ? q.shape[r - 3] / k.shape[r - 3] : 1;
  RefTensor out{q.shape, {}};
  out.shape[r - 1] = ev;
  out.v.assign(out.numel(), 0.0);
  std::vector<int64_t> score_shape(q.shape.begin(), q.shape.end() - 1);
  score_shape.push_back(s);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (int64_t row = 0; row < out.numel() / std::max<int64_t>(ev, 1); ++row) {
    std::vector<int64_t> qi = Unravel(row * q.shape[r - 1], q.shape);  // [..., i, 0]
    const int64_t i = qi[r - 2];
    std::vector<double> w(s);
    double mx = neg_inf;
    bool all_masked = true;
    for (int64_t j = 0; j < s; ++j) {
      std::vector<int64_t> ki = qi;
      if (r >= 3) ki[r - 3] /= group;
      ki[r - 2] = j;
      double dot = 0;
      for (int64_t c = 0; c < e; ++c) {
        ki[r - 1] = c;
        qi[r - 1] = c;
        dot += q.v[Ravel(qi, q.shape)] * k.v[Ravel(ki, k.shape)];
      }
      double x = dot * a.scale;
      if (a.causal && j > i) x = neg_inf;
      if (a.mask != nullptr) {
        std::vector<int64_t> si = qi;
        si[r - 1] = j;
        const double m = At(*a.mask, si);
        x = a.mask_is_bool ? (m != 0 ? x : neg_inf) : x + m;
      }
      w[j] = x;
      all_masked = all_masked && x == neg_inf;
      mx = std::max(mx, x);
    }
    if (all_masked) continue;  // zeros, as torch's SDPA
    double sum = 0;
    for (double& x : w) sum += (x = std::exp(x - mx));
    for (int64_t c = 0; c < ev; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < s; ++j) {
        std::vector<int64_t> vi = qi;
        if (r >= 3) vi[r - 3] /= group;
        vi[r - 2] = j;
        vi[r - 1] = c;
        acc += w[j] * v.v[Ravel(vi, v.shape)];
      }
      out.v[row * ev + c] = acc / sum;
    }
  }
  return out;
}

}  // namespace kiln::ref
