// CPU kernels for elementwise ops (one generic loop driven by the row's scalar function, or by
// its integer form when the output and every operand are integers: exact int64 math with
// wrap-around like torch), strided copies, and the triangular masks.
#include <array>

#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"

namespace kiln::cpu {
namespace {
constexpr int kMaxOperands = 9;  // an output and the inputs of any elementwise row
}  // namespace

namespace {

bool AllIntegral(absl::Span<const Tensor> in, const Tensor& out) {
  if (IsFloatingPoint(out.dtype())) return false;
  for (const Tensor& t : in) {
    if (IsFloatingPoint(t.dtype())) return false;
  }
  return true;
}

// out = fn(inputs) with every value read as `Value` (double, or int64 on the integer path).
template <typename Value, typename Load, typename Store, typename Fn>
void ElementwiseLoop(absl::Span<const Tensor> in, const Tensor& out, Load (*load_for)(DType),
                     Store store, Fn&& fn) {
  const int n = static_cast<int>(in.size());
  absl::InlinedVector<Strides, kMaxOperands> strides = {out.strides()};
  std::array<Load, kMaxOperands> load{};
  std::array<const void*, kMaxOperands> src{};
  for (int i = 0; i < n; ++i) {
    strides.push_back(BroadcastStrides(in[i], out.shape()));
    load[i] = load_for(in[i].dtype());
    src[i] = in[i].data_ptr();
  }
  void* dst = out.data_ptr();
  ForEachElement(out.shape(), strides, [&](const int64_t* off) {
    Value args[kMaxOperands];
    for (int i = 0; i < n; ++i) args[i] = load[i](src[i], off[i + 1]);
    store(dst, off[0], fn(args));
  });
}

}  // namespace

void Elementwise(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                 const OpAttrs& a) {
  if (def.int_scalar != nullptr && AllIntegral(in, out)) {  // exact integers, like torch
    const IntScalarFn fn = def.int_scalar;
    ElementwiseLoop<int64_t>(in, out, IntLoaderFor, IntStorerFor(out.dtype()),
                             [&](const int64_t* args) { return fn(args, a); });
    return;
  }
  const ScalarFn fn = def.scalar;
  ElementwiseLoop<double>(in, out, LoaderFor, StorerFor(out.dtype()),
                          [&](const double* args) { return fn(args, a); });
}

void Copy(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs&) {
  if (AllIntegral(in, out)) {  // int64 values above 2^53 must survive a copy
    ElementwiseLoop<int64_t>(in, out, IntLoaderFor, IntStorerFor(out.dtype()),
                             [](const int64_t* args) { return args[0]; });
    return;
  }
  ElementwiseLoop<double>(in, out, LoaderFor, StorerFor(out.dtype()),
                          [](const double* args) { return args[0]; });
}

namespace {

// Keeps element (i, j) of the last two dims where keep(j - i) holds, zeroes the rest.
template <typename Keep>
void TriangularMask(const Tensor& in, const Tensor& out, Keep keep) {
  // Elements move unchanged (int64 through int64, not double); the rest become 0.
  const bool ints = !IsFloatingPoint(in.dtype());
  const LoadFn load_d = LoaderFor(in.dtype());
  const StoreFn store_d = StorerFor(out.dtype());
  const IntLoadFn load_i = IntLoaderFor(in.dtype());
  const IntStoreFn store_i = IntStorerFor(out.dtype());
  auto store = [&](void* dst, int64_t d, const void* src, int64_t so, bool kept) {
    if (ints) {
      store_i(dst, d, kept ? load_i(src, so) : 0);
    } else {
      store_d(dst, d, kept ? load_d(src, so) : 0.0);
    }
  };
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
        store(dst, d, src, so, keep(j - i));
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
