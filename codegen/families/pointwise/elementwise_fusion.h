// The pointwise family's pass: maximal trees of elementwise ops (with broadcasting inputs, casts
// and scalars) become one kFusion node whose body the family lowers to a single kernel. Groups
// grow by the rules of passes/fusion_groups.h, within the family's limits (operands and rank,
// asked of the family: KernelFamily::Limits); groups of one op stay plain ops (their eager kernel
// is the same kernel). Does nothing when the family is disabled.
// Requires a verified graph; guarantees every fusion body holds elementwise ops only, returns the
// group's root first and then its further outputs, and keeps the graph topologically ordered.
#pragma once

#include "passes/kernel_family.h"
#include "passes/pass.h"

namespace kiln::passes {

class ElementwiseFusion : public Pass {
 public:
  explicit ElementwiseFusion(const KernelFamily& family) : family_(family) {}
  const char* name() const override { return "elementwise-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;

 private:
  const KernelFamily& family_;
};

}  // namespace kiln::passes
