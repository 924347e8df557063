// The numerics policy (docs/ARCHITECTURE.md) as a test check, shared by the compiled-vs-eager
// differential (tests/compile_test.cc) and the tensor-parallel models: a half-precision result
// against the float32 reference of the same program, judged relative to eager's own error.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/factories.h"
#include "runtime/tensor.h"
#include "tests/test_util.h"

namespace kiln {

// The numerics policy (docs/ARCHITECTURE.md) for a half-precision program, per output tensor,
// against the float32 reference on the same inputs: the root-mean-square error of compiled is at
// most 2 x eager's plus a floor of half the dtype's relative tolerance x the reference's root mean
// square (bf16: 8e-3, about one ulp; PyTorch's accuracy check for torch.compile,
// torch._dynamo.utils.same with an fp64 reference, compares the same way with 3 x); no
// element's error, in units of the dtype's tolerance (relative, with an absolute term of 1e-3 x
// the output's largest value), is above max(4 x eager's largest, 4); non-finite reference values
// are matched exactly. The root mean square, not the largest error, carries the comparison: a
// value rounded once (fused) instead of after every op (eager) is closer to the reference, but
// a later cancellation can make one element of it worse than an element where eager's roundings
// happened to cancel.
struct PolicyErrors {
  double rms = 0;      // root-mean-square error over the finite reference values
  double largest = 0;  // the largest error, in tolerance units (INFINITY: a non-finite mismatch)
  size_t worst = 0;    // its element
};

inline PolicyErrors ErrorsAgainst(const std::vector<double>& x, const std::vector<double>& r,
                                  double rtol, double atol) {
  PolicyErrors e;
  double sum = 0;
  size_t n = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    if (!std::isfinite(r[k])) {
      const bool same = std::isnan(r[k]) ? std::isnan(x[k]) : x[k] == r[k];
      if (!same) e.largest = INFINITY, e.worst = k;
      continue;
    }
    const double d = std::isfinite(x[k]) ? x[k] - r[k] : INFINITY;
    sum += d * d;
    ++n;
    const double units = std::abs(d) / (atol + rtol * std::abs(r[k]));
    if (units > e.largest) e.largest = units, e.worst = k;
  }
  e.rms = n ? std::sqrt(sum / n) : 0;
  return e;
}

inline void ExpectWithinPolicy(const std::vector<Tensor>& got, const std::vector<Tensor>& eager,
                               const std::vector<Tensor>& reference, const std::string& what) {
  ASSERT_EQ(got.size(), reference.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].shape(), reference[i].shape()) << what;
    const std::vector<double> c = to_vector(got[i]), e = to_vector(eager[i]),
                              r = to_vector(reference[i]);
    double largest = 0, squares = 0;
    for (double v : r) {
      if (!std::isfinite(v)) continue;
      largest = std::max(largest, std::abs(v));
      squares += v * v;
    }
    const double rtol = ToleranceFor(got[i].dtype()).rtol, atol = 1e-3 * largest + 1e-30;
    const double floor = rtol / 2 * std::sqrt(squares / std::max<size_t>(r.size(), 1));
    const PolicyErrors ec = ErrorsAgainst(c, r, rtol, atol), ee = ErrorsAgainst(e, r, rtol, atol);
    const std::string where = absl::StrCat(
        what, ": output ", i, ": compiled rms error ", ec.rms, ", largest ", ec.largest,
        " tolerances (element ", ec.worst, ": compiled ", c[ec.worst], ", eager ", e[ec.worst],
        ", float32 ", r[ec.worst], "); eager's rms ", ee.rms, ", largest ", ee.largest);
    EXPECT_LE(ec.rms, 2 * ee.rms + floor) << where;
    EXPECT_LE(ec.largest, std::max(4 * ee.largest, 4.0)) << where;
  }
}

}  // namespace kiln
