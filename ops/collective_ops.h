// The collective ops' registry columns (ops/registry.cc): their inference and their kernel. One
// kernel serves every device: the row's group (OpAttrs::group) does the work on the tensor's
// device (the thread and store groups through the host, NCCL on the GPU's stream).
#pragma once

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ops/op_def.h"

namespace kiln::collective {

absl::StatusOr<TensorType> InferAllReduce(absl::Span<const TensorType> in, const OpAttrs& a);
absl::StatusOr<TensorType> InferAllGather(absl::Span<const TensorType> in, const OpAttrs& a);
absl::StatusOr<TensorType> InferReduceScatter(absl::Span<const TensorType> in, const OpAttrs& a);
absl::StatusOr<TensorType> InferBroadcast(absl::Span<const TensorType> in, const OpAttrs& a);

void Run(const OpDef& def, absl::Span<const Tensor> inputs, const Tensor& out,
         const OpAttrs& attrs);

}  // namespace kiln::collective
