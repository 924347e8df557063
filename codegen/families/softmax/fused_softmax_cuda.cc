// Generated softmax kernels with an elementwise prologue (see fused_softmax_cuda.h).
#include "codegen/families/softmax/fused_softmax_cuda.h"

#include <algorithm>
#include <array>
#include <bit>
#include <map>
#include <mutex>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "ops/cuda/kernel_render.h"
#include "runtime/cuda_api.h"
#include "runtime/nvrtc.h"
#include "runtime/status.h"

namespace kiln::cuda_ops {
namespace {

constexpr int64_t kMaxBlocks = 1 << 20;          // grids stop here; kernels loop over the rest
constexpr int64_t kEagerRegisterRowMax = 16384;  // longer eager rows: the loop kernel

// The host side of KilnRowIndexer: each input's offset of a row's first element comes from
// the row index over `sizes` (the leading dims, merged where possible); `inner` is its stride
// along the row.
struct RowIndexer {
  int rank = 0;
  long long sizes[kMaxSoftmaxRank - 1] = {};
  absl::InlinedVector<std::array<long long, kMaxSoftmaxRank - 1>, 4> strides;  // per input
  absl::InlinedVector<long long, 4> inner;                                     // per input
  std::vector<long long> Params() const {
    std::vector<long long> p = {rank};
    p.insert(p.end(), sizes, sizes + kMaxSoftmaxRank - 1);
    for (const auto& s : strides) p.insert(p.end(), s.begin(), s.end());
    p.insert(p.end(), inner.begin(), inner.end());
    return p;
  }
};

// ---- Launching -------------------------------------------------------------------------------

// Each input's strides over the output's shape (0 where it broadcasts): the last dim's stride
// is `inner`; the leading dims, size-1 dims dropped, are merged wherever every input is
// contiguous across them (the [B*H*S] rows of contiguous scores with a [S, S] mask: rank 2).
RowIndexer BuildRowIndexer(absl::Span<const Tensor> in, const Tensor& out) {
  const int rank = static_cast<int>(out.dim());
  absl::InlinedVector<std::array<long long, kMaxSoftmaxRank>, 4> st(in.size());
  RowIndexer ix;
  ix.strides.resize(in.size());
  ix.inner.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    st[i].fill(0);
    ix.strides[i].fill(0);
    const int lead = rank - static_cast<int>(in[i].dim());
    for (int d = 0; d < in[i].dim(); ++d) {
      st[i][lead + d] = in[i].shape()[d] == 1 ? 0 : in[i].strides()[d];
    }
    ix.inner[i] = st[i][rank - 1];
  }
  for (int d = 0; d + 1 < rank; ++d) {
    const long long size = out.shape()[d];
    if (size == 1) continue;
    bool merge = ix.rank > 0;
    for (size_t i = 0; i < in.size() && merge; ++i) {
      merge = st[i][d] * size == ix.strides[i][ix.rank - 1];
    }
    if (merge) {  // dim d joins the previous kept dim as its faster part
      ix.sizes[ix.rank - 1] *= size;
      for (size_t i = 0; i < in.size(); ++i) ix.strides[i][ix.rank - 1] = st[i][d];
    } else {
      ix.sizes[ix.rank] = size;
      for (size_t i = 0; i < in.size(); ++i) ix.strides[i][ix.rank] = st[i][d];
      ++ix.rank;
    }
  }
  return ix;
}

// The vector kernel reads whole aligned vectors: every input is contiguous along the row and
// each row of it starts on a vector boundary.
bool VectorPathApplies(absl::Span<const Tensor> in, const Tensor& out, const RowIndexer& ix,
                       int vec) {
  if (out.size(-1) % vec != 0) return false;  // a run-time length the vectors do not divide
  auto aligned = [&](const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % (DTypeSize(t.dtype()) * vec) == 0;
  };
  if (!aligned(out)) return false;
  for (size_t i = 0; i < in.size(); ++i) {
    if (ix.inner[i] != 1 || !aligned(in[i])) return false;
    for (int d = 0; d < ix.rank; ++d) {
      if (ix.strides[i][d] % vec != 0) return false;
    }
  }
  return true;
}

// ---- Eager softmax ---------------------------------------------------------------------------

// The class of an eager row length: the next power of two while rows stay in registers, else 0
// (any length, the loop kernel). A sequence that grows by one each step compiles once per doubling.
int64_t EagerRowClass(int64_t n) {
  return n <= kEagerRegisterRowMax ? static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(n)))
                                   : 0;
}

// The eager kernels of one dtype, class and log flag, compiled on first use and kept (a std::map
// never moves its values).
const FusedSoftmaxKernels& EagerKernels(DType dtype, int64_t row_class, bool log) {
  struct Cache {
    std::mutex mu;
    std::map<std::tuple<DType, int64_t, bool>, FusedSoftmaxKernels> kernels ABSL_GUARDED_BY(mu);
  };
  static auto* cache = new Cache;  // never destroyed: ops may run during static teardown
  std::lock_guard<std::mutex> lock(cache->mu);
  const auto key = std::make_tuple(dtype, row_class, log);
  if (auto it = cache->kernels.find(key); it != cache->kernels.end()) return it->second;
  kir::Program load({dtype});
  load.Store(load.Load(0), dtype);
  const std::string base =
      absl::StrCat(log ? "kiln_log_softmax_" : "kiln_softmax_", DTypeName(dtype),
                   row_class > 0 ? absl::StrCat("_upto", row_class) : std::string("_any"));
  return cache->kernels
      .emplace(key, CompileFusedSoftmaxKernels(
                        base, load, dtype, {.row_len = 0, .max_row_len = row_class, .log = log}))
      .first->second;
}

}  // namespace

FusedSoftmaxKernels CompileFusedSoftmaxKernels(const std::string& base, const kir::Program& p,
                                               DType out, const SoftmaxForm& form) {
  const std::string src = RenderFusedSoftmaxSource(base, p, out, form);
  FusedSoftmaxKernels k;
  k.form = form;
  k.num_inputs = p.num_inputs();
  k.base = base;
  k.strided_layout = StridedSoftmaxLayout(form);
  k.strided = ValueOrThrow(cuda::GetKernel(src, base + "_strided"));
  if (const int vec = FusedSoftmaxVectorWidth(p.input_types(), out, form.planned_len()); vec > 0) {
    k.vec_layout = PlanSoftmaxRows(form.planned_len(), vec);
    k.vec = ValueOrThrow(cuda::GetKernel(src, base + "_vec"));
  }
  return k;
}

std::vector<cuda::KernelFootprint> FusedSoftmaxFootprints(const FusedSoftmaxKernels& k) {
  std::vector<cuda::KernelFootprint> f;
  for (const auto& [kernel, suffix] :
       {std::pair{k.vec, "_vec"}, std::pair{k.strided, "_strided"}}) {
    if (kernel != nullptr) f.push_back(ValueOrThrow(cuda::FootprintOf(kernel, k.base + suffix)));
  }
  return f;
}

void LaunchFusedSoftmax(const FusedSoftmaxKernels& k, absl::Span<const Tensor> in,
                        const Tensor& out) {
  KILN_CHECK(k.strided != nullptr && static_cast<int>(in.size()) == k.num_inputs &&
                 out.dim() >= 1 && out.dim() <= kMaxSoftmaxRank && k.form.Holds(out.size(-1)) &&
                 out.is_contiguous(),
             "fused softmax: compiled for ", k.num_inputs,
             " inputs and a contiguous output of rank <= ", kMaxSoftmaxRank, " with rows of ",
             k.form.Describe(), ", got ", in.size(), " inputs and ", Describe(out.type()),
             out.is_contiguous() ? "" : " (not contiguous)");
  long long row_len = out.size(-1);
  if (row_len == 0) return;
  long long n_rows = out.numel() / row_len;
  if (n_rows == 0) return;
  const RowIndexer ix = BuildRowIndexer(in, out);
  std::vector<long long> params = ix.Params();
  const bool vec = k.vec != nullptr && VectorPathApplies(in, out, ix, k.vec_layout.vec);
  const SoftmaxRowLayout& l = vec ? k.vec_layout : k.strided_layout;
  absl::InlinedVector<void*, 8> ptrs = {out.data_ptr()};
  for (const Tensor& t : in) ptrs.push_back(const_cast<void*>(t.data_ptr()));
  absl::InlinedVector<void*, 12> args;
  for (void*& p : ptrs) args.push_back(&p);
  args.push_back(&n_rows);
  args.push_back(&row_len);
  args.push_back(params.data());
  const int64_t grid =
      std::min<int64_t>((n_rows + l.rows_per_block() - 1) / l.rows_per_block(), kMaxBlocks);
  KILN_CUDA_CHECK(cuda::LaunchDependent(reinterpret_cast<const void*>(vec ? k.vec : k.strided),
                                        dim3(static_cast<unsigned>(grid)), dim3(l.threads),
                                        args.data(), 0, cuda::CurrentStream()));
}

void EagerSoftmaxLastDim(const Tensor& x, const Tensor& out, bool log) {
  KILN_CHECK(x.dim() >= 1 && out.shape() == x.shape() && out.dtype() == x.dtype() &&
                 IsFloatingPoint(x.dtype()) && out.is_contiguous() &&
                 (x.dim() <= kMaxSoftmaxRank || x.is_contiguous()),
             log ? "log_softmax" : "softmax",
             ": the CUDA row kernel takes a floating input of rank ", "1..", kMaxSoftmaxRank,
             " (any rank when contiguous) and a contiguous output of its ", "shape and dtype, got ",
             Describe(x.type()), " and ", Describe(out.type()));
  if (out.numel() == 0) return;
  const int64_t n = x.size(-1), rows = x.numel() / n;
  Tensor in = x, dst = out;
  if (x.is_contiguous()) {  // rows of n: any rank, and the indexer has nothing to merge
    in = x.as_strided({rows, n}, {n, 1}, x.offset());
    dst = out.as_strided({rows, n}, {n, 1}, out.offset());
  }
  LaunchFusedSoftmax(EagerKernels(x.dtype(), EagerRowClass(n), log), {in}, dst);
}

}  // namespace kiln::cuda_ops
