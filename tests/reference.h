// An independent double-precision reference for the op conformance tests. It is written apart
// from the kernels on purpose: values live in plain row-major vectors, indices are decomposed
// with div/mod (the kernels step strides incrementally), and every op is a few obvious lines.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace kiln::ref {

struct RefTensor {
  std::vector<int64_t> shape;
  std::vector<double> v;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

inline std::vector<int64_t> Unravel(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return idx;
}

inline int64_t Ravel(const std::vector<int64_t>& idx, const std::vector<int64_t>& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

inline std::vector<int64_t> BroadcastShape(std::vector<std::vector<int64_t>> shapes) {
  size_t rank = 0;
  for (auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (auto& s : shapes) {
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[rank - s.size() + i];
      if (s[i] != 1) o = s[i];
    }
  }
  return out;
}

// Value of `t` at index `idx` of the broadcast shape `out_shape`.
inline double At(const RefTensor& t, const std::vector<int64_t>& idx) {
  std::vector<int64_t> own(t.shape.size());
  const size_t lead = idx.size() - t.shape.size();
  for (size_t i = 0; i < t.shape.size(); ++i) own[i] = t.shape[i] == 1 ? 0 : idx[lead + i];
  return t.v[Ravel(own, t.shape)];
}

inline RefTensor Map(const std::vector<RefTensor>& in,
                     const std::function<double(const std::vector<double>&)>& f) {
  std::vector<std::vector<int64_t>> shapes;
  for (auto& t : in) shapes.push_back(t.shape);
  RefTensor out{BroadcastShape(shapes), {}};
  out.v.resize(out.numel());
  std::vector<double> args(in.size());
  for (int64_t i = 0; i < out.numel(); ++i) {
    const auto idx = Unravel(i, out.shape);
    for (size_t k = 0; k < in.size(); ++k) args[k] = At(in[k], idx);
    out.v[i] = f(args);
  }
  return out;
}

// Folds the elements along `dims` (all if empty) with `init` and `f`, then `finish(acc, count)`.
inline RefTensor Reduce(const RefTensor& x, std::vector<int64_t> dims, bool keepdim, double init,
                        const std::function<double(double, double)>& f,
                        const std::function<double(double, int64_t)>& finish) {
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  std::vector<bool> red(rank, dims.empty());
  for (int64_t d : dims) red[d < 0 ? d + rank : d] = true;
  std::vector<int64_t> kshape;  // keepdim shape
  for (int64_t i = 0; i < rank; ++i) kshape.push_back(red[i] ? 1 : x.shape[i]);
  RefTensor acc{kshape, std::vector<double>(0)};
  acc.v.assign(acc.numel(), init);
  std::vector<int64_t> count(acc.numel(), 0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = Unravel(i, x.shape);
    for (int64_t d = 0; d < rank; ++d) {
      if (red[d]) idx[d] = 0;
    }
    const int64_t o = Ravel(idx, kshape);
    acc.v[o] = f(acc.v[o], x.v[i]);
    ++count[o];
  }
  for (size_t o = 0; o < acc.v.size(); ++o) acc.v[o] = finish(acc.v[o], count[o]);
  if (!keepdim) {
    std::vector<int64_t> s;
    for (int64_t i = 0; i < rank; ++i) {
      if (!red[i]) s.push_back(x.shape[i]);
    }
    acc.shape = s;
  }
  return acc;
}

// Applies f to every 1-D row along `dim` (the row is given and returned in order).
inline RefTensor Rows(const RefTensor& x, int64_t dim,
                      const std::function<std::vector<double>(const std::vector<double>&)>& f) {
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  dim = dim < 0 ? dim + rank : dim;
  RefTensor out = x;
  const int64_t n = x.shape[dim];
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = Unravel(i, x.shape);
    if (idx[dim] != 0) continue;
    std::vector<double> row(n);
    for (int64_t j = 0; j < n; ++j) {
      idx[dim] = j;
      row[j] = x.v[Ravel(idx, x.shape)];
    }
    const auto r = f(row);
    for (int64_t j = 0; j < n; ++j) {
      idx[dim] = j;
      out.v[Ravel(idx, x.shape)] = r[j];
    }
  }
  return out;
}

// torch.matmul on row-major data: 1-D promotion and broadcast batch dims.
inline RefTensor Matmul(RefTensor a, RefTensor b) {
  const bool av = a.shape.size() == 1, bv = b.shape.size() == 1;
  if (av) a.shape.insert(a.shape.begin(), 1);
  if (bv) b.shape.push_back(1);
  const int64_t m = a.shape[a.shape.size() - 2], k = a.shape.back(), n = b.shape.back();
  std::vector<int64_t> ab(a.shape.begin(), a.shape.end() - 2),
      bb(b.shape.begin(), b.shape.end() - 2);
  std::vector<int64_t> batch = BroadcastShape({ab, bb});
  RefTensor out{batch, {}};
  out.shape.push_back(m);
  out.shape.push_back(n);
  out.v.assign(out.numel(), 0.0);
  int64_t nb = 1;
  for (int64_t d : batch) nb *= d;
  for (int64_t bi = 0; bi < nb; ++bi) {
    auto idx = Unravel(bi, batch);
    auto sub = [&](const std::vector<int64_t>& s) {  // batch offset of an operand
      std::vector<int64_t> own(s.size());
      for (size_t i = 0; i < s.size(); ++i) own[i] = s[i] == 1 ? 0 : idx[idx.size() - s.size() + i];
      return Ravel(own, s);
    };
    const int64_t ao = sub(ab) * m * k, bo = sub(bb) * k * n, oo = bi * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += a.v[ao + i * k + p] * b.v[bo + p * n + j];
        out.v[oo + i * n + j] = s;
      }
  }
  if (av) out.shape.erase(out.shape.end() - 2);
  if (bv) out.shape.pop_back();
  return out;
}

inline RefTensor Transpose2(const RefTensor& x) {  // swaps the last two dims
  RefTensor out = x;
  const size_t r = x.shape.size();
  std::swap(out.shape[r - 1], out.shape[r - 2]);
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = Unravel(i, x.shape);
    std::swap(idx[r - 1], idx[r - 2]);
    out.v[Ravel(idx, out.shape)] = x.v[i];
  }
  return out;
}

// Round-to-nearest-even of a float32 value (v must be one) to bfloat16, from its bits: add half
// an ulp of bfloat16 less one, plus the lowest kept bit (ties go to even), and drop the low 16
// bits. NaN stays NaN; values beyond the largest bfloat16 round to infinity.
inline double RoundToBFloat16(double v) {
  if (std::isnan(v)) return v;
  const uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(v));
  const uint32_t rounded = ((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16) << 16;
  return std::bit_cast<float>(rounded);
}

// Round-to-nearest-even of v to float16, in double arithmetic: the ulp of float16 at v's binade
// (2^-24 below 2^-14, the subnormals), v divided by it rounded to an even integer by nearbyint
// (the default rounding mode), and the overflow of IEEE 754: magnitudes from 65520 (half way
// between the largest float16, 65504, and 2^16) round to infinity.
inline double RoundToFloat16(double v) {
  if (std::isnan(v) || std::isinf(v) || v == 0) return v;
  if (std::fabs(v) >= 65520) return std::copysign(INFINITY, v);
  int exponent = 0;
  std::frexp(v, &exponent);  // |v| = m * 2^exponent, m in [0.5, 1)
  const double ulp = std::ldexp(1.0, std::max(exponent - 1, -14) - 10);
  return std::copysign(std::nearbyint(v / ulp) * ulp, v);
}

}  // namespace kiln::ref
