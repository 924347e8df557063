// Norm-linear fusion: a layer_norm or rms_norm whose users are all linears reading it as their
// input (one, as GPT-2's qkv; or several, as Llama's q/k/v and gate/up projections) becomes one
// fusion node (body: the norm, then the linears with their epilogues; outputs: the linears, or
// their gated products, below),
// run on CUDA as one launch of kiln's GEMV per linear that normalises the rows itself
// (codegen/families/norm_linear/README.md). In a token-by-token decode step every block's norms
// feed linears of one or a few rows: each norm loses its launch.
//
// Rules (each refusal is written to the explain log with its reason):
// - every user of the norm's value is a linear that reads it only as x (not as its weight, bias
//   or residual), and the value is not a graph output (it would be needed);
// - no other operand of the linears depends on one of them (the node would sit on a cycle
//   through its own output);
// - none has a symbolic dim (CompileOptions::dynamic): the executable sizes a fusion with
//   symbolic dims as the broadcast of its operands, which is not a linear's shape;
// - the family takes the operands (KernelFamily::RejectsOperands, given the linear's output type
//   first, then the norm's operands, then the linear's after x): on CUDA, one floating dtype, at
//   most the GEMV's row count.
// A linear whose users are the two halves of a gated product (a GLU MLP's merged gate/up
// projection: passes/gated_product.h, relu, gelu or silu as the activation) joins with the
// product: the body holds the slices, the activation and the mul, the node's output is the
// product, and the GEMV computes it without writing the linear's output. Where the product's
// values have other users the linear joins alone (its refusal logged). Only with
// PassContext::gated_gemv (CompileOptions::gated_gemv, default KILN_GEMV_GLU: off).
// Run after the GEMM-epilogue pass (the linear keeps its epilogue inside the body) and before
// pointwise fusion. Does nothing when the family is disabled. The norm and the linears leave the
// graph; the fusion node's outputs have the linears' values and types.
#pragma once

#include "passes/kernel_family.h"

namespace kiln::passes {

class NormLinearFusion : public FamilyPass {
 public:
  using FamilyPass::FamilyPass;
  const char* name() const override { return "norm-linear-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

}  // namespace kiln::passes
