// CPU matmul and linear: torch.matmul semantics (1-D, 2-D, broadcast batches, transposed
// operands read in place through GEMM flags) on top of the blocked float32 GEMM. linear's
// epilogue (relu, tanh GELU) is applied to each result, after the bias, before it is stored.
#include <vector>

#include "ops/cpu/gemm.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"
#include "ops/matrix_views.h"

namespace kiln::cpu {
namespace {

// A 2-D float32 operand ready for GemmF32: a pointer, a leading dim and a transpose flag.
// Non-float32 or arbitrarily strided inputs are converted into `scratch`.
struct GemmOperand {
  const float* data;
  int64_t ld;
  bool trans;
};

GemmOperand PrepareOperand(const void* base, DType dtype, int64_t rows, int64_t cols, int64_t s_row,
                           int64_t s_col, std::vector<float>& scratch) {
  if (dtype == DType::kFloat32) {
    const float* p = static_cast<const float*>(base);
    if (s_col == 1 && s_row >= std::max<int64_t>(cols, 1)) return {p, s_row, false};
    if (s_row == 1 && s_col >= std::max<int64_t>(rows, 1)) return {p, s_col, true};
  }
  scratch.resize(static_cast<size_t>(rows * cols));
  const LoadFn load = LoaderFor(dtype);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      scratch[r * cols + c] = static_cast<float>(load(base, r * s_row + c * s_col));
    }
  }
  return {scratch.data(), std::max<int64_t>(cols, 1), false};
}

// An elementwise function applied to each GEMM result before it is stored: the registry row's own
// scalar function (ops/op_def.h EpilogueActivation), so linear{epilogue} computes exactly what
// linear followed by the activation op computes.
struct Activation {
  ScalarFn fn = nullptr;  // nullptr: store the result as is
  OpAttrs attrs;
};

// out[M, N] = act(a[M, K] @ b[K, N] (+ bias[N])) (+ residual[M, N]) for 2-D strided views.
void Gemm2D(const Tensor& a, int64_t a_off, const Tensor& b, int64_t b_off, const Tensor& out,
            int64_t o_off, const Tensor* bias, const Activation& act = {},
            const Tensor* residual = nullptr) {
  const int64_t ra = a.dim(), rb = b.dim(), ro = out.dim();
  const int64_t m = a.shape()[ra - 2], k = a.shape()[ra - 1], n = b.shape()[rb - 1];
  const size_t esz = static_cast<size_t>(a.element_size());
  std::vector<float> sa, sb, sc;
  // An operand without elements (K == 0) has no address to offset: nothing reads it.
  auto base = [esz](const Tensor& t, int64_t off) -> const void* {
    return t.numel() == 0 ? nullptr : static_cast<const char*>(t.data_ptr()) + off * esz;
  };
  const GemmOperand ga =
      PrepareOperand(base(a, a_off), a.dtype(), m, k, a.strides()[ra - 2], a.strides()[ra - 1], sa);
  const GemmOperand gb =
      PrepareOperand(base(b, b_off), b.dtype(), k, n, b.strides()[rb - 2], b.strides()[rb - 1], sb);
  sc.assign(static_cast<size_t>(m * n), 0.0f);
  if (bias != nullptr) {
    const LoadFn load = LoaderFor(bias->dtype());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j)
        sc[i * n + j] = float(load(bias->data_ptr(), j * bias->stride(0)));
    }
  }
  GemmF32(ga.trans, gb.trans, m, n, k, 1.0f, ga.data, ga.ld, gb.data, gb.ld,
          bias != nullptr ? 1.0f : 0.0f, sc.data(), std::max<int64_t>(n, 1));
  const StoreFn store = StorerFor(out.dtype());
  const LoadFn load_residual = residual != nullptr ? LoaderFor(residual->dtype()) : nullptr;
  const int64_t s_row = out.strides()[ro - 2], s_col = out.strides()[ro - 1];
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double v = sc[i * n + j];
      if (act.fn != nullptr) v = act.fn(&v, act.attrs);
      if (residual != nullptr) {  // in float, as the GEMM's C: rounded once with the product
        v = static_cast<float>(v) +
            static_cast<float>(load_residual(residual->data_ptr(),
                                             i * residual->stride(0) + j * residual->stride(1)));
      }
      store(out.data_ptr(), o_off + i * s_row + j * s_col, v);
    }
  }
}

}  // namespace

void Matmul(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& attrs) {
  Tensor a = attrs.transpose_a ? SwapLast2(in[0]) : in[0];
  Tensor b = attrs.transpose_b ? SwapLast2(in[1]) : in[1];
  a = AsMatrix(a, true);
  b = AsMatrix(b, false);
  const int64_t m = a.size(-2), n = b.size(-1);
  // Out viewed as [batch..., M, N] (1-D operands dropped a dim from the real output).
  Shape batch;
  const int64_t out_batch_rank =
      out.dim() - (in[0].dim() == 1 ? 0 : 1) - (in[1].dim() == 1 ? 0 : 1);
  batch.assign(out.shape().begin(), out.shape().begin() + out_batch_rank);
  Shape o_shape = batch;
  o_shape.push_back(m);
  o_shape.push_back(n);
  Tensor o = out.as_strided(o_shape, ContiguousStrides(o_shape), out.offset());
  auto batch_strides = [&](const Tensor& t) {  // of t's batch dims broadcast to `batch`
    Strides s(batch.size(), 0);
    const int64_t lead = static_cast<int64_t>(batch.size()) - (t.dim() - 2);
    for (int64_t i = 0; i + 2 < t.dim(); ++i) {
      s[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
    }
    return s;
  };
  const Strides strides[] = {batch_strides(a), batch_strides(b), batch_strides(o)};
  ForEachElement(batch, strides,
                 [&](const int64_t* off) { Gemm2D(a, off[0], b, off[1], o, off[2], nullptr); });
}

namespace {

// x [..., K] as a matrix [M, K]: a view when the leading dims collapse into rows of one stride,
// else a contiguous copy. Size-1 dims take no part (their stride is arbitrary: [3, 1, 1, K] may
// have strides [1, 1, 7, 3]). M comes from the leading dims, not numel / K, which is 0 when K is.
Tensor FlattenRows(const Tensor& x) {
  const int64_t k = x.size(-1), m = NumElements(IntList(x.shape()).subspan(0, x.dim() - 1));
  if (x.dim() == 1) return x.as_strided({1, k}, {0, x.stride(0)}, x.offset());
  bool collapsible = true;
  int64_t row_stride = 0, rows = 1;
  for (int64_t i = x.dim() - 2; i >= 0 && collapsible; --i) {
    if (x.size(i) == 1) continue;
    if (rows == 1) row_stride = x.stride(i);
    collapsible = rows == 1 || x.stride(i) == row_stride * rows;
    rows *= x.size(i);
  }
  if (collapsible) return x.as_strided({m, k}, {row_stride, x.stride(-1)}, x.offset());
  Tensor flat = Tensor::Empty(x.shape(), x.dtype(), kCPU);
  Copy(GetOpDef(OpId::kContiguous), {&x, 1}, flat, {});
  return flat.as_strided({m, k}, {k, 1}, 0);
}

}  // namespace

void Linear(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& attrs) {
  const Tensor x2 = FlattenRows(in[0]);
  const int64_t n = out.size(-1), m = out.numel() / std::max<int64_t>(n, 1);
  const Tensor o = out.as_strided({m, n}, {n, 1}, out.offset());
  Activation act;
  if (const OpDef* def = EpilogueActivation(attrs.epilogue, &act.attrs)) act.fn = def->scalar;
  const bool residual = HasResidual(attrs);
  const Tensor r2 = residual ? FlattenRows(in.back()) : Tensor();
  Gemm2D(x2, 0, SwapLast2(in[1]), 0, o, 0, LinearHasBias(in.size(), attrs) ? &in[2] : nullptr, act,
         residual ? &r2 : nullptr);
}

}  // namespace kiln::cpu
