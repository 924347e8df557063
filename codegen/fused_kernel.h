// Lowering fusion bodies to the kernel IR (ops/kernel_ir.h), and the CPU evaluation of it.
//
// A body's inputs become the kernel's inputs (one load each, shared by every use), each op one
// instruction (identical ones are one value), each returned value a store. The CUDA skeletons of
// the kernel families print the program (ops/cuda/kernel_render.h); the CPU evaluator runs the
// same program in one pass over the iteration space with the registry's scalar functions, so
// compiled mode also runs, and is tested, without a GPU.
//
//   kir::Program p = codegen::LowerFusionBody(*node.body);
//   std::cout << p.ToString();   // the kernel IR, as the dumps show it beside the .cu
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/kernel_ir.h"

namespace kiln::codegen {

// Every value the body returns, stored in its own dtype.
kir::Program LowerFusionBody(const ir::Graph& body);
// Only `value` of the body (and what it needs), stored as float32: a softmax fusion's prologue.
kir::Program LowerBodyValue(const ir::Graph& body, ir::ValueId value);
// Evaluates `program` on the CPU: outputs[o] = program's store o over the outputs' (common)
// shape; inputs may broadcast and have any strides.
void EvaluateProgramOnCpu(const kir::Program& program, absl::Span<const Tensor> inputs,
                          absl::Span<const Tensor> outputs);

}  // namespace kiln::codegen
