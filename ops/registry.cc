// The op registry table: one row per OpId. Everything that differs between ops lives here; the
// rest of kiln looks rows up by OpId and never switches on the op.
#include <array>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codegen/families/pointwise/elementwise_cuda.h"
#include "ops/attention.h"
#include "ops/collective_ops.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/typed_elementwise.h"
#include "ops/cuda/index_cuda.h"
#include "ops/cuda/matmul_cuda.h"
#include "ops/cuda/reduce_cuda.h"
#include "ops/custom_op.h"
#include "ops/infer.h"
#include "ops/op_def.h"
#include "ops/strided.h"
#include "ops/views.h"
#include "profiler/host.h"
#include "runtime/build_config.h"
#include "runtime/status.h"

namespace kiln {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double GeluOf(double x, GeluApprox approx) {
  if (approx == GeluApprox::kTanh) {
    return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
  }
  return 0.5 * x * (1.0 + std::erf(x * kInvSqrt2));
}

// Scalar functions of the elementwise rows: args are the operands, already read as double.
using A = const OpAttrs&;
double FNeg(const double* x, A) { return -x[0]; }
double FExp(const double* x, A) { return std::exp(x[0]); }
double FLog(const double* x, A) { return std::log(x[0]); }
double FSqrt(const double* x, A) { return std::sqrt(x[0]); }
double FRsqrt(const double* x, A) { return 1.0 / std::sqrt(x[0]); }
double FTanh(const double* x, A) { return std::tanh(x[0]); }
double FSigmoid(const double* x, A) { return Sigmoid(x[0]); }
double FRelu(const double* x, A) { return x[0] > 0 || std::isnan(x[0]) ? x[0] : 0.0; }
double FGelu(const double* x, A a) { return GeluOf(x[0], a.approximate); }
double FSilu(const double* x, A) { return x[0] * Sigmoid(x[0]); }
double FIdentity(const double* x, A) { return x[0]; }
double FAddScalar(const double* x, A a) { return x[0] + a.scalar.to_double(); }
double FSubScalar(const double* x, A a) { return x[0] - a.scalar.to_double(); }
double FRsubScalar(const double* x, A a) { return a.scalar.to_double() - x[0]; }
double FMulScalar(const double* x, A a) { return x[0] * a.scalar.to_double(); }
double FDivScalar(const double* x, A a) { return x[0] / a.scalar.to_double(); }
double FAdd(const double* x, A) { return x[0] + x[1]; }
double FSub(const double* x, A) { return x[0] - x[1]; }
double FMul(const double* x, A) { return x[0] * x[1]; }
double FDiv(const double* x, A) { return x[0] / x[1]; }
double FWhere(const double* x, A) { return x[0] != 0 ? x[1] : x[2]; }
double FMaskedFill(const double* x, A a) { return x[1] != 0 ? a.scalar.to_double() : x[0]; }
double FCopy(const double* x, A) { return x[1]; }
double FAbs(const double* x, A) { return std::fabs(x[0]); }
double FSin(const double* x, A) { return std::sin(x[0]); }
double FCos(const double* x, A) { return std::cos(x[0]); }
double FPow(const double* x, A) { return std::pow(x[0], x[1]); }
double FErf(const double* x, A) { return std::erf(x[0]); }
double FFloor(const double* x, A) { return std::floor(x[0]); }
double FCeil(const double* x, A) { return std::ceil(x[0]); }
double FRound(const double* x, A) { return std::nearbyint(x[0]); }  // (to nearest, ties even)
double FTrunc(const double* x, A) { return std::trunc(x[0]); }
double FLog1p(const double* x, A) { return std::log1p(x[0]); }
double FExpm1(const double* x, A) { return std::expm1(x[0]); }
double FTan(const double* x, A) { return std::tan(x[0]); }
double FAtan(const double* x, A) { return std::atan(x[0]); }
double FLog2(const double* x, A) { return std::log2(x[0]); }
double FLog10(const double* x, A) { return std::log10(x[0]); }
double FExp2(const double* x, A) { return std::exp2(x[0]); }
double FSinh(const double* x, A) { return std::sinh(x[0]); }
double FCosh(const double* x, A) { return std::cosh(x[0]); }
double FAsin(const double* x, A) { return std::asin(x[0]); }
double FAcos(const double* x, A) { return std::acos(x[0]); }
double FAsinh(const double* x, A) { return std::asinh(x[0]); }
double FAcosh(const double* x, A) { return std::acosh(x[0]); }
double FAtanh(const double* x, A) { return std::atanh(x[0]); }
double FAtan2(const double* x, A) { return std::atan2(x[0], x[1]); }
double FReciprocal(const double* x, A) { return 1.0 / x[0]; }
double FSign(const double* x, A) { return cpu::SignOp::Apply(x[0], 0.0); }
double FRemainder(const double* x, A) { return cpu::RemainderOp::Apply(x[0], x[1]); }
double FFmod(const double* x, A) { return cpu::FmodOp::Apply(x[0], x[1]); }
double FFloorDivide(const double* x, A) { return cpu::FloorDivideOp::Apply(x[0], x[1]); }
double FPowScalar(const double* x, A a) { return std::pow(x[0], a.scalar.to_double()); }
double Minimum(double p, double q) { return std::isnan(p) || p < q ? p : q; }
double Maximum(double p, double q) { return std::isnan(p) || p > q ? p : q; }
double FMinimum(const double* x, A) { return Minimum(x[0], x[1]); }
double FMaximum(const double* x, A) { return Maximum(x[0], x[1]); }
double FClampMin(const double* x, A a) {
  return std::isnan(a.scalar.to_double()) ? a.scalar.to_double()
                                          : Maximum(x[0], a.scalar.to_double());
}
double FClampMax(const double* x, A a) {
  return std::isnan(a.scalar.to_double()) ? a.scalar.to_double()
                                          : Minimum(x[0], a.scalar.to_double());
}
double FEq(const double* x, A) { return x[0] == x[1]; }
double FNe(const double* x, A) { return x[0] != x[1]; }
double FLt(const double* x, A) { return x[0] < x[1]; }
double FLe(const double* x, A) { return x[0] <= x[1]; }
double FGt(const double* x, A) { return x[0] > x[1]; }
double FGe(const double* x, A) { return x[0] >= x[1]; }
double FEqScalar(const double* x, A a) { return x[0] == a.scalar.to_double(); }
double FNeScalar(const double* x, A a) { return x[0] != a.scalar.to_double(); }
double FLtScalar(const double* x, A a) { return x[0] < a.scalar.to_double(); }
double FLeScalar(const double* x, A a) { return x[0] <= a.scalar.to_double(); }
double FGtScalar(const double* x, A a) { return x[0] > a.scalar.to_double(); }
double FGeScalar(const double* x, A a) { return x[0] >= a.scalar.to_double(); }

// Integer forms: two's-complement wrap-around (computed unsigned, so overflow is defined).
using I = const int64_t*;
int64_t Wrap(uint64_t v) { return static_cast<int64_t>(v); }
uint64_t U(int64_t v) { return static_cast<uint64_t>(v); }
uint64_t S(A a) { return U(ScalarAsInt64(a)); }
int64_t INeg(I x, A) { return Wrap(0 - U(x[0])); }
int64_t IRelu(I x, A) { return x[0] > 0 ? x[0] : 0; }
int64_t IIdentity(I x, A) { return x[0]; }
int64_t IAddScalar(I x, A a) { return Wrap(U(x[0]) + S(a)); }
int64_t ISubScalar(I x, A a) { return Wrap(U(x[0]) - S(a)); }
int64_t IRsubScalar(I x, A a) { return Wrap(S(a) - U(x[0])); }
int64_t IMulScalar(I x, A a) { return Wrap(U(x[0]) * S(a)); }
int64_t IAdd(I x, A) { return Wrap(U(x[0]) + U(x[1])); }
int64_t ISub(I x, A) { return Wrap(U(x[0]) - U(x[1])); }
int64_t IMul(I x, A) { return Wrap(U(x[0]) * U(x[1])); }
int64_t IWhere(I x, A) { return x[0] != 0 ? x[1] : x[2]; }
int64_t IMaskedFill(I x, A a) { return x[1] != 0 ? ScalarAsInt64(a) : x[0]; }

// A row's CUDA kernel: the backend's function, or none in a build without CUDA (no CUDA tensor
// exists there, so no row is asked for one).
#if KILN_WITH_CUDA
#define KILN_CUDA_KERNEL(fn) fn
#else
#define KILN_CUDA_KERNEL(fn) nullptr
#endif

constexpr auto kEw = FusionKind::kElementwise;
constexpr auto kBc = FusionKind::kBroadcast;
constexpr auto kRed = FusionKind::kReduction;
constexpr auto kMm = FusionKind::kMatmul;
constexpr auto kView = FusionKind::kView;
constexpr auto kOpq = FusionKind::kOpaque;

// An elementwise row: the CPU kernel is the generic loop over `fn`, the CUDA kernel is generated
// from `expr` (the same expression the fusion codegen emits).
// A binary broadcasting row's operands take their common dtype (OpDef::common_dtype_operands).
constexpr bool TakesCommonDType(int arity, FusionKind kind) {
  return arity == 2 && kind == FusionKind::kBroadcast;
}
constexpr OpDef Ew(OpId id, const char* name, int arity, FusionKind kind, uint32_t attrs,
                   InferFn infer, ScalarFn fn, std::string_view expr) {
  OpDef def{id,      name,  arity, arity,
            kind,    attrs, infer, cpu::Elementwise,
            nullptr, fn,    expr,  KILN_CUDA_KERNEL(cuda_ops::Elementwise)};
  def.common_dtype_operands = TakesCommonDType(arity, kind);
  return def;
}
// An elementwise row whose CPU kernel computes in the operands' common type (integers exactly,
// ops/cpu/typed_elementwise.h); fusion and the CUDA kernel use `fn` and `expr` as above.
constexpr OpDef TypedEw(OpId id, const char* name, int arity, FusionKind kind, uint32_t attrs,
                        InferFn infer, KernelFn cpu, ScalarFn fn, std::string_view expr) {
  OpDef def{id,    name, arity,   arity, kind, attrs,
            infer, cpu,  nullptr, fn,    expr, KILN_CUDA_KERNEL(cuda_ops::Elementwise)};
  def.common_dtype_operands = TakesCommonDType(arity, kind);
  return def;
}
// A binary broadcasting row whose second operand is not converted with the first: copy's src
// takes self's dtype, masked_fill's mask stays a mask.
constexpr OpDef OwnDTypeOperands(OpDef def) {
  def.common_dtype_operands = false;
  return def;
}

// An elementwise row that also computes exactly on integers (IntScalarFn).
constexpr OpDef EwInt(OpId id, const char* name, int arity, FusionKind kind, uint32_t attrs,
                      InferFn infer, ScalarFn fn, IntScalarFn int_fn, std::string_view expr) {
  OpDef def = Ew(id, name, arity, kind, attrs, infer, fn, expr);
  def.int_scalar = int_fn;
  return def;
}
constexpr OpDef Op(OpId id, const char* name, int min_in, int max_in, FusionKind kind,
                   uint32_t attrs, InferFn infer, KernelFn cpu, KernelFn cuda) {
  return OpDef{id, name, min_in, max_in, kind, attrs, infer, cpu, nullptr, nullptr, {}, cuda};
}
// A row whose CUDA kernel launches a shape-dependent number of kernels (OpDef::cuda_launches_vary).
constexpr OpDef VaryingLaunches(OpDef def) {
  def.cuda_launches_vary = true;
  return def;
}
// A row whose result is allocated heads-last (OpDef::heads_last_output).
constexpr OpDef HeadsLastOutput(OpDef def) {
  def.heads_last_output = true;
  return def;
}
// A row whose kernel updates self in place without copying it (OpDef::updates_self).
constexpr OpDef UpdatesSelf(OpDef def) {
  def.updates_self = true;
  return def;
}
// A collective over attrs.group (OpDef::collective): one kernel for every device, the group's.
constexpr OpDef Collective(OpId id, const char* name, uint32_t attrs, InferFn infer) {
  OpDef def = Op(id, name, 1, 1, kOpq, kAttrGroup | attrs, infer, collective::Run, collective::Run);
  def.collective = true;
  return def;
}
constexpr OpDef View(OpId id, const char* name, uint32_t attrs, InferFn infer, ViewFn view) {
  return OpDef{id, name, 1, 1, kView, attrs, infer, nullptr, view};
}

// pow's CUDA expression over any operand type (float, double, or long long where the renderer
// computes integers in integers): in double, rounded when base and exponent are integral, so
// that integer powers are exact while they fit in 2^53 (beyond, and for 0 ** negative, the
// conversion back to an integer saturates where torch wraps). An exact integer kernel needs a
// helper in the kernel prelude (kiln_pow); NVRTC compiles no lambdas here.
#define KILN_POW_EXPR(base, exponent)                                                            \
  "((" exponent ") >= 0 && (double)(" base ") == rint((double)(" base ")) && (double)(" exponent \
  ") == rint((double)(" exponent ")) ? rint(pow((double)(" base "), (double)(" exponent          \
  "))) : pow((double)(" base "), (double)(" exponent ")))"

using O = OpId;
// clang-format off
constexpr std::array<OpDef, kNumOps> kRows = {{
  EwInt(O::kNeg,  "neg",     1, kEw, 0, infer::UnarySame,  FNeg, INeg, "(-$0)"),
  Ew(O::kExp,     "exp",     1, kEw, 0, infer::UnaryFloat, FExp,     "expf($0)"),
  Ew(O::kLog,     "log",     1, kEw, 0, infer::UnaryFloat, FLog,     "logf($0)"),
  Ew(O::kSqrt,    "sqrt",    1, kEw, 0, infer::UnaryFloat, FSqrt,    "sqrtf($0)"),
  Ew(O::kRsqrt,   "rsqrt",   1, kEw, 0, infer::UnaryFloat, FRsqrt,   "rsqrtf($0)"),
  Ew(O::kTanh,    "tanh",    1, kEw, 0, infer::UnaryFloat, FTanh,    "tanhf($0)"),
  Ew(O::kSigmoid, "sigmoid", 1, kEw, 0, infer::UnaryFloat, FSigmoid, "kiln_sigmoid($0)"),
  EwInt(O::kRelu, "relu",    1, kEw, 0, infer::UnarySame,  FRelu, IRelu, "kiln_relu($0)"),
  Ew(O::kGelu,    "gelu",    1, kEw, kAttrApproximate, infer::UnaryFloatOnly, FGelu,
     "kiln_gelu($0, $approximate)"),
  Ew(O::kSilu,    "silu",    1, kEw, 0, infer::UnaryFloatOnly, FSilu,    "kiln_silu($0)"),
  EwInt(O::kCast, "cast",    1, kEw, kAttrDType, infer::Cast, FIdentity, IIdentity, "$0"),
  EwInt(O::kAddScalar,  "add_scalar",  1, kEw, kAttrScalar, infer::ScalarArith, FAddScalar,  IAddScalar,  "($0 + $scalar)"),
  EwInt(O::kSubScalar,  "sub_scalar",  1, kEw, kAttrScalar, infer::SubtractScalar, FSubScalar,  ISubScalar,  "($0 - $scalar)"),
  EwInt(O::kRsubScalar, "rsub_scalar", 1, kEw, kAttrScalar, infer::SubtractScalar, FRsubScalar, IRsubScalar, "($scalar - $0)"),
  EwInt(O::kMulScalar,  "mul_scalar",  1, kEw, kAttrScalar, infer::ScalarArith, FMulScalar,  IMulScalar,  "($0 * $scalar)"),
  Ew(O::kDivScalar,  "div_scalar",  1, kEw, kAttrScalar, infer::ScalarDiv,   FDivScalar,  "($0 / $scalar)"),
  EwInt(O::kAdd, "add",   2, kBc, 0, infer::Binary,    FAdd, IAdd, "($0 + $1)"),
  EwInt(O::kSub, "sub",   2, kBc, 0, infer::Subtract,  FSub, ISub, "($0 - $1)"),
  EwInt(O::kMul, "mul",   2, kBc, 0, infer::Binary,    FMul, IMul, "($0 * $1)"),
  Ew(O::kDiv,   "div",   2, kBc, 0, infer::BinaryDiv, FDiv,   "($0 / $1)"),
  EwInt(O::kWhere, "where", 3, kBc, 0, infer::Where, FWhere, IWhere, "($0 != 0.f ? $1 : $2)"),
  OwnDTypeOperands(EwInt(O::kMaskedFill, "masked_fill", 2, kBc, kAttrScalar, infer::MaskedFill,
                         FMaskedFill, IMaskedFill, "($1 != 0.f ? $scalar : $0)")),
  OwnDTypeOperands(Ew(O::kCopy,  "copy",  2, kBc, 0, infer::Copy,      FCopy,  "$1")),
  Op(O::kSum,  "sum",  1, 1, kRed, kAttrDims | kAttrKeepdim, infer::ReduceSum,  cpu::Sum, KILN_CUDA_KERNEL(cuda_ops::Sum)),
  Op(O::kMean, "mean", 1, 1, kRed, kAttrDims | kAttrKeepdim, infer::ReduceMean, cpu::Mean, KILN_CUDA_KERNEL(cuda_ops::Mean)),
  Op(O::kMax,  "max",  1, 1, kRed, kAttrDims | kAttrKeepdim, infer::Reduce,     cpu::Max, KILN_CUDA_KERNEL(cuda_ops::Max)),
  Op(O::kProd, "prod", 1, 1, kRed, kAttrDims | kAttrKeepdim, infer::ReduceSum,  cpu::Prod, KILN_CUDA_KERNEL(cuda_ops::Prod)),
  Op(O::kSoftmax,    "softmax",     1, 1, kRed, kAttrDim, infer::Softmax, cpu::Softmax, KILN_CUDA_KERNEL(cuda_ops::Softmax)),
  Op(O::kLogSoftmax, "log_softmax", 1, 1, kRed, kAttrDim, infer::Softmax, cpu::LogSoftmax, KILN_CUDA_KERNEL(cuda_ops::LogSoftmax)),
  Op(O::kLayerNorm,  "layer_norm",  1, 3, kRed, kAttrEps, infer::LayerNorm, cpu::LayerNorm, KILN_CUDA_KERNEL(cuda_ops::LayerNorm)),
  Op(O::kRmsNorm,    "rms_norm",    1, 2, kRed, kAttrEps, infer::RmsNorm, cpu::RmsNorm, KILN_CUDA_KERNEL(cuda_ops::RmsNorm)),
  VaryingLaunches(Op(O::kMatmul, "matmul", 2, 2, kMm, kAttrTranspose, infer::Matmul, cpu::Matmul, KILN_CUDA_KERNEL(cuda_ops::Matmul))),
  VaryingLaunches(Op(O::kLinear, "linear", 2, 4, kMm, kAttrEpilogue,  infer::Linear, cpu::Linear, KILN_CUDA_KERNEL(cuda_ops::Linear))),
  View(O::kTranspose, "transpose", kAttrDim | kAttrDim2, infer::Transpose, views::Transpose),
  View(O::kPermute,   "permute",   kAttrDims,            infer::Permute,   views::Permute),
  View(O::kReshape,   "reshape",   kAttrDims,            infer::Reshape,   views::Reshape),
  View(O::kExpand,    "expand",    kAttrDims,            infer::Expand,    views::Expand),
  View(O::kSlice,     "slice",     kAttrDim | kAttrSlice, infer::Slice,    views::Slice),
  View(O::kUnsqueeze, "unsqueeze", kAttrDim,             infer::Unsqueeze, views::Unsqueeze),
  View(O::kSqueeze,   "squeeze",   kAttrDim | kAttrAllDims, infer::Squeeze, views::Squeeze),
  Op(O::kContiguous, "contiguous", 1, 1, kOpq, 0, infer::Same, cpu::Copy, KILN_CUDA_KERNEL(cuda_ops::Copy)),
  Op(O::kTriu, "triu", 1, 1, kOpq, kAttrDiagonal, infer::TriMask, cpu::Triu, KILN_CUDA_KERNEL(cuda_ops::Triu)),
  Op(O::kTril, "tril", 1, 1, kOpq, kAttrDiagonal, infer::TriMask, cpu::Tril, KILN_CUDA_KERNEL(cuda_ops::Tril)),
  Op(O::kAsStrided, "as_strided", 1, 1, kOpq, kAttrDims | kAttrStrided, infer::AsStrided,
     strided::AsStrided, strided::AsStrided),
  UpdatesSelf(Op(O::kAsStridedScatter, "as_strided_scatter", 2, 2, kOpq, kAttrDims | kAttrStrided,
                 infer::AsStridedScatter, strided::AsStridedScatter, strided::AsStridedScatter)),
  HeadsLastOutput(VaryingLaunches(Op(O::kScaledDotProductAttention, "scaled_dot_product_attention",
                                     3, 4, kOpq, kAttrAttention, attention::Infer,
                                     attention::CpuKernel, KILN_CUDA_KERNEL(attention::CudaKernel)))),
  // Typed rows: the expressions stay valid whatever the operands' compute type (float, double,
  // or long long where the renderer computes integers in integers): NaN propagates through
  // minimum/maximum/clamp, clamp's scalar takes the operand's type, pow is KILN_POW_EXPR.
  TypedEw(O::kAbs, "abs", 1, kEw, 0, infer::UnarySame, cpu::TypedElementwise<cpu::AbsOp>, FAbs,
          "(($0) < 0 ? -($0) : ($0) + 0)"),
  Ew(O::kSin, "sin", 1, kEw, 0, infer::UnaryFloat, FSin, "sinf($0)"),
  Ew(O::kCos, "cos", 1, kEw, 0, infer::UnaryFloat, FCos, "cosf($0)"),
  Ew(O::kErf, "erf", 1, kEw, 0, infer::UnaryFloat, FErf, "erff($0)"),
  TypedEw(O::kFloor, "floor", 1, kEw, 0, infer::UnarySame, cpu::TypedElementwise<cpu::FloorOp>,
          FFloor, "kiln_floor($0)"),
  TypedEw(O::kCeil, "ceil", 1, kEw, 0, infer::UnarySame, cpu::TypedElementwise<cpu::CeilOp>,
          FCeil, "kiln_ceil($0)"),
  TypedEw(O::kRound, "round", 1, kEw, 0, infer::UnarySame, cpu::TypedElementwise<cpu::RoundOp>,
          FRound, "kiln_round($0)"),
  TypedEw(O::kTrunc, "trunc", 1, kEw, 0, infer::UnarySame, cpu::TypedElementwise<cpu::TruncOp>,
          FTrunc, "kiln_trunc($0)"),
  Ew(O::kLog1p, "log1p", 1, kEw, 0, infer::UnaryFloat, FLog1p, "log1pf($0)"),
  Ew(O::kExpm1, "expm1", 1, kEw, 0, infer::UnaryFloat, FExpm1, "expm1f($0)"),
  Ew(O::kTan, "tan", 1, kEw, 0, infer::UnaryFloat, FTan, "tanf($0)"),
  Ew(O::kAtan, "atan", 1, kEw, 0, infer::UnaryFloat, FAtan, "atanf($0)"),
  Ew(O::kLog2, "log2", 1, kEw, 0, infer::UnaryFloat, FLog2, "log2f($0)"),
  Ew(O::kLog10, "log10", 1, kEw, 0, infer::UnaryFloat, FLog10, "log10f($0)"),
  Ew(O::kExp2, "exp2", 1, kEw, 0, infer::UnaryFloat, FExp2, "exp2f($0)"),
  Ew(O::kSinh, "sinh", 1, kEw, 0, infer::UnaryFloat, FSinh, "sinhf($0)"),
  Ew(O::kCosh, "cosh", 1, kEw, 0, infer::UnaryFloat, FCosh, "coshf($0)"),
  Ew(O::kAsin, "asin", 1, kEw, 0, infer::UnaryFloat, FAsin, "asinf($0)"),
  Ew(O::kAcos, "acos", 1, kEw, 0, infer::UnaryFloat, FAcos, "acosf($0)"),
  Ew(O::kAsinh, "asinh", 1, kEw, 0, infer::UnaryFloat, FAsinh, "asinhf($0)"),
  Ew(O::kAcosh, "acosh", 1, kEw, 0, infer::UnaryFloat, FAcosh, "acoshf($0)"),
  Ew(O::kAtanh, "atanh", 1, kEw, 0, infer::UnaryFloat, FAtanh, "atanhf($0)"),
  Ew(O::kAtan2, "atan2", 2, kBc, 0, infer::BinaryDiv, FAtan2, "atan2f($0, $1)"),
  Ew(O::kReciprocal, "reciprocal", 1, kEw, 0, infer::UnaryFloat, FReciprocal, "(1.f / ($0))"),
  TypedEw(O::kSign, "sign", 1, kEw, 0, infer::Same, cpu::TypedElementwise<cpu::SignOp>, FSign,
          "((($0) > 0) - (($0) < 0))"),
  TypedEw(O::kRemainder, "remainder", 2, kBc, 0, infer::BinaryNumeric,
          cpu::TypedElementwise<cpu::RemainderOp>, FRemainder, "kiln_remainder($0, $1)"),
  TypedEw(O::kFmod, "fmod", 2, kBc, 0, infer::BinaryNumeric,
          cpu::TypedElementwise<cpu::FmodOp>, FFmod, "kiln_fmod($0, $1)"),
  TypedEw(O::kFloorDivide, "floor_divide", 2, kBc, 0, infer::BinaryNumeric,
          cpu::TypedElementwise<cpu::FloorDivideOp>, FFloorDivide, "kiln_floor_divide($0, $1)"),
  TypedEw(O::kPowScalar, "pow_scalar", 1, kEw, kAttrScalar, infer::PowScalar,
          cpu::TypedElementwise<cpu::PowOp>, FPowScalar, KILN_POW_EXPR("$0", "$scalar")),
  TypedEw(O::kClampMin, "clamp_min", 1, kEw, kAttrScalar, infer::ClampScalar,
          cpu::TypedElementwise<cpu::ClampMinOp>, FClampMin,
          "(($0) != ($0) ? ($0) : (($0) < $scalar || $scalar != $scalar) ? (decltype(($0) + 0))$scalar : ($0))"),
  TypedEw(O::kClampMax, "clamp_max", 1, kEw, kAttrScalar, infer::ClampScalar,
          cpu::TypedElementwise<cpu::ClampMaxOp>, FClampMax,
          "(($0) != ($0) ? ($0) : (($0) > $scalar || $scalar != $scalar) ? (decltype(($0) + 0))$scalar : ($0))"),
  TypedEw(O::kEqScalar, "eq_scalar", 1, kEw, kAttrScalar, infer::CompareScalar, cpu::TypedElementwise<cpu::EqOp>, FEqScalar, "(($0) == $scalar)"),
  TypedEw(O::kNeScalar, "ne_scalar", 1, kEw, kAttrScalar, infer::CompareScalar, cpu::TypedElementwise<cpu::NeOp>, FNeScalar, "(($0) != $scalar)"),
  TypedEw(O::kLtScalar, "lt_scalar", 1, kEw, kAttrScalar, infer::CompareScalar, cpu::TypedElementwise<cpu::LtOp>, FLtScalar, "(($0) < $scalar)"),
  TypedEw(O::kLeScalar, "le_scalar", 1, kEw, kAttrScalar, infer::CompareScalar, cpu::TypedElementwise<cpu::LeOp>, FLeScalar, "(($0) <= $scalar)"),
  TypedEw(O::kGtScalar, "gt_scalar", 1, kEw, kAttrScalar, infer::CompareScalar, cpu::TypedElementwise<cpu::GtOp>, FGtScalar, "(($0) > $scalar)"),
  TypedEw(O::kGeScalar, "ge_scalar", 1, kEw, kAttrScalar, infer::CompareScalar, cpu::TypedElementwise<cpu::GeOp>, FGeScalar, "(($0) >= $scalar)"),
  TypedEw(O::kPow, "pow", 2, kBc, 0, infer::Pow, cpu::TypedElementwise<cpu::PowOp>, FPow,
          KILN_POW_EXPR("$0", "$1")),
  TypedEw(O::kMinimum, "minimum", 2, kBc, 0, infer::MinMax, cpu::TypedElementwise<cpu::MinimumOp>, FMinimum,
          "(($0) != ($0) || ($0) < ($1) ? ($0) : ($1))"),
  TypedEw(O::kMaximum, "maximum", 2, kBc, 0, infer::MinMax, cpu::TypedElementwise<cpu::MaximumOp>, FMaximum,
          "(($0) != ($0) || ($0) > ($1) ? ($0) : ($1))"),
  TypedEw(O::kEq, "eq", 2, kBc, 0, infer::Compare, cpu::TypedElementwise<cpu::EqOp>, FEq, "(($0) == ($1))"),
  TypedEw(O::kNe, "ne", 2, kBc, 0, infer::Compare, cpu::TypedElementwise<cpu::NeOp>, FNe, "(($0) != ($1))"),
  TypedEw(O::kLt, "lt", 2, kBc, 0, infer::Compare, cpu::TypedElementwise<cpu::LtOp>, FLt, "(($0) < ($1))"),
  TypedEw(O::kLe, "le", 2, kBc, 0, infer::Compare, cpu::TypedElementwise<cpu::LeOp>, FLe, "(($0) <= ($1))"),
  TypedEw(O::kGt, "gt", 2, kBc, 0, infer::Compare, cpu::TypedElementwise<cpu::GtOp>, FGt, "(($0) > ($1))"),
  TypedEw(O::kGe, "ge", 2, kBc, 0, infer::Compare, cpu::TypedElementwise<cpu::GeOp>, FGe, "(($0) >= ($1))"),
  Op(O::kEmbedding, "embedding", 2, 2, kOpq, 0, infer::Embedding, cpu::Embedding, KILN_CUDA_KERNEL(cuda_ops::Embedding)),
  Op(O::kIndexSelect, "index_select", 2, 2, kOpq, kAttrDim, infer::IndexSelect, cpu::IndexSelect, KILN_CUDA_KERNEL(cuda_ops::IndexSelect)),
  Op(O::kGather, "gather", 2, 2, kOpq, kAttrDim, infer::Gather, cpu::Gather, KILN_CUDA_KERNEL(cuda_ops::Gather)),
  Op(O::kCat, "cat", 1, kMaxCatInputs, kOpq, kAttrDim, infer::Cat, cpu::Cat, KILN_CUDA_KERNEL(cuda_ops::Cat)),
  VaryingLaunches(Op(O::kArgMax, "argmax", 1, 1, kRed, kAttrDims | kAttrKeepdim, infer::ArgMax, cpu::ArgMax, KILN_CUDA_KERNEL(cuda_ops::ArgMax))),
  Op(O::kTopK, "topk", 1, 1, kOpq, kAttrDim | kAttrTopK, infer::TopK, cpu::TopK, KILN_CUDA_KERNEL(cuda_ops::TopK)),
  Op(O::kCumsum, "cumsum", 1, 1, kOpq, kAttrDim, infer::Cumsum, cpu::Cumsum, KILN_CUDA_KERNEL(cuda_ops::Cumsum)),
  UpdatesSelf(Op(O::kIndexCopy, "index_copy", 3, 3, kOpq, kAttrDim, infer::IndexCopy, cpu::IndexCopy, KILN_CUDA_KERNEL(cuda_ops::IndexCopy))),
  UpdatesSelf(Op(O::kScatter, "scatter", 3, 3, kOpq, kAttrDim, infer::Scatter, cpu::Scatter, KILN_CUDA_KERNEL(cuda_ops::Scatter))),
  UpdatesSelf(Op(O::kScatterAdd, "scatter_add", 3, 3, kOpq, kAttrDim, infer::Scatter, cpu::ScatterAdd, KILN_CUDA_KERNEL(cuda_ops::ScatterAdd))),
  Collective(O::kAllReduce, "all_reduce", kAttrReduce, collective::InferAllReduce),
  Collective(O::kAllGather, "all_gather", 0, collective::InferAllGather),
  Collective(O::kReduceScatter, "reduce_scatter", kAttrReduce, collective::InferReduceScatter),
  Collective(O::kBroadcast, "broadcast", kAttrSrc, collective::InferBroadcast),
}};
// clang-format on

constexpr bool RowsInEnumOrder() {
  for (int i = 0; i < kNumOps; ++i) {
    if (static_cast<int>(kRows[i].id) != i) return false;
  }
  return true;
}
static_assert(RowsInEnumOrder(), "registry rows must follow the OpId enum, one row per op");

[[noreturn, gnu::noinline, gnu::cold]] void ThrowNoOp(int i) {
  throw Error(absl::InvalidArgumentError(
      absl::StrCat("no op with id ", i, " (the registry has ", kNumOps,
                   " built-in ops and the custom ops registered so far)")));
}

}  // namespace

const OpDef& GetOpDef(OpId id) {
  const int i = static_cast<int>(id);
  if (KILN_PREDICT_FALSE(i < 0 || i >= kNumOps)) {
    if (const OpDef* row = CustomOpRow(id)) return *row;  // ops/custom_op.h
    ThrowNoOp(i);
  }
  return kRows[i];
}

bool UsesIntegerPath(const OpDef& def, absl::Span<const DType> inputs, DType out) {
  if (def.int_scalar == nullptr || IsFloatingPoint(out)) return false;
  for (DType t : inputs) {
    if (IsFloatingPoint(t)) return false;
  }
  return true;
}

const OpDef* FindOpDef(std::string_view name) {
  for (const OpDef& def : kRows) {
    if (name == def.name) return &def;
  }
  return FindCustomOpRow(name);
}

const char* EpilogueName(Epilogue e) {
  static constexpr const char* kNames[kNumEpilogues] = {"none", "relu", "gelu_tanh", "add"};
  return kNames[static_cast<int>(e)];
}

const char* ReduceOpName(ReduceOp op) {
  static constexpr const char* kNames[kNumReduceOps] = {"sum", "max"};
  return kNames[static_cast<int>(op)];
}

const OpDef* EpilogueActivation(Epilogue e, OpAttrs* attrs) {
  *attrs = OpAttrs{};
  switch (e) {
    case Epilogue::kNone:
    case Epilogue::kAdd:
      return nullptr;
    case Epilogue::kRelu:
      return &GetOpDef(OpId::kRelu);
    case Epilogue::kGeluTanh:
      attrs->approximate = GeluApprox::kTanh;
      return &GetOpDef(OpId::kGelu);
  }
  return nullptr;
}

const char* FusionKindName(FusionKind k) {
  static constexpr const char* kNames[] = {"elementwise", "broadcast", "reduction",
                                           "matmul",      "view",      "opaque"};
  return kNames[static_cast<int>(k)];
}

}  // namespace kiln
