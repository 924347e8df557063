// Code generation for softmax fusions (passes/softmax_fusion.h): bodies of elementwise ops that
// end in a softmax over the last dim, optionally followed by one cast.
//
// On CUDA the ops before the softmax become the prologue expression (FusionExpression's inlining)
// of one generated softmax kernel (ops/cuda/fused_softmax_cuda.h) that evaluates it on load and
// stores the result in the output's dtype (so a trailing cast costs nothing). On the CPU the
// prologue runs through the fusion evaluator into a float32 buffer and the registry's CPU softmax
// writes the output: the same math as the kernel (the prologue's result kept in float32, no
// rounding between the softmax and the cast), so compiled-vs-eager tests run without a GPU.
//
//   if (codegen::SoftmaxOfFusion(*node.body) >= 0) kernels = codegen::CompileSoftmaxFusion(node);
#pragma once

#include <string>

#include "ir/graph.h"
#include "ops/cuda/fused_softmax_cuda.h"

namespace kiln::codegen {

// The body's softmax; -1 for a purely elementwise body.
ir::ValueId SoftmaxOfFusion(const ir::Graph& body);
// The kernel source of a softmax fusion node (dumps, tests) and what its launch looks like.
std::string SoftmaxFusionSource(const ir::Node& fusion);
std::string SoftmaxFusionLaunchNote(const ir::Node& fusion);
// Compiles the node's kernels with NVRTC (cached); throws kiln::Error on failure.
cuda_ops::FusedSoftmaxKernels CompileSoftmaxFusion(const ir::Node& fusion);
// Evaluates a softmax fusion body on the CPU into `out` (inputs may broadcast, any strides).
void EvaluateSoftmaxFusionOnCpu(const ir::Graph& body, absl::Span<const Tensor> inputs,
                                const Tensor& out);

}  // namespace kiln::codegen
