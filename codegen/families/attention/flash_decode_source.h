// The CUDA source of kiln's attention kernels for few query rows (decode: one new token attends
// to a long key/value cache), as one string handed to NVRTC after a few #defines
// (codegen/families/attention/flash_attention_cuda.cc). The flash kernel (flash_attention_source.h)
// gives each CTA 128 query rows of one (batch, head): with one query row that is B·H CTAs each
// walking all keys alone, 64 µs for GPT-2's 12 heads over 1024 keys on the H200. Here the keys are
// split instead (flash-decoding):
//   * KILN_FD_NAME: CTA (row, split) — row = one query row of one (batch, head), split = a run
//     of split_len keys — has 4 warps; warp w takes keys w·4 .. w·4+3 of each group of 16, one
//     lane per D/32 elements of the head dim: 4 keys' K and V rows are loaded before any is used
//     (memory-level parallelism), each score is a warp-shuffle reduction, and the softmax is
//     online in fp32 and base 2 (x = s·scale·log2 e + mask·log2 e), as in the flash kernel. The
//     4 warps' (m, l, O) merge in shared memory; with one split the CTA writes the output row,
//     otherwise (O unnormalised, m, l) go to a float workspace [rows][splits][D + 2].
//   * KILN_FD_COMBINE_NAME: one CTA per row merges its splits: O = Σ O_s·2^(m_s - M) / Σ l_s·2^(m_s
//   - M).
// Semantics match the flash kernel: causal is torch's top-left rule (key j for query i iff
// j <= i), grouped-query heads read K/V head h / group, the mask (bool: nonzero keeps; additive
// float32/float16/bfloat16) is broadcast with any strides, and a row with no visible key is
// written as zeros.
//
// Specialisation: KILN_FD_NAME, KILN_FD_COMBINE_NAME, KILN_FD_HEAD_DIM (64 or 128), KILN_FD_BF16
// (1 bfloat16, 0 float16), KILN_FD_CAUSAL (0/1), KILN_FD_MASK (as KILN_FA_MASK: 0 none, 1 bool,
// 2/3/4 additive float32/float16/bfloat16).
#pragma once

#include "codegen/families/attention/flash_attention_source.h"

namespace kiln::cuda_ops {

inline constexpr char kFlashDecodeSource[] = R"KILN_FD(
// After kFlashParamsSource (flash_attention_source.h): the flash kernel's parameters, then the
// split of the keys and the workspace.
struct KilnDecodeParams {
  KilnFlashParams f;
  float* part;    // [rows][splits][D + 2]: O (unnormalised), then m and l; unused with 1 split
  int splits;     // key runs per row (the grid's y)
  int split_len;  // keys per run
};

namespace kiln_fd {

constexpr int D = KILN_FD_HEAD_DIM;
constexpr int E = D / 32;     // head-dim elements per lane
constexpr int WARPS = 4;
constexpr int UNROLL = 4;     // keys per warp whose K and V rows are in flight together
constexpr int kMaxSplits = 1024;  // the host never splits a row further
constexpr float kLog2e = 1.4426950408889634f;
static_assert(D == 64 || D == 128, "head dim");

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float bf16_to_f(unsigned x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float f16_to_f(unsigned short x) {
  float f;
  asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(x));
  return f;
}
__device__ __forceinline__ float to_f(unsigned x) {
#if KILN_FD_BF16
  return bf16_to_f(x & 0xffff);
#else
  return f16_to_f(static_cast<unsigned short>(x & 0xffff));
#endif
}
__device__ __forceinline__ kiln_u16 from_f(float x) {
  unsigned short r;
#if KILN_FD_BF16
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
#else
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
#endif
  return r;
}

// The E elements of a row this lane owns, as floats (one 4- or 8-byte load).
__device__ __forceinline__ void load_lane(const kiln_u16* p, float (&out)[E]) {
#if KILN_FD_HEAD_DIM == 64
  const unsigned w = *reinterpret_cast<const unsigned*>(p);
  out[0] = to_f(w);
  out[1] = to_f(w >> 16);
#else
  const uint2 w = *reinterpret_cast<const uint2*>(p);
  out[0] = to_f(w.x);
  out[1] = to_f(w.x >> 16);
  out[2] = to_f(w.y);
  out[3] = to_f(w.y >> 16);
#endif
}

// Whether query row i sees key j, and the key's additive mask in base 2 (*add).
__device__ __forceinline__ bool visible(const KilnFlashParams& p, const char* mask, int i, int j,
                                        float* add) {
  bool keep = true;
#if KILN_FD_CAUSAL
  keep = j <= i;
#endif
#if KILN_FD_MASK != 0
  const long long off = i * p.m_row + j * p.m_col;
#if KILN_FD_MASK == 1
  keep = keep && reinterpret_cast<const unsigned char*>(mask)[off] != 0;
#elif KILN_FD_MASK == 2
  *add = reinterpret_cast<const float*>(mask)[off] * kLog2e;
#elif KILN_FD_MASK == 3
  *add = f16_to_f(reinterpret_cast<const kiln_u16*>(mask)[off]) * kLog2e;
#else
  *add = bf16_to_f(reinterpret_cast<const kiln_u16*>(mask)[off]) * kLog2e;
#endif
#endif
  return keep;
}

// Merges n parts' (m, l, O[d]) (m and l every ml_stride floats, O[d] every o_stride): returns the
// merged unnormalised O[d], and the merged m and l (l = 0 when no part saw a key).
__device__ __forceinline__ float merge(const float* m, const float* l, int ml_stride,
                                       const float* o, int o_stride, int n, float* m_out,
                                       float* l_out) {
  float big = neg_inf();
  for (int s = 0; s < n; ++s) big = fmaxf(big, m[s * ml_stride]);
  float sum = 0.f, acc = 0.f;
  if (big != neg_inf()) {
    for (int s = 0; s < n; ++s) {
      const float c = exp2f(m[s * ml_stride] - big);  // a part that saw nothing: m = -inf, c = 0
      sum += l[s * ml_stride] * c;
      acc += o[s * o_stride] * c;
    }
  }
  *m_out = big;
  *l_out = sum;
  return acc;
}

// The (b, h, i) of grid row r = (b * heads + h) * q_len + i.
struct Row {
  int b, h, i;
};
__device__ __forceinline__ Row row_of(const KilnFlashParams& p, int r) {
  const int bh = r / p.q_len;
  return {bh / p.heads, bh % p.heads, r % p.q_len};
}

}  // namespace kiln_fd

extern "C" __global__ void __launch_bounds__(kiln_fd::WARPS * 32) KILN_FD_NAME(const KilnDecodeParams dp) {
  using namespace kiln_fd;
  kiln_grid_dependency_sync();
  const KilnFlashParams& p = dp.f;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = blockIdx.x, split = blockIdx.y;
  const Row row = row_of(p, r);
  const int hk = row.h / p.group;
  const int j0 = split * dp.split_len;
  int j1 = min(j0 + dp.split_len, p.kv_len);
#if KILN_FD_CAUSAL
  j1 = min(j1, row.i + 1);
#endif
  const kiln_u16* q = p.q + row.b * p.q_batch + row.h * p.q_head + row.i * p.q_row + lane * E;
  const kiln_u16* k = p.k + row.b * p.k_batch + hk * p.k_head + lane * E;
  const kiln_u16* v = p.v + row.b * p.v_batch + hk * p.v_head + lane * E;
  const char* mask = static_cast<const char*>(p.mask);
#if KILN_FD_MASK != 0
  mask += (row.b * p.m_batch + row.h * p.m_head) * (KILN_FD_MASK == 1 ? 1 : KILN_FD_MASK == 2 ? 4 : 2);
#endif
  float qf[E];
  load_lane(q, qf);
#pragma unroll
  for (int e = 0; e < E; ++e) qf[e] *= p.scale_log2;  // scores come out as base-2 logits
  float m = neg_inf(), l = 0.f, acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;

  for (int jb = j0 + warp * UNROLL; jb < j1; jb += WARPS * UNROLL) {
    float kf[UNROLL][E], vf[UNROLL][E];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long j = min(jb + u, j1 - 1);  // past the run: re-read its last key, unused
      load_lane(k + j * p.k_row, kf[u]);
      load_lane(v + j * p.v_row, vf[u]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) s += qf[e] * kf[u][e];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      float add = 0.f;
      const bool keep = jb + u < j1 && visible(p, mask, row.i, jb + u, &add);
      const float x = s + add;
      if (keep && x != neg_inf()) {  // the same for every lane: s is reduced, the mask shared
        const float m_new = fmaxf(m, x);
        const float c = exp2f(m - m_new);  // 0 while nothing was seen (m = -inf)
        const float pr = exp2f(x - m_new);
        l = l * c + pr;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = acc[e] * c + pr * vf[u][e];
        m = m_new;
      }
    }
  }

  __shared__ float sm[WARPS], sl[WARPS], so[WARPS][D];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) so[warp][lane * E + e] = acc[e];
  __syncthreads();
  const int d = threadIdx.x;
  if (d >= D) return;
  float big, sum;
  const float o = merge(sm, sl, 1, &so[0][d], D, WARPS, &big, &sum);
  if (dp.splits == 1) {
    kiln_u16* out = p.o + row.b * p.o_batch + row.h * p.o_head + row.i * p.o_row;
    out[d] = from_f(sum > 0.f ? o / sum : 0.f);
    return;
  }
  float* part = dp.part + (static_cast<long long>(r) * dp.splits + split) * (D + 2);
  part[d] = o;
  if (d == 0) {
    part[D] = big;
    part[D + 1] = sum;
  }
}

extern "C" __global__ void __launch_bounds__(128) KILN_FD_COMBINE_NAME(const KilnDecodeParams dp) {
  using namespace kiln_fd;
  kiln_grid_dependency_sync();
  const KilnFlashParams& p = dp.f;
  // The splits' m and l in shared memory (read once, in parallel), then their weights
  // 2^(m_s - M); the threads then sum the weighted parts (below).
  __shared__ float sm[kMaxSplits], sl[kMaxSplits];
  const int r = blockIdx.x, t = threadIdx.x, n = dp.splits;
  const float* part = dp.part + static_cast<long long>(r) * n * (D + 2);
  for (int s = t; s < n; s += blockDim.x) {
    sm[s] = part[s * (D + 2) + D];
    sl[s] = part[s * (D + 2) + D + 1];
  }
  __shared__ float big_shared;
  __syncthreads();
  if (t < 32) {  // the max over the splits: one warp, then shuffles
    float big = neg_inf();
    for (int s = t; s < n; s += 32) big = fmaxf(big, sm[s]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, o));
    if (t == 0) big_shared = big;
  }
  __syncthreads();
  const float big = big_shared;
  for (int s = t; s < n; s += blockDim.x) {
    sm[s] = big == neg_inf() ? 0.f : exp2f(sm[s] - big);  // a split that saw nothing: 0
  }
  __syncthreads();
  // All 128 threads sum: thread t takes element t % D of every (128 / D)-th split, so its loads
  // of the workspace are few and independent (in flight together); the parts meet in shared.
  constexpr int H = 128 / D;
  const int d = t % D;
  float sum = 0.f, acc = 0.f;
#pragma unroll 16
  for (int s = t / D; s < n; s += H) {
    sum += sl[s] * sm[s];
    acc += part[s * (D + 2) + d] * sm[s];
  }
  __shared__ float red_sum[128], red_acc[128];
  red_sum[t] = sum;
  red_acc[t] = acc;
  __syncthreads();
  if (t >= D) return;
#pragma unroll
  for (int h = 1; h < H; ++h) {
    sum += red_sum[t + h * D];
    acc += red_acc[t + h * D];
  }
  const Row row = row_of(p, r);
  kiln_u16* out = p.o + row.b * p.o_batch + row.h * p.o_head + row.i * p.o_row;
  out[t] = from_f(sum > 0.f ? acc / sum : 0.f);
}
)KILN_FD";

}  // namespace kiln::cuda_ops
