// The Hopper attention kernel's configuration and source (see flash_attention_sm90_source.h). Host
// code only: a build without CUDA renders the same source.
#include "codegen/families/attention/flash_attention_sm90_source.h"

#include "absl/strings/str_cat.h"
#include "codegen/families/attention/flash_attention_source.h"
#include "ops/cuda/hopper_primitives.h"
#include "runtime/settings.h"
#include "runtime/status.h"

namespace kiln::cuda_ops {
namespace {

constexpr int kMaxSharedBytes = 227 * 1024;  // per CTA on sm_90

// The kernel after its #defines, the parameter block (flash_attention_source.h), the Hopper
// primitives and the two wgmma wrappers: kiln_fa3_qk (S = Q·Kᵀ, both from shared memory) and
// kiln_fa3_pv (O += P·V, P from registers, V MN-major).
constexpr char kKernel[] = R"KILN_FA3(
namespace kiln_fa3 {

constexpr int D = KILN_FA3_HEAD_DIM, BN = KILN_FA3_BLOCK_N, STAGES = KILN_FA3_STAGES;
constexpr int CONSUMERS = KILN_FA3_CONSUMERS;   // warpgroups of 64 query rows each
constexpr int BM = 64 * CONSUMERS;              // query rows of a CTA's tile
constexpr int SN = BN / 2, ON = D / 2;          // S and O accumulators per thread
constexpr unsigned Q_CHUNK = BM * 128, KV_CHUNK = BN * 128;  // bytes of 64 columns of a tile
constexpr unsigned Q_BYTES = BM * D * 2, KV_BYTES = BN * D * 2;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float exp2_approx(float x) {  // ex2.approx(-inf) = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// 2^x on the FMA pipe (FlashAttention-4's emulation): x = j + f with j = rint(x) and f in
// [-0.5, 0.5]; 2^f by a degree-3 minimax polynomial (relative error 7.5e-5, under half an f16
// ulp), times 2^j built from its exponent bits. x is clamped at -127, whose 2^j is +0: a masked
// score (-inf) gives +0 as ex2.approx.ftz does; a NaN stays NaN (max.NaN, then the product).
__device__ __forceinline__ float exp2_fma(float x) {
  float xc;
  asm("max.NaN.f32 %0, %1, 0fC2FE0000;" : "=f"(xc) : "f"(x));  // -127
  const float t = __fadd_rn(xc, 12582912.f);  // 1.5 * 2^23: rint(x) in the low mantissa bits
  const float f = __fsub_rn(xc, __fsub_rn(t, 12582912.f));
  const float y =
      fmaf(fmaf(fmaf(0.0551716691f, f, 0.242611122f), f, 0.693260985f), f, 0.999928074f);
  return y * __uint_as_float((__float_as_uint(t) << 23) + 0x3f800000u);  // 2^j: (j + 127) << 23
}

// Probability k of a thread's row (of BN / 4) as the plan splits them between the pipes.
__device__ __forceinline__ float exp2_split(float x, int k) {
  return k % 8 < KILN_FA3_EXP2_FMA ? exp2_fma(x) : exp2_approx(x);
}
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
#if KILN_FA3_BF16
  return kiln_pack_bf16x2(lo, hi);
#else
  return kiln_pack_f16x2(lo, hi);
#endif
}

// A quad of lanes (lane % 4 = q) holds one row's columns 2q, 2q + 1 of each 8-column group;
// x[i] is this lane's 4 bytes of group i of four. Leaves in x the 16 bytes of group q (x[c] from
// lane c), so the quad stores 64 contiguous bytes: whole 32-byte sectors, where each lane's own
// 4-byte stores would fill half a sector each. A 4x4 transpose in place, two butterfly stages of
// two shuffles; every lane of the warp takes part.
__device__ __forceinline__ void quad_transpose(unsigned (&x)[4], int lane) {
#pragma unroll
  for (int m = 1; m <= 2; m *= 2) {
    const bool upper = lane & m;  // keeps the entries with bit m set, trades the others
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (i & m) continue;
      const unsigned got = __shfl_xor_sync(0xffffffffu, upper ? x[i] : x[i | m], m);
      x[i] = upper ? got : x[i];
      x[i | m] = upper ? x[i | m] : got;
    }
  }
}

// Tile j's K or V (keys n0 .. n0 + BN) into one slot of the ring, completing on `bar`; issued by
// one thread. Keys past the end arrive as zeros.
__device__ __forceinline__ void load_tile(const KilnTensorMap* map, unsigned dst, unsigned bar,
                                          int n0, int head, int batch) {
  kiln_mbar_expect_tx(bar, KV_BYTES);
#pragma unroll
  for (int c = 0; c < D / 64; ++c) kiln_tma_load_4d(dst + c * KV_CHUNK, map, bar, c * 64, n0, head, batch);
}

// Tile j's K and V into one slot, each on its own barrier.
__device__ __forceinline__ void load_kv(const KilnTensorMap* k_map, const KilnTensorMap* v_map,
                                        unsigned sk, unsigned sv, unsigned k_bar, unsigned v_bar,
                                        int n0, int head, int batch) {
  load_tile(k_map, sk, k_bar, n0, head, batch);
  load_tile(v_map, sv, v_bar, n0, head, batch);
}

// S = Q·Kᵀ of the K tile at `sk_s`, issued as one wgmma group (not waited for).
__device__ __forceinline__ void issue_qk(float (&sc)[SN], unsigned sq, unsigned sk_s) {
  kiln_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int c = kk / 4, k4 = kk % 4;  // the 64-dim chunk, 16 dims (32 bytes) in it
    kiln_fa3_qk(sc, kiln_wgmma_desc(sq + c * Q_CHUNK) + 2 * k4,
                kiln_wgmma_desc(sk_s + c * KV_CHUNK) + 2 * k4, kk);
  }
  kiln_wgmma_commit();
}

// O += P·V of the V tile at `sv_s`, P from registers, issued as one wgmma group.
__device__ __forceinline__ void issue_pv(float (&o)[ON], const unsigned (&pa)[BN / 16][4],
                                         unsigned sv_s) {
  kiln_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    kiln_fa3_pv(o, pa[kk], kiln_wgmma_desc_mn(sv_s + kk * 16 * 128, KV_CHUNK), 1);
  }
  kiln_wgmma_commit();
}

// The persistent form's ping-pong (FlashAttention-3): the consumer warpgroups issue their wgmma in
// turns, w after w - 1, so one's products run while the others' softmax does. Named barrier 1 + w:
// the 128 threads of w wait on it, the 128 of w - 1 arrive.
__device__ __forceinline__ void turn_wait(int wg) {
#if KILN_FA3_PINGPONG
  asm volatile("bar.sync %0, 256;" ::"r"(1 + wg) : "memory");
#endif
}
__device__ __forceinline__ void turn_pass(int wg) {
#if KILN_FA3_PINGPONG
  asm volatile("bar.arrive %0, 256;" ::"r"(1 + (wg + 1) % CONSUMERS) : "memory");
#endif
}

// The running max and sum of this thread's two rows.
struct Rows {
  float max[2], sum[2];
};

// Online softmax of one tile in base-2 logits: masks where needed, moves a row's running max only
// when the tile's exceeds it by more than 2^8 (alpha[h]: the factor O must then be scaled by; 1
// otherwise), turns the scores into probabilities and adds them to the sums. Touches no O.
__device__ __forceinline__ void softmax(float (&sc)[SN], Rows& r, float (&alpha)[2],
                                        const KilnFlashParams& p, int n0, int m0, int row_lo,
                                        int lane) {
  // Per-element work only where needed: the ragged end of the keys, the diagonal, or a scale
  // that is not positive (the fast path's max of raw scores needs scale > 0).
  bool masked = n0 + BN > p.kv_len || !(p.scale_log2 > 0.f);
#if KILN_FA3_CAUSAL
  masked = masked || n0 + BN - 1 > m0;
#endif
  if (masked) {
#pragma unroll
    for (int i = 0; i < SN; ++i) {
      const int col = n0 + 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
      [[maybe_unused]] const int row = row_lo + 8 * ((i / 2) % 2);
      bool keep = col < p.kv_len;
#if KILN_FA3_CAUSAL
      keep = keep && col <= row;
#endif
      sc[i] = keep ? sc[i] * p.scale_log2 : neg_inf();
    }
  }
  float mx[2];
  bool grow = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m = neg_inf();
#pragma unroll
    for (int g = 0; g < BN / 8; ++g) m = fmaxf(m, fmaxf(sc[4 * g + 2 * h], sc[4 * g + 2 * h + 1]));
    mx[h] = masked ? m : m * p.scale_log2;
    grow = grow || mx[h] > r.max[h] + 8.f;
    alpha[h] = 1.f;
  }
  if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m = mx[h];
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      const float m_new = fmaxf(r.max[h], m);
      // exp2(-inf - m) = 0 drops a row's empty past; an all -inf row keeps p = 0 (no NaN)
      alpha[h] = exp2_approx(r.max[h] - (m_new == neg_inf() ? 0.f : m_new));
      r.max[h] = m_new;
      r.sum[h] *= alpha[h];
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_use = r.max[h] == neg_inf() ? 0.f : r.max[h];
    float sum = 0.f;
#pragma unroll
    for (int g = 0; g < BN / 8; ++g)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = sc[4 * g + 2 * h + e];
        const float pr = exp2_split(masked ? x - m_use : fmaf(x, p.scale_log2, -m_use), 2 * g + e);
        sc[4 * g + 2 * h + e] = pr;
        sum += pr;
      }
    r.sum[h] += sum;  // this thread's part; the quad's are added at the end
  }
}

__device__ __forceinline__ void rescale(float (&o)[ON], const float (&alpha)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (alpha[h] == 1.f) continue;
#pragma unroll
    for (int g = 0; g < D / 8; ++g) {
      o[4 * g + 2 * h] *= alpha[h];
      o[4 * g + 2 * h + 1] *= alpha[h];
    }
  }
}

// P as wgmma's A fragments: the accumulators of column groups 2kk and 2kk + 1.
__device__ __forceinline__ void pack_p(const float (&sc)[SN], unsigned (&pa)[BN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    pa[kk][0] = pack2(sc[8 * kk + 0], sc[8 * kk + 1]);
    pa[kk][1] = pack2(sc[8 * kk + 2], sc[8 * kk + 3]);
    pa[kk][2] = pack2(sc[8 * kk + 4], sc[8 * kk + 5]);
    pa[kk][3] = pack2(sc[8 * kk + 6], sc[8 * kk + 7]);
  }
}

}  // namespace kiln_fa3

#if KILN_FA3_CONSUMERS == 1
extern "C" __global__ void __launch_bounds__(128, KILN_FA3_MIN_BLOCKS) KILN_FA3_NAME(
    const __grid_constant__ KilnTensorMap q_map, const __grid_constant__ KilnTensorMap k_map,
    const __grid_constant__ KilnTensorMap v_map, const KilnFlashParams p) {
  using namespace kiln_fa3;
  // Q, then the K slots, the V slots (all at 1024-byte boundaries: the swizzle's period), then
  // the barriers: Q's, K's per slot, V's per slot.
  extern __shared__ __align__(1024) unsigned char kiln_smem[];
  const unsigned sq = kiln_smem_addr(kiln_smem);
  if (sq % 1024 != 0) __trap();  // the declaration's alignment is what the swizzle needs
  const unsigned sk = sq + Q_BYTES, sv = sk + STAGES * KV_BYTES;
  const unsigned q_bar = sv + STAGES * KV_BYTES, k_bar = q_bar + 8, v_bar = k_bar + 8 * STAGES;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  int pair, tile;  // CTAs start in the order of their linear index
  kiln_flash_work_item(blockIdx.x + blockIdx.y * gridDim.x, gridDim.y, gridDim.x, p.section, pair,
                       tile);
  const int batch = pair / p.heads, head = pair % p.heads, kv_head = head / p.group;
  const int m0 = tile * BM;
  int n_end = p.kv_len;
#if KILN_FA3_CAUSAL
  n_end = min(n_end, m0 + BM);  // keys past the CTA's last row are masked for all its rows
#endif
  const int n_tiles = (n_end + BN - 1) / BN;
  if (t == 0) {
    kiln_mbar_init(q_bar, 1);
    for (int s = 0; s < STAGES; ++s) {
      kiln_mbar_init(k_bar + 8 * s, 1);
      kiln_mbar_init(v_bar + 8 * s, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  kiln_grid_dependency_sync();
  if (t == 0) {
    kiln_mbar_expect_tx(q_bar, Q_BYTES);
#pragma unroll
    for (int c = 0; c < D / 64; ++c) kiln_tma_load_4d(sq + c * Q_CHUNK, &q_map, q_bar, c * 64, m0, head, batch);
    for (int j = 0; j < STAGES && j < n_tiles; ++j) {
      load_kv(&k_map, &v_map, sk + j * KV_BYTES, sv + j * KV_BYTES, k_bar + 8 * j, v_bar + 8 * j,
              j * BN, kv_head, batch);
    }
  }

  // Thread (warp w, lane l) holds rows 16w + l/4 (+8) of the tile and, of each 8-column group g
  // of S or O, columns 8g + 2(l%4) (+1), in acc[4g + 2h + e] (h: the row half, e: the column).
  float o[ON];
#pragma unroll
  for (int i = 0; i < ON; ++i) o[i] = 0.f;
  Rows rows = {{neg_inf(), neg_inf()}, {0.f, 0.f}};
  const int row_lo = m0 + warp * 16 + lane / 4;
  float sc[SN], alpha[2];
  unsigned pa[BN / 16][4];
  kiln_mbar_wait(q_bar, 0);
  // Tile 0's scores and probabilities. Then each tile j's S = Q·K(j)ᵀ is issued with the
  // previous tile's O += P·V and its softmax runs while that product does (FlashAttention-3's
  // intra-warpgroup overlap); O is rescaled once the product is in.
  kiln_mbar_wait(k_bar, 0);
  issue_qk(sc, sq, sk);
  kiln_wgmma_wait<0>();
  kiln_fence_operands(sc);
  softmax(sc, rows, alpha, p, 0, m0, row_lo, lane);  // O is zero: alpha needs no use
  pack_p(sc, pa);
  for (int j = 1; j < n_tiles; ++j) {
    const int s = j % STAGES, prev = (j - 1) % STAGES;
    kiln_mbar_wait(k_bar + 8 * s, (j / STAGES) & 1);
    issue_qk(sc, sq, sk + s * KV_BYTES);
    kiln_mbar_wait(v_bar + 8 * prev, ((j - 1) / STAGES) & 1);
    kiln_fence_operands(o);
    issue_pv(o, pa, sv + prev * KV_BYTES);
    kiln_wgmma_wait<1>();  // S(j) is in; P(j-1)·V(j-1) may still run
    kiln_fence_operands(sc);
    softmax(sc, rows, alpha, p, j * BN, m0, row_lo, lane);
    kiln_wgmma_wait<0>();
    kiln_fence_operands(o);
    rescale(o, alpha);
    pack_p(sc, pa);
    if (j - 1 + STAGES < n_tiles) {
      __syncthreads();  // every warp's wgmma has read slot `prev`: refill it
      if (t == 0) {
        load_kv(&k_map, &v_map, sk + prev * KV_BYTES, sv + prev * KV_BYTES, k_bar + 8 * prev,
                v_bar + 8 * prev, (j - 1 + STAGES) * BN, kv_head, batch);
      }
    }
  }
  const int last = (n_tiles - 1) % STAGES;
  kiln_mbar_wait(v_bar + 8 * last, ((n_tiles - 1) / STAGES) & 1);
  kiln_fence_operands(o);
  issue_pv(o, pa, sv + last * KV_BYTES);
  kiln_wgmma_wait<0>();
  kiln_fence_operands(o);

  // Normalise; stage the rows in Q's shared memory (free: every wgmma reading it has completed)
  // in the same swizzle, then 16-byte stores of the rows that exist.
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = rows.sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;  // a row with no keys: zeros
    const int r = warp * 16 + lane / 4 + 8 * h;
#pragma unroll
    for (int g = 0; g < D / 8; ++g) {
      const unsigned at = sq + (g / 8) * Q_CHUNK + r * 128 + (((g % 8) ^ (r % 8)) << 4) + (lane % 4) * 4;
      kiln_st_shared_u32(at, pack2(o[4 * g + 2 * h] * inv, o[4 * g + 2 * h + 1] * inv));
    }
  }
  __syncthreads();
  kiln_u16* out = p.o + batch * p.o_batch + head * p.o_head;
#pragma unroll
  for (int i = t; i < BM * D / 8; i += 128) {
    const int r = i / (D / 8), g = i % (D / 8);
    if (m0 + r < p.q_len) {
      const unsigned at = sq + (g / 8) * Q_CHUNK + r * 128 + (((g % 8) ^ (r % 8)) << 4);
      unsigned v0, v1, v2, v3;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3) : "r"(at));
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                   :: "l"(out + (long long)(m0 + r) * p.o_row + g * 8), "r"(v0), "r"(v1), "r"(v2),
                      "r"(v3) : "memory");
    }
  }
}
#else
// Two or three consumer warpgroups share each K/V tile (64 query rows each), a producer warpgroup
// (one thread) copies, and one CTA an SM loops over the (batch, head, row tile) work items: the
// producer loads the next item's Q and first K/V tiles while the consumers finish the current
// one. The producer gives most of its registers to the consumers (setmaxnreg).
// Which items a CTA takes: every gridDim.x-th from its own index, or (KILN_FA3_DYNAMIC, for
// causal work, whose items differ in length) its own index first and then the next item nobody
// has taken, counted by `next_work` (zeroed for the launch) once its producer has issued the
// current item's last copy (FlashAttention-3's tile scheduler). The producer hands each index to
// the consumers in shared memory with the item's Q (the q_full arrival publishes it); an index
// past the end stops them.
extern "C" __global__ void __launch_bounds__(128 * (KILN_FA3_CONSUMERS + 1), 1) KILN_FA3_NAME(
    const __grid_constant__ KilnTensorMap q_map, const __grid_constant__ KilnTensorMap k_map,
    const __grid_constant__ KilnTensorMap v_map, const KilnFlashParams p, int q_tiles, int works,
    int* next_work) {
  using namespace kiln_fa3;
  extern __shared__ __align__(1024) unsigned char kiln_smem[];
  const unsigned sq = kiln_smem_addr(kiln_smem);
  if (sq % 1024 != 0) __trap();  // the declaration's alignment is what the swizzle needs
  const unsigned sk = sq + Q_BYTES, sv = sk + STAGES * KV_BYTES;
  // Barriers: Q full, Q empty, then per slot K full, V full, K empty, V empty (a K slot is free
  // once S is in, before its V's product has run).
  const unsigned q_full = sv + STAGES * KV_BYTES, q_empty = q_full + 8, k_full = q_empty + 8;
  const unsigned v_full = k_full + 8 * STAGES, k_empty = v_full + 8 * STAGES;
  const unsigned v_empty = k_empty + 8 * STAGES, item_slot = v_empty + 8 * STAGES;
  const int t = threadIdx.x % 128, wg = threadIdx.x / 128, warp = t / 32, lane = t % 32;
  const int bh = works / q_tiles;
  if (threadIdx.x == 0) {
    kiln_mbar_init(q_full, 1);
    kiln_mbar_init(q_empty, CONSUMERS);
    for (int s = 0; s < STAGES; ++s) {
      kiln_mbar_init(k_full + 8 * s, 1);
      kiln_mbar_init(v_full + 8 * s, 1);
      kiln_mbar_init(k_empty + 8 * s, CONSUMERS);
      kiln_mbar_init(v_empty + 8 * s, CONSUMERS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  kiln_grid_dependency_sync();
  auto item = [&](int w, int& batch, int& head, int& m0, int& n_tiles) {
    int pair, tile;
    kiln_flash_work_item(w, q_tiles, bh, p.section, pair, tile);
    batch = pair / p.heads;
    head = pair % p.heads;
    m0 = tile * BM;
    int n_end = p.kv_len;
#if KILN_FA3_CAUSAL
    n_end = min(n_end, m0 + BM);
#endif
    n_tiles = (n_end + BN - 1) / BN;
  };
  if (wg == CONSUMERS) {  // the producer: one thread issues every copy
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
    if (t != 0) return;
    int it = 0;
    for (int w = blockIdx.x, done = 0;; ++done) {
#if KILN_FA3_DYNAMIC
      kiln_mbar_wait(q_empty, (done & 1) ^ 1);
      kiln_st_shared_u32(item_slot, w);
      if (w >= works) {
        kiln_mbar_arrive(q_full);  // the consumers' stop
        return;
      }
#else
      if (w >= works) return;
      kiln_mbar_wait(q_empty, (done & 1) ^ 1);
#endif
      int batch, head, m0, n_tiles;
      item(w, batch, head, m0, n_tiles);
      kiln_mbar_expect_tx(q_full, Q_BYTES);
#pragma unroll
      for (int c = 0; c < D / 64; ++c) kiln_tma_load_4d(sq + c * Q_CHUNK, &q_map, q_full, c * 64, m0, head, batch);
      for (int j = 0; j < n_tiles; ++j, ++it) {
        const int s = it % STAGES;
        const int phase = ((it / STAGES) & 1) ^ 1;
        kiln_mbar_wait(k_empty + 8 * s, phase);
        load_tile(&k_map, sk + s * KV_BYTES, k_full + 8 * s, j * BN, head / p.group, batch);
        kiln_mbar_wait(v_empty + 8 * s, phase);
        load_tile(&v_map, sv + s * KV_BYTES, v_full + 8 * s, j * BN, head / p.group, batch);
      }
#if KILN_FA3_DYNAMIC
      w = gridDim.x + atomicAdd(next_work, 1);
#else
      w += gridDim.x;
#endif
    }
  }
#if KILN_FA3_CONSUMERS == 2
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
#else
  asm volatile("setmaxnreg.inc.sync.aligned.u32 160;");
#endif
  const unsigned sq_c = sq + wg * 64 * 128;  // this consumer's 64 rows of each Q chunk
  // Every issue of wgmma (a tile's first S, each S(j) with P(j-1)·V(j-1), the last P·V) is a turn;
  // consumer 0 takes the first, and absorbs the last consumer's last pass after its loop.
  if (wg == CONSUMERS - 1) turn_pass(wg);
  int it = 0;
  for (int done = 0;; ++done) {
#if KILN_FA3_DYNAMIC
    kiln_mbar_wait(q_full, done & 1);  // this item's Q, or the producer's stop
    const int w = kiln_ld_shared_u32(item_slot);
#else
    const int w = blockIdx.x + done * gridDim.x;
#endif
    if (w >= works) break;
    int batch, head, m0, n_tiles;
    item(w, batch, head, m0, n_tiles);
    const int row0 = m0 + wg * 64, row_lo = row0 + warp * 16 + lane / 4;
    float o[ON];
#pragma unroll
    for (int i = 0; i < ON; ++i) o[i] = 0.f;
    Rows rows = {{neg_inf(), neg_inf()}, {0.f, 0.f}};
    float sc[SN], alpha[2];
    unsigned pa[BN / 16][4];
#if !KILN_FA3_DYNAMIC
    kiln_mbar_wait(q_full, done & 1);
#endif
    kiln_mbar_wait(k_full + 8 * (it % STAGES), (it / STAGES) & 1);
    turn_wait(wg);
    issue_qk(sc, sq_c, sk + (it % STAGES) * KV_BYTES);
    turn_pass(wg);
    kiln_wgmma_wait<0>();
    kiln_fence_operands(sc);
    if (t == 0) kiln_mbar_arrive(k_empty + 8 * (it % STAGES));
    if (n_tiles == 1 && t == 0) kiln_mbar_arrive(q_empty);  // Q read for the last time
    softmax(sc, rows, alpha, p, 0, row0, row_lo, lane);
    pack_p(sc, pa);
    for (int j = 1; j < n_tiles; ++j) {
      const int s = (it + j) % STAGES, prev = (it + j - 1) % STAGES;
      kiln_mbar_wait(k_full + 8 * s, ((it + j) / STAGES) & 1);
      kiln_mbar_wait(v_full + 8 * prev, ((it + j - 1) / STAGES) & 1);
      turn_wait(wg);
      issue_qk(sc, sq_c, sk + s * KV_BYTES);
      kiln_fence_operands(o);
      issue_pv(o, pa, sv + prev * KV_BYTES);
      turn_pass(wg);
      kiln_wgmma_wait<1>();
      kiln_fence_operands(sc);
      if (t == 0) kiln_mbar_arrive(k_empty + 8 * s);  // S(j) is in: K(j)'s slot is free
      if (j == n_tiles - 1 && t == 0) kiln_mbar_arrive(q_empty);
      softmax(sc, rows, alpha, p, j * BN, row0, row_lo, lane);
      kiln_wgmma_wait<0>();
      kiln_fence_operands(o);
      if (t == 0) kiln_mbar_arrive(v_empty + 8 * prev);  // P(j-1)·V(j-1) is in
      rescale(o, alpha);
      pack_p(sc, pa);
    }
    const int last = (it + n_tiles - 1) % STAGES;
    kiln_mbar_wait(v_full + 8 * last, ((it + n_tiles - 1) / STAGES) & 1);
    kiln_fence_operands(o);
    turn_wait(wg);
    issue_pv(o, pa, sv + last * KV_BYTES);
    turn_pass(wg);
    kiln_wgmma_wait<0>();
    kiln_fence_operands(o);
    if (t == 0) kiln_mbar_arrive(v_empty + 8 * last);
    it += n_tiles;
    // Normalise; each quad turns its row's pairs into whole groups (quad_transpose) and stores
    // 16 bytes a lane, for the rows that exist.
    kiln_u16* out = p.o + batch * p.o_batch + head * p.o_head;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = rows.sum[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int row = row_lo + 8 * h;
      kiln_u16* o_row = out + (long long)row * p.o_row + 8 * (lane % 4);
#pragma unroll
      for (int g0 = 0; g0 < D / 8; g0 += 4) {
        unsigned x[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int g = g0 + i;
          x[i] = pack2(o[4 * g + 2 * h] * inv, o[4 * g + 2 * h + 1] * inv);
        }
        quad_transpose(x, lane);
        if (row < p.q_len) {
          asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                       :: "l"(o_row + 8 * g0), "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3])
                       : "memory");
        }
      }
    }
  }
  if (wg == 0) turn_wait(wg);  // the last consumer's last pass: no arrival outlives the CTA
}
#endif
)KILN_FA3";

template <typename V>
void AppendDefine(std::string* source, const char* key, const V& value) {
  absl::StrAppend(source, "#define ", key, " ", value, "\n");
}

}  // namespace

int FlashSm90Config::shared_bytes() const {
  // The barriers (Q's two, four per slot) and the persistent form's work-item slot.
  return (block_m() + 2 * stages * block_n) * head_dim * 2 + 8 * (3 + 4 * stages);
}

std::string FlashSm90Config::Name() const {
  return absl::StrCat("kiln_flash_sm90_d", head_dim, dtype == DType::kFloat16 ? "_f16" : "_bf16",
                      causal ? "_causal" : "", "_", block_m(), "x", block_n, "_s", stages,
                      consumers == 1 ? absl::StrCat("_b", min_blocks)
                      : pingpong     ? "_persistent"
                                     : "_persistent_unordered",
                      dynamic ? "_dynamic" : "",
                      exp2_on_fma == 0 ? "" : absl::StrCat("_fma", exp2_on_fma));
}

FlashSm90Config PlanFlashSm90(int head_dim, DType dtype, bool causal, int64_t kv_len) {
  FlashSm90Config c;
  c.head_dim = head_dim;
  c.dtype = dtype;
  c.causal = causal;
  // Measured on the H200 (attention_bench, 2026-12-04, device us at [8,16,L,D]): head dim 64
  // causal under 2048 keys runs one warpgroup a CTA, three CTAs an SM, 128-key tiles, two in
  // flight (72 KB a CTA; L 1024: 62.5 against 74.2 with two persistent consumers); head dim 64
  // otherwise three consumers of a persistent CTA sharing 128-key tiles, four in flight (L 4096:
  // 1199 against 1303 with one-warpgroup CTAs); head dim 128 two consumers sharing 128-key tiles,
  // three in flight (224 KB; L 4096: 1908 against 2094 with 64-key tiles, five in flight). With
  // the dynamic schedule (H100, 2026-12-06, causal d64) three consumers win from 2048 keys (L
  // 2048: 183.8 against 193.0; L 4096: 654 against 699) and lose at 1024 (69.1 against 64.2).
  if (const int w = EnvLevel("KILN_FLASH_SM90_CONSUMERS"); w != 0) {
    c.consumers = w;
  } else {
    c.consumers = head_dim == 128 ? 2 : causal && kv_len < 2048 ? 1 : 3;
  }
  // One-warpgroup CTAs take 64-key tiles: at head dim 128 for the registers; at head dim 64
  // (causal) the diagonal tile then holds no keys past the CTA's rows (H100, 2026-12-06,
  // [8,16,1024,64] causal: 59.5 against 63.9 with 128-key tiles; 62.1 with three stages).
  c.block_n = 128, c.stages = 2, c.min_blocks = 3;
  if (c.consumers == 1) c.block_n = 64;
  if (c.consumers == 1 && head_dim == 128) c.min_blocks = 2;  // registers
  if (c.consumers == 2) c.stages = 3;
  if (c.consumers == 3) {  // 160 registers a consumer: 64-key tiles at head dim 128
    c.stages = head_dim == 128 ? 5 : 4;
    if (head_dim == 128) c.block_n = 64;
  }
  if (const int n = EnvLevel("KILN_FLASH_SM90_BLOCK_N"); n != 0) c.block_n = n;
  if (const int s = EnvLevel("KILN_FLASH_SM90_STAGES"); s != 0) c.stages = s;
  c.pingpong = EnvBool("KILN_FLASH_SM90_PINGPONG");
  if (const int e = EnvLevel("KILN_FLASH_SM90_EXP2_FMA"); e >= 0) c.exp2_on_fma = e;
  c.dynamic = causal && c.consumers > 1 && EnvBool("KILN_FLASH_SM90_DYNAMIC");
  return c;
}

std::string RenderFlashSm90Source(const FlashSm90Config& c) {
  KILN_CHECK((c.head_dim == 64 || c.head_dim == 128) &&
                 (c.dtype == DType::kBFloat16 || c.dtype == DType::kFloat16) &&
                 c.block_n % 16 == 0 && c.block_n >= 64 && c.block_n <= 256 && c.stages >= 2 &&
                 c.stages <= 8 && c.min_blocks >= 1 && c.min_blocks <= 4 && c.consumers >= 1 &&
                 c.consumers <= 3 && c.exp2_on_fma >= 0 && c.exp2_on_fma <= 8 &&
                 (!c.dynamic || c.consumers > 1) && c.shared_bytes() <= kMaxSharedBytes,
             "sm_90 attention kernel: needs head dim 64 or 128, bf16 or f16, 64..256 keys a ",
             "tile (a multiple of 16), 2..8 stages (tile j's S is computed while tile j-1's V is "
             "read), 1..4 CTAs an SM, 1..3 consumer warpgroups (2..3 for the dynamic schedule), "
             "0..8 of 8 exponentials on the FMA pipe, at most ",
             kMaxSharedBytes, " bytes of shared memory; got ", c.Name(), " (", c.shared_bytes(),
             " bytes)");
  std::string source;
  AppendDefine(&source, "KILN_FA3_NAME", c.Name());
  AppendDefine(&source, "KILN_FA3_HEAD_DIM", c.head_dim);
  AppendDefine(&source, "KILN_FA3_BLOCK_N", c.block_n);
  AppendDefine(&source, "KILN_FA3_STAGES", c.stages);
  AppendDefine(&source, "KILN_FA3_MIN_BLOCKS", c.min_blocks);
  AppendDefine(&source, "KILN_FA3_CONSUMERS", c.consumers);
  AppendDefine(&source, "KILN_FA3_PINGPONG", c.pingpong ? 1 : 0);
  AppendDefine(&source, "KILN_FA3_BF16", c.dtype == DType::kBFloat16 ? 1 : 0);
  AppendDefine(&source, "KILN_FA3_CAUSAL", c.causal ? 1 : 0);
  AppendDefine(&source, "KILN_FA3_EXP2_FMA", c.exp2_on_fma);
  AppendDefine(&source, "KILN_FA3_DYNAMIC", c.dynamic ? 1 : 0);
  absl::StrAppend(
      &source, kFlashParamsSource, HopperPrimitivesSource(),
      RenderWgmma("kiln_fa3_qk", c.block_n, c.dtype, {}),
      RenderWgmma("kiln_fa3_pv", c.head_dim, c.dtype, {.a_in_registers = true, .b_mn_major = true}),
      kKernel);
  return source;
}

}  // namespace kiln::cuda_ops
