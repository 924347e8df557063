// The CUDA source of kiln's attention kernels for few query rows (decode: one new token attends
// to a long key/value cache), as one string handed to NVRTC after a few #defines
// (codegen/families/attention/flash_attention_cuda.cc). The flash kernel (flash_attention_source.h)
// gives each CTA 128 query rows of one (batch, head): with one query row that is B·H CTAs each
// walking all keys alone, 64 µs for GPT-2's 12 heads over 1024 keys on the H200. Here the keys are
// split instead (flash-decoding):
//   * KILN_FD_NAME: CTA (row, split) — row = one query row of one (batch, head), split = a run
//     of split_len keys — has 4 warps. A key's K and V rows are read by a group of G = D/8 lanes,
//     16 bytes each (8 elements), so a warp holds 32/G keys per load and UNROLL loads of K and V
//     are in flight before any is used (16 keys, 4 KB a warp at D = 64: the bytes in flight are
//     what a decode step's attention is bound by). Keys the mask hides are not read at all (their
//     mask byte or value is read first): a KV cache filled to position p of its capacity costs p
//     keys, not the capacity. Each score is a shuffle reduction within the group; the softmax is
//     online in fp32 and base 2 (x = s·scale·log2 e + mask·log2 e), as in the flash kernel, one
//     rescale per UNROLL keys. The groups' (m, l, O) merge in shared memory.
//   * With one split the CTA writes the output row. With several on sm_90 the splits of a row are
//     one thread-block cluster (grid y = cluster y = splits, at most 16): each CTA stores its
//     (m, l, O) into CTA rank 0's shared memory (distributed shared memory), and after a cluster
//     barrier rank 0 writes O = Σ O_s·2^(m_s - M) / Σ l_s·2^(m_s - M): one kernel, no workspace.
//     Before sm_90 (no clusters) the splits write a float workspace [rows][splits][D + 2] and
//     KILN_FD_COMBINE_NAME (one CTA per row) merges it.
// Semantics match the flash kernel: causal is torch's top-left rule (key j for query i iff
// j <= i), grouped-query heads read K/V head h / group, the mask (bool: nonzero keeps; additive
// float32/float16/bfloat16) is broadcast with any strides, and a row with no visible key is
// written as zeros.
//
// With KILN_FD_APPEND the kernel also appends 1 (or up to 4) rows to the caches it reads (a decode
// step's index_copy_ of the new key and value into its KV cache, fused by the attention family):
// one CTA of each (batch, key head) writes them, and no CTA reads an appended key's row from the
// cache: the key loop skips the appended slots, and after it the CTA whose run holds one reads its
// row from the new rows (a one-key step of lane group 0), so the write and the reads need no
// ordering between CTAs, and the loop keeps its registers (the new rows' pointers live after it).
//
// Specialisation: KILN_FD_NAME, KILN_FD_COMBINE_NAME, KILN_FD_HEAD_DIM (64 or 128), KILN_FD_BF16
// (1 bfloat16, 0 float16), KILN_FD_CAUSAL (0/1), KILN_FD_MASK (as KILN_FA_MASK: 0 none, 1 bool,
// 2/3/4 additive float32/float16/bfloat16), KILN_FD_APPEND (0: none; else the most rows appended:
// 1, the decode step's one token, compares each key with one slot; 4 with four), KILN_FD_ROPE
// (0/1, with KILN_FD_APPEND only: the queries and the new keys are rotated by the rotary tables
// first, the rotate-half form of `q·cos + rotate_half(q)·sin`, and the rotated keys are what the
// caches get).
#pragma once

#include "codegen/families/attention/flash_attention_source.h"

namespace kiln::cuda_ops {

inline constexpr char kFlashDecodeSource[] = R"KILN_FD(
// After kFlashParamsSource (flash_attention_source.h): the flash kernel's parameters, then the
// split of the keys and the workspace.
struct KilnDecodeParams {
  KilnFlashParams f;
  float* part;    // [rows][splits][D + 2]: O (unnormalised), then m and l; null when the splits
                  // of a row are one cluster (or there is one split)
  int splits;     // key runs per row (the grid's y)
  int split_len;  // keys per run
  // A KV-cache append fused in (KILN_FD_APPEND): row t of k_new / v_new ([B, Hk, n_new, D]
  // strides below) is written into row slots[t] of the caches k / v.
  const kiln_u16* k_new; const kiln_u16* v_new;
  const void* slots;      // n_new indices, int64 (slots64) or int32, slot_stride apart
  long long slot_stride;
  long long kn_batch, kn_head, kn_row, vn_batch, vn_head, vn_row;
  unsigned* bad;          // raised for a slot outside [0, kv_len) (its rows are not written)
  int n_new, slots64;
  // Rotary embeddings fused in (KILN_FD_ROPE): the queries and the new keys are rotated before
  // use with the tables' row (b, i) (query row i, new row t = i): cos / sin [.., half] with
  // these strides (0 where they broadcast), the dtype of q.
  const kiln_u16* cos; const kiln_u16* sin;
  long long cos_batch, cos_row, sin_batch, sin_row;
};

namespace kiln_fd {

constexpr int D = KILN_FD_HEAD_DIM;
constexpr int VEC = 8;           // elements of a row per lane and load (16 bytes)
constexpr int G = D / VEC;       // lanes per key: 8 at D = 64, 16 at D = 128
constexpr int KPW = 32 / G;      // keys per warp and load
constexpr int WARPS = 4;
constexpr int UNROLL = 4;        // loads of K and V per lane in flight together
constexpr int GROUPS = WARPS * KPW;           // lane groups of a CTA (partial results)
constexpr int STEP = GROUPS * UNROLL;         // keys a CTA takes per iteration
constexpr int kMaxSplits = 1024;  // the host never splits a row further
constexpr int kMaxClusterSplits = 16;  // nor a row's cluster (a non-portable size on sm_90)
#if KILN_FD_APPEND
constexpr int kMaxNew = KILN_FD_APPEND;  // appended rows this variant takes (1, or up to 4)
#endif
constexpr float kLog2e = 1.4426950408889634f;
static_assert(D == 64 || D == 128, "head dim");

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float bf16_to_f(unsigned x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float f16_to_f(unsigned short x) {
  float f;
  asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(x));
  return f;
}
// Element 2w + h (h = 0 low, 1 high) of a 16-byte vector of 8 elements.
__device__ __forceinline__ float elem(unsigned w, int h) {
#if KILN_FD_BF16
  return h ? __uint_as_float(w & 0xffff0000u) : bf16_to_f(w & 0xffff);
#else
  return f16_to_f(static_cast<unsigned short>(h ? w >> 16 : w & 0xffff));
#endif
}
__device__ __forceinline__ void unpack(const uint4& r, float (&out)[VEC]) {
  const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = elem(w[i], 0);
    out[2 * i + 1] = elem(w[i], 1);
  }
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
  keep = keep && *add != neg_inf();  // a -inf key adds nothing: not read either
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

__device__ __forceinline__ kiln_u16* out_row(const KilnFlashParams& p, const Row& row) {
  return p.o + row.b * p.o_batch + row.h * p.o_head + row.i * p.o_row;
}

// One online-softmax step of a lane group over N keys whose K and V chunks are kr / vr (zeros
// for a hidden key, keep false): the scores by a shuffle reduction within the group (every lane
// of the warp takes part), then one rescale of (m, l, acc) and the weighted V rows.
template <int N>
__device__ __forceinline__ void attend(const float (&qf)[VEC], const uint4 (&kr)[N],
                                       const uint4 (&vr)[N], const bool (&keep)[N],
                                       const float (&add)[N], float& m, float& l,
                                       float (&acc)[VEC]) {
  float x[N];
  float m_new = m;
#pragma unroll
  for (int u = 0; u < N; ++u) {
    float kf[VEC];
    unpack(kr[u], kf);
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < VEC; ++e) s += qf[e] * kf[e];
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    x[u] = keep[u] ? s + add[u] : neg_inf();  // the same in every lane of the group
    m_new = fmaxf(m_new, x[u]);
  }
  if (m_new == neg_inf()) return;  // uniform within the group: nothing visible so far
  const float scale = exp2f(m - m_new);  // 0 while nothing was seen (m = -inf)
  l *= scale;
#pragma unroll
  for (int e = 0; e < VEC; ++e) acc[e] *= scale;
#pragma unroll
  for (int u = 0; u < N; ++u) {
    const float pr = exp2f(x[u] - m_new);  // 0 for a hidden key (x = -inf, V not read)
    float vf[VEC];
    unpack(vr[u], vf);
    l += pr;
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] += pr * vf[e];
  }
  m = m_new;
}

__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  return static_cast<unsigned>(from_f(lo)) | (static_cast<unsigned>(from_f(hi)) << 16);
}

#if KILN_FD_ROPE
// Rotary embedding ("rotate half") of this lane's 8 elements `x` of a row whose other half is
// in lane c ^ G/2 of its group: x1 cos - x2 sin in the first half, x2 cos + x1 sin in the second,
// with the tables' row (b, i), in fp32, rounded to the dtype as the unfused ops' result is. Every
// lane of the warp calls it (the partner's chunk comes by shuffles).
__device__ __forceinline__ uint4 rotate_half(const KilnDecodeParams& dp, const uint4& x, int c,
                                             long long b, long long i) {
  const uint4 y = make_uint4(__shfl_xor_sync(0xffffffffu, x.x, G / 2),
                             __shfl_xor_sync(0xffffffffu, x.y, G / 2),
                             __shfl_xor_sync(0xffffffffu, x.z, G / 2),
                             __shfl_xor_sync(0xffffffffu, x.w, G / 2));
  const float sign = c < G / 2 ? -1.f : 1.f;  // the first half subtracts the partner's product
  const int col = (c % (G / 2)) * VEC;
  const uint4 cr = __ldg(reinterpret_cast<const uint4*>(dp.cos + b * dp.cos_batch + i * dp.cos_row + col));
  const uint4 sr = __ldg(reinterpret_cast<const uint4*>(dp.sin + b * dp.sin_batch + i * dp.sin_row + col));
  const unsigned xw[4] = {x.x, x.y, x.z, x.w}, yw[4] = {y.x, y.y, y.z, y.w};
  const unsigned cw[4] = {cr.x, cr.y, cr.z, cr.w}, sw[4] = {sr.x, sr.y, sr.z, sr.w};
  unsigned out[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {  // two elements a word, so few values are live at once
    float r[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      r[h] = elem(xw[w], h) * elem(cw[w], h) + sign * (elem(yw[w], h) * elem(sw[w], h));
    }
    out[w] = pack2(r[0], r[1]);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}
#endif

#if KILN_FD_APPEND
// Appended slot t as the kernel reads it (an index of any of the two integer types).
__device__ __forceinline__ long long raw_slot(const KilnDecodeParams& dp, int t) {
  return dp.slots64 ? static_cast<const long long*>(dp.slots)[t * dp.slot_stride]
                    : static_cast<const int*>(dp.slots)[t * dp.slot_stride];
}

// Row t of the new keys (kv = 0) or values (kv = 1) of batch b, key head hk.
__device__ __forceinline__ const kiln_u16* new_row(const KilnDecodeParams& dp, int kv, long long b,
                                                   long long hk, int t) {
  return kv == 0 ? dp.k_new + b * dp.kn_batch + hk * dp.kn_head + t * dp.kn_row
                 : dp.v_new + b * dp.vn_batch + hk * dp.vn_head + t * dp.vn_row;
}

// The appended rows of (batch b, key head hk), written into the caches by one CTA of theirs:
// thread (kv, c) copies the 16 bytes c of K (kv = 0) or V of each new row, t = 0, 1, .. in order,
// so of two rows for one slot the last one stays (the reads below take the last one too). Every
// CTA reads an appended row from k_new / v_new, never from the cache: no CTA waits for this one.
// The 2G threads are warp 0's first lanes (G <= 16); with KILN_FD_ROPE the whole warp runs the
// loop, so that the key's lanes can trade halves by shuffles (lane c ^ G/2 holds the same row).
__device__ void append_rows(const KilnDecodeParams& dp, int b, int hk) {
  const KilnFlashParams& p = dp.f;
  const int kv = threadIdx.x / G, c = threadIdx.x % G;
#if KILN_FD_ROPE
  if (threadIdx.x >= 32) return;
#else
  if (kv >= 2) return;
#endif
  for (int t = 0; t < dp.n_new; ++t) {
    const long long s = raw_slot(dp, t);  // the same in every lane: the branch is uniform
    if (s < 0 || s >= p.kv_len) {
      if (threadIdx.x == 0) *dp.bad = 1u;  // reported by the caller's index check
      continue;
    }
    const kiln_u16* src = new_row(dp, kv, b, hk, t);
    kiln_u16* dst = const_cast<kiln_u16*>(kv == 0 ? p.k + b * p.k_batch + hk * p.k_head + s * p.k_row
                                                  : p.v + b * p.v_batch + hk * p.v_head + s * p.v_row);
#if KILN_FD_ROPE
    uint4 x = kv < 2 ? *reinterpret_cast<const uint4*>(src + c * VEC) : make_uint4(0, 0, 0, 0);
    const uint4 rotated = rotate_half(dp, x, c, b, t);
    if (kv == 0) x = rotated;
    if (kv < 2) *reinterpret_cast<uint4*>(dst + c * VEC) = x;
#else
    *reinterpret_cast<uint4*>(dst + c * VEC) = *reinterpret_cast<const uint4*>(src + c * VEC);
#endif
  }
}
#endif

#if __CUDA_ARCH__ >= 900
// Thread-block clusters (sm_90). The barrier every thread of the cluster's CTAs arrives at, split
// in two: arrive_early() at the kernel's start (relaxed: it only says the CTA is running) and
// wait_started() before the first store into another CTA's shared memory (which must have
// started); then cluster_sync(), whose release/acquire makes those stores visible. A float is
// stored into CTA `rank`'s shared memory at the address `local` has in this CTA's.
__device__ __forceinline__ void arrive_early() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void wait_started() {
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
               ::: "memory");
}
__device__ __forceinline__ void cluster_store(float* local, unsigned rank, float v) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
}
#endif

}  // namespace kiln_fd

// The one-row append variant is held to the plain kernel's 72 registers (7 CTAs an SM): at 78 a
// batch-8 GPT-2 step's 768 CTAs in clusters of 8 ran 1.5x slower than with the plain kernel.
// (A minimum of 1 CTA is not the same as none: nvcc then gave the plain kernel 80.)
#if KILN_FD_APPEND == 1
#define KILN_FD_BOUNDS __launch_bounds__(kiln_fd::WARPS * 32, 7)
#else
#define KILN_FD_BOUNDS __launch_bounds__(kiln_fd::WARPS * 32)
#endif

extern "C" __global__ void KILN_FD_BOUNDS KILN_FD_NAME(const KilnDecodeParams dp) {
  using namespace kiln_fd;
#if __CUDA_ARCH__ >= 900
  // The row's splits are one cluster: they merge in CTA rank 0's shared memory (below).
  if (dp.splits > 1 && dp.part == nullptr) arrive_early();  // uniform over the grid
#endif
  kiln_grid_dependency_sync();
  const KilnFlashParams& p = dp.f;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane / G, c = lane % G;  // this lane's key of the warp's KPW, its 8 elements
  const int r = blockIdx.x, split = blockIdx.y;
  const Row row = row_of(p, r);
  const int hk = row.h / p.group;
  const int j0 = split * dp.split_len;
  int j1 = min(j0 + dp.split_len, p.kv_len);
#if KILN_FD_CAUSAL
  j1 = min(j1, row.i + 1);
#endif
  const kiln_u16* q = p.q + row.b * p.q_batch + row.h * p.q_head + row.i * p.q_row + c * VEC;
  const kiln_u16* k = p.k + row.b * p.k_batch + hk * p.k_head + c * VEC;
  const kiln_u16* v = p.v + row.b * p.v_batch + hk * p.v_head + c * VEC;
  const char* mask = static_cast<const char*>(p.mask);
#if KILN_FD_MASK != 0
  mask += (row.b * p.m_batch + row.h * p.m_head) * (KILN_FD_MASK == 1 ? 1 : KILN_FD_MASK == 2 ? 4 : 2);
#endif
#if KILN_FD_APPEND
  // The appended slots (-1: none, or out of range): the loop below skips them, the tail after
  // it reads their rows from k_new / v_new.
  int slot[kMaxNew];
#pragma unroll
  for (int t = 0; t < kMaxNew; ++t) {
    const long long s = t < dp.n_new ? raw_slot(dp, t) : -1;
    slot[t] = s >= 0 && s < p.kv_len ? static_cast<int>(s) : -1;
  }
  if (split == 0 && row.i == 0 && row.h % p.group == 0) append_rows(dp, row.b, hk);
#endif
  float qf[VEC];
#if KILN_FD_ROPE
  unpack(rotate_half(dp, *reinterpret_cast<const uint4*>(q), c, row.b, row.i), qf);
#else
  unpack(*reinterpret_cast<const uint4*>(q), qf);
#endif
#pragma unroll
  for (int e = 0; e < VEC; ++e) qf[e] *= p.scale_log2;  // scores come out as base-2 logits
  float m = neg_inf(), l = 0.f, acc[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) acc[e] = 0.f;

  // The warp's keys of an iteration: jb + u·KPW + g for u < UNROLL (KPW consecutive rows a load).
  for (int jb = j0 + warp * KPW * UNROLL; jb < j1; jb += STEP) {
    bool keep[UNROLL];
    float add[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int j = jb + u * KPW + g;
      add[u] = 0.f;
      keep[u] = j < j1 && visible(p, mask, row.i, j, &add[u]);
#if KILN_FD_APPEND
#pragma unroll
      for (int t = 0; t < kMaxNew; ++t) keep[u] = keep[u] && j != slot[t];  // the tail's
#endif
    }
    uint4 kr[UNROLL], vr[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long j = jb + u * KPW + g;
      kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
      if (keep[u]) {
        kr[u] = __ldg(reinterpret_cast<const uint4*>(k + j * p.k_row));
        vr[u] = __ldg(reinterpret_cast<const uint4*>(v + j * p.v_row));
      }
    }
    attend(qf, kr, vr, keep, add, m, l, acc);
  }
#if KILN_FD_APPEND
  // The appended keys of this CTA's run, from the new rows: warp 0, each in lane group 0 (the
  // other groups take part in the shuffles with nothing to keep). Of two rows for one slot the
  // last one counts, as the cache keeps it (append_rows).
  if (warp == 0) {
#pragma unroll
    for (int t = 0; t < kMaxNew; ++t) {
      const int j = slot[t];
      bool keep[1] = {g == 0 && t < dp.n_new && j >= j0 && j < j1};
#pragma unroll
      for (int t2 = 0; t2 < kMaxNew; ++t2) keep[0] = keep[0] && !(t2 > t && slot[t2] == j);
      float add[1] = {0.f};
      keep[0] = keep[0] && visible(p, mask, row.i, j, &add[0]);
      uint4 kr[1] = {make_uint4(0, 0, 0, 0)}, vr[1] = {make_uint4(0, 0, 0, 0)};
      if (keep[0]) {
        kr[0] = __ldg(reinterpret_cast<const uint4*>(new_row(dp, 0, row.b, hk, t) + c * VEC));
        vr[0] = __ldg(reinterpret_cast<const uint4*>(new_row(dp, 1, row.b, hk, t) + c * VEC));
      }
#if KILN_FD_ROPE
      // The key as append_rows writes it (t < n_new is the same in every lane of the warp).
      if (t < dp.n_new) kr[0] = rotate_half(dp, kr[0], c, row.b, t);
#endif
      attend(qf, kr, vr, keep, add, m, l, acc);
    }
  }
#endif

  // The CTA's groups merge in shared memory: thread d < D then holds the CTA's O[d], m and l.
  __shared__ float sm[GROUPS], sl[GROUPS], so[GROUPS][D];
  const int grp = warp * KPW + g;
  if (c == 0) {
    sm[grp] = m;
    sl[grp] = l;
  }
#pragma unroll
  for (int e = 0; e < VEC; ++e) so[grp][c * VEC + e] = acc[e];
  __syncthreads();
  const int d = threadIdx.x;
  float big = neg_inf(), sum = 0.f, o = 0.f;
  if (d < D) o = merge(sm, sl, 1, &so[0][d], D, GROUPS, &big, &sum);
  if (dp.splits == 1) {
    if (d < D) out_row(p, row)[d] = from_f(sum > 0.f ? o / sum : 0.f);
    return;
  }
  if (dp.part != nullptr) {  // the workspace and the combine kernel (no clusters)
    if (d >= D) return;
    float* part = dp.part + (static_cast<long long>(r) * dp.splits + split) * (D + 2);
    part[d] = o;
    if (d == 0) {
      part[D] = big;
      part[D + 1] = sum;
    }
    return;
  }
#if __CUDA_ARCH__ >= 900
  // The row's splits are one cluster: each CTA stores its (m, l, O) into CTA rank 0's shared
  // memory (remote stores, issued together), and after the cluster barrier rank 0 merges them
  // from its own shared memory in split order while the others exit. (Rank 0 reading the others'
  // shared memory instead took a round trip per split and value, one after another.)
  __shared__ float cm[kMaxClusterSplits], cl[kMaxClusterSplits], co[kMaxClusterSplits][D];
  unsigned rank;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  wait_started();  // every CTA of the cluster runs: rank 0's shared memory exists
  if (d < D) cluster_store(&co[rank][d], 0, o);
  if (d == 0) {
    cluster_store(&cm[rank], 0, big);
    cluster_store(&cl[rank], 0, sum);
  }
  cluster_sync();
  if (rank != 0 || d >= D) return;
  float mx = neg_inf();
  for (int s = 0; s < dp.splits; ++s) mx = fmaxf(mx, cm[s]);
  float total = 0.f, value = 0.f;
  if (mx != neg_inf()) {
    for (int s = 0; s < dp.splits; ++s) {
      const float w = exp2f(cm[s] - mx);
      total += cl[s] * w;
      value += co[s][d] * w;
    }
  }
  out_row(p, row)[d] = from_f(total > 0.f ? value / total : 0.f);
#endif
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
  out_row(p, row_of(p, r))[t] = from_f(sum > 0.f ? acc / sum : 0.f);
}
)KILN_FD";

}  // namespace kiln::cuda_ops
