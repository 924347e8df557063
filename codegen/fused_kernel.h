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
#include "passes/fusion_groups.h"

namespace kiln::codegen {

// A pointwise body may end in a cat of values of one shape (passes/fusion_groups.h): its
// kernel iterates over that shape and stores operand k into slice k of the cat's result along
// `dim`. parts == 0: the body has no such cat.
struct CatSink {
  int dim = 0;
  int parts = 0;
};
CatSink CatSinkOf(const ir::Graph& body);
// The shape of output `o` of a body whose kernel iterates over `iteration` (symbolic plans): a
// trailing cat's is `parts` iterations along its dim.
Shape FusionOutputShape(const ir::Graph& body, size_t o, Shape iteration);
// The tensors a body's program stores into, from the node's outputs: the same, but a cat's
// result split into its `parts` slices (views) in front of the further outputs.
std::vector<Tensor> StoreTargets(const CatSink& cat, absl::Span<const Tensor> outputs);

// Segment `s` of `body` (passes::BodySegments) as a body of its own: the inputs it reads, its ops,
// the outputs it computes, in the body's order.
ir::Graph SegmentBody(const ir::Graph& body, const passes::BodySegment& s);

// Every value the body returns, stored in its own dtype (a trailing cat: each of its operands).
kir::Program LowerFusionBody(const ir::Graph& body);
// Only `value` of the body (and what it needs), stored as float32: a softmax fusion's prologue.
kir::Program LowerBodyValue(const ir::Graph& body, ir::ValueId value);
// Evaluates `program` on the CPU: outputs[o] = program's store o over the outputs' (common)
// shape; inputs may broadcast and have any strides.
void EvaluateProgramOnCpu(const kir::Program& program, absl::Span<const Tensor> inputs,
                          absl::Span<const Tensor> outputs);

}  // namespace kiln::codegen
