// CUDA registry kernels of the indexing, joining and selection rows (see index_cuda.h).
#include "ops/cuda/index_cuda.h"

#include <numeric>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/cpu/kernels.h"
#include "ops/cuda/index_kernels.h"
#include "ops/gather.h"
#include "runtime/cuda_api.h"
#include "runtime/status.h"

namespace kiln::cuda_ops {
namespace {

using cuda_kernels::ElemType;

// Runs the registry's CUDA kernel of `id` (a copy or a cast) from `in` into `out`.
void RunRegistryKernel(OpId id, const Tensor& in, const Tensor& out, const OpAttrs& a = {}) {
  const OpDef& def = GetOpDef(id);
  def.cuda(def, {in}, out, a);
}

Tensor Contiguous(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor copy = Tensor::Empty(t.type());
  RunRegistryKernel(OpId::kContiguous, t, copy);
  return copy;
}

// A contiguous host copy of a CUDA tensor (the error path of the index check).
Tensor ToHost(const Tensor& t) {
  const Tensor src = Contiguous(t);
  Tensor host = Tensor::Empty(t.shape(), t.dtype(), kCPU);
  cuda::Copy(host.data_ptr(), kCPU, src.data_ptr(), src.device(),
             static_cast<size_t>(src.numel() * src.element_size()));
  return host;
}

thread_local IndexCheckScope* t_index_scope = nullptr;

// The innermost scope's flag, or nullptr outside any scope.
unsigned* DeferredFlag(Device device) {
  return t_index_scope != nullptr ? t_index_scope->Take(device) : nullptr;
}

}  // namespace

unsigned* KernelIndexFlag(Device device) {
  if (unsigned* flag = DeferredFlag(device)) return flag;
  if (!cuda::Capturing(cuda::CurrentStream())) return nullptr;
  unsigned* global = nullptr;
  KILN_CUDA_CHECK(cuda_kernels::GlobalIndexErrorFlag(&global));
  return global;
}

namespace {

// The flag's value, after waiting for the current stream.
unsigned ReadFlag(const unsigned* device_flag) {
  const cudaStream_t stream = cuda::CurrentStream();
  unsigned value = 0;
  KILN_CUDA_CHECK(
      cudaMemcpyAsync(&value, device_flag, sizeof(value), cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return value;
}

// Waits for the stream; if a kernel raised `flag`, throws the CPU kernel's error for `index`
// (kOutOfRange, naming the op, the index and its position).
void ReportBadIndexIfFlagged(const OpDef& def, const Tensor& flag, const Tensor& index,
                             int64_t bound, int64_t dim, absl::Span<const Tensor> operands) {
  if (ReadFlag(flag.data<unsigned>()) == 0) return;
  gather::CheckIndices(def, ToHost(index), bound, dim, operands);
  throw Error(absl::InternalError(absl::StrCat(
      def.name,
      ": the CUDA kernel flagged an out-of-range index that the host check did not find")));
}

// Runs a gather-family plan and reports a bad index as kiln::Error (see index_cuda.h).
void RunChecked(const OpDef& def, const IndexPlan& plan, const Tensor& out, const Tensor& src,
                const Tensor& index, int64_t dim, absl::Span<const Tensor> operands) {
  const cudaStream_t stream = cuda::CurrentStream();
  if (unsigned* deferred = DeferredFlag(out.device());
      deferred != nullptr || cuda::Capturing(stream)) {
    KILN_CUDA_CHECK(cuda_kernels::RunIndexPlan(plan, out.numel(), out.data_ptr(), src.data_ptr(),
                                               index.data_ptr(), deferred, stream));
    return;
  }
  const Tensor flag = ZeroedFlag(out.device());
  KILN_CUDA_CHECK(cuda_kernels::RunIndexPlan(plan, out.numel(), out.data_ptr(), src.data_ptr(),
                                             index.data_ptr(), flag.data<unsigned>(), stream));
  ReportBadIndexIfFlagged(def, flag, index, plan.bound, dim, operands);
}

// The launchers' element type of `t` (argmax and topk take every one).
ElemType ToElemType(const OpDef& def, DType t) {
  if (const std::optional<ElemType> e = cuda_kernels::ElemTypeOf(t)) return *e;
  throw Error(absl::UnimplementedError(
      absl::StrCat(def.name, ": dtype ", DTypeName(t), " is not supported on CUDA")));
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

// The dims of a rank-`rank` tensor with `dim` moved last (its own inverse is not needed: the
// same order applied to the output view writes back in place).
std::vector<int64_t> DimLast(int64_t rank, int64_t dim) {
  std::vector<int64_t> order(rank);
  std::iota(order.begin(), order.end(), 0);
  order.erase(order.begin() + dim);
  order.push_back(dim);
  return order;
}

// Runs write(dst) on a contiguous tensor of `dst`'s type whose contents end up in `dst`.
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

}  // namespace

void Embedding(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs&) {
  const IndexPlan plan = gather::PlanEmbedding(def, in[0], in[1], out);
  RunChecked(def, plan, out, in[1], in[0], 0, in);
}

void IndexSelect(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                 const OpAttrs& a) {
  const IndexPlan plan = gather::PlanIndexSelect(def, in[0], a.dim, in[1], out);
  RunChecked(def, plan, out, in[0], in[1], a.dim, in);
}

void Gather(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const IndexPlan plan = gather::PlanGather(def, in[0], a.dim, in[1], out);
  RunChecked(def, plan, out, in[0], in[1], a.dim, in);
}

void IndexCopy(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const Tensor& self = in[0];
  const Tensor index = gather::Unaliased(in[1], out), source = gather::Unaliased(in[2], out);
  const int64_t d = a.dim < 0 ? a.dim + self.dim() : a.dim;
  const cudaStream_t stream = cuda::CurrentStream();
  if (!gather::SameView(out, self) && out.numel() > 0) {
    KILN_CUDA_CHECK(cuda_kernels::RunIndexPlan(gather::PlanCopy(def, self, out), out.numel(),
                                               out.data_ptr(), self.data_ptr(), nullptr, nullptr,
                                               stream));
  }
  if (source.numel() == 0) return;
  const IndexPlan plan = gather::PlanIndexCopy(def, out, d, index, source);
  unsigned* flag = DeferredFlag(out.device());
  if (flag == nullptr && !cuda::Capturing(stream)) {  // check every index before writing any
    const Tensor bad = ZeroedFlag(out.device());
    KILN_CUDA_CHECK(cuda_kernels::CheckIndexRange(
        index.data_ptr(), index.numel(), index.dim() == 1 ? index.stride(0) : 0,
        index.dtype() == DType::kInt64, plan.bound, bad.data<unsigned>(), stream));
    ReportBadIndexIfFlagged(def, bad, index, plan.bound, d, in);
  }
  KILN_CUDA_CHECK(cuda_kernels::RunIndexPlan(plan, source.numel(), out.data_ptr(),
                                             source.data_ptr(), index.data_ptr(), flag, stream));
}

namespace {

// out = self (unless out is self), then run(plan, index, src, flag) with every index checked
// before any is written (inside a capture or a deferred-check scope the kernel raises the flag
// instead, as index_copy's does).
template <typename Run>
void ScatterImpl(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a,
                 Run&& run) {
  const Tensor& self = in[0];
  const Tensor index = Contiguous(gather::Unaliased(in[1], out));
  const Tensor src = gather::Unaliased(in[2], out);
  const int64_t d = self.dim() == 0 ? 0 : (a.dim < 0 ? a.dim + self.dim() : a.dim);
  const cudaStream_t stream = cuda::CurrentStream();
  const IndexPlan plan = gather::PlanScatter(def, out, d, index, src);
  unsigned* flag = DeferredFlag(out.device());
  if (index.numel() > 0 && flag == nullptr && !cuda::Capturing(stream)) {  // out untouched yet
    const Tensor bad = ZeroedFlag(out.device());
    KILN_CUDA_CHECK(cuda_kernels::CheckIndexRange(index.data_ptr(), index.numel(), 1,
                                                  index.dtype() == DType::kInt64, plan.bound,
                                                  bad.data<unsigned>(), stream));
    ReportBadIndexIfFlagged(def, bad, index, plan.bound, d, in);
  }
  if (!gather::SameView(out, self) && out.numel() > 0) {
    KILN_CUDA_CHECK(cuda_kernels::RunIndexPlan(gather::PlanCopy(def, self, out), out.numel(),
                                               out.data_ptr(), self.data_ptr(), nullptr, nullptr,
                                               stream));
  }
  if (index.numel() > 0) run(plan, index, src, flag);
}

}  // namespace

void Scatter(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  ScatterImpl(def, in, out, a,
              [&](const IndexPlan& plan, const Tensor& index, const Tensor& src, unsigned* flag) {
                KILN_CUDA_CHECK(cuda_kernels::RunIndexPlan(plan, index.numel(), out.data_ptr(),
                                                           src.data_ptr(), index.data_ptr(), flag,
                                                           cuda::CurrentStream()));
              });
}

void ScatterAdd(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                const OpAttrs& a) {
  const ElemType t = ToElemType(def, out.dtype());  // bool refused before any write
  ScatterImpl(def, in, out, a,
              [&](const IndexPlan& plan, const Tensor& index, const Tensor& src, unsigned* flag) {
                KILN_CUDA_CHECK(cuda_kernels::ScatterAddPlan(plan, index.numel(), out.data_ptr(),
                                                             src.data_ptr(), index.data_ptr(), t,
                                                             flag, cuda::CurrentStream()));
              });
}

void Cat(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  gather::ForEachCatSlice(in, out, a.dim, [&](const Tensor& t, const Tensor& slice) {
    if (t.dtype() != out.dtype()) {
      OpAttrs cast;
      cast.dtype = out.dtype();
      RunRegistryKernel(OpId::kCast, t, slice, cast);
      return;
    }
    KILN_CUDA_CHECK(cuda_kernels::RunIndexPlan(gather::PlanCopy(def, t, slice), t.numel(),
                                               slice.data_ptr(), t.data_ptr(), nullptr, nullptr,
                                               cuda::CurrentStream()));
  });
}

void ArgMax(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const Tensor& x = in[0];
  const ElemType t = ToElemType(def, x.dtype());
  const bool clusters = cuda::Props(x.device().index).major >= 9;
  if (a.dims.empty() || x.dim() == 0) {  // one row: the flattened input
    const Tensor src = Contiguous(x);
    KILN_CUDA_CHECK(cuda_kernels::ArgMaxRows(src.data_ptr(), out.data<int64_t>(), 1, x.numel(), t,
                                             clusters, cuda::CurrentStream()));
    return;
  }
  const int64_t d = a.dims[0] < 0 ? a.dims[0] + x.dim() : a.dims[0];
  const int64_t n = x.size(d), rows = x.numel() / n;
  const Tensor src = Contiguous(Permuted(x, DimLast(x.dim(), d)));
  // out's elements in the order of the kept dims: out itself (keepdim or not: the reduced dim
  // has size 1 or is absent).
  WriteContiguous(out, [&](const Tensor& dst) {
    KILN_CUDA_CHECK(cuda_kernels::ArgMaxRows(src.data_ptr(), dst.data<int64_t>(), rows, n, t,
                                             clusters, cuda::CurrentStream()));
  });
}

void TopK(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const Tensor& x = in[0];
  const ElemType t = ToElemType(def, x.dtype());
  if (x.dim() == 0 || a.k > cuda_kernels::kTopKMaxK) {  // on a host copy
    const Tensor host_out = Tensor::Empty(out.shape(), DType::kInt64, kCPU);
    cpu::TopK(def, {ToHost(x)}, host_out, a);
    WriteContiguous(out, [&](const Tensor& dst) {
      cuda::Copy(dst.data_ptr(), dst.device(), host_out.data_ptr(), kCPU,
                 static_cast<size_t>(host_out.numel() * 8));
    });
    return;
  }
  const int64_t d = a.dim < 0 ? a.dim + x.dim() : a.dim;
  const int64_t n = x.size(d), rows = x.numel() / n;
  const std::vector<int64_t> order = DimLast(x.dim(), d);
  const Tensor src = Contiguous(Permuted(x, order));
  WriteContiguous(Permuted(out, order), [&](const Tensor& dst) {
    KILN_CUDA_CHECK(cuda_kernels::TopKRows(src.data_ptr(), dst.data<int64_t>(), rows, n, a.k,
                                           a.largest, t, cuda::CurrentStream()));
  });
}

void Cumsum(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const Tensor& x = in[0];
  const ElemType t = ToElemType(def, x.dtype());
  if (x.numel() == 0) return;
  const auto scan = [&](const Tensor& src, const Tensor& dst_view, int64_t rows, int64_t n) {
    WriteContiguous(dst_view, [&](const Tensor& dst) {
      KILN_CUDA_CHECK(cuda_kernels::CumsumRows(src.data_ptr(), dst.data_ptr(), rows, n, t,
                                               cuda::CurrentStream()));
    });
  };
  if (x.dim() == 0) return scan(Contiguous(x), out, 1, 1);  // one row of one element
  const int64_t d = a.dim < 0 ? a.dim + x.dim() : a.dim;
  const std::vector<int64_t> order = DimLast(x.dim(), d);  // the rows along d, made last
  scan(Contiguous(Permuted(x, order)), Permuted(out, order), x.numel() / x.size(d), x.size(d));
}

IndexCheckScope::IndexCheckScope() : outer_(t_index_scope) { t_index_scope = this; }

IndexCheckScope::IndexCheckScope(unsigned* device_flag)
    : flag_(device_flag), outer_(t_index_scope) {
  t_index_scope = this;
}

unsigned* IndexCheckScope::Take(Device device) {
  if (flag_ == nullptr) {
    if (cuda::Capturing()) return nullptr;  // a capture's owner checks the global flag
    owned_ = ZeroedFlag(device);
    flag_ = owned_.data<unsigned>();
  }
  used_ = true;
  return flag_;
}

IndexCheckScope::~IndexCheckScope() { t_index_scope = outer_; }

bool IndexCheckScope::Active() { return t_index_scope != nullptr; }

Tensor ZeroedFlag(Device device) {
  Tensor flag = Tensor::Empty({1}, DType::kInt32, device);
  KILN_CUDA_CHECK(cudaMemsetAsync(flag.data_ptr(), 0, sizeof(unsigned), cuda::CurrentStream()));
  return flag;
}

void ThrowIfIndexFlagged(unsigned* device_flag, const std::string& what) {
  if (ReadFlag(device_flag) == 0) return;
  KILN_CUDA_CHECK(cudaMemsetAsync(device_flag, 0, sizeof(unsigned), cuda::CurrentStream()));
  throw Error(absl::OutOfRangeError(absl::StrCat(
      what,
      ": an embedding/index_select/gather/index_copy kernel met an index out of range (a "
      "gather's rows for it are zeros, index_copy skipped its slice); run the function eagerly "
      "to see which op and index")));
}

void CheckCapturedIndexErrors() {
  bool seen = false;
  KILN_CUDA_CHECK(cuda_kernels::TakeGlobalIndexError(&seen, cuda::CurrentStream()));
  if (seen) {
    throw Error(absl::OutOfRangeError(
        "an embedding/index_select/gather kernel replayed from a CUDA graph met an index out of "
        "range (its output rows are zeros); run the function eagerly to see which"));
  }
}

}  // namespace kiln::cuda_ops
