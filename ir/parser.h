// Parses the text form of graphs (what PrintGraph in printer.h writes) back into a Graph, so
// that pass tests can start from text and dumps can be read back.
//
//   absl::StatusOr<Graph> g = ParseGraph(R"(
//     graph(%0: f32[4, 8]@meta) {
//       %1 = gelu(%0) {approximate=tanh} : f32[4, 8]@meta
//       return %1
//     })");
//
// Value ids in the text may be any numbers (tests write them by hand): they are renumbered in
// order of definition, graph inputs first, each fusion body with its own numbering. Hence
// ParseGraph(PrintGraph(g)) prints exactly like g for graphs whose inputs come first (as
// traced graphs do). Types and attributes are taken as written (only the attributes the op's
// registry row declares are accepted); Verify (verifier.h) checks that they agree with the
// registry. Constants come back with their name and type but without a tensor
// (Node::constant is undefined). `//` comments and any whitespace are allowed between tokens.
//
// Errors are absl::InvalidArgumentError "line 3, col 12: expected ')' after operands".
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "ir/graph.h"

namespace kiln::ir {

absl::StatusOr<Graph> ParseGraph(std::string_view text);
// The attributes of an op call of `def` as PrintAttrs writes them ("{dim=-1}", or "").
absl::StatusOr<OpAttrs> ParseAttrs(const OpDef& def, std::string_view text);

}  // namespace kiln::ir
