// View ops: new metadata over the input's storage, no data moved (like aten::t, as_strided).
// reshape is the one view that may copy: when the strides cannot express the new shape it
// returns a contiguous copy, as torch.reshape does (view() refuses instead).
#pragma once

#include <optional>

#include "ops/op_def.h"

namespace kiln::views {

Tensor Transpose(const Tensor& in, const TensorType& out, const OpAttrs& a);
Tensor Permute(const Tensor& in, const TensorType& out, const OpAttrs& a);
Tensor Reshape(const Tensor& in, const TensorType& out, const OpAttrs& a);
Tensor Expand(const Tensor& in, const TensorType& out, const OpAttrs& a);
Tensor Slice(const Tensor& in, const TensorType& out, const OpAttrs& a);
Tensor Unsqueeze(const Tensor& in, const TensorType& out, const OpAttrs& a);
Tensor Squeeze(const Tensor& in, const TensorType& out, const OpAttrs& a);

// Strides that view `in` as `shape` without a copy, if they exist (torch's computeStride).
std::optional<Strides> ViewStrides(const Tensor& in, IntList shape);

}  // namespace kiln::views
