// Shape and dtype inference of every op: the META half of each registry row. Eager dispatch
// and graph building call the same functions. Errors name the rule broken; the dispatcher
// prefixes the op name and the operands.
#pragma once

#include "ops/op_def.h"

namespace kiln::infer {

using Types = absl::Span<const TensorType>;
using Result = absl::StatusOr<TensorType>;

Result UnaryFloat(Types in, const OpAttrs& a);   // exp, tanh, gelu, ...: ints promote to float32
Result UnarySame(Types in, const OpAttrs& a);    // neg, relu: dtype kept
Result ScalarArith(Types in, const OpAttrs& a);  // x (op) scalar
Result ScalarDiv(Types in, const OpAttrs& a);    // x / scalar: always floating
Result Cast(Types in, const OpAttrs& a);
Result Binary(Types in, const OpAttrs& a);     // add, sub, mul: broadcast + promote
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
Result Same(Types in, const OpAttrs& a);     // contiguous
Result TriMask(Types in, const OpAttrs& a);  // triu, tril: rank >= 2

// Resolves one -1 in a reshape target against `numel`; error if impossible.
absl::StatusOr<Shape> InferReshapeSizes(IntList sizes, int64_t numel);

}  // namespace kiln::infer
