// Code generation for fusion nodes: the CUDA program of a fusion body (rendered by the one
// elementwise skeleton in ops/cuda/elementwise_cuda.h, from each registry row's expression) and
// the CPU evaluation of the same body in one pass over the output's elements (the registry's
// scalar functions), so compiled mode also runs, and is tested, without a GPU.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/cuda/elementwise_cuda.h"

namespace kiln::codegen {

// The fused CUDA expression of a body: its ops' registry expressions inlined into one tree over
// $0..$n (the body inputs, each loaded once), float32 math, explicit casts rounding.
std::string FusionExpression(const ir::Graph& body);
// The same for any elementwise value of the body (a softmax fusion's prologue).
std::string ValueExpression(const ir::Graph& body, ir::ValueId value);
std::vector<DType> FusionInputTypes(const ir::Graph& body);
// The full CUDA source of the fusion node's kernels (what the dumps show); softmax fusions get
// theirs from codegen/fused_softmax.h.
std::string FusionSource(const ir::Node& fusion);
// How the node's kernel is launched, for the dump's header ("launch: ...").
std::string FusionLaunchNote(const ir::Node& fusion);
// Evaluates a fusion on the CPU into `out` (inputs may broadcast and have any strides).
void EvaluateFusionOnCpu(const ir::Graph& body, absl::Span<const Tensor> inputs, const Tensor& out);

}  // namespace kiln::codegen
