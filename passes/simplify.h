// Clean-up passes.
//
// DeadCodeElimination: removes nodes no graph output depends on, but collectives (OpDef::
//   collective: the other ranks wait for them, used here or not) and what they read. Requires
//   nothing; guarantees every remaining node (except inputs and collectives) is used.
// CommonSubexpressionElimination: op nodes with the same op, inputs and attributes become one
//   (collectives never: two calls are two exchanges; two that outputs hold, directly or through
//   views, neither: eager returns separate tensors); requires topological order (always true),
//   keeps it.
// ConstantFolding: op nodes whose inputs are all constants (and cheap: not matmul/linear) are
//   evaluated once at compile time and become constants (e.g. a causal mask built in forward),
//   when those constants are the trace's own (Node::local) or the weights are frozen
//   (PassContext::fold_constants); otherwise the user's tensors are read at call time.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

class DeadCodeElimination : public Pass {
 public:
  const char* name() const override { return "dce"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

class CommonSubexpressionElimination : public Pass {
 public:
  const char* name() const override { return "cse"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

class ConstantFolding : public Pass {
 public:
  const char* name() const override { return "constant-folding"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

// Replaces every use of `from` by `to` (nodes and outputs).
void ReplaceAllUses(ir::Graph& graph, ir::ValueId from, ir::ValueId to);

}  // namespace kiln::passes
