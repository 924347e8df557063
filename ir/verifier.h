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
//     first output has the node's type, which holds only ops, and which the kernel family that
//     owns it accepts (`check`, given by codegen/fusion_template.h; without it, the family rules
//     are not checked);
//   - result nodes name an output (#1 and on) of a fusion and have its type.
// A violation is absl::InternalError naming the value, the op and the mismatch, e.g.
//   "%3 (add): recorded type f32[3] differs from the inferred f32[4]".
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "ir/graph.h"

namespace kiln::ir {

// A kernel family's rule for fusion bodies: OK, or why the body is not one the family compiles.
using FusionBodyCheck = std::function<absl::Status(const Graph& body)>;

absl::Status Verify(const Graph& graph, const FusionBodyCheck& check = nullptr);

}  // namespace kiln::ir
