// CPU reference kernel of scaled_dot_product_attention: the math form in double, one query row
// at a time, any strides, grouped-query heads, bool/additive masks broadcast over the scores. A
// row whose every score is -inf (fully masked) is zeros, as torch's SDPA gives.
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"

namespace kiln::cpu {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Offsets of one [T, E] matrix of `t` for the batch index `idx` (q's leading dims); `group`
// divides the head index (dim -3) for grouped-query k/v.
int64_t MatrixOffset(const Tensor& t, IntList idx, int64_t group) {
  int64_t off = 0;
  for (size_t d = 0; d < idx.size(); ++d) {
    const bool head = d + 3 == static_cast<size_t>(t.dim());
    off += (head ? idx[d] / group : idx[d]) * t.stride(d);
  }
  return off;
}

// Rows of `t` (a [rows, cols] matrix at `off`) as doubles, row-major.
std::vector<double> LoadMatrix(const Tensor& t, int64_t off, int64_t rows, int64_t cols) {
  const LoadFn load = LoaderFor(t.dtype());
  std::vector<double> m(rows * cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      m[i * cols + j] = load(t.data_ptr(), off + i * t.stride(-2) + j * t.stride(-1));
    }
  }
  return m;
}

struct Problem {
  int64_t l, s, e, ev;
  const OpAttrs* attrs;
  const Tensor* mask;    // nullptr: none
  Strides mask_strides;  // over out's shape (0 where it broadcasts)
};

// Scores of query row i (scale, causal rule and mask applied).
void Scores(const Problem& p, const std::vector<double>& q, const std::vector<double>& k, int64_t i,
            int64_t mask_off, std::vector<double>* s) {
  const int64_t r = static_cast<int64_t>(p.mask_strides.size());
  for (int64_t j = 0; j < p.s; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < p.e; ++c) dot += q[i * p.e + c] * k[j * p.e + c];
    double x = dot * p.attrs->scale;
    if (p.attrs->is_causal && j > i) x = kNegInf;
    if (p.mask != nullptr) {
      const int64_t at = mask_off + i * p.mask_strides[r - 2] + j * p.mask_strides[r - 1];
      const double m = LoaderFor(p.mask->dtype())(p.mask->data_ptr(), at);
      x = p.mask->dtype() == DType::kBool ? (m != 0 ? x : kNegInf) : x + m;
    }
    (*s)[j] = x;
  }
}

// out row = softmax(s) · v, zeros when every score is -inf.
void Row(const Problem& p, const std::vector<double>& s, const std::vector<double>& v,
         std::vector<double>* o) {
  double mx = kNegInf;
  bool all_masked = true;
  for (double x : s) {
    all_masked = all_masked && x == kNegInf;
    mx = std::isnan(x) || x > mx ? x : mx;
  }
  std::fill(o->begin(), o->end(), 0.0);
  if (all_masked) return;
  double sum = 0;
  for (int64_t j = 0; j < p.s; ++j) {
    const double w = std::exp(s[j] - mx);
    sum += w;
    for (int64_t c = 0; c < p.ev; ++c) (*o)[c] += w * v[j * p.ev + c];
  }
  for (double& x : *o) x /= sum;
}

}  // namespace

void ScaledDotProductAttention(const OpDef&, absl::Span<const Tensor> in, const Tensor& out,
                               const OpAttrs& a) {
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  const int64_t rank = q.dim();
  Problem p{q.size(-2), k.size(-2), q.size(-1), v.size(-1), &a, nullptr, {}};
  if (in.size() > 3) {
    p.mask = &in[3];
    p.mask_strides = BroadcastStrides(in[3], out.shape());
  }
  const int64_t group = rank >= 3 ? q.size(-3) / k.size(-3) : 1;
  const Shape batch(q.shape().begin(), q.shape().end() - 2);
  const StoreFn store = StorerFor(out.dtype());
  std::vector<double> s(p.s), o(p.ev);
  for (int64_t flat = 0; flat < NumElements(batch); ++flat) {
    Shape idx(batch.size());
    for (int64_t d = static_cast<int64_t>(batch.size()) - 1, rest = flat; d >= 0; --d) {
      idx[d] = rest % batch[d];
      rest /= batch[d];
    }
    const std::vector<double> qm = LoadMatrix(q, MatrixOffset(q, idx, 1), p.l, p.e);
    const std::vector<double> km = LoadMatrix(k, MatrixOffset(k, idx, group), p.s, p.e);
    const std::vector<double> vm = LoadMatrix(v, MatrixOffset(v, idx, group), p.s, p.ev);
    int64_t mask_off = 0;
    for (size_t d = 0; p.mask != nullptr && d < idx.size(); ++d) {
      mask_off += idx[d] * p.mask_strides[d];
    }
    const int64_t out_off = MatrixOffset(out, idx, 1);
    for (int64_t i = 0; i < p.l; ++i) {
      Scores(p, qm, km, i, mask_off, &s);
      Row(p, s, vm, &o);
      for (int64_t c = 0; c < p.ev; ++c) {
        store(out.data_ptr(), out_off + i * out.stride(-2) + c * out.stride(-1), o[c]);
      }
    }
  }
}

}  // namespace kiln::cpu
