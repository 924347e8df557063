// Shape and dtype inference of every op: the META half of each registry row. Eager dispatch
// and graph building call the same functions. Errors name the rule broken; the dispatcher
// prefixes the op name and the operands.
#pragma once

#include <vector>

#include "ops/op_def.h"

namespace kiln::infer {

using Types = absl::Span<const TensorType>;
using Result = absl::StatusOr<TensorType>;

// Which of `rank` dims a reduction over `dims` (empty: all) takes, each wrapped; a dim out of
// range or named twice is an error.
absl::StatusOr<std::vector<bool>> ReducedMask(IntList dims, int64_t rank);

Result UnaryFloat(Types in, const OpAttrs& a);      // exp, tanh, gelu, ...: ints promote to float32
Result UnarySame(Types in, const OpAttrs& a);       // neg, relu: dtype kept
Result UnaryFloatOnly(Types in, const OpAttrs& a);  // gelu, silu: floating inputs only (torch)
Result ScalarArith(Types in, const OpAttrs& a);     // x (op) scalar
Result SubtractScalar(Types in, const OpAttrs& a);  // ScalarArith, a bool x refused (as torch)
Result ScalarDiv(Types in, const OpAttrs& a);       // x / scalar: always floating
Result Cast(Types in, const OpAttrs& a);
Result Binary(Types in, const OpAttrs& a);     // add, sub, mul: broadcast + promote
Result Subtract(Types in, const OpAttrs& a);   // sub: Binary, any bool operand refused (torch)
Result BinaryDiv(Types in, const OpAttrs& a);  // true division: floating result
Result Where(Types in, const OpAttrs& a);
Result MaskedFill(Types in, const OpAttrs& a);
Result Reduce(Types in, const OpAttrs& a);     // max: dtype kept
Result ReduceSum(Types in, const OpAttrs& a);  // sum: integers widen to int64
Result ReduceMean(Types in, const OpAttrs& a);
Result Softmax(Types in, const OpAttrs& a);
// Normalisations over the last dim; the result keeps the input's dtype. layer_norm: parameters
// of the input's dtype, or float32 under a half input; rms_norm: a weight of any dtype.
Result LayerNorm(Types in, const OpAttrs& a);
Result RmsNorm(Types in, const OpAttrs& a);
Result Matmul(Types in, const OpAttrs& a);
Result Linear(Types in, const OpAttrs& a);
Result Transpose(Types in, const OpAttrs& a);
Result Permute(Types in, const OpAttrs& a);
Result Reshape(Types in, const OpAttrs& a);
Result Expand(Types in, const OpAttrs& a);
Result Slice(Types in, const OpAttrs& a);
Result Unsqueeze(Types in, const OpAttrs& a);
Result Squeeze(Types in, const OpAttrs& a);
Result Same(Types in, const OpAttrs& a);       // contiguous, sign: the input's type
Result TriMask(Types in, const OpAttrs& a);    // triu, tril: rank >= 2
Result Copy(Types in, const OpAttrs& a);       // copy(self, src): self's type, src broadcasts
Result AsStrided(Types in, const OpAttrs& a);  // the window's shape, in bounds
Result AsStridedScatter(Types in, const OpAttrs& a);  // the base's type; src has the window's

// The dtype of a binary op's result (torch's result_type of two tensors): a tensor with dims
// outranks a zero-dim one of its category (bool < integer < floating), so bfloat16 x + a float32
// 0-d tensor is bfloat16 and int32 x + an int64 0-d tensor int32; a zero-dim operand of a higher
// category decides (int32 x + a float32 0-d tensor is float32); otherwise PromoteTypes.
DType ResultType(const TensorType& a, const TensorType& b);
// The common dtype of a tensor and a scalar operand (torch's result_type with a Python number):
// a floating type stays; with an integer scalar an integer type stays and bool becomes int64;
// a floating scalar makes an integer or bool type float32.
DType ScalarResultType(DType t, const Scalar& scalar);
Result Compare(Types in, const OpAttrs& a);        // eq, ne, lt, le, gt, ge: broadcast, bool
Result CompareScalar(Types in, const OpAttrs& a);  // x (cmp) scalar: bool
Result MinMax(Types in, const OpAttrs& a);         // minimum, maximum: broadcast + promote
Result Pow(Types in, const OpAttrs& a);            // pow(x, y): broadcast + promote, not bool
// remainder, fmod, floor_divide: broadcast + promote, not bool (as pow)
Result BinaryNumeric(Types in, const OpAttrs& a);
Result PowScalar(Types in, const OpAttrs& a);    // pow(x, scalar)
Result ClampScalar(Types in, const OpAttrs& a);  // clamp_min / clamp_max(x, scalar)

// Indexing, joining and selection (infer_indexing.cc).
Result Embedding(Types in, const OpAttrs& a);    // weight [V, D], indices [*] -> [*, D]
Result IndexSelect(Types in, const OpAttrs& a);  // x, 1-D index along a.dim
Result Gather(Types in, const OpAttrs& a);       // x, index of x's rank along a.dim
Result IndexCopy(Types in, const OpAttrs& a);    // self, 1-D index, source along a.dim
Result Scatter(Types in, const OpAttrs& a);      // self, index, src of self's rank along a.dim
Result Cat(Types in, const OpAttrs& a);          // any number of tensors along a.dim
Result ArgMax(Types in, const OpAttrs& a);       // along a.dims (none or one), keepdim: int64
Result TopK(Types in, const OpAttrs& a);         // indices of the k largest along a.dim: int64
Result Cumsum(Types in, const OpAttrs& a);       // along a.dim: floats keep, integers int64

// Resolves one -1 in a reshape target against `numel`; error if impossible.
absl::StatusOr<Shape> InferReshapeSizes(IntList sizes, int64_t numel);

}  // namespace kiln::infer
