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

// out = fn(inputs) with every value read as `Value` (double, or int64 on the integer path) by
// the loader load_for(dtype) gives.
template <typename Value, typename LoadFor, typename Store, typename Fn>
void ElementwiseLoop(absl::Span<const Tensor> in, const Tensor& out, LoadFor load_for, Store store,
                     Fn&& fn) {
  using Load = decltype(load_for(DType::kFloat32));
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

// An integer element converted to the floating dtype `To` as torch converts an integer operand
// to a floating common dtype: through float, rounded once from the exact integer (not through
// double, which rounds int64 values past 2^53 a first time).
template <typename Int, DType To>
double IntAs(const void* base, int64_t i) {
  const float f = static_cast<float>(static_cast<const Int*>(base)[i]);
  return To == DType::kFloat32 ? f : RoundToDType(To, f);
}
template <DType To>
LoadFn IntLoaderTo(DType from) {
  if (from == DType::kInt32) return IntAs<int32_t, To>;
  if (from == DType::kInt64) return IntAs<int64_t, To>;
  return LoaderFor(from);  // bool (0 or 1) and floating operands: exact in double
}

// The loader of an operand of dtype `from` whose op computes in the floating dtype `common`.
LoadFn OperandLoader(DType from, DType common) {
  switch (common) {
    case DType::kBFloat16:
      return IntLoaderTo<DType::kBFloat16>(from);
    case DType::kFloat16:
      return IntLoaderTo<DType::kFloat16>(from);
    case DType::kFloat32:
      return IntLoaderTo<DType::kFloat32>(from);
    default:
      return LoaderFor(from);
  }
}

// The floating dtype an op with a floating result computes in: the inputs' promotion, or the
// result's dtype when the inputs are all integers (int / int, exp(int)).
DType FloatingCommonDType(absl::Span<const Tensor> in, DType out) {
  DType common = in.empty() ? out : in[0].dtype();
  for (const Tensor& t : in) common = PromoteTypes(common, t.dtype());
  return IsFloatingPoint(common) ? common : out;
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
  const DType out_t = out.dtype();
  if (!IsFloatingPoint(out_t)) {
    ElementwiseLoop<double>(in, out, LoaderFor, StorerFor(out_t),
                            [&](const double* args) { return fn(args, a); });
    return;
  }
  // A floating result: integer operands converted to the common floating dtype first and the
  // scalar to float (the op math type of float32, bfloat16 and float16), as torch computes
  // x * 0.1 with 0.1f.
  const DType common = FloatingCommonDType(in, out_t);
  const OpAttrs* attrs = &a;
  OpAttrs rounded;
  if (def.attr_fields & kAttrScalar) {
    rounded = a;
    rounded.scalar = static_cast<double>(static_cast<float>(a.scalar.to_double()));
    attrs = &rounded;
  }
  ElementwiseLoop<double>(
      in, out, [common](DType t) { return OperandLoader(t, common); }, StorerFor(out_t),
      [&](const double* args) { return fn(args, *attrs); });
}

void Copy(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs&) {
  if (AllIntegral(in, out)) {  // int64 values above 2^53 must survive a copy
    ElementwiseLoop<int64_t>(in, out, IntLoaderFor, IntStorerFor(out.dtype()),
                             [](const int64_t* args) { return args[0]; });
    return;
  }
  const DType out_t = out.dtype();
  ElementwiseLoop<double>(
      in, out, [out_t](DType t) { return OperandLoader(t, out_t); }, StorerFor(out_t),
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
