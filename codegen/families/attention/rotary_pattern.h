// The rotary position embedding (RoPE, the "rotate half" layout of GPT-NeoX and LLaMA) as a traced
// graph holds it, found so that the attention family's decode kernel can rotate its query and the
// new key rows itself (attention_fusion.h) instead of a pointwise kernel doing it before:
//
//   %x1 = slice(%x) {dim=-1, start=0, end=half}       %x2 = slice(%x) {dim=-1, start=half, end=D}
//   %y  = cat(sub(mul(%x1, %cos), mul(%x2, %sin)), add(mul(%x2, %cos), mul(%x1, %sin))) {dim=-1}
//
// (kiln's RotaryEmbedding, ops/modules.h; each mul and the add in either operand order), with x,
// cos, sin and y of one floating dtype and cos / sin [.., half] broadcasting to the halves.
#pragma once

#include <vector>

#include "ir/graph.h"

namespace kiln::passes {

struct RotaryMatch {
  ir::ValueId x = -1, cos = -1, sin = -1;
  std::vector<ir::ValueId> ops;  // the pattern's nine ops (slices, muls, sub, add, cat)
};

// Whether %y is the pattern with every op but %y used only inside it (`uses`:
// Graph::UseCounts); fills `m` when it is.
bool MatchRotary(const ir::Graph& g, ir::ValueId y, const std::vector<int>& uses, RotaryMatch* m);

}  // namespace kiln::passes
