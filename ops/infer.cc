// Shape/dtype inference for every registry row (see infer.h).
#include "ops/infer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"

namespace kiln::infer {
namespace {

absl::Status Invalid(std::string msg) { return absl::InvalidArgumentError(std::move(msg)); }

DType FloatOrDefault(DType t) { return IsFloatingPoint(t) ? t : DType::kFloat32; }

absl::Status RequireFloat(const TensorType& t, const char* what) {
  if (IsFloatingPoint(t.dtype)) return absl::OkStatus();
  return Invalid(absl::StrCat(what, " must be a floating-point tensor, got ", DTypeName(t.dtype)));
}

}  // namespace

absl::StatusOr<std::vector<bool>> ReducedMask(IntList dims, int64_t rank) {
  // A 0-d tensor has one dim to name (0 or -1), and no entry in the result.
  std::vector<bool> mask(std::max<int64_t>(rank, 1), dims.empty());
  for (int64_t d : dims) {
    KILN_ASSIGN_OR_RETURN(int64_t w, WrapDim(d, rank));
    if (mask[w]) return Invalid(absl::StrCat("dim ", d, " appears twice in the dims"));
    mask[w] = true;
  }
  mask.resize(rank);
  return mask;
}

Result UnaryFloat(Types in, const OpAttrs&) {
  return TensorType{in[0].shape, FloatOrDefault(in[0].dtype), in[0].device};
}

Result UnaryFloatOnly(Types in, const OpAttrs&) {
  KILN_RETURN_IF_ERROR(RequireFloat(in[0], "input"));
  return in[0];
}

Result UnarySame(Types in, const OpAttrs&) {
  if (in[0].dtype == DType::kBool) return Invalid("bool tensors are not supported; cast first");
  return in[0];
}

Result ScalarArith(Types in, const OpAttrs& a) {
  // A scalar acts like a Python number: an integer keeps an integer tensor's type (int32 * 3e9
  // wraps in int32, like torch) and makes a bool tensor int64; a floating one makes it float32.
  return TensorType{in[0].shape, ScalarResultType(in[0].dtype, a.scalar), in[0].device};
}

namespace {

// torch refuses a difference with any bool operand.
absl::Status RefuseBoolSubtraction(DType a, DType b) {
  if (a != DType::kBool && b != DType::kBool) return absl::OkStatus();
  return Invalid(
      absl::StrCat("subtraction with a bool tensor is not supported (as in torch): ", DTypeName(a),
                   " - ", DTypeName(b), "; to invert a mask use eq(mask, false)"));
}

}  // namespace

Result SubtractScalar(Types in, const OpAttrs& a) {
  KILN_RETURN_IF_ERROR(RefuseBoolSubtraction(
      in[0].dtype, a.scalar.is_bool() ? DType::kBool : ScalarResultType(in[0].dtype, a.scalar)));
  return ScalarArith(in, a);
}

Result ScalarDiv(Types in, const OpAttrs&) { return UnaryFloat(in, {}); }

Result Cast(Types in, const OpAttrs& a) {
  if (static_cast<int>(a.dtype) >= kNumDTypes) {
    return Invalid(absl::StrCat("unknown dtype ", static_cast<int>(a.dtype)));
  }
  return TensorType{in[0].shape, a.dtype, in[0].device};
}

Result Binary(Types in, const OpAttrs&) {
  KILN_ASSIGN_OR_RETURN(Shape shape, BroadcastShapes(in[0].shape, in[1].shape));
  DType t = ResultType(in[0], in[1]);
  return TensorType{std::move(shape), t, in[0].device};
}

Result Subtract(Types in, const OpAttrs& a) {
  if (in[0].dtype == DType::kBool && in[1].dtype == DType::kBool) {
    return Invalid("subtracting two bool tensors is not supported (as in torch); use ne() for xor");
  }
  KILN_RETURN_IF_ERROR(RefuseBoolSubtraction(in[0].dtype, in[1].dtype));
  return Binary(in, a);
}

Result BinaryDiv(Types in, const OpAttrs& a) {
  KILN_ASSIGN_OR_RETURN(TensorType t, Binary(in, a));
  t.dtype = FloatOrDefault(t.dtype);
  return t;
}

Result Where(Types in, const OpAttrs&) {
  if (in[0].dtype != DType::kBool) {
    return Invalid(absl::StrCat("condition must be bool, got ", DTypeName(in[0].dtype)));
  }
  KILN_ASSIGN_OR_RETURN(Shape s, BroadcastShapes(in[0].shape, in[1].shape));
  KILN_ASSIGN_OR_RETURN(s, BroadcastShapes(s, in[2].shape));
  return TensorType{std::move(s), ResultType(in[1], in[2]), in[0].device};
}

Result MaskedFill(Types in, const OpAttrs& a) {
  if (in[1].dtype != DType::kBool) {
    return Invalid(absl::StrCat("mask must be bool, got ", DTypeName(in[1].dtype)));
  }
  const DType t = in[0].dtype;
  if (!a.scalar.FitsIn(t)) {
    return Invalid(absl::StrCat("the value ", a.scalar.ToString(), " cannot be converted to ",
                                DTypeName(t), " without overflow"));
  }
  KILN_ASSIGN_OR_RETURN(Shape s, BroadcastShapes(in[0].shape, in[1].shape));
  return TensorType{std::move(s), in[0].dtype, in[0].device};
}

namespace {

// The shape of reducing x over a.dims (empty: all dims), with or without keepdim.
Result ReduceShape(const TensorType& x, const OpAttrs& a) {
  KILN_ASSIGN_OR_RETURN(std::vector<bool> mask, ReducedMask(a.dims, x.rank()));
  Shape out;
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (!mask[i]) {
      out.push_back(x.shape[i]);
    } else if (a.keepdim) {
      out.push_back(1);
    }
  }
  return TensorType{std::move(out), x.dtype, x.device};
}

}  // namespace

Result Reduce(Types in, const OpAttrs& a) {
  // max has no identity: like torch, reducing over an empty dim is an error, not -inf.
  const TensorType& x = in[0];
  KILN_ASSIGN_OR_RETURN(std::vector<bool> mask, ReducedMask(a.dims, x.rank()));
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (!mask[i] || x.shape[i] != 0) continue;
    return Invalid(absl::StrCat("cannot reduce over dim ", i, " of size 0 of ",
                                ShapeString(x.shape),
                                ": max has no identity (torch: expected "
                                "reduction dim ",
                                i, " to have non-zero size)"));
  }
  return ReduceShape(x, a);
}

Result ReduceSum(Types in, const OpAttrs& a) {
  KILN_ASSIGN_OR_RETURN(TensorType t, ReduceShape(in[0], a));
  if (!IsFloatingPoint(t.dtype)) t.dtype = DType::kInt64;  // like torch: integer sums widen
  return t;
}

Result ReduceMean(Types in, const OpAttrs& a) {
  KILN_RETURN_IF_ERROR(RequireFloat(in[0], "input"));
  return ReduceShape(in[0], a);
}

Result Softmax(Types in, const OpAttrs& a) {
  KILN_RETURN_IF_ERROR(RequireFloat(in[0], "input"));
  KILN_RETURN_IF_ERROR(WrapDim(a.dim, in[0].rank()).status());
  return in[0];
}

namespace {

// The checks layer_norm and rms_norm share: a floating input of rank >= 1 normalised over its
// last dim, parameters of shape [d]. The result has the input's type.
Result NormShape(Types in) {
  const TensorType& x = in[0];
  KILN_RETURN_IF_ERROR(RequireFloat(x, "input"));
  if (x.rank() < 1) return Invalid("input must have at least one dim");
  const int64_t d = x.shape.back();
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i].shape != Shape{d}) {
      return Invalid(absl::StrCat(i == 1 ? "weight" : "bias", " must have shape [", d,
                                  "] (the last dim of the input), got ", ShapeString(in[i].shape)));
    }
  }
  return x;
}

}  // namespace

Result LayerNorm(Types in, const OpAttrs&) {
  // torch 2.11: weight and bias have the input's dtype, or (mixed precision) are float32 under
  // a bfloat16/float16 input; the result keeps the input's dtype, computed in float32.
  KILN_ASSIGN_OR_RETURN(TensorType out, NormShape(in));
  const DType x = in[0].dtype;
  const bool reduced = x == DType::kBFloat16 || x == DType::kFloat16;
  bool same = true, all_f32 = true;
  for (size_t i = 1; i < in.size(); ++i) {
    same &= in[i].dtype == x;
    all_f32 &= in[i].dtype == DType::kFloat32;
  }
  if (same || (reduced && all_f32)) return out;
  std::string params;
  for (size_t i = 1; i < in.size(); ++i) {
    absl::StrAppend(&params, i == 1 ? "weight " : ", bias ", DTypeName(in[i].dtype));
  }
  return Invalid(absl::StrCat(
      "input ", DTypeName(x), " with ", params, ": weight and bias must have the input's dtype",
      reduced ? ", or all be float32 (mixed precision)" : "", " (torch's rule)"));
}

Result RmsNorm(Types in, const OpAttrs&) {
  // torch 2.11 (rms_norm_composite): any weight dtype; the normalised input is multiplied by the
  // weight in float32 and the result cast back to the input's dtype.
  return NormShape(in);
}

Result Matmul(Types in, const OpAttrs& a) {
  Shape sa = in[0].shape, sb = in[1].shape;
  if (sa.empty() || sb.empty()) return Invalid("both operands must have at least one dim");
  if (in[0].dtype != in[1].dtype) {
    return Invalid(absl::StrCat("operands must have the same dtype, got ", DTypeName(in[0].dtype),
                                " and ", DTypeName(in[1].dtype)));
  }
  if (!IsFloatingPoint(in[0].dtype)) return Invalid("operands must be floating point");
  if ((a.transpose_a && sa.size() < 2) || (a.transpose_b && sb.size() < 2)) {
    return Invalid("a transposed operand must have at least two dims");
  }
  if (a.transpose_a) std::swap(sa[sa.size() - 1], sa[sa.size() - 2]);
  if (a.transpose_b) std::swap(sb[sb.size() - 1], sb[sb.size() - 2]);
  const bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
  if (a_vec) sa.insert(sa.begin(), 1);
  if (b_vec) sb.push_back(1);
  const int64_t k_a = sa.back(), k_b = sb[sb.size() - 2];
  if (k_a != k_b) {
    return Invalid(absl::StrCat("inner dims do not match: ", ShapeString(in[0].shape),
                                a.transpose_a ? "ᵀ" : "", " @ ", ShapeString(in[1].shape),
                                a.transpose_b ? "ᵀ" : "", " has K = ", k_a, " vs ", k_b));
  }
  KILN_ASSIGN_OR_RETURN(Shape out, BroadcastShapes(IntList(sa).subspan(0, sa.size() - 2),
                                                   IntList(sb).subspan(0, sb.size() - 2)));
  if (!a_vec) out.push_back(sa[sa.size() - 2]);
  if (!b_vec) out.push_back(sb.back());
  return TensorType{std::move(out), in[0].dtype, in[0].device};
}

// linear(x, w[, bias]) and, with epilogue=add, linear(x, w[, bias], residual).
Result Linear(Types in, const OpAttrs& a) {
  const bool residual = HasResidual(a);
  if (residual && in.size() < 3) {
    return Invalid(
        "epilogue=add needs the residual as the last input: (input, weight[, bias], "
        "residual)");
  }
  if (!residual && in.size() > 3) {
    return Invalid(absl::StrCat("takes (input, weight[, bias]), got ", in.size(),
                                " inputs (a 4th is only the residual of epilogue=add)"));
  }
  const TensorType &x = in[0], &w = in[1];
  const bool has_bias = LinearHasBias(in.size(), a);
  if (x.rank() < 1 || w.rank() != 2) {
    return Invalid(absl::StrCat("expected input [..., in] and weight [out, in], got ",
                                ShapeString(x.shape), " and ", ShapeString(w.shape)));
  }
  if (x.shape.back() != w.shape[1]) {
    return Invalid(absl::StrCat("input features ", x.shape.back(), " do not match weight ",
                                ShapeString(w.shape), " (expected [out, ", x.shape.back(), "])"));
  }
  if (x.dtype != w.dtype || (has_bias && in[2].dtype != x.dtype)) {
    return Invalid("input, weight and bias must have the same dtype");
  }
  if (!IsFloatingPoint(x.dtype)) return Invalid("operands must be floating point");
  if (has_bias && in[2].shape != Shape{w.shape[0]}) {
    return Invalid(
        absl::StrCat("bias must have shape [", w.shape[0], "], got ", ShapeString(in[2].shape)));
  }
  Shape out = x.shape;
  out.back() = w.shape[0];
  if (residual && (in.back().shape != out || in.back().dtype != x.dtype)) {
    return Invalid(absl::StrCat("the residual of epilogue=add must be ", DTypeName(x.dtype), " ",
                                ShapeString(out), " (the output's type, no broadcasting), got ",
                                DTypeName(in.back().dtype), " ", ShapeString(in.back().shape)));
  }
  return TensorType{std::move(out), x.dtype, x.device};
}

Result Transpose(Types in, const OpAttrs& a) {
  TensorType t = in[0];
  KILN_ASSIGN_OR_RETURN(int64_t d0, WrapDim(a.dim, t.rank()));
  KILN_ASSIGN_OR_RETURN(int64_t d1, WrapDim(a.dim2, t.rank()));
  if (t.rank() > 0) std::swap(t.shape[d0], t.shape[d1]);
  return t;
}

Result Permute(Types in, const OpAttrs& a) {
  TensorType t = in[0];
  if (static_cast<int64_t>(a.dims.size()) != t.rank()) {
    return Invalid(absl::StrCat("permutation [", absl::StrJoin(a.dims, ", "), "] must list ",
                                t.rank(), " dims"));
  }
  std::vector<bool> seen(t.rank(), false);
  for (size_t i = 0; i < a.dims.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(int64_t d, WrapDim(a.dims[i], t.rank()));
    if (seen[d]) return Invalid(absl::StrCat("dim ", a.dims[i], " repeats in the permutation"));
    seen[d] = true;
    t.shape[i] = in[0].shape[d];
  }
  return t;
}

absl::StatusOr<Shape> InferReshapeSizes(IntList sizes, int64_t numel) {
  Shape out(sizes.begin(), sizes.end());
  int64_t known = 1, infer_at = -1;
  bool overflow = false;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1 && infer_at < 0) {
      infer_at = static_cast<int64_t>(i);
    } else if (out[i] < 0) {
      return Invalid(absl::StrCat("invalid target shape ", ShapeString(sizes)));
    } else {
      overflow |= __builtin_mul_overflow(known, out[i], &known);
    }
  }
  const bool zero = std::find(out.begin(), out.end(), 0) != out.end();
  const bool fits = zero ? numel == 0 && infer_at < 0
                         : !overflow && (infer_at >= 0 ? numel % known == 0 : known == numel);
  if (!fits) {
    return Invalid(
        absl::StrCat("shape ", ShapeString(sizes), " is invalid for ", numel, " elements"));
  }
  if (infer_at >= 0) out[infer_at] = numel / known;
  return out;
}

Result Reshape(Types in, const OpAttrs& a) {
  KILN_ASSIGN_OR_RETURN(Shape s, InferReshapeSizes(a.dims, in[0].numel()));
  return TensorType{std::move(s), in[0].dtype, in[0].device};
}

Result Expand(Types in, const OpAttrs& a) {
  const TensorType& x = in[0];
  const int64_t rank = static_cast<int64_t>(a.dims.size());
  if (rank < x.rank()) {
    return Invalid(absl::StrCat("cannot expand ", ShapeString(x.shape), " to fewer dims ",
                                ShapeString(a.dims)));
  }
  Shape out(a.dims.begin(), a.dims.end());
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t xi = i - (rank - x.rank());
    const int64_t have = xi >= 0 ? x.shape[xi] : 1;
    if (out[i] == -1 && xi >= 0) out[i] = have;
    if (out[i] == -1) {
      return Invalid(absl::StrCat("cannot expand ", ShapeString(x.shape), " to ",
                                  ShapeString(a.dims), ": -1 is not allowed in a leading, new dim ",
                                  "(dim ", i, ")"));
    }
    if (out[i] < 0) {
      return Invalid(absl::StrCat("cannot expand ", ShapeString(x.shape), " to ",
                                  ShapeString(a.dims), ": size ", out[i], " of dim ", i,
                                  " is negative (only -1, keep the size, is allowed)"));
    }
    if (have != 1 && have != out[i]) {
      return Invalid(absl::StrCat("cannot expand ", ShapeString(x.shape), " to ",
                                  ShapeString(a.dims), ": dim ", i, " has size ", have,
                                  " (only size-1 dims expand)"));
    }
  }
  return TensorType{std::move(out), x.dtype, x.device};
}

Result Slice(Types in, const OpAttrs& a) {
  TensorType t = in[0];
  if (t.rank() == 0) return Invalid("cannot slice a 0-d tensor");
  KILN_ASSIGN_OR_RETURN(int64_t d, WrapDim(a.dim, t.rank()));
  if (a.step <= 0) return Invalid(absl::StrCat("slice step must be positive, got ", a.step));
  const int64_t n = t.shape[d];
  // Bounds clamp like Python's; no intermediate can overflow, whatever start, end and step are.
  auto clamp = [n](int64_t v) {
    if (v < 0) v = v < -n ? 0 : v + n;
    return std::min(v, n);
  };
  const int64_t start = clamp(a.start), end = clamp(a.end);
  t.shape[d] = end > start ? 1 + (end - start - 1) / a.step : 0;
  return t;
}

Result Unsqueeze(Types in, const OpAttrs& a) {
  TensorType t = in[0];
  const int64_t r = t.rank();  // the new dim goes anywhere in -(r + 1) .. r
  if (a.dim < -(r + 1) || a.dim > r) {
    return Invalid(absl::StrCat("dim ", a.dim, " is out of range for a tensor of rank ", r,
                                " (expected ", -(r + 1), "..", r, ": where the new dim goes)"));
  }
  t.shape.insert(t.shape.begin() + (a.dim < 0 ? a.dim + r + 1 : a.dim), 1);
  return t;
}

Result Squeeze(Types in, const OpAttrs& a) {
  TensorType t = in[0];
  if (a.all_dims) {
    t.shape.erase(std::remove(t.shape.begin(), t.shape.end(), 1), t.shape.end());
    return t;
  }
  KILN_ASSIGN_OR_RETURN(int64_t d, WrapDim(a.dim, t.rank()));
  if (t.rank() > 0 && t.shape[d] == 1) t.shape.erase(t.shape.begin() + d);
  return t;
}

Result Same(Types in, const OpAttrs&) { return in[0]; }

Result Copy(Types in, const OpAttrs&) {
  KILN_ASSIGN_OR_RETURN(Shape s, BroadcastShapes(in[0].shape, in[1].shape));
  if (s != in[0].shape) {
    return Invalid(absl::StrCat("src of shape ", ShapeString(in[1].shape),
                                " does not broadcast to self's shape ", ShapeString(in[0].shape)));
  }
  return in[0];
}

namespace {

// The window (sizes a.dims, strides a.strides, offset a.offset) lies inside `numel` elements.
absl::Status CheckWindow(const OpAttrs& a, int64_t numel) {
  if (a.dims.size() != a.strides.size() || a.offset < 0) {
    return Invalid(absl::StrCat("a window needs one stride per size and offset >= 0, got sizes ",
                                ShapeString(a.dims), ", strides ", ShapeString(a.strides),
                                ", offset ", a.offset));
  }
  int64_t last = a.offset;
  for (size_t d = 0; d < a.dims.size(); ++d) {
    if (a.dims[d] < 0 || a.strides[d] < 0) return Invalid("window sizes and strides must be >= 0");
    if (a.dims[d] == 0) return absl::OkStatus();
    last += (a.dims[d] - 1) * a.strides[d];
  }
  if (last >= numel && NumElements(a.dims) > 0) {
    return Invalid(absl::StrCat("window sizes ", ShapeString(a.dims), ", strides ",
                                ShapeString(a.strides), ", offset ", a.offset, " reaches element ",
                                last, " of a tensor of ", numel));
  }
  return absl::OkStatus();
}

}  // namespace

Result AsStrided(Types in, const OpAttrs& a) {
  KILN_RETURN_IF_ERROR(CheckWindow(a, in[0].numel()));
  return TensorType{a.dims, in[0].dtype, in[0].device};
}

Result AsStridedScatter(Types in, const OpAttrs& a) {
  KILN_RETURN_IF_ERROR(CheckWindow(a, in[0].numel()));
  if (in[1].shape != a.dims) {
    return Invalid(absl::StrCat("src of shape ", ShapeString(in[1].shape),
                                " is not the window's shape ", ShapeString(a.dims)));
  }
  return in[0];
}

Result TriMask(Types in, const OpAttrs&) {
  if (in[0].rank() < 2) {
    return Invalid(absl::StrCat("input must have at least 2 dims, got ", ShapeString(in[0].shape)));
  }
  return in[0];
}

DType ResultType(const TensorType& a, const TensorType& b) {
  if ((a.rank() == 0) == (b.rank() == 0)) return PromoteTypes(a.dtype, b.dtype);
  const DType dims = a.rank() == 0 ? b.dtype : a.dtype;  // c10's combine_categories
  const DType zero = a.rank() == 0 ? a.dtype : b.dtype;
  if (IsFloatingPoint(dims)) return dims;
  if (dims == DType::kBool || IsFloatingPoint(zero)) return PromoteTypes(dims, zero);
  return dims;
}

DType ScalarResultType(DType t, const Scalar& scalar) {
  if (IsFloatingPoint(t) || scalar.is_bool()) return t;  // a bool number keeps any tensor's type
  if (!scalar.is_integer()) return DType::kFloat32;
  return t == DType::kBool ? DType::kInt64 : t;
}

Result Compare(Types in, const OpAttrs& a) {
  KILN_ASSIGN_OR_RETURN(TensorType t, Binary(in, a));
  t.dtype = DType::kBool;
  return t;
}

Result CompareScalar(Types in, const OpAttrs&) {
  return TensorType{in[0].shape, DType::kBool, in[0].device};
}

Result MinMax(Types in, const OpAttrs& a) { return Binary(in, a); }

Result BinaryNumeric(Types in, const OpAttrs& a) {
  KILN_ASSIGN_OR_RETURN(TensorType t, Binary(in, a));
  if (t.dtype == DType::kBool) return Invalid("bool tensors are not supported; cast first");
  return t;
}

Result Pow(Types in, const OpAttrs& a) { return BinaryNumeric(in, a); }

Result PowScalar(Types in, const OpAttrs& a) {
  const DType t = ScalarResultType(in[0].dtype, a.scalar);
  if (!IsFloatingPoint(t) && a.scalar.to_int64() < 0) {
    return Invalid(absl::StrCat("integers to negative integer powers are not allowed (",
                                DTypeName(in[0].dtype), " tensor ** ", a.scalar.ToString(), ")"));
  }
  return TensorType{in[0].shape, t, in[0].device};
}

Result ClampScalar(Types in, const OpAttrs& a) {
  // torch promotes (clamp(int_tensor, 0.5) is float32) and converts the bound to the result
  // type with an overflow check (an int32 tensor clamped at 2^40 is an error, not a wrapped bound).
  const DType t = ScalarResultType(in[0].dtype, a.scalar);
  if (!a.scalar.FitsIn(t)) {
    return Invalid(absl::StrCat("the bound ", a.scalar.ToString(), " cannot be converted to ",
                                DTypeName(t), " without overflow"));
  }
  return TensorType{in[0].shape, t, in[0].device};
}

}  // namespace kiln::infer
