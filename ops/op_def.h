// The op registry: one OpDef row per op, used by eager execution, tracing, passes and codegen.
//
// A row holds the op's name, arity, fusion kind, its shape/dtype inference (`infer`, shared by
// eager and graph mode so they can never disagree), its kernels per device, and for elementwise
// ops the scalar function (the CPU oracle and the compiled-mode CPU evaluator) and the CUDA
// expression the fusion codegen emits. Adding an op means adding one enum value and one row in
// ops/registry.cc; a static_assert keeps the two in step.
//
//   const OpDef& def = GetOpDef(OpId::kGelu);
//   StatusOr<TensorType> t = def.infer(input_types, attrs);
#pragma once

#include <cstdint>
#include <string_view>
#include <tuple>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/scalar.h"
#include "runtime/tensor.h"

namespace kiln {

enum class OpId : uint16_t {
  // elementwise, one input
  kNeg,
  kExp,
  kLog,
  kSqrt,
  kRsqrt,
  kTanh,
  kSigmoid,
  kRelu,
  kGelu,
  kSilu,
  kCast,
  kAddScalar,
  kSubScalar,
  kRsubScalar,
  kMulScalar,
  kDivScalar,
  // elementwise with broadcasting
  kAdd,
  kSub,
  kMul,
  kDiv,
  kWhere,
  kMaskedFill,
  kCopy,  // copy(self, src): src broadcast to self's shape, in self's dtype (copy_'s row)
  // reductions and normalisations
  kSum,
  kMean,
  kMax,
  kProd,  // products (integers and bools in int64, as sum)
  kSoftmax,
  kLogSoftmax,
  kLayerNorm,
  kRmsNorm,
  // matrix products
  kMatmul,
  kLinear,
  // views (metadata only)
  kTranspose,
  kPermute,
  kReshape,
  kExpand,
  kSlice,
  kUnsqueeze,
  kSqueeze,
  // others
  kContiguous,
  kTriu,
  kTril,
  kAsStrided,         // a strided window of a tensor's contiguous layout, as a fresh tensor
  kAsStridedScatter,  // the base with src written into such a window (functional in-place)
  kScaledDotProductAttention,
  // elementwise math and comparisons (exact on integers: ops/cpu/typed_elementwise.h)
  kAbs,
  kSin,
  kCos,
  kErf,
  kFloor,  // floor/ceil/round/trunc: integers pass unchanged
  kCeil,
  kRound,  // half to even, as torch.round
  kTrunc,
  kLog1p,
  kExpm1,
  kTan,
  kAtan,
  kLog2,
  kLog10,
  kExp2,
  kSinh,
  kCosh,
  kAsin,
  kAcos,
  kAsinh,
  kAcosh,
  kAtanh,
  kAtan2,  // atan2(y, x): the angle of (x, y), quadrant-aware
  kReciprocal,
  kSign,         // -1, 0 or 1 (0 for NaN, as torch); bool passes unchanged
  kRemainder,    // Python's %: the divisor's sign
  kFmod,         // C's fmod: the dividend's sign
  kFloorDivide,  // the quotient rounded down
  kPowScalar,
  kClampMin,  // clamp(x, min) = max(x, min) with a scalar bound
  kClampMax,
  kEqScalar,
  kNeScalar,
  kLtScalar,
  kLeScalar,
  kGtScalar,
  kGeScalar,
  kPow,
  kMinimum,
  kMaximum,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  // indexing, joining and selection
  kEmbedding,
  kIndexSelect,
  kGather,
  kCat,
  kArgMax,
  kTopK,        // the indices of the k largest (or smallest); values are a gather of them
  kCumsum,      // running sums along a dim
  kIndexCopy,   // index_copy(self, index, source){dim}: self with rows index[i] = source row i
  kScatter,     // scatter(self, index, src){dim}: self with out[..index[i]..] = src[i] (torch's)
  kScatterAdd,  // the same with += (repeated indices accumulate)
  // collectives over a process group (ops/distributed.h), functional: a fresh result
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kNumOps  // must stay last
};
inline constexpr int kNumOps = static_cast<int>(OpId::kNumOps);
inline constexpr int kMaxCatInputs = 1024;  // cat's arity limit

// How passes treat an op (TVM's TOpPattern): fusion keys on this alone.
enum class FusionKind : uint8_t { kElementwise, kBroadcast, kReduction, kMatmul, kView, kOpaque };
const char* FusionKindName(FusionKind k);

enum class GeluApprox : uint8_t { kNone, kTanh };

// What linear applies after its bias in the same GEMM (cuBLASLt's epilogue), set by the GEMM
// epilogue fusion pass; eager linear() never sets it. kRelu and kGeluTanh are activations
// (kGeluTanh is gelu{approximate=tanh}). kAdd adds a residual, linear's last input, of the
// output's shape and dtype: linear(x, w[, bias], residual){epilogue=add} = x·wᵀ + bias + residual
// (cuBLASLt's C with beta = 1), rounded once.
enum class Epilogue : uint8_t { kNone, kRelu, kGeluTanh, kAdd };
inline constexpr int kNumEpilogues = 4;
const char* EpilogueName(Epilogue e);  // "none", "relu", "gelu_tanh", "add" (the IR text form)

// How a collective combines the ranks' tensors (all_reduce, reduce_scatter).
enum class ReduceOp : uint8_t { kSum, kMax };
inline constexpr int kNumReduceOps = 2;
const char* ReduceOpName(ReduceOp op);  // "sum", "max" (the IR text form)

// Attributes of an op call. Each row says which fields it reads (OpDef::attr_fields) so the IR
// can print and parse exactly those.
struct OpAttrs {
  Scalar scalar;                         // the scalar of *_scalar ops, masked_fill's value
  double eps = 1e-5;                     // layer_norm / rms_norm
  int64_t dim = 0;                       // softmax, transpose (first), slice, unsqueeze/squeeze
  int64_t dim2 = 0;                      // transpose (second)
  int64_t start = 0, end = 0, step = 1;  // slice
  int64_t diagonal = 0;                  // triu / tril
  Shape dims;             // reduction dims (empty = all), permute order, reshape/expand sizes
  bool keepdim = false;   // reductions
  bool all_dims = false;  // squeeze every size-1 dim
  bool transpose_a = false, transpose_b = false;  // matmul operands as GEMM flags
  GeluApprox approximate = GeluApprox::kNone;
  DType dtype = DType::kFloat32;        // cast
  Epilogue epilogue = Epilogue::kNone;  // linear
  Strides strides;                      // as_strided(_scatter): the window (sizes in dims)
  int64_t offset = 0;                   //   and its element offset

  // scaled_dot_product_attention: the scale (always resolved; the API's default is 1/sqrt(E))
  double scale = 0;
  bool is_causal = false, enable_gqa = false;
  int64_t k = 0;        // topk
  bool largest = true;  // topk
  // collectives: the process group by its id (ProcessGroup::id(), never reused in a process),
  // how all_reduce and reduce_scatter combine, broadcast's source rank
  int64_t group = 0;
  ReduceOp reduce = ReduceOp::kSum;
  int64_t src = 0;
  friend bool operator==(const OpAttrs&, const OpAttrs&) = default;
};

// Bits of OpDef::attr_fields.
enum AttrField : uint32_t {
  kAttrScalar = 1u << 0,
  kAttrEps = 1u << 1,
  kAttrDim = 1u << 2,
  kAttrDim2 = 1u << 3,
  kAttrSlice = 1u << 4,
  kAttrDiagonal = 1u << 5,
  kAttrDims = 1u << 6,
  kAttrKeepdim = 1u << 7,
  kAttrAllDims = 1u << 8,
  kAttrTranspose = 1u << 9,
  kAttrApproximate = 1u << 10,
  kAttrDType = 1u << 11,
  kAttrEpilogue = 1u << 12,
  kAttrStrided = 1u << 13,    // strides, offset (with kAttrDims: the sizes)
  kAttrAttention = 1u << 14,  // scale, is_causal, enable_gqa
  kAttrTopK = 1u << 15,       // k and largest
  kAttrGroup = 1u << 16,      // collectives' process group
  kAttrReduce = 1u << 17,     // all_reduce's and reduce_scatter's combination
  kAttrSrc = 1u << 18,        // broadcast's source rank
};

// ---- The attribute table -------------------------------------------------------------------
// Every attribute once: its name in the IR text, the OpDef::attr_fields bit that declares it, its
// member, and whether the text shows it only when it differs from OpAttrs{}'s value. The printer,
// the parser, the kernel-cache key and the eager kernels' memo comparison are derived from this
// list (in this order); ops/kernel_ir.cc checks that it names every field of OpAttrs. A new
// attribute is its field above plus one row here.
template <typename T>
struct AttrRow {
  const char* key;
  uint32_t field;
  T OpAttrs::*member;
  bool only_if_set = false;
};
inline constexpr auto kAttrRows =
    std::make_tuple(AttrRow<Scalar>{"scalar", kAttrScalar, &OpAttrs::scalar},
                    AttrRow<double>{"eps", kAttrEps, &OpAttrs::eps},
                    AttrRow<int64_t>{"dim", kAttrDim, &OpAttrs::dim},
                    AttrRow<int64_t>{"dim2", kAttrDim2, &OpAttrs::dim2},
                    AttrRow<int64_t>{"start", kAttrSlice, &OpAttrs::start},
                    AttrRow<int64_t>{"end", kAttrSlice, &OpAttrs::end},
                    AttrRow<int64_t>{"step", kAttrSlice, &OpAttrs::step},
                    AttrRow<int64_t>{"diagonal", kAttrDiagonal, &OpAttrs::diagonal},
                    AttrRow<Shape>{"dims", kAttrDims, &OpAttrs::dims},
                    AttrRow<bool>{"keepdim", kAttrKeepdim, &OpAttrs::keepdim},
                    AttrRow<bool>{"all_dims", kAttrAllDims, &OpAttrs::all_dims, true},
                    AttrRow<bool>{"transpose_a", kAttrTranspose, &OpAttrs::transpose_a, true},
                    AttrRow<bool>{"transpose_b", kAttrTranspose, &OpAttrs::transpose_b, true},
                    AttrRow<GeluApprox>{"approximate", kAttrApproximate, &OpAttrs::approximate},
                    AttrRow<DType>{"dtype", kAttrDType, &OpAttrs::dtype},
                    AttrRow<Strides>{"strides", kAttrStrided, &OpAttrs::strides},
                    AttrRow<int64_t>{"offset", kAttrStrided, &OpAttrs::offset},
                    AttrRow<int64_t>{"k", kAttrTopK, &OpAttrs::k},
                    AttrRow<bool>{"largest", kAttrTopK, &OpAttrs::largest},
                    AttrRow<Epilogue>{"epilogue", kAttrEpilogue, &OpAttrs::epilogue, true},
                    AttrRow<double>{"scale", kAttrAttention, &OpAttrs::scale},
                    AttrRow<bool>{"is_causal", kAttrAttention, &OpAttrs::is_causal, true},
                    AttrRow<bool>{"enable_gqa", kAttrAttention, &OpAttrs::enable_gqa, true},
                    AttrRow<int64_t>{"group", kAttrGroup, &OpAttrs::group},
                    AttrRow<ReduceOp>{"reduce", kAttrReduce, &OpAttrs::reduce},
                    AttrRow<int64_t>{"src", kAttrSrc, &OpAttrs::src});
inline constexpr int kNumAttrRows = std::tuple_size_v<decltype(kAttrRows)>;

// Calls f(row) for every row of the table, in order.
template <typename F>
constexpr void ForEachAttrRow(F&& f) {
  std::apply([&f](const auto&... row) { (f(row), ...); }, kAttrRows);
}

struct OpDef;
using InferFn = absl::StatusOr<TensorType> (*)(absl::Span<const TensorType> inputs,
                                               const OpAttrs& attrs);
// Computes `out` (already allocated with the inferred type, or an in-place target) from inputs.
using KernelFn = void (*)(const OpDef& def, absl::Span<const Tensor> inputs, const Tensor& out,
                          const OpAttrs& attrs);
// Builds the output of a view op over the input's storage (no data moves).
using ViewFn = Tensor (*)(const Tensor& input, const TensorType& out, const OpAttrs& attrs);
// The scalar function of an elementwise op, on values already read as double.
using ScalarFn = double (*)(const double* args, const OpAttrs& attrs);
// The same on integers, for rows that keep integer dtypes (add, mul, neg, where, ...): when the
// output and every operand are integer or bool, kernels compute in int64 with two's-complement
// wrap-around (torch's integer semantics) instead of through double. The scalar attribute is
// attrs.scalar as an int64 (ScalarAsInt64).
using IntScalarFn = int64_t (*)(const int64_t* args, const OpAttrs& attrs);

struct OpDef {
  OpId id;
  const char* name;
  int min_inputs, max_inputs;
  FusionKind kind;
  uint32_t attr_fields;
  InferFn infer;
  KernelFn cpu = nullptr;     // CPU reference kernel (nullptr for views)
  ViewFn view = nullptr;      // views only
  ScalarFn scalar = nullptr;  // elementwise only
  // Elementwise only: the CUDA expression over the operands $0, $1, ... and the attributes $scalar
  // and $approximate, computed in float, or in long long for integer operands and results
  // (ops/cuda/kernel_render.cc).
  std::string_view cuda_expr;
  KernelFn cuda = nullptr;           // the CUDA kernel (nullptr: none)
  IntScalarFn int_scalar = nullptr;  // elementwise rows with an exact integer form
  // The CUDA kernel's launches (kernels, memsets) depend on the shapes (cuBLASLt's split-K,
  // attention's split-key decode, argmax over few long rows): a compiled plan counts them by
  // capturing one call (codegen/launch_count.h) instead of counting one kernel.
  bool cuda_launches_vary = false;
  // Given out == inputs[0] (an in-place call), the kernel writes only what changes (index_copy_
  // writes its rows, as_strided_scatter its window) instead of all of self: a compiled plan runs
  // such a node in place on an input the function writes anyway (codegen/executable.h), and out of
  // place its CUDA kernel launches once more (the copy of self into out).
  bool updates_self = false;
  // The result [..., H, L, E] (rank >= 3) is allocated as [..., L, H, E] and viewed back, as
  // torch's flash and cuDNN attention return it: its transpose(-3, -2) is contiguous, so merging
  // the heads (reshape to [..., L, H·E]) is a view instead of a copy. Kernels write through the
  // strides (NewOutput).
  bool heads_last_output = false;
  // A collective (ops/distributed.h): it talks to the other ranks of its group, so passes never
  // run it at compile time (constant folding), drop it when its result is unused (dead-code
  // elimination) or merge two calls of it (common subexpressions), and every rank's plan must
  // issue the same ones in the same order (one trace of the same program does).
  bool collective = false;
  // A binary elementwise row whose operands torch converts to their common dtype
  // (infer::ResultType) before the op: a zero-dim operand can be wider than that (a float32 0-d
  // tensor against bfloat16 x), and the dispatcher converts it (ops/dispatch.cc). Every binary
  // broadcasting row but copy and masked_fill.
  bool common_dtype_operands = false;

  bool is_elementwise() const {
    return kind == FusionKind::kElementwise || kind == FusionKind::kBroadcast;
  }
};

// True when an elementwise call computes on the integer path: the row has an integer form and
// the output and every input are integer or bool.
bool UsesIntegerPath(const OpDef& def, absl::Span<const DType> inputs, DType out);
// attrs.scalar as the int64 the integer path uses (an integer scalar exactly; a floating one
// truncated toward zero).
inline int64_t ScalarAsInt64(const OpAttrs& attrs) { return attrs.scalar.to_int64(); }

const OpDef& GetOpDef(OpId id);
// Looks an op up by name (IR parsing, tests); nullptr if unknown. Not for the dispatch path.
const OpDef* FindOpDef(std::string_view name);

// The elementwise row whose scalar function / kernel a linear epilogue applies, with the
// attributes to call it with (relu, or gelu{approximate=tanh}); nullptr for kNone and kAdd (not
// an activation). Kernels use it so that the fused activation is computed exactly as the
// standalone op would.
const OpDef* EpilogueActivation(Epilogue e, OpAttrs* attrs);

// Whether linear's last input is the residual of Epilogue::kAdd (not its bias).
inline bool HasResidual(const OpAttrs& a) { return a.epilogue == Epilogue::kAdd; }
// Whether a linear call of `num_inputs` operands, (x, w[, bias][, residual]), has a bias (in[2]).
inline bool LinearHasBias(size_t num_inputs, const OpAttrs& a) {
  return num_inputs == (HasResidual(a) ? 4u : 3u);
}

}  // namespace kiln
