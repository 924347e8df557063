// The CUDA source of kiln's flash attention forward kernel, as one string that kiln hands NVRTC
// (codegen/families/attention/flash_attention_cuda.cc) after a few #defines that specialise it, and
// that the standalone GPU harness (tools/flash_attention/) #includes to compile exactly the same
// text.
//
// Design (FlashAttention-2's forward pass, written for mma.sync on sm_80+):
//   * One CTA owns BLOCK_M query rows of one (batch, head); its WARPS warps split them, WM rows
//     each (MT m16 tiles). K and V tiles of BLOCK_N keys stream through shared memory with
//     cp.async, double buffered. With ONE_SYNC, K(j+1) and V(j+1) are fetched together while
//     tile j computes, one barrier per tile; without, K(j+1) is fetched during S = Q·Kᵀ and V(j+1)
//     during O += P·V, two barriers per tile. Rows of 16-byte chunks are XOR-swizzled
//     (chunk ^ row % 8) so ldmatrix reads are free of bank conflicts.
//   * S = Q·Kᵀ and O += P·V run on tensor cores (mma.sync.m16n8k16, bf16/f16 in, fp32
//     accumulate); Q and K fragments come from ldmatrix, V's from ldmatrix.trans; P is the S
//     accumulator converted in registers (the C layout of two n8 tiles is the A layout of one
//     k16 step). Scores never leave registers.
//   * Softmax is online, in fp32 and base 2: x = s·scale·log2(e) (+ mask·log2(e)), running row
//     max m and sum l, exp2 via ex2.approx; unmasked tiles fold the scale into one FFMA per
//     score, and O is rescaled only when a row max grows by more than 2^8 (see online_softmax).
//     A row whose every score is -inf (fully masked) ends with l = 0 and is written as zeros, as
//     torch's SDPA does (its math backend's _safe_softmax).
//   * Causal (torch's is_causal: key j attends to query i iff j <= i, aligned top-left): tiles
//     past a CTA's last row are never loaded, a warp skips tiles past its own last row, and only
//     tiles crossing the diagonal (or the ragged end of the keys, or any tile when a mask is
//     given) pay for per-element masking. CTAs with the most tiles are scheduled first, over
//     sections of (batch, head) pairs whose K/V fit in L2 (kiln_flash_work_item).
//   * Grouped-query attention: query head h reads K/V head h / group.
//   * Any lengths: Q/K/V rows past the end are zero-filled by cp.async (src-size 0), keys past
//     the end are masked, rows past the end are not stored. The output is staged through the
//     warp's own (now unused) Q rows in shared memory and written with 16-byte stores.
//
// Specialisation (#defines placed before this text):
//   KILN_FA_NAME        the kernel's name
//   KILN_FA_HEAD_DIM    64 or 128 (query, key and value head dim)
//   KILN_FA_BLOCK_M     query rows per CTA;  KILN_FA_BLOCK_N  keys per K/V tile
//   KILN_FA_WARPS       warps per CTA (BLOCK_M / WARPS rows each, a multiple of 16)
//   KILN_FA_Q_IN_REGS   1: Q fragments are loaded once into registers; 0: re-read each tile
//   KILN_FA_MIN_BLOCKS  the second __launch_bounds__ argument (CTAs per SM to fit)
//   KILN_FA_BF16        1: bfloat16 inputs and output, 0: float16
//   KILN_FA_CAUSAL      0 or 1
//   KILN_FA_MASK        0 none, 1 bool (nonzero = keep), 2/3/4 additive float32/float16/bfloat16
//   KILN_FA_ONE_SYNC    1: one barrier per K/V tile (K and V of tile j+1 fetched together);
//                       0: two (V(j) waited for after the softmax, FlashAttention-2's order)
#pragma once

namespace kiln::cuda_ops {

// The parameter block every attention kernel of kiln takes (the flash kernel here, the decode
// kernels of flash_decode_source.h), mirrored field for field by FlashParams on the host.
inline constexpr char kFlashParamsSource[] = R"KILN_FA(
typedef unsigned short kiln_u16;

// Programmatic dependent launch (runtime/cuda.h LaunchDependent): waits until every earlier
// kernel has finished and its writes are visible, then lets the next kernel start launching (one
// kernel ahead). The kernels call it first, before any load or store (without the launch
// attribute it returns at once).
__device__ __forceinline__ void kiln_grid_dependency_sync() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Strides count elements; a broadcast mask dim has stride 0. The last dim of q, k, v, o is
// contiguous, and every row/head/batch stride is a multiple of 8 (16-byte cp.async).
struct KilnFlashParams {
  const kiln_u16* q; const kiln_u16* k; const kiln_u16* v; kiln_u16* o; const void* mask;
  long long q_batch, q_head, q_row;
  long long k_batch, k_head, k_row;
  long long v_batch, v_head, v_row;
  long long o_batch, o_head, o_row;
  long long m_batch, m_head, m_row, m_col;
  int heads;       // query heads (the grid's x is batch * heads)
  int group;       // query heads per key/value head (1 without grouped-query attention)
  int q_len, kv_len;
  float scale_log2;  // scale * log2(e)
  int section;       // (batch, head) pairs whose CTAs run together (kiln_flash_work_item)
};

// Work item w of pairs * q_tiles (a CTA's linear index, or a persistent CTA's w-th item): the
// (batch, head) pairs in sections of `section`, whose K and V fit in L2 together, one section
// after the other; within one, the row tiles longest first (the causal ones), each over the
// section's pairs. The CTAs running at once then read the K/V of a few heads, from L2, not of
// every head, from memory.
__device__ __forceinline__ void kiln_flash_work_item(int w, int q_tiles, int pairs, int section,
                                                     int& pair, int& tile) {
  const int first = w / (section * q_tiles) * section;
  const int n = min(section, pairs - first), r = w - first * q_tiles;
  tile = q_tiles - 1 - r / n;
  pair = first + r % n;
}
)KILN_FA";

// The flash kernel; its source is kFlashParamsSource followed by this text.
inline constexpr char kFlashAttentionSource[] = R"KILN_FA(
namespace kiln_fa {

constexpr int D = KILN_FA_HEAD_DIM;
constexpr int BM = KILN_FA_BLOCK_M;
constexpr int BN = KILN_FA_BLOCK_N;
constexpr int WARPS = KILN_FA_WARPS;
constexpr int THREADS = WARPS * 32;
constexpr int WM = BM / WARPS;     // query rows per warp
constexpr int MT = WM / 16;        // m16 tiles per warp
constexpr int NT = BN / 8;         // n8 tiles of S
constexpr int DT = D / 8;          // n8 tiles of O
constexpr int CHUNKS = D / 8;      // 16-byte chunks per row
constexpr int ROW_BYTES = D * 2;
[[maybe_unused]] constexpr float kLog2e = 1.4426950408889634f;
static_assert(WM % 16 == 0 && BN % 16 == 0 && D % 16 == 0, "tile shapes");
static_assert((BM * CHUNKS) % THREADS == 0 && (BN * CHUNKS) % THREADS == 0, "tile loads");

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][D] tile.
__device__ __forceinline__ unsigned swz(int row, int chunk) {
  return row * ROW_BYTES + ((chunk ^ (row & 7)) << 4);
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// d += a · b for one m16n8k16 tile: a is 16x16 (row-major fragments), b 16x8, fp32 accumulate.
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if KILN_FA_BF16
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#endif
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a packed pair of 16-bit values (lo in the low half), rounded to nearest even.
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  unsigned r;
#if KILN_FA_BF16
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#else
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}

__device__ __forceinline__ float exp2_approx(float x) {  // ex2.approx(-inf) = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Tile copies: thread `tid` moves 16-byte chunk tid % CHUNKS of rows tid / CHUNKS + i * kPass,
// so its swizzled column and its pointer step are the same for every row it copies.
constexpr int kPass = THREADS / CHUNKS;  // rows per pass of the CTA
static_assert(THREADS % CHUNKS == 0 && kPass % 8 == 0, "tile copy passes keep the swizzle");

struct TileCopy {
  unsigned smem;      // the thread's first chunk in shared memory, relative to the tile
  long long offset;   // its first element relative to the tile's first row, and per pass
  long long pass;
  int row;            // its first row
};

__device__ __forceinline__ TileCopy tile_copy(long long row_stride, int tid) {
  const int row = tid / CHUNKS, chunk = tid % CHUNKS;
  return {swz(row, chunk), row * row_stride + chunk * 8, kPass * row_stride, row};
}

// Copies rows [0, ROWS) of the global tile starting at `src` into swizzled shared memory at
// `smem`; rows at or past `valid_rows` are zero-filled (src-size 0, reading nothing).
template <int ROWS>
__device__ __forceinline__ void load_tile(unsigned smem, const kiln_u16* src, const TileCopy& c,
                                          int valid_rows) {
  const kiln_u16* from = src + c.offset;
#pragma unroll
  for (int i = 0; i < ROWS / kPass; ++i) {
    const bool valid = c.row + i * kPass < valid_rows;
    cp_async16(smem + c.smem + i * kPass * ROW_BYTES, valid ? from : src, valid);
    from += c.pass;
  }
}

// The additive mask value (times log2(e)) or the bool mask's keep flag of one element.
__device__ __forceinline__ float mask_add(const void* m, long long off) {
#if KILN_FA_MASK == 2
  return static_cast<const float*>(m)[off] * kLog2e;
#elif KILN_FA_MASK == 3
  float f;
  asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(static_cast<const kiln_u16*>(m)[off]));
  return f * kLog2e;
#elif KILN_FA_MASK == 4
  return __uint_as_float(((unsigned)static_cast<const kiln_u16*>(m)[off]) << 16) * kLog2e;
#else
  return 0.f;
#endif
}

// Per-warp state: the output accumulator and the running row max / sum of the warp's rows. A
// thread holds rows g and g + 8 (g = lane / 4) of each m16 tile, columns 2t, 2t + 1 (t = lane % 4)
// of each n8 tile.
struct Rows {
  float o[MT][DT][4];
  float max[MT][2];
  float sum[MT][2];
};

// S = Q·Kᵀ for one K tile (scores of the warp's rows against BN keys), raw (unscaled).
__device__ __forceinline__ void qk(float (&s)[MT][NT][4], const unsigned (&qf)[MT][D / 16][4],
                                   unsigned sq_warp, unsigned sk, int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
  // ldmatrix rows: lanes 0-7 / 8-15 / 16-23 / 24-31 address the four 8x8 matrices.
  const int k_row = (lane & 7) + ((lane >> 4) << 3), k_chunk = (lane >> 3) & 1;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#if KILN_FA_Q_IN_REGS
      a[mt][0] = qf[mt][kk][0]; a[mt][1] = qf[mt][kk][1];
      a[mt][2] = qf[mt][kk][2]; a[mt][3] = qf[mt][kk][3];
#else
      ldsm_x4(a[mt], sq_warp + swz(mt * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#endif
    }
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      unsigned b[4];  // keys np*16 + [0, 8) and [8, 16), dims kk*16 + [0, 16)
      ldsm_x4(b, sk + swz(np * 16 + k_row, kk * 2 + k_chunk));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma(s[mt][2 * np], a[mt], b[0], b[1]);
        mma(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Scales the scores to base-2 logits and applies the causal rule, the key bound and the mask.
// `row0` is the warp's first query row, `n0` the tile's first key.
__device__ __forceinline__ void scale_mask(float (&s)[MT][NT][4], const KilnFlashParams& p,
                                           const char* mask, int row0, int n0, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[mt][nt][e] * p.scale_log2;
        [[maybe_unused]] const int row = row0 + mt * 16 + g + (e >> 1) * 8;
        const int col = n0 + nt * 8 + 2 * t + (e & 1);
        bool keep = col < p.kv_len;
#if KILN_FA_CAUSAL
        keep = keep && col <= row;
#endif
#if KILN_FA_MASK != 0
        if (keep && row < p.q_len) {
          const long long off = row * p.m_row + col * p.m_col;
#if KILN_FA_MASK == 1
          keep = reinterpret_cast<const unsigned char*>(mask)[off] != 0;
#else
          x += mask_add(mask, off);
#endif
        }
#endif
        s[mt][nt][e] = keep ? x : neg_inf();
      }
}

// Online softmax over one tile, in base-2 logits: turns s into unnormalised probabilities
// exp2(x - m) and adds them to the row sums. kLogits: s holds the logits already (scale_mask
// ran); else s holds raw scores and c = scale·log2(e) > 0, so a row's max logit is c times its
// max score and each probability costs one FFMA and one ex2.
// The running max m of a row moves only when a tile's max exceeds it by more than kRescale (so
// probabilities stay below 2^8 and the final division is exact): then the warp reduces the max
// over each row's quad and rescales O and the sums by exp2(m_old - m_new). After the first tile
// that almost never happens, and the shuffles and the O rescale are skipped (FlashAttention-4's
// conditional rescaling).
template <bool kLogits>
__device__ __forceinline__ void online_softmax(float (&s)[MT][NT][4], Rows& r, float c) {
  constexpr float kRescale = 8.f;
  float mx[MT][2];
  bool grow = false;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // row g (elements 0, 1) and row g + 8 (elements 2, 3)
      float m = neg_inf();
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) m = fmaxf(m, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
      mx[mt][h] = kLogits ? m : m * c;
      grow = grow || mx[mt][h] > r.max[mt][h] + kRescale;
    }
  if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float m = mx[mt][h];
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        const float m_new = fmaxf(r.max[mt][h], m);
        // exp2(-inf - m) = 0 drops a row's empty past; an all -inf row keeps p = 0 (no NaN)
        const float alpha = exp2_approx(r.max[mt][h] - (m_new == neg_inf() ? 0.f : m_new));
        r.max[mt][h] = m_new;
        r.sum[mt][h] *= alpha;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          r.o[mt][dt][2 * h] *= alpha;
          r.o[mt][dt][2 * h + 1] *= alpha;
        }
      }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_use = r.max[mt][h] == neg_inf() ? 0.f : r.max[mt][h];
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = s[mt][nt][2 * h + e];
          const float pr = exp2_approx(kLogits ? x - m_use : fmaf(x, c, -m_use));
          s[mt][nt][2 * h + e] = pr;
          sum += pr;
        }
      r.sum[mt][h] += sum;  // per-thread partial; the quad's are added at the end
    }
}

// O += P·V for one V tile.
__device__ __forceinline__ void pv(const float (&s)[MT][NT][4], Rows& r, unsigned sv, int lane) {
  const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_chunk = lane >> 4;
#pragma unroll
  for (int ks = 0; ks < BN / 16; ++ks) {
    unsigned a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      a[mt][0] = pack2(s[mt][2 * ks][0], s[mt][2 * ks][1]);
      a[mt][1] = pack2(s[mt][2 * ks][2], s[mt][2 * ks][3]);
      a[mt][2] = pack2(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
      a[mt][3] = pack2(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < DT / 2; ++dp) {
      unsigned b[4];  // keys ks*16 + [0, 16), dims dp*16 + [0, 8) and [8, 16)
      ldsm_x4_trans(b, sv + swz(ks * 16 + v_row, dp * 2 + v_chunk));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma(r.o[mt][2 * dp], a[mt], b[0], b[1]);
        mma(r.o[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Normalises the warp's rows and writes them: registers -> the warp's Q rows in shared memory
// (swizzled) -> 16-byte global stores of the rows that exist.
__device__ __forceinline__ void store_rows(Rows& r, unsigned char* smem_warp, unsigned sq_warp,
                                           kiln_u16* o, long long o_row, int rows_left, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = r.sum[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;  // a fully masked row: zeros
      const int row = mt * 16 + g + h * 8;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const unsigned packed = pack2(r.o[mt][dt][2 * h] * inv, r.o[mt][dt][2 * h + 1] * inv);
        *reinterpret_cast<unsigned*>(smem_warp + swz(row, dt) + 4 * t) = packed;
      }
    }
  __syncwarp();
#pragma unroll
  for (int it = 0; it < WM * CHUNKS / 32; ++it) {
    const int id = it * 32 + lane;
    const int row = id / CHUNKS, chunk = id % CHUNKS;
    if (row < rows_left) {
      unsigned v0, v1, v2, v3;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3) : "r"(sq_warp + swz(row, chunk)));
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n"
                   :: "l"(o + row * o_row + chunk * 8), "r"(v0), "r"(v1), "r"(v2), "r"(v3)
                   : "memory");
    }
  }
}

}  // namespace kiln_fa

extern "C" __global__ void __launch_bounds__(kiln_fa::THREADS, KILN_FA_MIN_BLOCKS)
KILN_FA_NAME(const KilnFlashParams p) {
  using namespace kiln_fa;
  kiln_grid_dependency_sync();
  extern __shared__ __align__(128) unsigned char kiln_smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  int pair, tile;  // CTAs start in the order of their linear index
  kiln_flash_work_item(blockIdx.x + blockIdx.y * gridDim.x, gridDim.y, gridDim.x, p.section, pair,
                       tile);
  const int b = pair / p.heads, h = pair % p.heads, hk = h / p.group;
  const int m0 = tile * BM;
  const int row0 = m0 + warp * WM;                   // the warp's first query row

  const kiln_u16* q = p.q + b * p.q_batch + h * p.q_head + m0 * p.q_row;
  const kiln_u16* k = p.k + b * p.k_batch + hk * p.k_head;
  const kiln_u16* v = p.v + b * p.v_batch + hk * p.v_head;
  const char* mask = static_cast<const char*>(p.mask);
#if KILN_FA_MASK != 0
  mask += (b * p.m_batch + h * p.m_head) * (KILN_FA_MASK == 1 ? 1 : KILN_FA_MASK == 2 ? 4 : 2);
#endif

  // Shared memory: Q [BM][D], K [2][BN][D], V [2][BN][D], all swizzled.
  const unsigned sq = static_cast<unsigned>(__cvta_generic_to_shared(kiln_smem));
  const unsigned sk = sq + BM * ROW_BYTES;
  const unsigned sv = sk + 2 * BN * ROW_BYTES;
  const unsigned sq_warp = sq + warp * WM * ROW_BYTES;

  int n_end = p.kv_len;
#if KILN_FA_CAUSAL
  n_end = min(n_end, m0 + BM);  // keys past the CTA's last row are masked for all its rows
#endif
  const int n_tiles = (n_end + BN - 1) / BN;

  const TileCopy kc = tile_copy(p.k_row, tid), vc = tile_copy(p.v_row, tid);
  load_tile<BM>(sq, q, tile_copy(p.q_row, tid), p.q_len - m0);
  if (n_tiles > 0) load_tile<BN>(sk, k, kc, p.kv_len);
  cp_commit();
  if (n_tiles > 0) load_tile<BN>(sv, v, vc, p.kv_len);
  cp_commit();  // groups: {Q, K(0)}, {V(0)}

  Rows r;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) r.o[mt][dt][0] = r.o[mt][dt][1] = r.o[mt][dt][2] = r.o[mt][dt][3] = 0.f;
    r.max[mt][0] = r.max[mt][1] = neg_inf();
    r.sum[mt][0] = r.sum[mt][1] = 0.f;
  }
  unsigned qf[MT][D / 16][4];
  const bool warp_rows = row0 < p.q_len;  // the warp has rows to compute

  for (int j = 0; j < n_tiles; ++j) {
    const int n0 = j * BN;
    const unsigned buf = (j & 1) * BN * ROW_BYTES, next = buf ^ (BN * ROW_BYTES);
#if KILN_FA_ONE_SYNC
    // One barrier a tile: K(j) and V(j) have landed and every warp is done with tile j - 1,
    // whose buffers now receive tile j + 1. The whole tile then computes without a barrier.
    cp_wait<0>();
    __syncthreads();
    if (j + 1 < n_tiles) {
      load_tile<BN>(sk + next, k + (n0 + BN) * p.k_row, kc, p.kv_len - n0 - BN);
      load_tile<BN>(sv + next, v + (n0 + BN) * p.v_row, vc, p.kv_len - n0 - BN);
    }
    cp_commit();
#else
    cp_wait<1>();  // Q and K(j) have landed
    __syncthreads();
    if (j + 1 < n_tiles) load_tile<BN>(sk + next, k + (n0 + BN) * p.k_row, kc, p.kv_len - n0 - BN);
    cp_commit();
#endif
#if KILN_FA_Q_IN_REGS
    if (j == 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          ldsm_x4(qf[mt][kk], sq_warp + swz(mt * 16 + (lane & 15), kk * 2 + (lane >> 4)));
    }
#endif
    // A warp whose rows all precede the tile's first key (causal) skips the tile.
    const bool live = warp_rows && (!KILN_FA_CAUSAL || n0 <= row0 + WM - 1);
    // Per-element work only where needed: a mask, the ragged end of the keys, the diagonal, or
    // a scale that is not positive (the fast path's max of raw scores needs scale > 0).
    const bool masked = KILN_FA_MASK != 0 || n0 + BN > p.kv_len ||
                        (KILN_FA_CAUSAL && n0 + BN - 1 > row0) || !(p.scale_log2 > 0.f);
    float s[MT][NT][4];
    if (live) {
      qk(s, qf, sq_warp, sk + buf, lane);
      if (masked) {
        scale_mask(s, p, mask, row0, n0, lane);
        online_softmax<true>(s, r, p.scale_log2);
      } else {
        online_softmax<false>(s, r, p.scale_log2);
      }
    }
#if !KILN_FA_ONE_SYNC
    cp_wait<1>();  // V(j) has landed
    __syncthreads();
    if (j + 1 < n_tiles) load_tile<BN>(sv + next, v + (n0 + BN) * p.v_row, vc, p.kv_len - n0 - BN);
    cp_commit();
#endif
    if (live) pv(s, r, sv + buf, lane);
  }

  cp_wait<0>();  // with no K tile the Q copies (issued by every thread) may still be in flight
  __syncthreads();
  kiln_u16* o = p.o + b * p.o_batch + h * p.o_head + row0 * p.o_row;
  store_rows(r, kiln_smem + warp * WM * ROW_BYTES, sq_warp, o, p.o_row, p.q_len - row0, lane);
}
)KILN_FA";

}  // namespace kiln::cuda_ops
