// Shape/dtype inference of the indexing, joining and selection rows (see infer.h): embedding,
// index_select, gather, cat, argmax and topk. Errors name the rule broken; the dispatcher
// prefixes the op and its operands.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ops/infer.h"
#include "runtime/status.h"

namespace kiln::infer {
namespace {

absl::Status Invalid(std::string msg) { return absl::InvalidArgumentError(std::move(msg)); }

absl::Status RequireIndexType(const TensorType& t, const char* what) {
  if (t.dtype == DType::kInt64 || t.dtype == DType::kInt32) return absl::OkStatus();
  return Invalid(absl::StrCat(what, " must be int64 or int32, got ", DTypeName(t.dtype)));
}

absl::Status RequireNotBool(const TensorType& t) {
  if (t.dtype != DType::kBool) return absl::OkStatus();
  return Invalid("bool tensors are not supported; cast first");
}

}  // namespace

Result Embedding(Types in, const OpAttrs&) {
  const TensorType &indices = in[0], &weight = in[1];
  KILN_RETURN_IF_ERROR(RequireIndexType(indices, "indices"));
  if (weight.rank() != 2) {
    return Invalid(
        absl::StrCat("weight must be 2-D [num_embeddings, dim], got ", ShapeString(weight.shape)));
  }
  Shape out = indices.shape;
  out.push_back(weight.shape[1]);
  return TensorType{std::move(out), weight.dtype, indices.device};
}

Result IndexSelect(Types in, const OpAttrs& a) {
  const TensorType &x = in[0], &index = in[1];
  KILN_RETURN_IF_ERROR(RequireIndexType(index, "index"));
  if (index.rank() > 1) {
    return Invalid(absl::StrCat("index must be 1-D (or 0-d), got ", ShapeString(index.shape)));
  }
  if (x.rank() == 0) return Invalid("cannot index_select from a 0-d tensor");
  KILN_ASSIGN_OR_RETURN(int64_t d, WrapDim(a.dim, x.rank()));
  TensorType t = x;
  t.shape[d] = index.numel();
  return t;
}

Result Gather(Types in, const OpAttrs& a) {
  const TensorType &x = in[0], &index = in[1];
  KILN_RETURN_IF_ERROR(RequireIndexType(index, "index"));
  if (index.rank() != x.rank()) {
    return Invalid(absl::StrCat("index ", ShapeString(index.shape),
                                " must have as many dims as the input ", ShapeString(x.shape)));
  }
  KILN_ASSIGN_OR_RETURN(int64_t d, WrapDim(a.dim, x.rank()));
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (i != d && index.shape[i] > x.shape[i]) {
      return Invalid(absl::StrCat("index ", ShapeString(index.shape), " is larger than the input ",
                                  ShapeString(x.shape), " in dim ", i, " (only dim ", d,
                                  " may be larger)"));
    }
  }
  return TensorType{index.shape, x.dtype, x.device};
}

Result IndexCopy(Types in, const OpAttrs& a) {
  const TensorType &self = in[0], &index = in[1], &source = in[2];
  KILN_RETURN_IF_ERROR(RequireIndexType(index, "index"));
  if (index.rank() > 1) {
    return Invalid(absl::StrCat("index must be 1-D (or 0-d), got ", ShapeString(index.shape)));
  }
  if (self.rank() == 0) return Invalid("cannot index_copy into a 0-d tensor");
  KILN_ASSIGN_OR_RETURN(int64_t d, WrapDim(a.dim, self.rank()));
  if (source.dtype != self.dtype) {
    return Invalid(absl::StrCat("source's dtype ", DTypeName(source.dtype), " must equal self's ",
                                DTypeName(self.dtype)));
  }
  if (source.rank() != self.rank()) {
    return Invalid(absl::StrCat("source ", ShapeString(source.shape),
                                " must have as many dims as self ", ShapeString(self.shape)));
  }
  for (int64_t i = 0; i < self.rank(); ++i) {
    if (i == d && source.shape[i] != index.numel()) {
      return Invalid(absl::StrCat("source ", ShapeString(source.shape), " has ", source.shape[i],
                                  " slices along dim ", d, " but index has ", index.numel(),
                                  " entries"));
    }
    if (i != d && source.shape[i] != self.shape[i]) {
      return Invalid(absl::StrCat("source ", ShapeString(source.shape), " must match self ",
                                  ShapeString(self.shape), " in every dim but ", d, " (dim ", i,
                                  " differs)"));
    }
  }
  return self;
}

Result Scatter(Types in, const OpAttrs& a) {
  const TensorType &self = in[0], &index = in[1], &src = in[2];
  KILN_RETURN_IF_ERROR(RequireIndexType(index, "index"));
  if (src.dtype != self.dtype) {
    return Invalid(absl::StrCat("src's dtype ", DTypeName(src.dtype), " must equal self's ",
                                DTypeName(self.dtype)));
  }
  if (index.rank() != self.rank() || src.rank() != self.rank()) {
    return Invalid(absl::StrCat("index ", ShapeString(index.shape), ", self ",
                                ShapeString(self.shape), " and src ", ShapeString(src.shape),
                                " must have the same number of dims"));
  }
  KILN_ASSIGN_OR_RETURN(int64_t d, WrapDim(a.dim, self.rank()));
  if (self.rank() > 0 && self.shape[d] == 0 && index.numel() > 0) {
    return Invalid(absl::StrCat("dim ", d, " of self ", ShapeString(self.shape),
                                " is empty, so none of the index's ", index.numel(),
                                " entries is in range"));
  }
  for (int64_t i = 0; i < self.rank(); ++i) {
    if (index.shape[i] > src.shape[i] || (i != d && index.shape[i] > self.shape[i])) {
      return Invalid(absl::StrCat(
          "index ", ShapeString(index.shape), " is larger than ",
          index.shape[i] > src.shape[i] ? "src " : "self ",
          ShapeString(index.shape[i] > src.shape[i] ? src.shape : self.shape), " in dim ", i,
          " (index may be larger than self only in dim ", d, ", never larger than src)"));
    }
  }
  return self;
}

namespace {

// torch's legacy rule: a 1-D empty tensor joins any cat (it is skipped).
bool SkippedByCat(const TensorType& t) { return t.rank() == 1 && t.shape[0] == 0; }

}  // namespace

Result Cat(Types in, const OpAttrs& a) {
  const auto ref =
      std::find_if(in.begin(), in.end(), [](const TensorType& t) { return !SkippedByCat(t); });
  const TensorType& base = ref == in.end() ? in[0] : *ref;
  if (base.rank() == 0) return Invalid("zero-dimensional tensors cannot be concatenated");
  KILN_ASSIGN_OR_RETURN(int64_t d, WrapDim(a.dim, base.rank()));
  TensorType out{base.shape, base.dtype, base.device};
  out.shape[d] = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const TensorType& t = in[i];
    out.dtype = PromoteTypes(out.dtype, t.dtype);
    if (SkippedByCat(t) && &t != &base) continue;
    bool match = t.rank() == base.rank();
    for (int64_t k = 0; match && k < base.rank(); ++k)
      match = k == d || t.shape[k] == base.shape[k];
    if (!match) {
      return Invalid(absl::StrCat("tensor ", i, " has shape ", ShapeString(t.shape),
                                  ", which does not match ", ShapeString(base.shape),
                                  " except in dim ", d));
    }
    if (__builtin_add_overflow(out.shape[d], t.shape[d], &out.shape[d])) {
      return Invalid(absl::StrCat("the sizes along dim ", d,
                                  " add up past int64's range (at tensor ", i, ", ",
                                  ShapeString(t.shape), ")"));
    }
  }
  return out;
}

Result ArgMax(Types in, const OpAttrs& a) {
  const TensorType& x = in[0];
  KILN_RETURN_IF_ERROR(RequireNotBool(x));
  if (a.dims.size() > 1) return Invalid("argmax takes one dim (or none: the flattened input)");
  if (a.dims.empty() && x.numel() == 0) {
    return Invalid(
        absl::StrCat("cannot take the argmax of an empty tensor ", ShapeString(x.shape)));
  }
  if (!a.dims.empty() && x.rank() > 0) {
    KILN_ASSIGN_OR_RETURN(int64_t d, WrapDim(a.dims[0], x.rank()));
    if (x.shape[d] == 0) {
      return Invalid(
          absl::StrCat("the reduced dim ", a.dims[0], " of ", ShapeString(x.shape), " has size 0"));
    }
  }
  KILN_ASSIGN_OR_RETURN(TensorType t, Reduce(in, a));
  t.dtype = DType::kInt64;
  return t;
}

Result TopK(Types in, const OpAttrs& a) {
  const TensorType& x = in[0];
  KILN_RETURN_IF_ERROR(RequireNotBool(x));
  KILN_ASSIGN_OR_RETURN(int64_t d, WrapDim(a.dim, x.rank()));
  const int64_t n = x.rank() == 0 ? 1 : x.shape[d];
  if (x.rank() == 0 && a.k != 1) {
    return Invalid(absl::StrCat("k = ", a.k, " for a 0-d input: k must be 1"));
  }
  if (a.k < 0 || a.k > n) {
    return Invalid(absl::StrCat("k = ", a.k, " is out of range for dim ", a.dim, " of size ", n,
                                " (need 0 <= k <= ", n, ")"));
  }
  TensorType t{x.shape, DType::kInt64, x.device};
  if (x.rank() > 0) t.shape[d] = a.k;
  return t;
}

Result Cumsum(Types in, const OpAttrs& a) {
  const TensorType& x = in[0];
  KILN_RETURN_IF_ERROR(WrapDim(a.dim, x.rank()).status());
  const DType t = IsFloatingPoint(x.dtype) ? x.dtype : DType::kInt64;  // as torch
  return TensorType{x.shape, t, x.device};
}

}  // namespace kiln::infer
