// CPU kernels for elementwise ops (one generic loop driven by the row's scalar function),
// strided copies, and the triangular masks.
#include <array>

#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"

namespace kiln::cpu {
namespace {
constexpr int kMaxOperands = 9;  // an output and the inputs of any elementwise row
}  // namespace

void Elementwise(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                 const OpAttrs& a) {
  const int n = static_cast<int>(in.size());
  absl::InlinedVector<Strides, kMaxOperands> strides = {out.strides()};
  std::array<LoadFn, kMaxOperands> load{};
  std::array<const void*, kMaxOperands> src{};
  for (int i = 0; i < n; ++i) {
    strides.push_back(BroadcastStrides(in[i], out.shape()));
    load[i] = LoaderFor(in[i].dtype());
    src[i] = in[i].data_ptr();
  }
  const StoreFn store = StorerFor(out.dtype());
  void* dst = out.data_ptr();
  const ScalarFn fn = def.scalar;
  ForEachElement(out.shape(), strides, [&](const int64_t* off) {
    double args[kMaxOperands];
    for (int i = 0; i < n; ++i) args[i] = load[i](src[i], off[i + 1]);
    store(dst, off[0], fn(args, a));
  });
}

void Copy(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs&) {
  const LoadFn load = LoaderFor(in[0].dtype());
  const StoreFn store = StorerFor(out.dtype());
  const void* src = in[0].data_ptr();
  void* dst = out.data_ptr();
  const Strides strides[] = {out.strides(), BroadcastStrides(in[0], out.shape())};
  ForEachElement(out.shape(), strides,
                 [&](const int64_t* off) { store(dst, off[0], load(src, off[1])); });
}

namespace {

// Keeps element (i, j) of the last two dims where keep(j - i) holds, zeroes the rest.
template <typename Keep>
void TriangularMask(const Tensor& in, const Tensor& out, Keep keep) {
  const LoadFn load = LoaderFor(in.dtype());
  const StoreFn store = StorerFor(out.dtype());
  const int64_t rank = in.dim(), rows = in.size(-2), cols = in.size(-1);
  Shape outer(in.shape().begin(), in.shape().end() - 2);
  const Strides strides[] = {Strides(out.strides().begin(), out.strides().end() - 2),
                             Strides(in.strides().begin(), in.strides().end() - 2)};
  const void* src = in.data_ptr();
  void* dst = out.data_ptr();
  ForEachElement(outer, strides, [&](const int64_t* off) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t so = off[1] + i * in.strides()[rank - 2] + j * in.strides()[rank - 1];
        const int64_t d = off[0] + i * out.strides()[rank - 2] + j * out.strides()[rank - 1];
        store(dst, d, keep(j - i) ? load(src, so) : 0.0);
      }
    }
  });
}

}  // namespace

void Triu(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  TriangularMask(in[0], out, [&](int64_t j_minus_i) { return j_minus_i >= a.diagonal; });
}

void Tril(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  TriangularMask(in[0], out, [&](int64_t j_minus_i) { return j_minus_i <= a.diagonal; });
}

}  // namespace kiln::cpu
