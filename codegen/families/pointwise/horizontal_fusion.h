// Horizontal fusion: small pointwise kernels that do not depend on each other, one after another
// in the plan, become one combo kernel (Inductor's combo kernels). A decode step's RoPE of q and
// of k read the same cos and sin, are a few thousand elements each, and cost a launch each: one
// kernel runs both. A fusion node joins the one before it when
// - both are pointwise fusions of static sizes on one device, of at most kMaxComboElements
//   elements in all and none empty (larger kernels fill the GPU apart, and the combo kernel's
//   index math is strided; a node whose first output is empty does not run);
// - no node between them, nor the later one, reads the earlier one's outputs (the combo node
//   stands where the later one stood; the earlier one's results move after it);
// - the joined kernel keeps within the pointwise kernel's operand budget.
// The joined body holds both bodies side by side (passes::BodySegments tells them apart again);
// its outputs are the earlier node's, then the later one's, handed out by result nodes.
// CompileOptions::horizontal_fusion (default KILN_EW_COMBINE, off: the combo kernel has not yet
// run on a GPU; the CPU evaluates the same segments and the tests compile its CUDA source) turns
// it on.
#pragma once

#include <cstdint>

#include "ir/graph.h"
#include "passes/kernel_family.h"
#include "passes/pass.h"

namespace kiln::passes {

inline constexpr int64_t kMaxComboElements = int64_t{1} << 18;

// Joins pointwise fusion nodes of `family` in `graph` as above; logs each join to ctx.explain.
// Returns whether it changed the graph.
bool CombineSmallFusions(ir::Graph& graph, const KernelFamily& family, PassContext& ctx);

}  // namespace kiln::passes
