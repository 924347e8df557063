// The public op API: thin wrappers that fill OpAttrs and dispatch through the registry.
#include "ops/ops.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "ops/infer.h"
#include "ops/views.h"
#include "runtime/status.h"

namespace kiln {
namespace {

Tensor Unary(OpId id, const Tensor& x) { return Dispatch(id, {x}); }
Tensor WithScalar(OpId id, const Tensor& x, Scalar s) {
  OpAttrs a;
  a.scalar = s;
  return Dispatch(id, {x}, a);
}
Tensor WithDims(OpId id, const Tensor& x, IntList dims, bool keepdim = false) {
  OpAttrs a;
  a.dims.assign(dims.begin(), dims.end());
  a.keepdim = keepdim;
  return Dispatch(id, {x}, a);
}
Tensor WithDim(OpId id, const Tensor& x, int64_t dim) {
  OpAttrs a;
  a.dim = dim;
  return Dispatch(id, {x}, a);
}

}  // namespace

Tensor neg(const Tensor& x) { return Unary(OpId::kNeg, x); }
Tensor exp(const Tensor& x) { return Unary(OpId::kExp, x); }
Tensor log(const Tensor& x) { return Unary(OpId::kLog, x); }
Tensor sqrt(const Tensor& x) { return Unary(OpId::kSqrt, x); }
Tensor rsqrt(const Tensor& x) { return Unary(OpId::kRsqrt, x); }
Tensor tanh(const Tensor& x) { return Unary(OpId::kTanh, x); }
Tensor sigmoid(const Tensor& x) { return Unary(OpId::kSigmoid, x); }
Tensor relu(const Tensor& x) { return Unary(OpId::kRelu, x); }
Tensor silu(const Tensor& x) { return Unary(OpId::kSilu, x); }

Tensor gelu(const Tensor& x, std::string_view approximate) {
  KILN_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be 'none' or ",
             "'tanh', got '", std::string(approximate), "'");
  OpAttrs a;
  a.approximate = approximate == "tanh" ? GeluApprox::kTanh : GeluApprox::kNone;
  return Dispatch(OpId::kGelu, {x}, a);
}

Tensor cast(const Tensor& x, DType dtype) {
  CheckDefined("cast", x);
  if (x.dtype() == dtype) return x;
  OpAttrs a;
  a.dtype = dtype;
  return Dispatch(OpId::kCast, {x}, a);
}

Tensor add(const Tensor& a, const Tensor& b) { return Dispatch(OpId::kAdd, {a, b}); }
Tensor sub(const Tensor& a, const Tensor& b) { return Dispatch(OpId::kSub, {a, b}); }
Tensor mul(const Tensor& a, const Tensor& b) { return Dispatch(OpId::kMul, {a, b}); }
Tensor div(const Tensor& a, const Tensor& b) { return Dispatch(OpId::kDiv, {a, b}); }
Tensor add(const Tensor& a, Scalar b) { return WithScalar(OpId::kAddScalar, a, b); }
Tensor sub(const Tensor& a, Scalar b) { return WithScalar(OpId::kSubScalar, a, b); }
Tensor mul(const Tensor& a, Scalar b) { return WithScalar(OpId::kMulScalar, a, b); }
Tensor div(const Tensor& a, Scalar b) { return WithScalar(OpId::kDivScalar, a, b); }
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
Tensor operator-(Scalar a, const Tensor& b) { return WithScalar(OpId::kRsubScalar, b, a); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
Tensor operator-(const Tensor& x) { return neg(x); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  return Dispatch(OpId::kWhere, {cond, a, b});
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value) {
  OpAttrs a;
  a.scalar = value;
  return Dispatch(OpId::kMaskedFill, {x, mask}, a);
}

const Tensor& add_(const Tensor& self, const Tensor& other) {
  return DispatchInPlace(OpId::kAdd, {self, other});
}
const Tensor& mul_(const Tensor& self, const Tensor& other) {
  return DispatchInPlace(OpId::kMul, {self, other});
}
const Tensor& add_(const Tensor& self, Scalar other) {
  OpAttrs a;
  a.scalar = other;
  return DispatchInPlace(OpId::kAddScalar, {self}, a);
}
const Tensor& mul_(const Tensor& self, Scalar other) {
  OpAttrs a;
  a.scalar = other;
  return DispatchInPlace(OpId::kMulScalar, {self}, a);
}
const Tensor& masked_fill_(const Tensor& self, const Tensor& mask, Scalar value) {
  OpAttrs a;
  a.scalar = value;
  return DispatchInPlace(OpId::kMaskedFill, {self, mask}, a);
}
const Tensor& copy_(const Tensor& self, const Tensor& src) {
  return DispatchInPlace(OpId::kCopy, {self, src});
}

Tensor sum(const Tensor& x, IntList dims, bool keepdim) {
  return WithDims(OpId::kSum, x, dims, keepdim);
}
Tensor mean(const Tensor& x, IntList dims, bool keepdim) {
  return WithDims(OpId::kMean, x, dims, keepdim);
}
Tensor max(const Tensor& x, IntList dims, bool keepdim) {
  return WithDims(OpId::kMax, x, dims, keepdim);
}
Tensor prod(const Tensor& x, IntList dims, bool keepdim) {
  return WithDims(OpId::kProd, x, dims, keepdim);
}
Tensor softmax(const Tensor& x, int64_t dim) { return WithDim(OpId::kSoftmax, x, dim); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return WithDim(OpId::kLogSoftmax, x, dim); }

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  KILN_CHECK(weight.defined() || !bias.defined(), "layer_norm: a bias needs a weight ",
             "(pass ones for the weight)");
  OpAttrs a;
  a.eps = eps;
  if (!weight.defined()) return Dispatch(OpId::kLayerNorm, {x}, a);
  if (!bias.defined()) return Dispatch(OpId::kLayerNorm, {x, weight}, a);
  return Dispatch(OpId::kLayerNorm, {x, weight, bias}, a);
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  OpAttrs a;
  a.eps = eps;
  return weight.defined() ? Dispatch(OpId::kRmsNorm, {x, weight}, a)
                          : Dispatch(OpId::kRmsNorm, {x}, a);
}

Tensor matmul(const Tensor& a, const Tensor& b) { return Dispatch(OpId::kMatmul, {a, b}); }

namespace {

// linear with torch's weight of shape (in_features): x @ w, one feature, plus a bias that
// broadcasts to it.
Tensor LinearOfVector(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const Tensor y = matmul(x, weight);
  if (!bias.defined()) return y;
  const absl::StatusOr<Shape> s = BroadcastShapes(y.shape(), bias.shape());
  KILN_CHECK(bias.dtype() == y.dtype() && s.ok() && *s == y.shape(), "bias ", Describe(bias.type()),
             " must have the output's dtype and broadcast to its shape ", y.shape_string(),
             " (a 1-D weight gives one feature)");
  return add(y, bias);
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (weight.defined() && weight.dim() == 1) {
    return WithErrorContext([] { return "linear"; },
                            [&] { return LinearOfVector(x, weight, bias); });
  }
  return bias.defined() ? Dispatch(OpId::kLinear, {x, weight, bias})
                        : Dispatch(OpId::kLinear, {x, weight});
}

namespace {
std::atomic<bool> g_allow_tf32{false};  // read by the CUDA backend's GEMMs (ops/cuda/matmul_cuda.h)
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  OpAttrs a;
  a.dim = dim0;
  a.dim2 = dim1;
  return Dispatch(OpId::kTranspose, {x}, a);
}

Tensor t(const Tensor& x) {
  CheckDefined("t", x);
  KILN_CHECK(x.dim() <= 2, "t: expects a tensor with <= 2 dims, got ", x.shape_string(),
             " (use transpose(x, d0, d1))");
  return x.dim() < 2 ? x : transpose(x, 0, 1);
}

Tensor permute(const Tensor& x, IntList dims) { return WithDims(OpId::kPermute, x, dims); }
Tensor reshape(const Tensor& x, IntList shape) { return WithDims(OpId::kReshape, x, shape); }
Tensor expand(const Tensor& x, IntList shape) { return WithDims(OpId::kExpand, x, shape); }
Tensor broadcast_to(const Tensor& x, IntList shape) { return expand(x, shape); }

Tensor view(const Tensor& x, IntList shape) {
  CheckDefined("view", x);
  absl::StatusOr<Shape> sizes = infer::InferReshapeSizes(shape, x.numel());
  KILN_CHECK(sizes.ok(), "view: ", sizes.status().message());
  const Shape& target = *sizes;
  KILN_CHECK(views::ViewStrides(x, target).has_value(), "view: a tensor of shape ",
             x.shape_string(), " and strides ", ShapeString(x.strides()), " cannot be viewed as ",
             ShapeString(target), "; use reshape() (which copies)");
  return reshape(x, target);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  OpAttrs a;
  a.dim = dim;
  a.start = start;
  a.end = end;
  a.step = step;
  return Dispatch(OpId::kSlice, {x}, a);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) { return WithDim(OpId::kUnsqueeze, x, dim); }
Tensor squeeze(const Tensor& x, int64_t dim) { return WithDim(OpId::kSqueeze, x, dim); }
Tensor squeeze(const Tensor& x) {
  OpAttrs a;
  a.all_dims = true;
  return Dispatch(OpId::kSqueeze, {x}, a);
}

Tensor contiguous(const Tensor& x) {
  CheckDefined("contiguous", x);
  // x itself when contiguous, while tracing too (writes through the result reach x, as eagerly;
  // compiled functions guard on their inputs' contiguity, codegen/compile.h).
  if (x.is_contiguous()) return x;
  return Dispatch(OpId::kContiguous, {x});
}

Tensor triu(const Tensor& x, int64_t diagonal) {
  OpAttrs a;
  a.diagonal = diagonal;
  return Dispatch(OpId::kTriu, {x}, a);
}
Tensor tril(const Tensor& x, int64_t diagonal) {
  OpAttrs a;
  a.diagonal = diagonal;
  return Dispatch(OpId::kTril, {x}, a);
}

Tensor to(const Tensor& x, DType dtype) {
  CheckDefined("to", x);
  return cast(x, dtype);
}

Tensor to(const Tensor& x, Device device) {
  CheckDefined("to", x);
  if (x.device() == device) return x;
  KILN_CHECK(!x.device().is_meta(), "to: cannot move a meta tensor ", Describe(x.type()), " to ",
             device.str(), ": it holds no data");
  // Inside a traced function a tensor with meta storage on a real device is a traced value:
  // kiln graphs stay on one device.
  KILN_CHECK(x.storage() == nullptr || !x.storage()->device().is_meta(), "to: cannot move ",
             Describe(x.type()), " to ", device.str(),
             " inside a compiled function: a compiled graph runs on one device");
  // A real tensor (weights, a mask built from a factory) is copied now, even while tracing: it
  // becomes a constant of the graph. Its contiguous copy must not be recorded either.
  const Tensor src = [&] {
    ScopedDispatchHook eager(nullptr);
    return contiguous(x);
  }();
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), device);
  if (!device.is_meta()) {
    CopyBytes(out.data_ptr(), device, src.data_ptr(), src.device(),
              static_cast<size_t>(src.numel() * src.element_size()));
  }
  return out;
}

Tensor clone(const Tensor& x) { return Dispatch(OpId::kContiguous, {x}); }

Tensor abs(const Tensor& x) { return Unary(OpId::kAbs, x); }
Tensor sin(const Tensor& x) { return Unary(OpId::kSin, x); }
Tensor cos(const Tensor& x) { return Unary(OpId::kCos, x); }
Tensor erf(const Tensor& x) { return Unary(OpId::kErf, x); }
Tensor floor(const Tensor& x) { return Unary(OpId::kFloor, x); }
Tensor ceil(const Tensor& x) { return Unary(OpId::kCeil, x); }
Tensor round(const Tensor& x) { return Unary(OpId::kRound, x); }
Tensor trunc(const Tensor& x) { return Unary(OpId::kTrunc, x); }
Tensor log1p(const Tensor& x) { return Unary(OpId::kLog1p, x); }
Tensor expm1(const Tensor& x) { return Unary(OpId::kExpm1, x); }
Tensor tan(const Tensor& x) { return Unary(OpId::kTan, x); }
Tensor atan(const Tensor& x) { return Unary(OpId::kAtan, x); }
Tensor log2(const Tensor& x) { return Unary(OpId::kLog2, x); }
Tensor log10(const Tensor& x) { return Unary(OpId::kLog10, x); }
Tensor exp2(const Tensor& x) { return Unary(OpId::kExp2, x); }
Tensor sinh(const Tensor& x) { return Unary(OpId::kSinh, x); }
Tensor cosh(const Tensor& x) { return Unary(OpId::kCosh, x); }
Tensor asin(const Tensor& x) { return Unary(OpId::kAsin, x); }
Tensor acos(const Tensor& x) { return Unary(OpId::kAcos, x); }
Tensor asinh(const Tensor& x) { return Unary(OpId::kAsinh, x); }
Tensor acosh(const Tensor& x) { return Unary(OpId::kAcosh, x); }
Tensor atanh(const Tensor& x) { return Unary(OpId::kAtanh, x); }
Tensor atan2(const Tensor& y, const Tensor& x) { return Dispatch(OpId::kAtan2, {y, x}); }
Tensor reciprocal(const Tensor& x) { return Unary(OpId::kReciprocal, x); }
Tensor sign(const Tensor& x) { return Unary(OpId::kSign, x); }
Tensor cumsum(const Tensor& x, int64_t dim) {
  OpAttrs a;
  a.dim = dim;
  // Bools sum as int64 (the CUDA kernel reads no bool).
  const Tensor in = x.defined() && x.dtype() == DType::kBool ? cast(x, DType::kInt64) : x;
  return Dispatch(OpId::kCumsum, {in}, a);
}
Tensor remainder(const Tensor& x, const Tensor& y) { return Dispatch(OpId::kRemainder, {x, y}); }
Tensor fmod(const Tensor& x, const Tensor& y) { return Dispatch(OpId::kFmod, {x, y}); }
Tensor floor_divide(const Tensor& x, const Tensor& y) {
  return Dispatch(OpId::kFloorDivide, {x, y});
}

namespace {

// x and a zero-dim tensor holding `s` in their common dtype (torch's result_type with a Python
// number; the scalar rounded to a floating dtype once, as torch converts it), for the binary
// rows that have no scalar form.
Tensor ScalarOperand(const char* op, const Tensor& x, Scalar s) {
  KILN_CHECK(x.defined(), op, ": the input is an undefined tensor");
  const DType t = infer::ScalarResultType(x.dtype(), s);
  return WithErrorContext([&] { return absl::StrCat(op, " of ", Describe(x.type())); },
                          [&] {
                            return full(
                                {}, IsFloatingPoint(t) ? Scalar(RoundToDType(t, s.to_double())) : s,
                                t, x.device());
                          });
}

}  // namespace

Tensor remainder(const Tensor& x, Scalar y) {
  return remainder(x, ScalarOperand("remainder", x, y));
}
Tensor operator%(const Tensor& a, const Tensor& b) { return remainder(a, b); }
Tensor operator%(const Tensor& a, Scalar b) { return remainder(a, b); }
Tensor operator%(Scalar a, const Tensor& b) {
  return remainder(ScalarOperand("remainder", b, a), b);
}
Tensor fmod(const Tensor& x, Scalar y) { return fmod(x, ScalarOperand("fmod", x, y)); }
Tensor floor_divide(const Tensor& x, Scalar y) {
  return floor_divide(x, ScalarOperand("floor_divide", x, y));
}
Tensor pow(const Tensor& x, const Tensor& exponent) { return Dispatch(OpId::kPow, {x, exponent}); }
Tensor pow(const Tensor& x, Scalar exponent) { return WithScalar(OpId::kPowScalar, x, exponent); }
Tensor pow(Scalar base, const Tensor& exponent) {
  return pow(ScalarOperand("pow", exponent, base), exponent);
}
Tensor where(const Tensor& cond, const Tensor& a, Scalar b) {
  return where(cond, a, ScalarOperand("where", a, b));
}
Tensor where(const Tensor& cond, Scalar a, const Tensor& b) {
  return where(cond, ScalarOperand("where", b, a), b);
}

Tensor div(const Tensor& a, const Tensor& b, std::string_view rounding_mode) {
  KILN_CHECK(rounding_mode == "floor" || rounding_mode == "trunc",
             "div: rounding_mode must be \"trunc\" or \"floor\" (or none: div(a, b)), got \"",
             std::string(rounding_mode), "\"");
  if (rounding_mode == "floor") return floor_divide(a, b);
  KILN_CHECK(a.defined() && b.defined(), "div: the operands must be defined tensors");
  KILN_CHECK(a.dtype() != DType::kBool || b.dtype() != DType::kBool,
             "div: rounding_mode \"trunc\" does not take two bool tensors (as in torch), got ",
             Describe(a.type()), " / ", Describe(b.type()));
  return WithErrorContext([] { return "div"; },
                          [&] {
                            const DType t = infer::ResultType(a.type(), b.type());
                            if (t == DType::kBFloat16 || t == DType::kFloat16) {
                              // In float32, rounded once (torch's kernels).
                              const DType f32 = DType::kFloat32;
                              return cast(trunc(div(cast(a, f32), cast(b, f32))), t);
                            }
                            if (IsFloatingPoint(t)) return trunc(div(a, b));
                            // Integers, exactly: the floor quotient, one up where the division was
                            // inexact and the signs differ (a divisor of 0 is floor_divide's
                            // error).
                            const Tensor q = floor_divide(a, b);
                            const Tensor inexact = ne(remainder(a, b), 0);
                            const Tensor signs_differ = ne(lt(a, 0), lt(b, 0));
                            return where(logical_and(inexact, signs_differ), add(q, 1), q);
                          });
}
Tensor minimum(const Tensor& a, const Tensor& b) { return Dispatch(OpId::kMinimum, {a, b}); }
Tensor maximum(const Tensor& a, const Tensor& b) { return Dispatch(OpId::kMaximum, {a, b}); }
Tensor clamp_min(const Tensor& x, Scalar min) { return WithScalar(OpId::kClampMin, x, min); }
Tensor clamp_max(const Tensor& x, Scalar max) { return WithScalar(OpId::kClampMax, x, max); }

Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  KILN_CHECK(min.has_value() || max.has_value(), "clamp: at least one of min and max must be ",
             "given (operand: ", x.defined() ? Describe(x.type()) : "undefined", ")");
  Tensor y = min ? clamp_min(x, *min) : x;
  return max ? clamp_max(y, *max) : y;
}

Tensor clamp(const Tensor& x, const Tensor& min, const Tensor& max) {
  KILN_CHECK(min.defined() || max.defined(), "clamp: at least one of min and max must be given");
  KILN_CHECK(x.defined(), "clamp: the input is an undefined tensor");
  Shape shape = x.shape();
  for (const Tensor* bound : {&min, &max}) {
    if (!bound->defined()) continue;
    const absl::StatusOr<Shape> b = BroadcastShapes(shape, bound->shape());
    KILN_CHECK(b.ok(), "clamp: the shapes of x ", x.shape_string(), ", min ",
               min.defined() ? min.shape_string() : "(none)", " and max ",
               max.defined() ? max.shape_string() : "(none)", " do not broadcast");
    shape = *b;
  }
  Tensor y = min.defined() ? maximum(x, min) : x;
  return max.defined() ? minimum(y, max) : y;
}

namespace {

// torch converts a Python number to a floating tensor's dtype before comparing.
Tensor CompareScalar(OpId id, const Tensor& x, Scalar s) {
  if (x.defined() && IsFloatingPoint(x.dtype())) {
    s = RoundToDType(x.dtype(), s.to_double());
  }
  return WithScalar(id, x, s);
}

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return Dispatch(OpId::kEq, {a, b}); }
Tensor ne(const Tensor& a, const Tensor& b) { return Dispatch(OpId::kNe, {a, b}); }
Tensor lt(const Tensor& a, const Tensor& b) { return Dispatch(OpId::kLt, {a, b}); }
Tensor le(const Tensor& a, const Tensor& b) { return Dispatch(OpId::kLe, {a, b}); }
Tensor gt(const Tensor& a, const Tensor& b) { return Dispatch(OpId::kGt, {a, b}); }
Tensor ge(const Tensor& a, const Tensor& b) { return Dispatch(OpId::kGe, {a, b}); }
Tensor eq(const Tensor& a, Scalar b) { return CompareScalar(OpId::kEqScalar, a, b); }
Tensor ne(const Tensor& a, Scalar b) { return CompareScalar(OpId::kNeScalar, a, b); }
Tensor lt(const Tensor& a, Scalar b) { return CompareScalar(OpId::kLtScalar, a, b); }
Tensor le(const Tensor& a, Scalar b) { return CompareScalar(OpId::kLeScalar, a, b); }
Tensor gt(const Tensor& a, Scalar b) { return CompareScalar(OpId::kGtScalar, a, b); }
Tensor ge(const Tensor& a, Scalar b) { return CompareScalar(OpId::kGeScalar, a, b); }
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator==(const Tensor& a, Scalar b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, Scalar b) { return ne(a, b); }
Tensor operator<(const Tensor& a, Scalar b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, Scalar b) { return le(a, b); }
Tensor operator>(const Tensor& a, Scalar b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, Scalar b) { return ge(a, b); }

}  // namespace kiln
