// The gather family's plans, index check and CPU runner (see gather.h).
#include "ops/gather.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ops/cpu/loops.h"
#include "ops/dispatch.h"
#include "runtime/status.h"

namespace kiln::gather {
namespace {

int64_t Wrap(int64_t d, int64_t rank) { return d < 0 ? d + rank : d; }

// A plan with the output's shape and strides filled in.
IndexPlan Base(const OpDef& def, const Tensor& out, int64_t elem_size) {
  if (out.dim() > kIndexPlanMaxRank) {
    throw Error(absl::UnimplementedError(
        absl::StrCat(def.name, ": outputs of more than ", kIndexPlanMaxRank,
                     " dims are not supported, got ", out.shape_string())));
  }
  IndexPlan p;
  p.rank = static_cast<int>(out.dim());
  for (int d = 0; d < p.rank; ++d) {
    p.sizes[d] = out.size(d);
    p.out_strides[d] = out.stride(d);
  }
  p.elem_size = static_cast<int>(elem_size);
  return p;
}

void SetIndex(IndexPlan& p, const Tensor& index) {
  p.has_index = true;
  p.index_is_int64 = index.dtype() == DType::kInt64;
}

}  // namespace

IndexPlan PlanEmbedding(const OpDef& def, const Tensor& indices, const Tensor& weight,
                        const Tensor& out) {
  IndexPlan p = Base(def, out, weight.element_size());
  SetIndex(p, indices);
  for (int d = 0; d < indices.dim(); ++d) p.idx_strides[d] = indices.stride(d);
  p.src_strides[p.rank - 1] = weight.stride(1);
  p.select_stride = weight.stride(0);
  p.bound = weight.size(0);
  return p;
}

IndexPlan PlanIndexSelect(const OpDef& def, const Tensor& x, int64_t dim, const Tensor& index,
                          const Tensor& out) {
  IndexPlan p = Base(def, out, x.element_size());
  SetIndex(p, index);
  const int64_t d = Wrap(dim, x.dim());
  for (int i = 0; i < p.rank; ++i) p.src_strides[i] = i == d ? 0 : x.stride(i);
  p.idx_strides[d] = index.dim() == 1 ? index.stride(0) : 0;
  p.select_stride = x.stride(d);
  p.bound = x.size(d);
  return p;
}

IndexPlan PlanGather(const OpDef& def, const Tensor& x, int64_t dim, const Tensor& index,
                     const Tensor& out) {
  IndexPlan p = Base(def, out, x.element_size());
  SetIndex(p, index);
  if (x.dim() == 0) {  // a 0-d gather: index 0 picks the one element
    p.bound = 1;
    return p;
  }
  const int64_t d = Wrap(dim, x.dim());
  for (int i = 0; i < p.rank; ++i) {
    p.src_strides[i] = i == d ? 0 : x.stride(i);
    p.idx_strides[i] = index.stride(i);
  }
  p.select_stride = x.stride(d);
  p.bound = x.size(d);
  return p;
}

IndexPlan PlanIndexCopy(const OpDef& def, const Tensor& out, int64_t dim, const Tensor& index,
                        const Tensor& source) {
  IndexPlan p = Base(def, source, out.element_size());  // iterates over the source
  SetIndex(p, index);
  p.scatter = true;
  const int64_t d = Wrap(dim, out.dim());
  for (int i = 0; i < p.rank; ++i) {
    p.src_strides[i] = source.stride(i);
    p.out_strides[i] = i == d ? 0 : out.stride(i);
  }
  p.idx_strides[d] = index.dim() == 1 ? index.stride(0) : 0;
  p.select_stride = out.stride(d);
  p.bound = out.size(d);
  return p;
}

IndexPlan PlanScatter(const OpDef& def, const Tensor& out, int64_t dim, const Tensor& index,
                      const Tensor& src) {
  IndexPlan p = Base(def, index, out.element_size());  // iterates over the index
  SetIndex(p, index);
  p.scatter = true;
  if (out.dim() == 0) {  // a 0-d scatter: index 0 picks the one element
    p.bound = 1;
    return p;
  }
  const int64_t d = Wrap(dim, out.dim());
  for (int i = 0; i < p.rank; ++i) {
    p.src_strides[i] = src.stride(i);
    p.out_strides[i] = i == d ? 0 : out.stride(i);
    p.idx_strides[i] = index.stride(i);
  }
  p.select_stride = out.stride(d);
  p.bound = out.size(d);
  return p;
}

IndexPlan PlanCopy(const OpDef& def, const Tensor& src, const Tensor& out) {
  IndexPlan p = Base(def, out, out.element_size());
  for (int i = 0; i < p.rank; ++i) p.src_strides[i] = src.size(i) == 1 ? 0 : src.stride(i);
  return p;
}

bool SameView(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.offset() == b.offset() && a.shape() == b.shape() &&
         a.strides() == b.strides();
}

Tensor Unaliased(const Tensor& t, const Tensor& out) {
  if (GetMemOverlap(out, t) == MemOverlap::kNo) return t;
  Tensor copy = Tensor::Empty(t.type());
  DispatchOut(OpId::kContiguous, {t}, {}, copy);
  return copy;
}

void CheckIndices(const OpDef& def, const Tensor& index, int64_t bound, int64_t dim,
                  absl::Span<const Tensor> operands) {
  const bool is64 = index.dtype() == DType::kInt64;
  const Strides strides[] = {index.strides()};
  int64_t flat = 0, bad_at = -1, bad_value = 0;
  cpu::ForEachElement(index.shape(), strides, [&](const int64_t* off) {
    const int64_t v = is64 ? index.data<int64_t>()[off[0]] : index.data<int32_t>()[off[0]];
    if ((v < 0 || v >= bound) && bad_at < 0) bad_at = flat, bad_value = v;
    ++flat;
  });
  if (bad_at < 0) return;
  Shape pos(index.dim());
  for (int64_t d = index.dim() - 1; d >= 0; --d) {
    pos[d] = bad_at % index.size(d);
    bad_at /= index.size(d);
  }
  const std::string operand_list = absl::StrJoin(
      operands, ", ",
      [](std::string* out, const Tensor& t) { absl::StrAppend(out, Describe(t.type())); });
  throw Error(absl::OutOfRangeError(
      absl::StrCat(def.name, ": index ", bad_value, " is out of range for dim ", dim, " with size ",
                   bound, " (valid: 0..", bound - 1, "), at position ", ShapeString(pos),
                   " of the indices (operands: ", operand_list, ")")));
}

namespace {

// Calls fn(o, s) for every element of plan `p` with its output and source offsets, the index
// applied (to the output's for a scatter, else to the source's).
template <typename F>
void ForEachPlanElement(const IndexPlan& p, const void* index, F&& fn) {
  const Shape shape(p.sizes, p.sizes + p.rank);
  const Strides strides[] = {Strides(p.out_strides, p.out_strides + p.rank),
                             Strides(p.src_strides, p.src_strides + p.rank),
                             Strides(p.idx_strides, p.idx_strides + p.rank)};
  cpu::ForEachElement(shape, strides, [&](const int64_t* off) {
    int64_t o = off[0], s = off[1];
    if (p.has_index) {
      const int64_t v = p.index_is_int64 ? static_cast<const int64_t*>(index)[off[2]]
                                         : static_cast<const int32_t*>(index)[off[2]];
      (p.scatter ? o : s) += v * p.select_stride;
    }
    fn(o, s);
  });
}

}  // namespace

void RunOnCpu(const IndexPlan& p, void* out, const void* src, const void* index) {
  char* dst = static_cast<char*>(out);
  const char* from = static_cast<const char*>(src);
  const int64_t size = p.elem_size;
  ForEachPlanElement(p, index, [&](int64_t o, int64_t s) {
    std::memcpy(dst + o * size, from + s * size, static_cast<size_t>(size));
  });
}

void ScatterAddOnCpu(const IndexPlan& p, DType dtype, void* out, const void* src,
                     const void* index) {
  if (!IsFloatingPoint(dtype)) {  // integers add exactly, wrapping in dtype
    const IntLoadFn load = IntLoaderFor(dtype);
    const IntStoreFn store = IntStorerFor(dtype);
    ForEachPlanElement(p, index, [&](int64_t o, int64_t s) {
      store(out, o,
            static_cast<int64_t>(static_cast<uint64_t>(load(out, o)) +
                                 static_cast<uint64_t>(load(src, s))));
    });
    return;
  }
  const LoadFn load = LoaderFor(dtype);
  const StoreFn store = StorerFor(dtype);
  ForEachPlanElement(p, index,
                     [&](int64_t o, int64_t s) { store(out, o, load(out, o) + load(src, s)); });
}

}  // namespace kiln::gather
