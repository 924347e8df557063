// How many kernels and memsets one library call (a cuBLASLt matmul or linear) launches on CUDA,
// for the plan's own count (Executable::kernels_per_step). cuBLASLt may split K, which adds a
// reduction kernel and a memset of its workspace, and kiln's matmul copies an operand it cannot
// read in place: neither shows in the graph. The call runs once on the given tensors (so its
// cuBLASLt plan and workspace exist; the values do not matter), then is captured once with CUDA
// stream capture on a private stream and never replayed: the captured graph's kernel and memset
// nodes are the count. Results are cached per (op, attrs, operand types and strides).
//
//   LaunchCount c = CountLaunchesOnce(OpId::kLinear, {x, w}, attrs);  // {1, 0} for most GEMMs
//
// Thread-safe. Without CUDA, or when the capture fails, the count is one kernel with the reason
// in `error` (a count must never make compiling fail).
#pragma once

#include <functional>
#include <string>

#include "absl/types/span.h"
#include "ops/op_def.h"

namespace kiln::codegen {

struct LaunchCount {
  int kernels = 1;
  int memsets = 0;
  std::string error;  // why the call could not be measured ("" when it was)
};

LaunchCount CountLaunchesOnce(OpId op, absl::Span<const Tensor> inputs, const OpAttrs& attrs);

// The same for any call on CUDA tensors (a fused node's run of several library calls), cached
// under `key`, which must name everything the launches depend on: the op or family, attributes,
// operand types, strides and alignments.
LaunchCount CountCallLaunchesOnce(const std::string& key, const std::function<void()>& call);

// The cache key CountLaunchesOnce uses for (op, inputs, attrs); a part of such keys.
std::string LaunchKey(OpId op, absl::Span<const Tensor> inputs, const OpAttrs& attrs);

}  // namespace kiln::codegen
