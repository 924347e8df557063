// Kernels of the strided-window rows, shared by CPU and CUDA (each composes the device's copy
// kernel): as_strided gathers a window of the input's contiguous layout into a fresh tensor;
// as_strided_scatter returns the base with src written into such a window. The tracer uses them
// to record in-place ops on views functionally (ir/tracer.h): the write becomes a scatter into
// the base, and later reads of other views of it become windows of the new base.
#pragma once

#include "ops/op_def.h"

namespace kiln::strided {

void AsStrided(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void AsStridedScatter(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                      const OpAttrs& a);

}  // namespace kiln::strided
