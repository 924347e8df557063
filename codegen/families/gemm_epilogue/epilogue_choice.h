// Per-shape choice between a GEMM with a fused activation epilogue and the plain GEMM followed
// by the activation kernel. cuBLASLt's GELU epilogues can pick slower algorithms than the plain
// GEMM for some bf16 shapes, so on CUDA the compiled plan times both once per (shapes, dtype,
// bias, epilogue) on the device, on random operands (ops/cuda/device_timing.h: cold caches, device
// time alone, as the GEMV choice times), and keeps the faster; the decision is cached for the
// process. On the CPU the fused form is kept (it is one pass either way). The choice is the CUDA
// backend's (epilogue_choice.cc); RunSplit is in every build (epilogue_template.cc).
#pragma once

#include <string>

#include "ir/graph.h"

namespace kiln::codegen {

struct EpilogueChoice {
  bool fused = true;    // false: run linear without the epilogue, then the activation op
  std::string explain;  // "epilogue choice: ..." with both timings; "" when not measured
};

// For a linear node with an epilogue attribute on a CUDA device (inputs taken from its graph).
EpilogueChoice ChooseEpilogue(const ir::Graph& graph, const ir::Node& linear);

// The split form of linear `in` {attrs.epilogue}: the plain linear, then the activation op or the
// add of the residual, written to `out`.
void RunSplit(absl::Span<const Tensor> in, const OpAttrs& attrs, const Tensor& out);

}  // namespace kiln::codegen
