// kiln's flash attention kernel on the host side: which inputs it runs, its configurations, the
// source it hands NVRTC (flash_attention_plan.cc, in every build), and the launch
// (flash_attention_cuda.cc, the CUDA backend). The kernel itself is
// codegen/families/attention/flash_attention_source.h; up to kFlashDecodeMaxQueries query rows, the
// split-key kernels of flash_decode_source.h run.
//
//   if (FlashAttentionUnsupportedReason(inputs, attrs).empty())
//     LaunchFlashAttention(inputs, attrs, out);    // out = sdpa(q, k, v[, mask])
//
// The kernel takes q/k/v of rank 2..4 ([B, H, T, D], [H, T, D], [T, D]) in bfloat16 or float16
// with head dim 64 or 128 (v's equal to q's), each contiguous along D with 16-byte aligned rows
// (strides in multiples of 8 elements: a [B, T, H, D] tensor transposed to [B, H, T, D] is read
// in place), any lengths, causal or not, grouped-query heads, and an optional mask (bool or
// additive float32/float16/bfloat16) broadcast to [B, H, L, S] with any strides. Everything else
// falls back to the math form (ops/attention.h) with the reason this file gives. One kernel per
// (head dim, dtype, causal, mask kind), compiled with NVRTC on first use and cached (memory and
// disk, runtime/nvrtc.h); the tiling per head dim is PlanFlashAttention's.
#pragma once

#include <string>

#include "ops/op_def.h"

namespace kiln::cuda_ops {

enum class FlashMask : uint8_t { kNone, kBool, kFloat32, kFloat16, kBFloat16 };

struct FlashAttentionConfig {
  int head_dim = 64;
  DType dtype = DType::kBFloat16;
  bool causal = false;
  FlashMask mask = FlashMask::kNone;
  // Tiling: query rows per CTA, keys per K/V tile, warps, Q fragments kept in registers, the
  // CTAs per SM the register budget is cut for (__launch_bounds__), one barrier per K/V tile.
  int block_m = 128, block_n = 64, warps = 4, min_blocks = 2;
  bool q_in_regs = true, one_sync = true;
  // The decode kernel also appends rows to the caches (FlashKvAppend): 0 no, else the most rows
  // its variant takes (1 for a decode step's token, or 4).
  int kv_append = 0;
  // With kv_append: the queries and the new keys are rotated first (FlashKvAppend::cos).
  bool rope = false;

  int threads() const { return warps * 32; }
  int shared_bytes() const { return (block_m + 4 * block_n) * head_dim * 2; }  // Q, 2x K, 2x V
};

// The configuration kiln runs for these operands (the tiling measured best on the H200).
FlashAttentionConfig PlanFlashAttention(int head_dim, DType dtype, bool causal, FlashMask mask);
// For a grid of `bh` (batch, head) pairs and `q_len` query rows on `sm_count` SMs: with head dim
// 64, when 128-row tiles would give fewer CTAs than SMs (a prefill of one sequence: 12 heads x
// 4 tiles for GPT-2 small's 512 tokens), 64-row tiles (the harness's tiling D: 4 warps of 16
// rows, 3 CTAs per SM), twice the CTAs. KILN_FLASH_SMALL_GRID=0 keeps the 128-row tiles (A/B).
FlashAttentionConfig ForGrid(FlashAttentionConfig c, int64_t bh, int64_t q_len, int sm_count);
FlashMask FlashMaskOf(DType mask_dtype);
// Strides of a [B, H, T, D]-like tensor of rank 2..4 (0 for absent or size-1 dims).
struct FlashBatchStrides {
  long long batch = 0, head = 0, row = 0;
};
FlashBatchStrides FlashStridesOf(const Tensor& t);

// KilnFlashParams (flash_attention_source.h) on the host, field for field.
struct FlashParams {
  const void *q, *k, *v;
  void* o;
  const void* mask;
  long long q_batch, q_head, q_row;
  long long k_batch, k_head, k_row;
  long long v_batch, v_head, v_row;
  long long o_batch, o_head, o_row;
  long long m_batch, m_head, m_row, m_col;
  int heads, group, q_len, kv_len;
  float scale_log2;
  int section;
};
// The parameters of out = sdpa(q, k, v[, mask]) for operands FlashAttentionUnsupportedReason
// accepts: pointers, strides, lengths, heads, the scale; `section` every (batch, head) pair.
FlashParams MakeFlashParams(absl::Span<const Tensor> in, const OpAttrs& a, const Tensor& out);

// One launch of the (mma.sync) flash kernel of `c` by whoever holds it prebuilt (a kernel package
// built from RenderFlashAttentionSource(c): 04_attention --variant package): grid, block, dynamic
// shared memory and the bytes of its one parameter. `c` must fit the operands (head dim, dtype,
// causal, mask kind: checked, with the rule named); any tiling of it runs any lengths.
struct FlashLaunchDescription {
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  int shared_bytes = 0;
  std::string params;
};
FlashLaunchDescription DescribeFlashLaunch(const FlashAttentionConfig& c,
                                           absl::Span<const Tensor> in, const OpAttrs& a,
                                           const Tensor& out);

// "kiln_flash_attention_d64_bf16_causal_128x64w4": what the profiler's kernel table shows.
std::string FlashAttentionKernelName(const FlashAttentionConfig& c);
// The full CUDA source of one configuration: its #defines, then the kernel text.
std::string RenderFlashAttentionSource(const FlashAttentionConfig& c);

// Why the flash kernel cannot run operands of these types (q, k, v[, mask]): "" when it can.
// Checks device, dtype, head dims and rank; no data needed (graphs, the pattern pass).
std::string FlashAttentionTypesUnsupported(absl::Span<const TensorType> in);
// The same for tensors, plus layout (contiguous head dim, 16-byte aligned rows), the GPU's
// compute capability and the grid limits.
std::string FlashAttentionUnsupportedReason(absl::Span<const Tensor> in, const OpAttrs& a);

// Up to this many query rows the split-key decode kernels (flash_decode_source.h) run instead
// of the flash kernel's 128-row tiles (one new token against a KV cache).
inline constexpr int64_t kFlashDecodeMaxQueries = 4;
// "kiln_flash_decode_d64_bf16_boolmask" (and its "_combine"), and their source; the tiling
// fields of the config are unused.
std::string FlashDecodeKernelName(const FlashAttentionConfig& c);
std::string RenderFlashDecodeSource(const FlashAttentionConfig& c);

// A KV-cache append fused into the decode kernel (the attention family's node for
// `index_copy_(k_cache, -2, slots, k_new); index_copy_(v_cache, -2, slots, v_new);
// sdpa(q, k_cache, v_cache, ...)`): the kernel writes row t of k_new / v_new into row slots[t]
// of the caches it is given as k and v, and reads those rows from k_new / v_new. A slot outside
// the cache raises `*bad` and writes nothing (index_copy's rule; the caller reports it).
// With rotary tables (cos defined) the queries and the new keys are first rotated, the rotate-half
// form: with x = (x1, x2) the halves of a row, (x1·cos - x2·sin, x2·cos + x1·sin), the rotated
// keys being what the caches get. cos and sin [.., half] broadcast to [B, 1, rows, half] (rows:
// the query rows, which then equal the new rows) in q's dtype, rows 16-byte aligned.
struct FlashKvAppend {
  Tensor slots;             // int64 or int32, 1-D, at most kFlashDecodeMaxQueries
  Tensor k_new, v_new;      // the caches' shapes with slots.numel() rows, the same layout rules
  unsigned* bad = nullptr;  // the launch needs one (ops/cuda/index_cuda.h KernelIndexFlag)
  Tensor cos, sin;          // rotary tables, or undefined
};
// Why the decode kernel cannot run sdpa(in) with `append` ("" when it can): the flash kernel's
// own rules, then at most kFlashDecodeMaxQueries query rows and new rows, and the new rows'
// dtype, shape and layout.
std::string FlashKvAppendUnsupportedReason(absl::Span<const Tensor> in, const OpAttrs& a,
                                           const FlashKvAppend& append);

// Whether the kernels can write `out` in place: the inferred type, contiguous head dim, 16-byte
// aligned rows (a contiguous result, or the heads-last one Dispatch allocates, always can).
bool FlashCanWrite(const Tensor& out);

// out = scaled_dot_product_attention(q, k, v[, mask]) on the current stream; the operands must
// pass FlashAttentionUnsupportedReason and `out` FlashCanWrite. Throws kiln::Error with the NVRTC
// log or the CUDA error.
// With `append` (which must pass FlashKvAppendUnsupportedReason) the decode kernel also writes
// the new rows into in[1] and in[2].
void LaunchFlashAttention(absl::Span<const Tensor> in, const OpAttrs& a, const Tensor& out,
                          const FlashKvAppend* append = nullptr);

// The bytes of the decode kernels' one parameter as the host fills it (its mirror of
// KilnDecodeParams): the kernel's parameter in its PTX must be as long (a test checks).
size_t FlashDecodeParamsBytes();

}  // namespace kiln::cuda_ops
