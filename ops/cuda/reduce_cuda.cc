// CUDA registry kernels for reductions, normalisations and triangular masks (see reduce_cuda.h).
//
// Each kernel lays its operand out as contiguous rows (a permuted view, copied only when not
// already contiguous), runs a launcher from reduce_kernels.h on the current stream and checks
// it. Views are built here with Tensor::as_strided and copies run the registry's CUDA kernels
// directly, so nothing goes through the dispatcher (or a tracing hook) from inside a kernel.
#include "ops/cuda/reduce_cuda.h"

#include <cstdint>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/families/softmax/fused_softmax_cuda.h"
#include "ops/cuda/reduce_kernels.h"
#include "runtime/cuda_api.h"
#include "runtime/status.h"

namespace kiln::cuda_ops {
namespace {

using cuda_kernels::ElemType;

[[noreturn]] void ThrowUnsupported(const OpDef& def, DType t) {
  throw Error(absl::UnimplementedError(
      absl::StrCat(def.name, ": dtype ", DTypeName(t), " is not supported on CUDA")));
}

// The launchers' element type of `t`: a floating type or int64.
ElemType ToElemType(const OpDef& def, DType t) {
  const std::optional<ElemType> e = cuda_kernels::ElemTypeOf(t);
  if (!e.has_value() || *e == ElemType::kI32) ThrowUnsupported(def, t);
  return *e;
}

ElemType FloatElemType(const OpDef& def, DType t) {
  if (!IsFloatingPoint(t)) ThrowUnsupported(def, t);
  return ToElemType(def, t);
}

// Runs the registry's CUDA kernel of `id` (a copy or a cast) from `in` into `out`.
void RunRegistryKernel(OpId id, const Tensor& in, const Tensor& out, const OpAttrs& a = {}) {
  const OpDef& def = GetOpDef(id);
  if (def.cuda == nullptr) {
    throw Error(absl::UnimplementedError(absl::StrCat(def.name, ": no CUDA kernel registered")));
  }
  def.cuda(def, {in}, out, a);
}

// `t` itself when contiguous, else a contiguous copy.
Tensor Contiguous(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor copy = Tensor::Empty(t.type());
  RunRegistryKernel(OpId::kContiguous, t, copy);
  return copy;
}

// `t` itself when it has `dtype`, else a contiguous converted copy.
Tensor CastTo(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor copy = Tensor::Empty(t.shape(), dtype, t.device());
  OpAttrs a;
  a.dtype = dtype;
  RunRegistryKernel(OpId::kCast, t, copy, a);
  return copy;
}

// A view of `t` whose dim i is dim order[i] of `t` (metadata only).
Tensor Permuted(const Tensor& t, const std::vector<int64_t>& order) {
  Shape shape;
  Strides strides;
  for (int64_t d : order) {
    shape.push_back(t.size(d));
    strides.push_back(t.stride(d));
  }
  return t.as_strided(shape, strides, t.offset());
}

// Calls write(dst) with a contiguous tensor of dst's type whose contents end up in `dst`: dst
// itself when contiguous, else a temporary copied into dst afterwards.
template <typename F>
void WriteContiguous(const Tensor& dst, F&& write) {
  if (dst.is_contiguous()) {
    write(dst);
    return;
  }
  const Tensor tmp = Tensor::Empty(dst.type());
  write(tmp);
  RunRegistryKernel(OpId::kContiguous, tmp, dst);
}

// Reduces x over a.dims into out: kept dims first and reduced dims last make [outer, inner]
// rows, whose order is out's element order (keepdim or not).
void Reduce(const OpDef& def, const Tensor& x, const Tensor& out, const OpAttrs& a, int op) {
  const int64_t rank = x.dim();
  std::vector<bool> reduced(rank, a.dims.empty());
  for (int64_t d : a.dims) {
    if (rank > 0) reduced[d < 0 ? d + rank : d] = true;
  }
  std::vector<int64_t> order;
  int64_t outer = 1, inner = 1;
  for (int pass = 0; pass < 2; ++pass) {  // kept dims, then reduced dims
    for (int64_t d = 0; d < rank; ++d) {
      if (reduced[d] != (pass == 1)) continue;
      order.push_back(d);
      (pass == 0 ? outer : inner) *= x.size(d);
    }
  }
  const Tensor rows = inner == 0 ? x : Contiguous(Permuted(x, order));
  const ElemType out_t = ToElemType(def, out.dtype());
  const ElemType in_t = inner == 0 ? out_t : ToElemType(def, rows.dtype());  // x is never read
  WriteContiguous(out, [&](const Tensor& dst) {
    KILN_CUDA_CHECK(cuda_kernels::RowReduce(rows.data_ptr(), dst.data_ptr(), outer, inner, op, in_t,
                                            out_t, cuda::CurrentStream()));
  });
}

// Writes `value` into the one element of a 0-dim `out`.
void FillScalar(const Tensor& out, double value) {
  uint64_t bits = 0;
  StorerFor(out.dtype())(&bits, 0, value);
  cuda::Copy(out.data_ptr(), out.device(), &bits, kCPU, static_cast<size_t>(out.element_size()));
}

// softmax / log_softmax along `dim`: the dim is swapped with the last one (no copy when it is
// already last and the input contiguous) and the rows are written through the same swap, by the
// softmax family's row kernel (codegen/families/softmax/fused_softmax_cuda.h), the one the
// compiler fuses prologues into.
void SoftmaxImpl(const OpDef& def, const Tensor& x, const Tensor& out, int64_t dim, bool log) {
  const int64_t rank = x.dim();
  if (rank == 0) {  // like the CPU kernel: 1 (log: 0) whatever the value
    FillScalar(out, log ? 0.0 : 1.0);
    return;
  }
  if (!IsFloatingPoint(x.dtype())) ThrowUnsupported(def, x.dtype());
  if (dim < 0) dim += rank;
  std::vector<int64_t> order(rank);
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[dim], order[rank - 1]);  // its own inverse
  const Tensor src = Contiguous(Permuted(x, order));
  WriteContiguous(Permuted(out, order),
                  [&](const Tensor& dst) { EagerSoftmaxLastDim(src, dst, log); });
}

// layer_norm / rms_norm over the last dim; in = x[, weight[, bias]]. Weight and bias are used as
// they are when they have x's dtype, else as float32 (exact for every float dtype).
void NormImpl(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, double eps,
              bool rms) {
  const Tensor& x = in[0];
  const ElemType t = FloatElemType(def, x.dtype());
  const int64_t n = x.size(-1), rows = x.numel() / n;
  bool native = true;
  for (size_t i = 1; i < in.size(); ++i) native &= in[i].dtype() == x.dtype();
  const DType w_dtype = native ? x.dtype() : DType::kFloat32;
  const void* params[2] = {nullptr, nullptr};  // weight, bias
  std::vector<Tensor> keep;                    // holds converted copies until the launch
  for (size_t i = 1; i < in.size(); ++i) {
    keep.push_back(Contiguous(CastTo(in[i], w_dtype)));
    params[i - 1] = keep.back().data_ptr();
  }
  const Tensor src = Contiguous(x);
  WriteContiguous(out, [&](const Tensor& dst) {
    KILN_CUDA_CHECK(cuda_kernels::RowNorm(src.data_ptr(), params[0], params[1], dst.data_ptr(),
                                          rows, n, eps, rms, t, ToElemType(def, w_dtype),
                                          cuda::CurrentStream(),
                                          cuda::UseDependentLaunch(x.device().index)));
  });
}

void TriangularImpl(const Tensor& x, const Tensor& out, int64_t diagonal, bool upper) {
  const int64_t rows = x.size(-2), cols = x.size(-1), batch = x.numel() / (rows * cols);
  const Tensor src = Contiguous(x);
  WriteContiguous(out, [&](const Tensor& dst) {
    KILN_CUDA_CHECK(cuda_kernels::Triangular(src.data_ptr(), dst.data_ptr(), batch, rows, cols,
                                             diagonal, upper, static_cast<int>(x.element_size()),
                                             cuda::CurrentStream()));
  });
}

}  // namespace

void Sum(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const Tensor& x = in[0];
  const bool widen = !IsFloatingPoint(x.dtype()) && x.numel() > 0;  // ints and bool sum in int64
  Reduce(def, widen ? CastTo(x, DType::kInt64) : x, out, a, cuda_kernels::kReduceSum);
}

void Prod(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const Tensor& x = in[0];
  const bool widen = !IsFloatingPoint(x.dtype()) && x.numel() > 0;  // as sum: in int64
  Reduce(def, widen ? CastTo(x, DType::kInt64) : x, out, a, cuda_kernels::kReduceProd);
}

void Mean(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  if (!IsFloatingPoint(in[0].dtype())) ThrowUnsupported(def, in[0].dtype());
  Reduce(def, in[0], out, a, cuda_kernels::kReduceMean);
}

void Max(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const DType t = in[0].dtype();
  if (IsFloatingPoint(t) || t == DType::kInt64) {
    Reduce(def, in[0], out, a, cuda_kernels::kReduceMax);
    return;
  }
  // int32 and bool: the max of the values widened to int64, narrowed back (exact).
  const Tensor wide = Tensor::Empty(out.shape(), DType::kInt64, out.device());
  Reduce(def, CastTo(in[0], DType::kInt64), wide, a, cuda_kernels::kReduceMax);
  OpAttrs cast;
  cast.dtype = out.dtype();
  RunRegistryKernel(OpId::kCast, wide, out, cast);
}

void Softmax(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  SoftmaxImpl(def, in[0], out, a.dim, /*log=*/false);
}

void LogSoftmax(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                const OpAttrs& a) {
  SoftmaxImpl(def, in[0], out, a.dim, /*log=*/true);
}

void LayerNorm(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  NormImpl(def, in, out, a.eps, /*rms=*/false);
}

void RmsNorm(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  NormImpl(def, in, out, a.eps, /*rms=*/true);
}

void Triu(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  TriangularImpl(in[0], out, a.diagonal, /*upper=*/true);
}

void Tril(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  TriangularImpl(in[0], out, a.diagonal, /*upper=*/false);
}

}  // namespace kiln::cuda_ops
