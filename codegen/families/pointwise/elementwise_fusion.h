// The pointwise family's pass: maximal trees of elementwise ops (with broadcasting inputs, casts
// and scalars) become one kFusion node whose body the family lowers to a single kernel. Groups
// grow by the rules of passes/fusion_groups.h, within the family's limits (operands and rank,
// asked of the family: KernelFamily::Limits); groups of one op stay plain ops (their eager kernel
// is the same kernel). Does nothing when the family is disabled.
// Requires a verified graph; guarantees every fusion body holds elementwise ops only, returns the
// group's root first and then its further outputs, and keeps the graph topologically ordered.
#pragma once

#include "passes/kernel_family.h"

namespace kiln::passes {

class ElementwiseFusion : public FamilyPass {
 public:
  using FamilyPass::FamilyPass;
  const char* name() const override { return "elementwise-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

}  // namespace kiln::passes
