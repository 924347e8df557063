// Attention fusion: attention written the naive way becomes one scaled_dot_product_attention
// node (kiln's flash kernel on CUDA, the math form on the CPU):
//
//   %s = matmul(%q, %k) {transpose_b=true}      (canonicalisation folded the transpose)
//   %t = mul_scalar(%s) {scalar=0.125}          (or div_scalar; or the scale folded into q)
//   %u = masked_fill(%t, %m) {scalar=-inf}      (a constant bool mask; or add(%t, %a), additive)
//   %p = softmax(%u) {dim=-1}
//   %o = matmul(%p, %v)
//   ->
//   %o = scaled_dot_product_attention(%q, %k, %v) {scale=0.125, is_causal=true}
//
// The scale, mask and additive terms may come in any order, each at most once; the in-place
// variants (masked_fill_, mul_) trace to the same ops. A constant mask that is exactly the causal
// pattern (true above the diagonal) becomes is_causal (the kernel skips the masked tiles); another
// constant bool mask becomes its complement (SDPA's true means "take part"); a bool mask known
// only at run time becomes an additive mask; an additive mask may be any value. Near-misses are
// refused with a line in the explain log ("attention fusion: ..."): scores or probabilities used
// elsewhere, a softmax not over the last dim, a constant mask that hides every key of some row
// (softmax gives NaN there, SDPA zeros), a fill value that is not -inf, mixed dtypes, or operands
// the family's kernel does not take (KernelFamily::RejectsOperands: kiln's flash kernel on CUDA;
// then the softmax fusion handles the chain). Does nothing when the family is disabled.
// Numerics (compile.h): where a mask known only at run time hides a whole row, or a score
// overflows to +inf, the fused node gives SDPA's answer (zeros for the hidden row, as the SDPA
// rewrite of torch.compile does) where eager softmax gives NaN.
// Requires a verified, canonicalised graph; rewrites the final matmul in place (its operands are
// all defined before it) and leaves the chain dead for DCE.
//
// Then a decode step's KV-cache append joins the attention that reads it (one kernel, where the
// writes were two more launches):
//
//   %k2 = index_copy(%k_cache, %pos, %k_new) {dim=2}   (index_copy_: the cache written in place)
//   %v2 = index_copy(%v_cache, %pos, %v_new) {dim=2}
//   %o = scaled_dot_product_attention(%q, %k2, %v2, %mask)
//   ->
//   %o = fusion kiln_fused_index_copy_scaled_dot_product_attention_0(...)  (the three as its body)
//   %k2 = result %o #1, %v2 = result %o #2
//
// when both writes go along the key-row dim (-2) at the same index tensor into two different
// caches, with at most kFlashDecodeMaxQueries query rows and new rows, static shapes, and
// nothing the node reads depending on the writes. The plan runs the node in place on the caches
// where it would run the index_copy ops in place (codegen/executable.h); the CUDA kernel writes
// the new rows itself and reads them from k_new / v_new (flash_decode_source.h). Refusals are
// logged ("attention fusion: KV append not fused: ...").
//
// With PassContext::kv_rope (CompileOptions::kv_rope, default KILN_KV_ROPE: off) the rotary
// embeddings of the query and of the new key rows join that node too, when both are the rotate-half
// pattern (rotary_pattern.h) with the same cos / sin tables, used by nothing else: the decode
// kernel rotates them itself (the pointwise kernel that did is gone, one launch fewer per layer and
// step), and the rotated keys are what the caches get.
#pragma once

#include "passes/kernel_family.h"

namespace kiln::passes {

// The most query rows and appended rows the fused KV append takes (the decode kernel's
// kFlashDecodeMaxQueries).
inline constexpr int64_t kKvAppendMaxRows = 4;

// Where the operands of a KV-append attention body (above) are: positions among the body's
// inputs, and among its outputs the updated caches (-1: not an output of the node).
struct KvAppendBody {
  int q = -1, k_cache = -1, v_cache = -1, mask = -1, slots = -1, k_new = -1, v_new = -1;
  int k_out = -1, v_out = -1;
  // With the rotary embedding joined: the tables (body inputs); q and k_new are then the rows
  // before their rotation. -1: no rotation.
  int cos = -1, sin = -1;
  int dim = 2;        // the index_copy dim (the caches' key-row dim)
  OpAttrs attention;  // the scaled_dot_product_attention's attributes
};
// Whether `body` is a KV-append attention body; fills `roles` when it is.
bool ParseKvAppendBody(const ir::Graph& body, KvAppendBody* roles);

class AttentionFusion : public FamilyPass {
 public:
  using FamilyPass::FamilyPass;
  const char* name() const override { return "attention-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph& graph, PassContext& ctx) override;
};

}  // namespace kiln::passes
