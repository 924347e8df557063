// The graph verifier: checks the invariants every pass may rely on and must preserve (the pass
// pipeline runs it after each pass; tests run it on parsed and hand-built graphs).
//
//   KILN_RETURN_IF_ERROR(ir::Verify(graph));
//
// Checked, recursively into fusion bodies:
//   - every node's inputs are values defined earlier (topological order, nothing dangling);
//   - the graph inputs are exactly the kInput nodes; the outputs are values of the graph;
//   - op nodes have an arity their registry row accepts, operands on one device, and a recorded
//     type equal to what the row's Infer gives for the operand types;
//   - constants holding a tensor have that tensor's type;
//   - fusion nodes have a body whose inputs match the node's operand types one for one, whose
//     single output has the node's type, and which holds only elementwise/broadcast ops.
// A violation is absl::InternalError naming the value, the op and the mismatch, e.g.
//   "%3 (add): recorded type f32[3] differs from the inferred f32[4]".
#pragma once

#include "absl/status/status.h"
#include "ir/graph.h"

namespace kiln::ir {

absl::Status Verify(const Graph& graph);

}  // namespace kiln::ir
