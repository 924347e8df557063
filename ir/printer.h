// The text form of graphs (parsed back by parser.h) and Graphviz DOT export.
//
//   graph(%0: bf16[8192, 768]) {
//     %1 = constant "gate.weight" : bf16[3072, 768]
//     %2 = linear(%0, %1) : bf16[8192, 3072]
//     %3 = gelu(%2) {approximate=tanh} : bf16[8192, 3072]
//     %4 = fusion kiln_fused_gelu_mul_0(%2, %5) : bf16[8192, 3072] {
//       graph(%0: bf16[8192, 3072], %1: bf16[8192, 3072]) { ... }
//     }
//     return %3
//   }
// Types print as dtype[shape] with the device appended when it is not cuda:0 ("@cpu").
#pragma once

#include <string>

#include "ir/graph.h"

namespace kiln::ir {

std::string PrintGraph(const Graph& graph);
std::string PrintType(const TensorType& type);
// The attributes a row declares, as "{dim=-1, keepdim=true}" ("" when the op has none). Defaults
// that would only add noise are left out: all_dims, transpose_a/b when false, linear's epilogue
// when none ("{epilogue=gelu_tanh}" otherwise).
std::string PrintAttrs(const OpDef& def, const OpAttrs& attrs);
std::string ToDot(const Graph& graph, const std::string& name = "kiln");

}  // namespace kiln::ir
