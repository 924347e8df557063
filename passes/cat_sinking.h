// Cat sinking: an elementwise op reading a cat computes on the cat's parts instead, and the cat
// moves after it, so that the pointwise family stores the cat from the parts' one kernel
// (codegen/families/pointwise/README.md) instead of materialising the cat and reading it back.
// transformers' rotary embedding, q * cos + rotate_half(q) * sin with rotate_half(x) =
// cat(-x2, x1), is the case in point:
//
//   %4 = cat(%2, %3) {dim=-1}        %2 = neg(x2), %3 = x1
//   %5 = mul(%4, %sin)
//   %6 = add(%qcos, %5)              %qcos = mul(%q, %cos)
// becomes
//   %7 = add(mul(%q[.., :h], %cos[.., :h]), mul(%2, %sin[.., :h]))
//   %8 = add(mul(%q[.., h:], %cos[.., h:]), mul(%3, %sin[.., h:]))
//   %9 = cat(%7, %8) {dim=-1}
// (two kernels before, one after). The other operands are sliced along the cat's dim (not where
// they broadcast along it); one that is itself an elementwise op used only here is rebuilt on
// sliced operands instead of being sliced (to a small depth), so it joins the parts' kernel.
//
// Rules: the op is elementwise (FusionKind kElementwise or kBroadcast) with static sizes; the
// cat has static sizes, at most kMaxSunkParts parts all of its dtype (no promotion), no other user
// and is no graph output, and spans the op's whole extent along its dim; every part's op and the
// rebuilt value have the op's dtype and type (else nothing changes). Runs to a fixed point (a chain
// of elementwise ops after a cat sinks it past each). On CUDA values only with
// PassContext::cuda_cat_sinking (CompileOptions::cuda_cat_sinking, default KILN_CAT_SINK_CUDA: on;
// the stored-cat kernels it leads to ran the CUDA suite and compute-sanitizer on an H100). Each
// rewrite is logged ("cat sinking: mul %8 computes on the 2 parts of cat %6; ...").
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

inline constexpr int kMaxSunkParts = 8;

class CatSinking : public Pass {
 public:
  const char* name() const override { return "cat-sinking"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

}  // namespace kiln::passes
