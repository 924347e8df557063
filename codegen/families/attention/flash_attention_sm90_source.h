// kiln's Hopper attention kernel (sm_90a, generated with NVRTC): the forward pass of
// scaled_dot_product_attention without a mask, causal or not, head dim 64 or 128, bf16 or f16,
// grouped-query heads, q/k/v of any strides with a contiguous head dim (a [B, T, H, D] tensor
// viewed as [B, H, T, D] read in place), any lengths. The host side that needs no GPU: the
// configuration, its name and its source (flash_attention_cuda.cc compiles and launches it).
//
// Design: a CTA of one warpgroup (128 threads) owns 64 query rows of one (batch, head); three
// CTAs share an SM, so one's softmax runs while another's wgmma keeps the tensor cores busy. Or
// (head dim 128, and head dim 64 without causality) two or three consumer warpgroups share each
// K/V tile of a persistent CTA, one an SM, fed by a producer warpgroup, and issue their wgmma in
// turns (FlashAttention-3's ping-pong). Either way the work goes in sections of (batch, head)
// pairs whose K/V fit in L2 together, longest row tiles first (kiln_flash_work_item).
// Q and a ring of `stages` K/V tiles of block_n keys are copied by TMA (rank-4 tensor maps, the
// 128-byte swizzle) into shared memory, each tile's K and V on their own mbarrier, issued by one
// thread `stages` tiles ahead (a K slot refilled once its S is in, a V slot once its P·V is). S =
// Q·Kᵀ is one wgmma.mma_async m64n<block_n>k16 per 16 dims, both operands in shared memory
// (K-major); the online softmax runs on the accumulators in registers (fp32, base 2, the scale
// folded into one FFMA, the running max moved only when it grows by more than 2^8); P stays in
// registers as the A operand of O += P·V, one m64n<head dim>k16 per 16 keys with V MN-major in
// shared memory. Tile j's S = Q·Kᵀ is issued together with tile j-1's P·V, and tile j's softmax
// runs while that product does (FlashAttention-3's intra-warpgroup overlap). Causal: tiles past the
// CTA's last row are never loaded, only tiles crossing the diagonal or the end of the keys pay for
// per-element masking. The output is staged in Q's shared memory and written with 16-byte stores
// (the persistent form, whose Q buffer already holds the next item's rows, transposes each quad's
// pairs in registers so that each lane stores 16 contiguous bytes: whole 32-byte sectors, half
// the sectors and a quarter of the requests of 4-byte stores). A fully masked row (no keys) is
// written as zeros.
//
// sm_90a code runs on compute capability 9.0 exactly; elsewhere, and for masks, the mma.sync
// kernel (flash_attention_source.h) runs.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/dtype.h"

namespace kiln::cuda_ops {

struct FlashSm90Config {
  int head_dim = 64;  // 64 or 128
  DType dtype = DType::kBFloat16;
  bool causal = false;
  int block_n = 128;   // keys per K/V tile: a multiple of 16 in 64..256
  int stages = 2;      // K/V tiles in flight: 2..8
  int min_blocks = 3;  // CTAs per SM the registers are cut for (__launch_bounds__; 1 consumer)
  // 1: a CTA is one warpgroup of 64 query rows, min_blocks CTAs an SM. 2 or 3: that many
  // warpgroups share each K/V tile (64 rows each), a producer warpgroup copies, one persistent CTA
  // an SM walks the work.
  int consumers = 1;
  // 2 or 3 consumers: they take turns issuing wgmma (FlashAttention-3's ping-pong, named
  // barriers), so one's softmax runs under the others' products.
  bool pingpong = true;
  // Of every 8 probabilities a thread computes, how many are 2^x by a polynomial on the FMA pipe
  // (FlashAttention-4's split) instead of ex2.approx on the MUFU pipe, which yields 16 results a
  // clock an SM against 128 FMAs: at head dim 64 a tile's exponentials take about as long as its
  // two products.
  int exp2_on_fma = 0;
  // The persistent form's CTAs take their next work item from a counter in global memory as they
  // free up (FlashAttention-3's tile scheduler) instead of every gridDim.x-th: causal items range
  // from one K/V tile to all of them, and a fixed share leaves some SMs idle at the end. The
  // persistent form only (2 or 3 consumers).
  bool dynamic = false;

  int block_m() const { return 64 * consumers; }  // query rows of a CTA's tile
  int threads() const { return consumers == 1 ? 128 : 128 * (consumers + 1); }
  int shared_bytes() const;  // Q, the K/V ring and the barriers
  // "kiln_flash_sm90_d64_bf16_causal_64x64_s2_b3"; "…_128x128_s3_persistent" for 2 consumers
  // ("_persistent_unordered" without ping-pong, "_dynamic" appended with the counter), "_fma2"
  // when 2 of 8 exponentials are polynomials
  std::string Name() const;
};

// The form and tiling kiln runs for kv_len keys (KILN_FLASH_SM90_CONSUMERS,
// KILN_FLASH_SM90_BLOCK_N, KILN_FLASH_SM90_STAGES, KILN_FLASH_SM90_PINGPONG,
// KILN_FLASH_SM90_EXP2_FMA and KILN_FLASH_SM90_DYNAMIC override them for A/B).
FlashSm90Config PlanFlashSm90(int head_dim, DType dtype, bool causal, int64_t kv_len);

// The kernel's source (its one kernel is config.Name()). Throws kiln::Error for a config outside
// the ranges above or over a CTA's 227 KB of shared memory.
std::string RenderFlashSm90Source(const FlashSm90Config& config);

}  // namespace kiln::cuda_ops
