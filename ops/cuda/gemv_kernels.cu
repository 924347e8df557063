// GEMV kernels (see gemv_kernels.h).
//
// The work: a CTA of kWarps = 4 warps covers 4 / wpc output columns with wpc warps per column
// (wpc is 1, 2 or 4: more than one only when n is small and k long, where one warp per column
// would leave too few loads in flight to keep HBM busy). The wpc·32 threads of a column split its
// k: thread t reads the 16-byte vectors t, t + wpc·32, ... of the w row (kVec = 16 / sizeof(T)
// elements each; kUnroll of them are issued before the first is used) with the streaming hint
// (each weight is read once), and for each the matching vector of every x row through the
// read-only data cache (x is a few KiB that every CTA reads: it stays in L1/L2), keeping M float32
// sums. Elements past the last whole vector, and whole rows when w is not 16-byte aligned, go one
// element per thread (x too when its rows are not 16-byte aligned). The sums meet by warp
// shuffles, then (wpc > 1) through shared memory in warp order, so results do not depend on
// timing. The kernel is templated on the row count M (1..8): the sums live in registers.
//
// With a norm (NormGemvKernel), each CTA first computes the statistics of the M x rows (a warp
// per row, as the eager norm computes them: the mean summed in double and kept as hi + lo floats,
// the squared deviations in float), writes the normalised rows, rounded to T, to shared memory
// once, and the same column loop reads x from there; the grid is capped at kNormCtasPerSm per SM
// so that each CTA amortises that over several column tiles. (Normalising as x was read cost
// n·m·k normalisations: the GPT-2 decode step ran 1.3x slower at batch 1 and 2.3x at batch 8 than
// with the norm's own kernel.) The plain kernel is unchanged by it: the shared-memory variant is a
// template flag of the loads. One row of float16 / bfloat16 has nothing to amortise that prologue
// over and folds the norm into the column sums instead (FoldedNormGemvKernel, below).
//
// 2..8 rows of float16 / bfloat16 (aligned, k a multiple of 8) take the tensor-core path instead
// (MmaGemvKernel, NormMmaGemvKernel, and for bfloat16 with a norm FoldedRmsMmaGemvKernel and
// FoldedLayerMmaGemvKernel, and the gated product after an RMS norm GatedFoldedRmsMmaGemvKernel;
// see "the tensor-core path" below).
//
// Before its dependency wait (a programmatic dependent launch) every kernel but the chain loads
// the first weights of its first column tile: into the registers its dot loop starts from where
// the host says no kernel that may still be running writes them (GemvArgs::preload_weights; at
// GPT-2's decode shapes that is each thread's whole share of the row), else into L2.
//
// Indexing is int64 throughout (a w of n·k > 2^31 elements is the LM head of a large vocabulary);
// CTAs stride over column tiles, so the grid stays within limits for any n.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "ops/cuda/float_convert.cuh"
#include "ops/cuda/gemv_kernels.h"
#include "ops/cuda/grid_dependency.cuh"

namespace kiln::cuda_kernels {
namespace {

constexpr int kWarps = 4;  // per CTA
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 4;  // w vectors in flight per thread
constexpr int64_t kMaxGrid = int64_t{1} << 30;
constexpr int kNormCtasPerSm = 8;  // CTAs per SM of the GEMV with a norm (each normalises x once)
// Weight bytes of a chain's first steps that its CTAs pull into L2 up front (the H200's L2 holds
// 50 MiB; a step past this, an LM head, streams its weights as it runs).
constexpr int64_t kChainPrefetchBytes = int64_t{24} << 20;

template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte vector

template <typename T>
struct Params {
  const T* x;
  int64_t ldx;
  const T* w;
  int64_t ldw;
  const T* bias;  // nullptr: none
  int64_t bias_stride;
  T* out;             // [m, n] contiguous
  const T* residual;  // [m, n] contiguous, or nullptr
  int64_t n, k;
  int wpc;     // warps per column: 1, 2 or 4
  bool vec_w;  // every w row starts 16-byte aligned
  bool vec_x;  // every x row starts 16-byte aligned
  GemvAct act;
  bool preload;  // the first tile's weights load before the dependency wait (GemvArgs)
};

// The GEMV's parameters with a norm of each x row (gemv.x is the x before the norm).
template <typename T>
struct NormParams {
  Params<T> gemv;
  GemvNorm norm;
  const T* weight;  // [k] or nullptr
  const T* bias;    // [k] or nullptr
  float eps;
  bool vec;  // x rows, weight and bias 16-byte aligned and k whole 16-byte vectors
};

// The up half of a gated product (GemvArgs::w_up): its weight rows and bias, as Params' w and bias
// are laid out. Only the gated kernels read it.
template <typename T>
struct UpHalf {
  const T* w = nullptr;
  const T* bias = nullptr;
};

// An x row's statistics: x - mean as (x - hi) - lo (the mean in double, split in two floats, so
// that values near the mean keep their precision), and 1 / sqrt(var + eps).
struct RowNorm {
  float hi, lo, inv;
};

// The kVec<T> elements of a 16-byte word as floats (element 0 in the low bytes).
template <typename T>
__device__ __forceinline__ void Unpack(const uint4& raw, float (&f)[kVec<T>]) {
  const uint32_t word[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      f[i] = __uint_as_float(word[i]);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      f[2 * i] = __uint_as_float(word[i] << 16);
      f[2 * i + 1] = __uint_as_float(word[i] & 0xFFFF0000u);
    } else {
      f[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(word[i] & 0xFFFFu)));
      f[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(word[i] >> 16)));
    }
  }
}

// Where x is read from: global memory through the read-only data cache (the kernel never writes
// it), shared memory (the normalised rows: a plain load), or global memory through L2 only (the
// chain kernel, whose earlier steps write the x of later ones: the read-only path may keep a stale
// line for the whole kernel).
enum class XFrom { kReadOnly, kShared, kCoherent };

// Elements [v·kVec, (v + 1)·kVec) of x row `row` as floats, or zeros when `valid` is false.
template <typename T, bool kVecX, XFrom kFrom = XFrom::kReadOnly>
__device__ __forceinline__ void LoadX(const T* row, int64_t v, bool valid, float (&f)[kVec<T>]) {
  if constexpr (kVecX) {
    if constexpr (kFrom == XFrom::kShared) {
      Unpack<T>(valid ? reinterpret_cast<const uint4*>(row)[v] : make_uint4(0, 0, 0, 0), f);
    } else if constexpr (kFrom == XFrom::kCoherent) {
      Unpack<T>(valid ? __ldcg(reinterpret_cast<const uint4*>(row) + v) : make_uint4(0, 0, 0, 0),
                f);
    } else {
      Unpack<T>(valid ? __ldg(reinterpret_cast<const uint4*>(row) + v) : make_uint4(0, 0, 0, 0), f);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kVec<T>; ++i) f[i] = valid ? ToFloat(row[v * kVec<T> + i]) : 0.f;
  }
}

// The w vectors v0, v0 + stride, ... (kUnroll of them) with the streaming hint (each weight is
// read once), all issued before any is used; zeros past the row's nvec vectors.
__device__ __forceinline__ void LoadWeightVectors(const uint4* wv, int64_t v0, int stride,
                                                  int64_t nvec, uint4 (&raw)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t v = v0 + int64_t{u} * stride;
    raw[u] = v < nvec ? __ldcs(wv + v) : make_uint4(0, 0, 0, 0);
  }
}

// acc[r] += w[i]·x[r, i] over the kUnroll weight vectors `raw` (v0, v0 + stride, ...; zeros past
// the row's nvec vectors). Every x row is 16-byte aligned when kVecX. Per x row its loads, then
// the FMAs; vectors past the end count as zeros (both operands: a NaN in x must not meet a padding
// 0).
template <typename T, int M, bool kVecX, XFrom kFromX>
__device__ __forceinline__ void DotChunk(const Params<T>& p, const uint4 (&raw)[kUnroll],
                                         int64_t v0, int stride, int64_t nvec, float (&acc)[M]) {
  constexpr int V = kVec<T>;
#pragma unroll
  for (int r = 0; r < M; ++r) {
    float xf[kUnroll][V];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + int64_t{u} * stride;
      LoadX<T, kVecX, kFromX>(p.x + r * p.ldx, v, v < nvec, xf[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float wf[V];
      Unpack<T>(raw[u], wf);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[r] = fmaf(wf[i], xf[u][i], acc[r]);
    }
  }
}

// A thread's kUnroll weight vectors in registers: the dot loops' working buffer, one per kernel.
// With `preloaded` it holds the thread's first chunk of its first column tile, loaded before the
// dependency wait (PreloadFirstTile), and that tile's loop starts from it instead of loading it.
// (A branch inside the loop cost more than the preload gave; a second buffer for the preloaded
// chunk, live across the tile loop, doubled the registers.)
struct WeightChunk {
  uint4 raw[kUnroll];
  bool preloaded;
};

// acc[r] += w[i]·x[r, i] over this thread's 16-byte vectors of the row: t, t + stride, ... below
// k / kVec. `w` is 16-byte aligned. Straight-line code per kUnroll vectors: the w loads are all
// issued first, then DotChunk. With `have_first`, chunk.raw already holds the first chunk.
template <typename T, int M, bool kVecX, XFrom kFromX>
__device__ __forceinline__ void DotVectors(const Params<T>& p, const T* w, int t, int stride,
                                           WeightChunk& chunk, bool have_first, float (&acc)[M]) {
  const int64_t nvec = p.k / kVec<T>;
  if (t >= nvec) return;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  if (!have_first) LoadWeightVectors(wv, t, stride, nvec, chunk.raw);
  for (int64_t v0 = t;;) {
    DotChunk<T, M, kVecX, kFromX>(p, chunk.raw, v0, stride, nvec, acc);
    v0 += int64_t{kUnroll} * stride;
    if (v0 >= nvec) break;
    LoadWeightVectors(wv, v0, stride, nvec, chunk.raw);
  }
}

// One element of x, the bias or the residual as a float: through L2 only when an earlier step of
// the same kernel may have written it (XFrom::kCoherent), else a plain load.
template <XFrom kFrom, typename T>
__device__ __forceinline__ float LoadElement(const T* p) {
  if constexpr (kFrom == XFrom::kCoherent) {
    return ToFloat(__ldcg(p));
  } else {
    return ToFloat(*p);
  }
}

// acc[r] += w[i]·x[r, i] for this thread's elements begin + t, begin + t + stride, ... below k.
template <typename T, int M, XFrom kFromX>
__device__ __forceinline__ void DotElements(const Params<T>& p, const T* w, int64_t begin, int t,
                                            int stride, float (&acc)[M]) {
#pragma unroll 4
  for (int64_t i = begin + t; i < p.k; i += stride) {
    const float wf = ToFloat(w[i]);
#pragma unroll
    for (int r = 0; r < M; ++r) {
      acc[r] = fmaf(wf, LoadElement<kFromX>(p.x + r * p.ldx + i), acc[r]);
    }
  }
}

template <typename V>  // float, or double for the norm's mean
__device__ __forceinline__ V WarpSum(V v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

// kiln's relu (NaN stays NaN) and tanh GELU (ops/cuda/kernel_render.cc kiln_relu, kiln_gelu).
__device__ __forceinline__ float Activate(float v, GemvAct act) {
  switch (act) {
    case GemvAct::kRelu:
      return v > 0.f || v != v ? v : 0.f;
    case GemvAct::kGeluTanh:
      return 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    default:
      return v;
  }
}

// The gate's activation in a gated product: Activate's, kiln's erf GELU and SiLU (kernel_render.cc
// kiln_gelu, kiln_silu). Apart from Activate, so that the plain kernels' code stays as it was.
__device__ __forceinline__ float GateActivate(float v, GemvAct act) {
  switch (act) {
    case GemvAct::kGelu:
      return 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
    case GemvAct::kSilu:
      return v / (1.f + expf(-v));
    default:
      return Activate(v, act);
  }
}

// The epilogue's operands of column `col` as this lane stores them: the bias, and (lane r < M)
// residual[r, col]. Loaded with the column's weights, so that their round trip through L2 is not
// added after the sums (it was: the loads sat behind the reductions).
struct EpilogueIn {
  float bias = 0.f, residual = 0.f;
};

template <typename T, int M, XFrom kFrom = XFrom::kReadOnly>
__device__ __forceinline__ EpilogueIn LoadEpilogue(const Params<T>& p, int64_t col, int lane) {
  EpilogueIn e;
  if (col >= p.n) return e;
  if (p.bias != nullptr) e.bias = LoadElement<kFrom>(p.bias + col * p.bias_stride);
  if (p.residual != nullptr && lane < M) {
    e.residual = LoadElement<kFrom>(p.residual + lane * p.n + col);
  }
  return e;
}

// out[r, col] = act(acc[r] + bias[col]) (+ residual[r, col]) for every row, lane r storing row r.
template <typename T, int M>
__device__ __forceinline__ void Store(const Params<T>& p, int64_t col, int lane,
                                      const float (&acc)[M], const EpilogueIn& e) {
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (lane == r) {
      float v = Activate(p.bias != nullptr ? acc[r] + e.bias : acc[r], p.act);
      if (p.residual != nullptr) v += e.residual;
      p.out[r * p.n + col] = FromFloat<T>(v);
    }
  }
}

// The gated product's store: out[r, col] = act(gate[r] + bias[col]) · (up[r] + bias_up[col]),
// lane r storing row r (`bias_up`: this lane's up bias, loaded with the column's weights).
template <typename T, int M>
__device__ __forceinline__ void StoreGated(const Params<T>& p, int64_t col, int lane,
                                           const float (&gate)[M], const float (&up)[M],
                                           const EpilogueIn& e, float bias_up) {
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (lane == r) {
      const float g = GateActivate(p.bias != nullptr ? gate[r] + e.bias : gate[r], p.act);
      p.out[r * p.n + col] = FromFloat<T>(g * (p.bias != nullptr ? up[r] + bias_up : up[r]));
    }
  }
}

// Pulls this thread's share of weight row `col` into L2 (128-byte lines, a hint: it never reads
// stale data, since L2 is where writes land). Run before GridDependencySync(), so the weights
// stream in while the previous kernel finishes. (Into L1 instead, the norm GEMV's first tile ran
// 1.6 µs slower on the H200.)
template <typename T>
__device__ __forceinline__ void PrefetchRow(const Params<T>& p, int64_t col, int t, int stride) {
  if (col >= p.n) return;
  const char* row = reinterpret_cast<const char*>(p.w + col * p.ldw);
  const int64_t bytes = p.k * static_cast<int64_t>(sizeof(T));
  for (int64_t at = int64_t{t} * 128; at < bytes; at += int64_t{stride} * 128) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row + at));
  }
}

// The sums over p.x (read as kFromX says) of weight row `col` of `w_rows` (rows p.ldw apart), every
// row's in acc, complete in the lanes of the column's first warp (part == 0). Called by every
// thread of the CTA (the warps of a column meet in shared memory). With `first` (the CTA's first
// tile) and chunk.preloaded, chunk.raw holds the row's first chunk.
template <typename T, int M, XFrom kFromX>
__device__ __forceinline__ void ColumnSums(const Params<T>& p, const T* w_rows, int64_t col, int t,
                                           int stride, bool first, WeightChunk& chunk,
                                           float (&partial)[kWarps][M], float (&acc)[M]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int part = warp % p.wpc;
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.f;
  if (col < p.n) {  // uniform over the warp: every lane reaches the shuffles below
    const bool have_first = chunk.preloaded && first;
    const T* w = w_rows + col * p.ldw;
    int64_t begin = 0;
    if (p.vec_w) {
      if (p.vec_x) {
        DotVectors<T, M, true, kFromX>(p, w, t, stride, chunk, have_first, acc);
      } else {
        DotVectors<T, M, false, kFromX>(p, w, t, stride, chunk, have_first, acc);
      }
      begin = p.k - p.k % kVec<T>;
    }
    DotElements<T, M, kFromX>(p, w, begin, t, stride, acc);
  }
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = WarpSum(acc[r]);
  if (p.wpc > 1) {  // uniform over the CTA
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < M; ++r) partial[warp][r] = acc[r];
    }
    __syncthreads();
    if (part == 0) {
      for (int j = 1; j < p.wpc; ++j) {
#pragma unroll
        for (int r = 0; r < M; ++r) acc[r] += partial[warp + j][r];
      }
    }
    __syncthreads();  // `partial` is written again
  }
}

// The CTA's column tiles: dot products over p.x (read as kFromX says), bias, activation, residual
// and store; kGated: the gate's and the up's sums (`up`'s rows) and their product (StoreGated).
// With chunk.preloaded, the CTA's first tile starts from the weights loaded before the wait.
template <typename T, int M, XFrom kFromX, bool kGated = false>
__device__ __forceinline__ void ColumnTiles(const Params<T>& p, float (&partial)[kWarps][M],
                                            WeightChunk& chunk, const UpHalf<T>& up = {}) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cols = kWarps / p.wpc;  // columns per CTA
  const int part = warp % p.wpc;    // this warp's share of the column's k
  const int t = part * 32 + lane, stride = p.wpc * 32;
  const int64_t tiles = (p.n + cols - 1) / cols;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // uniform over the CTA
    const int64_t col = tile * cols + warp / p.wpc;
    const EpilogueIn e = part == 0 ? LoadEpilogue<T, M, kFromX>(p, col, lane) : EpilogueIn{};
    float acc[M];
    ColumnSums<T, M, kFromX>(p, p.w, col, t, stride, tile == blockIdx.x, chunk, partial, acc);
    if constexpr (kGated) {
      const float bias_up = part == 0 && col < p.n && up.bias != nullptr
                                ? LoadElement<kFromX>(up.bias + col * p.bias_stride)
                                : 0.f;
      float up_acc[M];
      ColumnSums<T, M, kFromX>(p, up.w, col, t, stride, false, chunk, partial, up_acc);
      if (col < p.n && part == 0) StoreGated<T, M>(p, col, lane, acc, up_acc, e, bias_up);
    } else {
      if (col < p.n && part == 0) Store<T, M>(p, col, lane, acc, e);
    }
  }
}

// Before the dependency wait, this thread's share of its first column tile: with p.preload (and
// 16-byte aligned rows) its first weight vectors into registers, so that their round trip to HBM
// overlaps the previous kernel's tail; else the rows into L2 (a hint, never stale). The host sets
// p.preload only where no kernel that may still be running writes the weights (GemvArgs).
template <typename T>
__device__ __forceinline__ void PreloadFirstTile(const Params<T>& p, WeightChunk& chunk) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t col = int64_t{blockIdx.x} * (kWarps / p.wpc) + warp / p.wpc;
  const int t = (warp % p.wpc) * 32 + lane, stride = p.wpc * 32;
  chunk.preloaded = p.preload && p.vec_w && col < p.n;  // uniform over the warp
  if (chunk.preloaded) {
    LoadWeightVectors(reinterpret_cast<const uint4*>(p.w + col * p.ldw), t, stride, p.k / kVec<T>,
                      chunk.raw);
  } else {
    PrefetchRow(p, col, t, stride);
  }
}

template <typename T, int M>
__global__ void __launch_bounds__(kThreads) GemvKernel(Params<T> p) {
  __shared__ float partial[kWarps][M];
  WeightChunk chunk;
  PreloadFirstTile(p, chunk);
  GridDependencySync();  // x, residual and out may be earlier kernels' buffers
  ColumnTiles<T, M, XFrom::kReadOnly>(p, partial, chunk);
}

// The gated product (GemvArgs::w_up): the gate's and the up's sums of each column, their product.
template <typename T, int M>
__global__ void __launch_bounds__(kThreads) GatedGemvKernel(Params<T> p, UpHalf<T> up) {
  __shared__ float partial[kWarps][M];
  WeightChunk chunk;
  PreloadFirstTile(p, chunk);
  GridDependencySync();  // x and out may be earlier kernels' buffers
  ColumnTiles<T, M, XFrom::kReadOnly, true>(p, partial, chunk, up);
}

// The statistics of the M x rows into `norms` (a warp per row; every thread of the CTA calls):
// as the eager norm computes them (reduce_kernels.cu NormOp), the mean summed in double (0 for
// RMS), the squared deviations in float. x is read in 16-byte vectors where its rows are aligned,
// unrolled so that a lane's loads are in flight together; the second pass reads L1.
template <typename T, int M>
__device__ void ComputeRowNorms(const NormParams<T>& np, RowNorm* norms) {
  constexpr int V = kVec<T>;
  const Params<T>& p = np.gemv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t nvec = p.vec_x ? p.k / V : 0;
  for (int r = warp; r < M; r += kWarps) {
    const T* x = p.x + r * p.ldx;
    double sum = 0;
    if (np.norm == GemvNorm::kLayer) {
#pragma unroll 4
      for (int64_t v = lane; v < nvec; v += 32) {
        float f[V];
        LoadX<T, true>(x, v, true, f);
#pragma unroll
        for (int i = 0; i < V; ++i) sum += f[i];
      }
      for (int64_t i = nvec * V + lane; i < p.k; i += 32) sum += ToFloat(x[i]);
      sum = WarpSum(sum);
    }
    const double mean = sum / static_cast<double>(p.k);
    const float hi = static_cast<float>(mean), lo = static_cast<float>(mean - hi);
    float sq = 0.f;
#pragma unroll 4
    for (int64_t v = lane; v < nvec; v += 32) {
      float f[V];
      LoadX<T, true>(x, v, true, f);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float d = (f[i] - hi) - lo;
        sq += d * d;
      }
    }
    for (int64_t i = nvec * V + lane; i < p.k; i += 32) {
      const float d = (ToFloat(x[i]) - hi) - lo;
      sq += d * d;
    }
    sq = WarpSum(sq);
    if (lane == 0) norms[r] = {hi, lo, 1.f / sqrtf(sq / static_cast<float>(p.k) + np.eps)};
  }
  __syncthreads();
}

// The 16 bits of a 2-byte float.
template <typename T>
__device__ __forceinline__ uint32_t Bits16(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat16_as_ushort(v);
  } else {
    return __half_as_ushort(v);
  }
}

// kVec<T> floats rounded to T as one 16-byte word (Unpack's inverse).
template <typename T>
__device__ __forceinline__ uint4 Pack(const float (&f)[kVec<T>]) {
  uint32_t word[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      word[i] = __float_as_uint(f[i]);
    } else {
      word[i] = Bits16(FromFloat<T>(f[2 * i])) | Bits16(FromFloat<T>(f[2 * i + 1])) << 16;
    }
  }
  return make_uint4(word[0], word[1], word[2], word[3]);
}

// The eager norm's arithmetic for one element (reduce_kernels.cu NormOp).
__device__ __forceinline__ float Normalize(float x, const RowNorm& s, float weight, float bias) {
  return ((x - s.hi) - s.lo) * s.inv * weight + bias;
}

// The CTA's x rows normalised once, as the eager norm writes them (rounded to T), into `out`
// ([M, k] in shared memory): every column tile of the CTA then reads them from there. In 16-byte
// vectors where x, the norm's weight and bias are aligned and k is whole vectors (np.vec).
template <typename T, int M>
__device__ void NormalizeRows(const NormParams<T>& np, const RowNorm* norms, T* out) {
  constexpr int V = kVec<T>;
  const Params<T>& p = np.gemv;
  const int64_t nvec = np.vec ? p.k / V : 0;
  for (int r = 0; r < M; ++r) {
    const T* x = p.x + r * p.ldx;
    T* o = out + r * p.k;
    const RowNorm s = norms[r];
#pragma unroll 2
    for (int64_t v = threadIdx.x; v < nvec; v += kThreads) {
      float xf[V], wf[V], bf[V];
      LoadX<T, true>(x, v, true, xf);
      LoadX<T, true>(np.weight, v, np.weight != nullptr, wf);
      LoadX<T, true>(np.bias, v, np.bias != nullptr, bf);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        xf[i] = Normalize(xf[i], s, np.weight != nullptr ? wf[i] : 1.f, bf[i]);
      }
      reinterpret_cast<uint4*>(o)[v] = Pack<T>(xf);
    }
    for (int64_t i = nvec * V + threadIdx.x; i < p.k; i += kThreads) {
      const float w = np.weight != nullptr ? ToFloat(np.weight[i]) : 1.f;
      const float b = np.bias != nullptr ? ToFloat(np.bias[i]) : 0.f;
      o[i] = FromFloat<T>(Normalize(ToFloat(x[i]), s, w, b));
    }
  }
  __syncthreads();
}

// Every CTA's prologue with a norm: the rows' statistics, the rows normalised into shared memory
// (`words`, m·k elements), and the GEMV's parameters reading x from there.
template <typename T, int M>
__device__ __forceinline__ Params<T> NormalizeIntoShared(const NormParams<T>& np, RowNorm* norms,
                                                         uint4* words) {
  ComputeRowNorms<T, M>(np, norms);
  T* normed = reinterpret_cast<T*>(words);
  NormalizeRows<T, M>(np, norms, normed);
  Params<T> p = np.gemv;
  p.x = normed;
  p.ldx = p.k;
  p.vec_x = p.k % kVec<T> == 0;  // rows of whole vectors stay 16-byte aligned
  return p;
}

// The GEMV of the normalised x rows: statistics and the normalised rows in shared memory once per
// CTA (m·k elements of dynamic shared memory), then the plain kernel's column loop over them.
template <typename T, int M>
__global__ void __launch_bounds__(kThreads, 1) NormGemvKernel(NormParams<T> np) {
  __shared__ float partial[kWarps][M];
  __shared__ RowNorm norms[M];
  extern __shared__ uint4 normed_words[];
  WeightChunk chunk;
  PreloadFirstTile(np.gemv, chunk);
  GridDependencySync();  // x, residual and out may be earlier kernels' buffers
  ColumnTiles<T, M, XFrom::kShared>(NormalizeIntoShared<T, M>(np, norms, normed_words), partial,
                                    chunk);
}

// The gated product of the normalised x rows: NormGemvKernel's prologue, GatedGemvKernel's tiles.
template <typename T, int M>
__global__ void __launch_bounds__(kThreads, 1) GatedNormGemvKernel(NormParams<T> np, UpHalf<T> up) {
  __shared__ float partial[kWarps][M];
  __shared__ RowNorm norms[M];
  extern __shared__ uint4 normed_words[];
  WeightChunk chunk;
  PreloadFirstTile(np.gemv, chunk);
  GridDependencySync();  // x and out may be earlier kernels' buffers
  ColumnTiles<T, M, XFrom::kShared, true>(NormalizeIntoShared<T, M>(np, norms, normed_words),
                                          partial, chunk, up);
}

// ---- One row with its norm folded into the dot products (decode at batch 1). ----------------
//
// With one x row there is nothing to amortise the prologue over: statistics, a barrier, the
// normalised row through shared memory and another barrier put three dependent round trips
// before the first weight is used (in a GPT-2 decode step the qkv norm GEMV took 5.3 µs, the
// plain o-proj GEMV 3.0). Instead each warp folds the norm into its column's sums,
//   Σ w·(γ·(x - μ)·inv + β) = inv·(Σ wγ(x - x0) - (μ - x0)·Σ wγ) + Σ wβ,
// and takes the row's statistics from the x it reads anyway: Σ(x - x0) and Σ(x - x0)² (x0 = x[0]
// for a layer norm, so the sums stay small next to the spread; 0 for RMS). One pass, no shared
// memory, no barrier: the plain kernel's shape. The normalised row is not rounded to T before the
// products (the eager norm's output is): the result is nearer the float32 reference than the two
// ops', by at most that rounding.
//
// The loop is bound by its instructions where the row is long, so an RMS norm with γ (Llama's)
// runs a form of its own (kRms: Σ wγx and Σx² only, no x - x0, Σ wγ, Σ wβ, Σ x; timed on the
// H100 as a branch of one kernel: Llama-1B's MLP 37.7 -> 33.6 µs, LM head 62.6 -> 56.3). Every
// other norm runs the general form, a kernel of its own whose PTX is the one before: as branches
// of one kernel the general form compiled to 64 registers instead of 80, and GPT-2's decode ran
// 4.5 % slower in that run (its GEMV choices changed in the same tree, so the cause is not
// settled). Summing the statistics once per CTA behind a barrier, instead of per warp, was also
// tried: GPT-2's decode 5 % slower.

// The folded sums of one column: a1 = Σ wγ(x - x0), a2 = Σ wγ, a3 = Σ wβ; s1 = Σ(x - x0),
// s2 = Σ(x - x0)² over this thread's 16-byte vectors t, t + stride, ... (LaunchNormed folds only
// where k is whole vectors and x, w, γ and β are 16-byte aligned).
struct FoldedSums {
  float a1 = 0.f, a2 = 0.f, a3 = 0.f, s1 = 0.f, s2 = 0.f;
};

// The folded sums over the kUnroll weight vectors `raw` (v0, v0 + stride, ... below nvec): every
// sum, or with kRms (an RMS norm with γ) a1 and s2 alone.
template <bool kRms, typename T, XFrom kFromX>
__device__ __forceinline__ void FoldedChunk(const NormParams<T>& np, const uint4 (&raw)[kUnroll],
                                            int64_t v0, int stride, int64_t nvec, float x0,
                                            FoldedSums& f) {
  constexpr int V = kVec<T>;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t v = v0 + int64_t{u} * stride;
    if (v >= nvec) break;  // uniform past the end: later u are out of bounds too
    float wf[V], xf[V], gf[V], bf[V];
    Unpack<T>(raw[u], wf);
    LoadX<T, true, kFromX>(np.gemv.x, v, true, xf);
    if constexpr (kRms) {
      LoadX<T, true, kFromX>(np.weight, v, true, gf);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        f.a1 = fmaf(wf[i] * gf[i], xf[i], f.a1);
        f.s2 = fmaf(xf[i], xf[i], f.s2);
      }
      continue;
    }
    LoadX<T, true, kFromX>(np.weight, v, np.weight != nullptr, gf);
    LoadX<T, true, kFromX>(np.bias, v, np.bias != nullptr, bf);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float d = xf[i] - x0;
      const float wg = np.weight != nullptr ? wf[i] * gf[i] : wf[i];
      f.a1 = fmaf(wg, d, f.a1);
      f.a2 += wg;
      f.a3 = fmaf(wf[i], bf[i], f.a3);
      f.s1 += d;
      f.s2 = fmaf(d, d, f.s2);
    }
  }
}

// The folded sums of one column's row `w`; with `have_first`, chunk.raw holds its first chunk.
template <bool kRms, typename T, XFrom kFromX>
__device__ __forceinline__ void DotFolded(const NormParams<T>& np, const T* w, float x0, int t,
                                          int stride, WeightChunk& chunk, bool have_first,
                                          FoldedSums& f) {
  const int64_t nvec = np.gemv.k / kVec<T>;
  if (t >= nvec) return;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  if (!have_first) LoadWeightVectors(wv, t, stride, nvec, chunk.raw);
  for (int64_t v0 = t;;) {
    FoldedChunk<kRms, T, kFromX>(np, chunk.raw, v0, stride, nvec, x0, f);
    v0 += int64_t{kUnroll} * stride;
    if (v0 >= nvec) break;
    LoadWeightVectors(wv, v0, stride, nvec, chunk.raw);
  }
}

// A column's output before the epilogue, from its folded sums over a row of length k
// (statistics in double, as the eager norm sums its mean; the inverse deviation in float, as it
// computes it): inv·(a1 - mean·a2) + a3, the mean (of x - x0) taken only for a layer norm. The
// tensor-core fold (MmaTile) finishes its sums with it too.
__device__ __forceinline__ float FoldedValue(bool layer, int64_t k, float eps, float a1, float a2,
                                             float a3, double s1, double s2) {
  const double kd = static_cast<double>(k);
  const double mean = layer ? s1 / kd : 0.0;  // of x - x0
  const double var = s2 / kd - mean * mean;
  const float inv = 1.f / sqrtf(static_cast<float>(var > 0.0 ? var : 0.0) + eps);
  return inv * (a1 - static_cast<float>(mean) * a2) + a3;
}

// A column's folded sums over the CTA: FoldedValue's operands.
struct FoldedTotals {
  float a1, a2, a3;
  double s1, s2;
};

// The folded sums of weight row `col` of `w_rows` (rows p.ldw apart), complete in the lanes of the
// column's first warp (part == 0). Called by every thread of the CTA (the warps of a column meet
// in shared memory, in warp order). `first`: as ColumnSums'.
template <bool kRms, typename T, XFrom kFromX>
__device__ __forceinline__ FoldedTotals FoldedColumn(const NormParams<T>& np, const T* w_rows,
                                                     int64_t col, float x0, int t, int stride,
                                                     bool first, WeightChunk& chunk,
                                                     float (&dots)[kWarps][3],
                                                     double (&stats)[kWarps][2]) {
  const Params<T>& p = np.gemv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int part = warp % p.wpc;
  FoldedSums f;
  if (col < p.n) {
    const bool have_first = chunk.preloaded && first;
    DotFolded<kRms, T, kFromX>(np, w_rows + col * p.ldw, x0, t, stride, chunk, have_first, f);
  }
  float a1 = WarpSum(f.a1), a2 = WarpSum(f.a2), a3 = WarpSum(f.a3);
  double s1 = WarpSum(static_cast<double>(f.s1)), s2 = WarpSum(static_cast<double>(f.s2));
  if (p.wpc > 1) {  // uniform over the CTA
    if (lane == 0) {
      dots[warp][0] = a1, dots[warp][1] = a2, dots[warp][2] = a3;
      stats[warp][0] = s1, stats[warp][1] = s2;
    }
    __syncthreads();
    if (part == 0) {
      for (int j = 1; j < p.wpc; ++j) {
        a1 += dots[warp + j][0], a2 += dots[warp + j][1], a3 += dots[warp + j][2];
        s1 += stats[warp + j][0], s2 += stats[warp + j][1];
      }
    }
    __syncthreads();  // the arrays are written again
  }
  return {a1, a2, a3, s1, s2};
}

template <typename T>
__device__ __forceinline__ float FoldedValue(const NormParams<T>& np, const FoldedTotals& f) {
  return FoldedValue(np.norm == GemvNorm::kLayer, np.gemv.k, np.eps, f.a1, f.a2, f.a3, f.s1, f.s2);
}

// The CTA's column tiles of the folded GEMV (x, the norm's weight and bias read as kFromX says);
// kGated: the gate's and the up's folded values (`up`'s rows) and their product (StoreGated).
template <bool kRms, typename T, XFrom kFromX, bool kGated = false>
__device__ __forceinline__ void FoldedColumnTiles(const NormParams<T>& np, float (&dots)[kWarps][3],
                                                  double (&stats)[kWarps][2], WeightChunk& chunk,
                                                  const UpHalf<T>& up = {}) {
  const Params<T>& p = np.gemv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cols = kWarps / p.wpc, part = warp % p.wpc;
  const int t = part * 32 + lane, stride = p.wpc * 32;
  const float x0 = np.norm == GemvNorm::kLayer ? LoadElement<kFromX>(p.x) : 0.f;
  const int64_t tiles = (p.n + cols - 1) / cols;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // uniform over the CTA
    const int64_t col = tile * cols + warp / p.wpc;
    const EpilogueIn e = part == 0 ? LoadEpilogue<T, 1, kFromX>(p, col, lane) : EpilogueIn{};
    const FoldedTotals gate = FoldedColumn<kRms, T, kFromX>(np, p.w, col, x0, t, stride,
                                                            tile == blockIdx.x, chunk, dots, stats);
    if constexpr (kGated) {
      const float bias_up = part == 0 && col < p.n && up.bias != nullptr
                                ? LoadElement<kFromX>(up.bias + col * p.bias_stride)
                                : 0.f;
      const FoldedTotals u =
          FoldedColumn<kRms, T, kFromX>(np, up.w, col, x0, t, stride, false, chunk, dots, stats);
      if (col < p.n && part == 0) {
        const float acc[1] = {FoldedValue(np, gate)}, up_acc[1] = {FoldedValue(np, u)};
        StoreGated<T, 1>(p, col, lane, acc, up_acc, e, bias_up);
      }
    } else {
      if (col < p.n && part == 0) {
        const float acc[1] = {FoldedValue(np, gate)};
        Store<T, 1>(p, col, lane, acc, e);
      }
    }
  }
}

template <typename T, bool kRms>
__global__ void __launch_bounds__(kThreads) FoldedNormGemvKernel(NormParams<T> np) {
  __shared__ float dots[kWarps][3];
  __shared__ double stats[kWarps][2];
  WeightChunk chunk;
  PreloadFirstTile(np.gemv, chunk);
  GridDependencySync();  // x, residual and out may be earlier kernels' buffers
  FoldedColumnTiles<kRms, T, XFrom::kReadOnly>(np, dots, stats, chunk);
}

// The gated product of one row with its norm folded (GatedGemvKernel's product,
// FoldedNormGemvKernel's sums).
template <typename T, bool kRms>
__global__ void __launch_bounds__(kThreads)
    GatedFoldedNormGemvKernel(NormParams<T> np, UpHalf<T> up) {
  __shared__ float dots[kWarps][3];
  __shared__ double stats[kWarps][2];
  WeightChunk chunk;
  PreloadFirstTile(np.gemv, chunk);
  GridDependencySync();  // x and out may be earlier kernels' buffers
  FoldedColumnTiles<kRms, T, XFrom::kReadOnly, true>(np, dots, stats, chunk, up);
}

// Whether the folded GEMV of `np` runs the RMS form (an RMS norm with γ).
template <typename T>
__host__ __device__ __forceinline__ bool FoldsRmsForm(const NormParams<T>& np) {
  return np.norm == GemvNorm::kRms && np.weight != nullptr;
}

// ---- A chain of one-row GEMVs in one launch (gemv_kernels.h GemvChain). ---------------------
//
// Each GEMV of a decode step is a latency chain (a 1.2 MB GEMV takes ~3 µs where its bytes need
// 0.3): ramp-up, the first weights' round trip to HBM, the tail. The chain kernel runs several
// one-row GEMVs (plain or with a folded norm) as steps of one cooperative launch: every CTA
// first pulls its column tiles' weight rows of every step into L2, then runs step after step,
// the grid meeting at a barrier before a step whose reads or writes overlap what a step since the
// last barrier writes or reads (the host compares the byte ranges: a decode layer's output
// projection, MLP and next qkv each wait for the one before; q, k and v of one norm do not). Steps
// read x, the norm weight and bias through L2 (XFrom::kCoherent): an earlier step of the same
// kernel may have written them. (The prefetch is a hint: a weight an earlier step writes is read
// after its barrier all the same.)
template <typename T>
struct ChainStep {
  NormParams<T> np;  // np.norm == kNone: the plain GEMV of np.gemv
};

template <typename T>
struct ChainParams {
  ChainStep<T> steps[kGemvChainMaxOps];
  bool barrier_before[kGemvChainMaxOps];  // step i reads or writes what a step since the last
                                          // barrier writes or reads
  int count;
  int prefetched;  // steps whose weights are pulled into L2 up front (their bytes fit in it)
};

// Pulls every weight row of the CTA's column tiles of `p` into L2 (as ColumnTiles maps them).
template <typename T>
__device__ __forceinline__ void PrefetchCtaTiles(const Params<T>& p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cols = kWarps / p.wpc;
  const int64_t tiles = (p.n + cols - 1) / cols;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    PrefetchRow(p, tile * cols + warp / p.wpc, (warp % p.wpc) * 32 + lane, p.wpc * 32);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    GemvChainKernel(const __grid_constant__ ChainParams<T> c) {
  __shared__ float partial[kWarps][1];
  __shared__ float dots[kWarps][3];
  __shared__ double stats[kWarps][2];
  for (int i = 0; i < c.prefetched; ++i) PrefetchCtaTiles(c.steps[i].np.gemv);
  WeightChunk chunk;
  chunk.preloaded = false;  // the steps' weights are in L2, not in registers
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  for (int i = 0; i < c.count; ++i) {
    if (c.barrier_before[i]) grid.sync();
    const NormParams<T>& np = c.steps[i].np;
    if (np.norm == GemvNorm::kNone) {
      ColumnTiles<T, 1, XFrom::kCoherent>(np.gemv, partial, chunk);
    } else {
      if (FoldsRmsForm(np)) {
        FoldedColumnTiles<true, T, XFrom::kCoherent>(np, dots, stats, chunk);
      } else {
        FoldedColumnTiles<false, T, XFrom::kCoherent>(np, dots, stats, chunk);
      }
    }
  }
}

// ---- The tensor-core path: 2..8 rows of bfloat16 / float16. ----------------------------------
//
// With M x rows each weight feeds M FMAs, and the FMA loop above is bound by its instructions (the
// x loads and conversions for every row) long before HBM is. Here the weights are the A operand of
// mma.m16n8k16 (16 w rows = 16 output columns, a "tile") and the x rows the B operand (8 columns;
// rows >= M are zeros), so the products cost nothing and only the weights' bytes remain. The sum
// over k does not care which k a fragment slot holds as long as A and B agree, so each thread
// loads whole 16-byte vectors: lane (g, c) = (lane / 4, lane % 4) reads elements 8c .. 8c+7 and
// 32+8c .. 32+8c+7 of a 64-element chunk of w rows g and g + 8 and of x row g (a load instruction
// of the warp covers 64 contiguous bytes of each of 8 rows), and k16 step s takes its words 2s
// and 2s+1. The 4 warps of a CTA take the tile's chunks in turn, kMmaUnroll chunks in flight each;
// where a tile has many chunks and the grid few tiles, its chunks are also split over the CTAs of
// a thread-block cluster (grid y, sm_90), whose rank 0 adds the others' sums from their shared
// memory. Sums are fp32 (the mma's accumulator); bias, activation, residual and the rounding are
// the FMA path's (Store).
constexpr int kMmaTile = 16;      // output columns per tile (the mma's M)
constexpr int kMmaChunk = 64;     // k per chunk (4 mma k-steps)
constexpr int kMmaUnroll = 2;     // chunks in flight per warp
constexpr int kMmaMaxSplits = 8;  // CTAs of a cluster sharing one tile's chunks (portable size)

// w rows g and g + 8 and x row g of one chunk, 16 elements each as 8 32-bit words.
struct MmaChunk {
  uint32_t wg[8], wh[8], x[8];
  uint32_t ug[8], uh[8];  // a gated product: the up half's rows g and g + 8
  uint32_t gamma[8];      // a folded norm (MmaX::kRmsFolded, kLayerFolded): γ at x's elements
  uint32_t beta[8];       // kLayerFolded, lanes of x row 1 only: β at x's elements
};

// Where MmaTile's x rows come from: global memory, shared memory (normalised there by the CTA), or
// global memory with an RMS norm folded in (kRmsFolded, bfloat16 only): each x element is
// multiplied by γ as it is read, rounded to bfloat16 for the mma, and squared into the row's sum;
// the row's 1 / rms multiplies the column sums at the end,
//   Σ w·x·inv·γ = inv·Σ w·(γx).
// No prologue: the tile loop's shape and grid. The products γx are rounded where the eager norm
// rounds x·inv·γ: the same error, placed differently. (float16 would overflow on γx where the
// normalised value does not: it keeps the prologue.)
// A layer norm folds the same way (kLayerFolded, bfloat16 only), its mean taken from the sums:
//   Σ w·(γ(x - μ)·inv + β) = inv·(Σ wγ(x - x0) - (μ - x0)·Σ wγ) + Σ wβ,
// x0 = the mean of the row's first chunk (its first min(k, 64) elements), so that the sums
// Σ(x - x0), Σ(x - x0)² stay small next to the row's spread for rows far from zero (as the
// one-row fold) and the rounded γ(x - x0) lies about as far from zero as the normalised value:
// with x0 one element, |x0 - μ| ~ σ about doubled the squared rounding error that the
// (μ - x0)·Σ wγ term leaves after cancelling (up to 3 of 2304 outputs of a [3, 768] row block
// at 768 columns outside the per-op tolerance of the eager norm then linear, on the H100). Σ wγ and
// Σ wβ are a second mma beside the dot products, whose B operand holds γ (ones without it) in its
// column 0 and β (zeros without it) in column 1.
enum class MmaX { kGlobal, kShared, kRmsFolded, kLayerFolded };

// A folded norm's operands (MmaX::kRmsFolded, kLayerFolded): γ and β (nullptr: none) and eps.
template <typename T>
struct MmaFold {
  const T* gamma = nullptr;
  const T* beta = nullptr;
  float eps = 0.f;
};

__device__ __forceinline__ void Words(const uint4& v, uint32_t* out) {
  out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
}

// The chunk at k offset kc: this lane's two 16-byte vectors of each of its w rows (zeros past k
// and for w rows past n) into `out_g` and `out_h`. k is a multiple of 8, so a vector is whole or
// out.
template <typename T>
__device__ __forceinline__ void LoadMmaWeights(const Params<T>& p, const T* wg, const T* wh,
                                               int64_t kc, int c, uint32_t (&out_g)[8],
                                               uint32_t (&out_h)[8]) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t at = kc + 32 * h + 8 * c;
    const bool in = at < p.k;
    Words(in && wg != nullptr ? __ldcs(reinterpret_cast<const uint4*>(wg + at)) : zero,
          out_g + 4 * h);
    Words(in && wh != nullptr ? __ldcs(reinterpret_cast<const uint4*>(wh + at)) : zero,
          out_h + 4 * h);
  }
}

// The same chunk's two vectors of this lane's x row (zeros past k and for x rows past m), and
// with a folded norm γ's at the same k (zeros without it), and β's in the lanes of x row 1.
template <typename T, MmaX kX>
__device__ __forceinline__ void LoadMmaX(const Params<T>& p, const T* x, const MmaFold<T>& fold,
                                         int64_t kc, int c, MmaChunk& f) {
  constexpr bool kFolded = kX == MmaX::kRmsFolded || kX == MmaX::kLayerFolded;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t at = kc + 32 * h + 8 * c;
    uint4 xv = make_uint4(0, 0, 0, 0);
    if (at < p.k && x != nullptr) {
      xv = kX == MmaX::kShared ? *reinterpret_cast<const uint4*>(x + at)
                               : __ldg(reinterpret_cast<const uint4*>(x + at));
    }
    Words(xv, f.x + 4 * h);
    if constexpr (kFolded) {
      const bool in = at < p.k && fold.gamma != nullptr;
      Words(in ? __ldg(reinterpret_cast<const uint4*>(fold.gamma + at)) : make_uint4(0, 0, 0, 0),
            f.gamma + 4 * h);
    }
    if constexpr (kX == MmaX::kLayerFolded) {
      const bool in = at < p.k && fold.beta != nullptr && (threadIdx.x % 32) / 4 == 1;
      Words(in ? __ldg(reinterpret_cast<const uint4*>(fold.beta + at)) : make_uint4(0, 0, 0, 0),
            f.beta + 4 * h);
    }
  }
}

// A folded norm's chunk (kRmsFolded, kLayerFolded): its x words become γ(x - x0) rounded to T, and
// x - x0 and its square add to the row's `shifted` (kLayer) and `squares`. A layer norm's x0 is the
// row's shift, and words past k (`in_lo` / `in_hi`: whether words 0..3 / 4..7 lie before it) become
// zeros; an RMS norm's x0 is 0, and without γ its words stay as they are.
template <typename T, bool kLayer>
__device__ __forceinline__ void FoldNorm(MmaChunk& f, bool has_gamma, float x0, bool in_lo,
                                         bool in_hi, float& squares, float& shifted) {
  static_assert(std::is_same_v<T, __nv_bfloat16>, "float16 would overflow on γ(x - x0)");
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const bool in = !kLayer || (j < 4 ? in_lo : in_hi);
    float lo = in ? __uint_as_float(f.x[j] << 16) - x0 : 0.f;
    float hi = in ? __uint_as_float(f.x[j] & 0xFFFF0000u) - x0 : 0.f;
    if constexpr (kLayer) shifted += lo + hi;
    squares = fmaf(lo, lo, fmaf(hi, hi, squares));
    if (has_gamma) {
      lo *= __uint_as_float(f.gamma[j] << 16);
      hi *= __uint_as_float(f.gamma[j] & 0xFFFF0000u);
    }
    if (kLayer || has_gamma) f.x[j] = Bits16(FromFloat<T>(lo)) | Bits16(FromFloat<T>(hi)) << 16;
  }
}

// kLayerFolded: the row's shift x0, the mean of its first chunk, for the lanes of x row g (0 for
// rows past m: `x` nullptr). Every lane of the warp calls it; every warp and every CTA of a
// cluster gets the same float (the 4 lanes' partial sums add in an order that commutes).
template <typename T>
__device__ __forceinline__ float FirstChunkMean(const Params<T>& p, const T* x, int c) {
  float sum = 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t at = 32 * h + 8 * c;
    if (x == nullptr || at >= p.k) continue;
    float f[kVec<T>];
    Unpack<T>(__ldg(reinterpret_cast<const uint4*>(x + at)), f);
#pragma unroll
    for (int j = 0; j < kVec<T>; j += 2) sum += f[j] + f[j + 1];
  }
  sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
  sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
  return sum / static_cast<float>(p.k < kMmaChunk ? p.k : kMmaChunk);
}

// kLayerFolded: word j of the second B operand in a lane of x row g: γ (ones without it) for
// column 0, β (zeros without it) for column 1, zeros elsewhere.
__device__ __forceinline__ uint32_t FoldColumnWord(const MmaChunk& f, int g, bool has_gamma,
                                                   int j) {
  if (g == 0) return has_gamma ? f.gamma[j] : 0x3F803F80u;  // two bfloat16 ones
  return g == 1 ? f.beta[j] : 0u;
}

// A warp's kMmaUnroll chunks in flight: the tile loop's working buffer, one per kernel. With the
// weights preloaded before the dependency wait (PreloadMmaTile), it holds the w words of the
// warp's first chunks of the CTA's first tile, and that iteration loads only x.
struct MmaChunks {
  MmaChunk f[kMmaUnroll];
  bool preloaded;
};

// The w rows g and g + 8 of `tile` (nullptr past n) and, in a gated product, the up half's same
// rows, this warp's first chunk of them and its stride, and the chunks of a row.
template <typename T>
struct MmaRows {
  const T* wg;
  const T* wh;
  const T* ug;
  const T* uh;
  int64_t first, stride, chunks;
};

// `up_w`: a gated product's up rows, laid out as w's (nullptr: none).
template <typename T>
__device__ __forceinline__ MmaRows<T> RowsOf(const Params<T>& p, int64_t tile, int split,
                                             int splits, const T* up_w = nullptr) {
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
  const int64_t col_g = tile * kMmaTile + g, col_h = col_g + 8;
  const bool in_g = col_g < p.n, in_h = col_h < p.n, up = up_w != nullptr;
  return {in_g ? p.w + col_g * p.ldw : nullptr,
          in_h ? p.w + col_h * p.ldw : nullptr,
          up && in_g ? up_w + col_g * p.ldw : nullptr,
          up && in_h ? up_w + col_h * p.ldw : nullptr,
          int64_t{split} * kWarps + warp,
          int64_t{kWarps} * splits,
          (p.k + kMmaChunk - 1) / kMmaChunk};
}

// The chunk at k offset kc of this lane's w rows and, kGated, of its up rows.
template <typename T, bool kGated>
__device__ __forceinline__ void LoadTileWeights(const Params<T>& p, const MmaRows<T>& rows,
                                                int64_t kc, int c, MmaChunk& f) {
  LoadMmaWeights<T>(p, rows.wg, rows.wh, kc, c, f.wg, f.wh);
  if constexpr (kGated) LoadMmaWeights<T>(p, rows.ug, rows.uh, kc, c, f.ug, f.uh);
}

template <typename T>
__device__ __forceinline__ void Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}
// The float at `local`'s address in the shared memory of cluster CTA `rank`.
__device__ __forceinline__ float ClusterLoad(const float* local, unsigned rank) {
  const auto addr = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
#endif

// The sums a thread of MmaTile holds for its output (column t / 8, row t % 8) once its CTA's
// warps are added: the dot product, and with a folded norm its row's Σx² (kLayerFolded: Σ(x - x0)²
// and Σ(x - x0)) and (kLayerFolded) its column's Σ wγ and Σ wβ; a gated product's up sum after
// them (kUpSum<kX>).
enum TileSum { kDot, kSquares, kShifted, kWGamma, kWBeta };
template <MmaX kX>
constexpr int kTileSums = kX == MmaX::kLayerFolded ? 5
                          : kX == MmaX::kRmsFolded ? 2
                                                   : 1;
template <MmaX kX>
constexpr int kUpSum = kTileSums<kX>;

// Shared memory of a tile's sums: each warp's accumulators (kGated: the gate's, then the up's)
// and, with a folded norm, each warp's row statistics (kLayerFolded: and column sums of γ and β);
// then the CTA's per thread, which cluster rank 0 reads from the others. Arrays a kernel does not
// use have one element.
template <MmaX kX, bool kGated = false>
struct MmaShared {
  static constexpr bool kStats = kTileSums<kX> > 1, kLayer = kX == MmaX::kLayerFolded;
  float warp[kWarps][kGated ? 8 : 4][32];
  float squares[kWarps][kStats ? 8 : 1];
  float shifted[kWarps][kLayer ? 8 : 1];
  float folds[kWarps][2][kLayer ? kMmaTile : 1];
  float cta[kTileSums<kX> + (kGated ? 1 : 0)][kThreads];  // by TileSum, then kUpSum
};

// One tile: this CTA's share of its chunks (split `split` of `splits`), the sums over warps (and
// over the cluster when splits > 1), then (a folded norm) the row's normalisation, bias,
// activation, residual and the store by rank 0. Thread t ends with output (column tile·16 + t / 8,
// row t % 8). With `have_first`, chunks.f already holds the w words of the warp's first iteration.
// kGated: the up half's rows (`up`) take a second mma on the same x operand, and the store is
// StoreGated's act(gate + bias) · (up + up bias) (no residual: the host refuses one).
template <typename T, MmaX kX, bool kGated = false>
__device__ __forceinline__ void MmaTile(const Params<T>& p, int m, int64_t tile, int split,
                                        int splits, MmaShared<kX, kGated>& sh,
                                        MmaChunks& chunks_in_flight, bool have_first,
                                        const MmaFold<T>& fold = {}, const UpHalf<T>& up = {}) {
  constexpr bool kRms = kX == MmaX::kRmsFolded, kLayer = kX == MmaX::kLayerFolded;
  constexpr int kSums = kTileSums<kX> + (kGated ? 1 : 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const MmaRows<T> rows = RowsOf(p, tile, split, splits, kGated ? up.w : nullptr);
  const T* x = g < m ? p.x + g * p.ldx : nullptr;
  const int64_t chunks = rows.chunks, stride = rows.stride;
  MmaChunk(&f)[kMmaUnroll] = chunks_in_flight.f;
  // Thread t ends with output (column t / 8, row t % 8) of the tile; split 0 (cluster rank 0)
  // stores it. Its bias and residual are loaded now, with the weights, not after the sums.
  const int t = threadIdx.x, col = t / 8, row = t % 8;
  const int64_t out_col = tile * kMmaTile + col;
  const bool stores = split == 0 && row < m && out_col < p.n;
  float b = 0.f, res = 0.f;
  if (stores && p.bias != nullptr) b = ToFloat(p.bias[out_col * p.bias_stride]);
  if (stores && p.residual != nullptr) res = ToFloat(p.residual[row * p.n + out_col]);
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  float du[4] = {0.f, 0.f, 0.f, 0.f};     // kGated: the up half's sums, as d
  float folds[4] = {0.f, 0.f, 0.f, 0.f};  // kLayer: Σ wγ, Σ wβ of columns g and g + 8 (c = 0)
  float squares = 0.f, shifted = 0.f;     // a folded norm: of this lane's x elements
  float x0 = 0.f;
  if constexpr (kLayer) x0 = FirstChunkMean(p, x, c);
  bool weights_loaded = have_first;
  for (int64_t q = rows.first; q < chunks; q += stride * kMmaUnroll) {
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int64_t qu = q + u * stride, kc = qu < chunks ? qu * kMmaChunk : p.k;
      if (!weights_loaded) LoadTileWeights<T, kGated>(p, rows, kc, c, f[u]);
      LoadMmaX<T, kX>(p, x, fold, kc, c, f[u]);
    }
    weights_loaded = false;
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      if constexpr (kRms || kLayer) {
        const int64_t qu = q + u * stride, kc = qu < chunks ? qu * kMmaChunk : p.k;
        FoldNorm<T, kLayer>(f[u], fold.gamma != nullptr, x0, kc + 8 * c < p.k,
                            kc + 32 + 8 * c < p.k, squares, shifted);
      }
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        Mma<T>(d, f[u].wg[2 * s], f[u].wh[2 * s], f[u].wg[2 * s + 1], f[u].wh[2 * s + 1],
               f[u].x[2 * s], f[u].x[2 * s + 1]);
        if constexpr (kGated) {
          Mma<T>(du, f[u].ug[2 * s], f[u].uh[2 * s], f[u].ug[2 * s + 1], f[u].uh[2 * s + 1],
                 f[u].x[2 * s], f[u].x[2 * s + 1]);
        }
        if constexpr (kLayer) {
          Mma<T>(folds, f[u].wg[2 * s], f[u].wh[2 * s], f[u].wg[2 * s + 1], f[u].wh[2 * s + 1],
                 FoldColumnWord(f[u], g, fold.gamma != nullptr, 2 * s),
                 FoldColumnWord(f[u], g, fold.gamma != nullptr, 2 * s + 1));
        }
      }
    }
  }
  // d[i]: column g + 8 (i / 2), row 2c + i % 2. Thread t takes column t / 8 and row t % 8.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sh.warp[warp][i][lane] = d[i];
    if constexpr (kGated) sh.warp[warp][4 + i][lane] = du[i];
  }
  if constexpr (kSums > 1) {  // the 4 lanes of row g hold its statistics
    squares += __shfl_xor_sync(0xFFFFFFFFu, squares, 1);
    squares += __shfl_xor_sync(0xFFFFFFFFu, squares, 2);
    if (c == 0) sh.squares[warp][g] = squares;
  }
  if constexpr (kLayer) {  // and lanes c = 0 the column sums: folds[i] of column g + 8 (i / 2)
    shifted += __shfl_xor_sync(0xFFFFFFFFu, shifted, 1);
    shifted += __shfl_xor_sync(0xFFFFFFFFu, shifted, 2);
    if (c == 0) {
      sh.shifted[warp][g] = shifted;
#pragma unroll
      for (int i = 0; i < 4; ++i) sh.folds[warp][i % 2][g + 8 * (i / 2)] = folds[i];
    }
  }
  __syncthreads();
  const int i = (col / 8) * 2 + row % 2, from = (col % 8) * 4 + row / 2;
  float sums[kSums];
#pragma unroll
  for (int j = 0; j < kSums; ++j) sums[j] = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    sums[kDot] += sh.warp[w][i][from];
    if constexpr (kGated) sums[kUpSum<kX>] += sh.warp[w][4 + i][from];
    if constexpr (kSums > 1) sums[kSquares] += sh.squares[w][row];
    if constexpr (kLayer) {
      sums[kShifted] += sh.shifted[w][row];
      sums[kWGamma] += sh.folds[w][0][col];
      sums[kWBeta] += sh.folds[w][1][col];
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (splits > 1) {  // the cluster's CTAs hold the other splits: rank 0 (split 0) adds them up
#pragma unroll
    for (int j = 0; j < kSums; ++j) sh.cta[j][t] = sums[j];
    ClusterSync();
    if (split == 0) {  // every load issued before the first is used: one round trip, not seven
      float other[kMmaMaxSplits][kSums];
#pragma unroll
      for (int r = 1; r < kMmaMaxSplits; ++r) {
#pragma unroll
        for (int j = 0; j < kSums; ++j)
          other[r][j] = r < splits ? ClusterLoad(&sh.cta[j][t], r) : 0.f;
      }
#pragma unroll
      for (int r = 1; r < kMmaMaxSplits; ++r) {
#pragma unroll
        for (int j = 0; j < kSums; ++j) {
          if (r < splits) sums[j] += other[r][j];
        }
      }
    }
    ClusterSync();  // every CTA's shared memory lives until rank 0 has read it
  }
#endif
  if (stores) {
    float v = sums[kDot];
    // The eager norm's 1 / rms (reduce_kernels.cu NormOp): the squares summed in float.
    float inv = 1.f;
    if constexpr (kRms) {
      inv = 1.f / sqrtf(sums[kSquares] / static_cast<float>(p.k) + fold.eps);
      v *= inv;
    }
    if constexpr (kLayer) {
      v = FoldedValue(true, p.k, fold.eps, v, sums[kWGamma], sums[kWBeta], sums[kShifted],
                      sums[kSquares]);
    }
    if constexpr (kGated) {
      static_assert(!kLayer, "a gated layer norm keeps the prologue");
      // Loaded here, not with the bias: held over the tile loop it spilled.
      const float bu = up.bias != nullptr ? ToFloat(up.bias[out_col * p.bias_stride]) : 0.f;
      p.out[row * p.n + out_col] =
          FromFloat<T>(GateActivate(v + b, p.act) * (sums[kUpSum<kX>] * inv + bu));
    } else {
      float y = Activate(v + b, p.act);
      if (p.residual != nullptr) y += res;
      p.out[row * p.n + out_col] = FromFloat<T>(y);
    }
  }
  __syncthreads();  // sh.warp is written again by the next tile
}

// This CTA's first chunks of w rows into L2 before the dependency wait (as PrefetchRow).
template <typename T>
__device__ __forceinline__ void PrefetchMmaTile(const Params<T>& p, int64_t tile, int split,
                                                int splits) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t col = tile * kMmaTile + lane % kMmaTile;
  if (col >= p.n) return;
  const char* row = reinterpret_cast<const char*>(p.w + col * p.ldw);
  const int64_t chunk = int64_t{split} * kWarps + warp;
  const int64_t at = (chunk * kMmaChunk + (lane / kMmaTile) * (kMmaChunk / 2)) * sizeof(T);
  if (at < p.k * static_cast<int64_t>(sizeof(T)))
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row + at));
}

// Before the dependency wait: with p.preload, the w words (kGated: and the up half's, `up_w`) of
// this warp's first iteration of `tile` into `chunks` (their round trip to HBM overlapping the
// previous kernel's tail; the host sets it only where no kernel that may still run writes them,
// GemvArgs::preload_weights); else those rows' first chunks into L2.
template <typename T, bool kGated = false>
__device__ __forceinline__ void PreloadMmaTile(const Params<T>& p, int64_t tile, int split,
                                               int splits, MmaChunks& chunks,
                                               const T* up_w = nullptr) {
  chunks.preloaded = p.preload;
  if (!p.preload) {
    PrefetchMmaTile(p, tile, split, splits);
    if constexpr (kGated) {
      Params<T> up = p;
      up.w = up_w;
      PrefetchMmaTile(up, tile, split, splits);
    }
    return;
  }
  const MmaRows<T> rows = RowsOf(p, tile, split, splits, kGated ? up_w : nullptr);
  const int c = threadIdx.x % 4;
#pragma unroll
  for (int u = 0; u < kMmaUnroll; ++u) {
    const int64_t qu = rows.first + u * rows.stride;
    LoadTileWeights<T, kGated>(p, rows, qu < rows.chunks ? qu * kMmaChunk : p.k, c, chunks.f[u]);
  }
}

// Grid (tiles, splits), clusters (1, splits): CTA (tile, split) takes split `split` of the tile.
template <typename T>
__global__ void __launch_bounds__(kThreads) MmaGemvKernel(Params<T> p, int m) {
  __shared__ MmaShared<MmaX::kGlobal> sh;
  MmaChunks chunks;
  PreloadMmaTile(p, blockIdx.x, blockIdx.y, gridDim.y, chunks);
  GridDependencySync();  // x, residual and out may be earlier kernels' buffers
  MmaTile<T, MmaX::kGlobal>(p, m, blockIdx.x, blockIdx.y, gridDim.y, sh, chunks, chunks.preloaded);
}

// The RMS norm GEMV of bfloat16 rows on tensor cores with the norm folded (MmaX::kRmsFolded):
// MmaGemvKernel's grid, no prologue.
template <typename T>
__global__ void __launch_bounds__(kThreads) FoldedRmsMmaGemvKernel(NormParams<T> np, int m) {
  __shared__ MmaShared<MmaX::kRmsFolded> sh;
  MmaChunks chunks;
  PreloadMmaTile(np.gemv, blockIdx.x, blockIdx.y, gridDim.y, chunks);
  GridDependencySync();  // x, γ, residual and out may be earlier kernels' buffers
  MmaTile<T, MmaX::kRmsFolded>(np.gemv, m, blockIdx.x, blockIdx.y, gridDim.y, sh, chunks,
                               chunks.preloaded, MmaFold<T>{np.weight, nullptr, np.eps});
}

// The layer norm GEMV of bfloat16 rows on tensor cores with the norm folded (MmaX::kLayerFolded):
// MmaGemvKernel's grid, no prologue.
template <typename T>
__global__ void __launch_bounds__(kThreads) FoldedLayerMmaGemvKernel(NormParams<T> np, int m) {
  __shared__ MmaShared<MmaX::kLayerFolded> sh;
  MmaChunks chunks;
  PreloadMmaTile(np.gemv, blockIdx.x, blockIdx.y, gridDim.y, chunks);
  GridDependencySync();  // x, γ, β, residual and out may be earlier kernels' buffers
  MmaTile<T, MmaX::kLayerFolded>(np.gemv, m, blockIdx.x, blockIdx.y, gridDim.y, sh, chunks,
                                 chunks.preloaded, MmaFold<T>{np.weight, np.bias, np.eps});
}

// The gated product (GemvArgs::w_up) of bfloat16 rows after an RMS norm, on tensor cores with the
// norm folded: FoldedRmsMmaGemvKernel with the up half's rows beside the gate's, one x operand
// for both mma, and act(gate) · up stored. (ptxas, nvcc 13.0, sm_90: 128 registers, no spills,
// 5,808 bytes of shared memory. Not yet run on a GPU; a compiled model reaches it only with
// KILN_GEMV_GLU=on.)
template <typename T>
__global__ void __launch_bounds__(kThreads)
    GatedFoldedRmsMmaGemvKernel(NormParams<T> np, int m, UpHalf<T> up) {
  __shared__ MmaShared<MmaX::kRmsFolded, true> sh;
  MmaChunks chunks;
  PreloadMmaTile<T, true>(np.gemv, blockIdx.x, blockIdx.y, gridDim.y, chunks, up.w);
  GridDependencySync();  // x, γ and out may be earlier kernels' buffers
  MmaTile<T, MmaX::kRmsFolded, true>(np.gemv, m, blockIdx.x, blockIdx.y, gridDim.y, sh, chunks,
                                     chunks.preloaded, MmaFold<T>{np.weight, nullptr, np.eps}, up);
}

// The norm GEMV on tensor cores: the rows normalised into shared memory once per CTA, as
// NormGemvKernel does, then tiles blockIdx.x, blockIdx.x + gridDim.x, ..., each split over the
// grid's y as MmaGemvKernel's are (every CTA of a cluster walks the same tiles).
template <typename T, int M>
__global__ void __launch_bounds__(kThreads, 1) NormMmaGemvKernel(NormParams<T> np) {
  __shared__ MmaShared<MmaX::kShared> sh;
  __shared__ RowNorm norms[M];
  extern __shared__ uint4 normed_words[];
  MmaChunks chunks;
  PreloadMmaTile(np.gemv, blockIdx.x, blockIdx.y, gridDim.y, chunks);
  GridDependencySync();  // x, residual and out may be earlier kernels' buffers
  const Params<T> p = NormalizeIntoShared<T, M>(np, norms, normed_words);
  const int64_t tiles = (p.n + kMmaTile - 1) / kMmaTile;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    MmaTile<T, MmaX::kShared>(p, M, tile, blockIdx.y, gridDim.y, sh, chunks,
                              chunks.preloaded && tile == blockIdx.x);
  }
}

// Returns once `ns` nanoseconds have passed since the call (the device's global timer).
__device__ void SpinFor(int64_t ns) {
  auto now = [] {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  };
  const uint64_t start = now();
  while (now() - start < static_cast<uint64_t>(ns)) __nanosleep(1000);
}

// Waits on the device until `ns` nanoseconds have passed since it started.
__global__ void DelayKernel(int64_t ns) { SpinFor(ns); }

// FillAfterDelay's kernel: the dependent launch's trigger first, then the wait, then the writes.
__global__ void FillAfterDelayKernel(uint16_t* p, int64_t count, uint16_t value, int64_t ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  SpinFor(ns);
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) p[i] = value;
}

// Warps per column: split k over more warps while the grid has fewer than 32 warps per SM and
// each warp keeps at least two full sweeps of 16-byte vectors.
int WarpsPerColumn(int64_t n, int64_t k, int sm_count, int vec) {
  const int64_t enough_warps = int64_t{std::max(sm_count, 1)} * 32;
  int wpc = 1;
  while (wpc < kWarps && n * wpc < enough_warps && k >= int64_t{2 * 32} * vec * (wpc * 2)) {
    wpc *= 2;
  }
  return wpc;
}

// Whether every one of `rows` rows, `ld` elements apart from `p`, starts 16-byte aligned.
bool RowsAligned16(const void* p, int64_t ld, int64_t rows, size_t elem_size) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p);
  if (rows > 1) bits |= static_cast<uint64_t>(ld) * elem_size;  // modular: negative ld is fine
  return bits % 16 == 0;
}

template <typename T, size_t... I>
std::array<void (*)(Params<T>), sizeof...(I)> KernelTable(std::index_sequence<I...>) {
  return {&GemvKernel<T, static_cast<int>(I) + 1>...};
}

template <typename T, size_t... I>
std::array<void (*)(Params<T>, UpHalf<T>), sizeof...(I)> GatedKernelTable(
    std::index_sequence<I...>) {
  return {&GatedGemvKernel<T, static_cast<int>(I) + 1>...};
}

template <typename T, size_t... I>
std::array<void (*)(NormParams<T>), sizeof...(I)> NormKernelTable(std::index_sequence<I...>) {
  return {&NormGemvKernel<T, static_cast<int>(I) + 1>...};
}

template <typename T, size_t... I>
std::array<void (*)(NormParams<T>, UpHalf<T>), sizeof...(I)> GatedNormKernelTable(
    std::index_sequence<I...>) {
  return {&GatedNormGemvKernel<T, static_cast<int>(I) + 1>...};
}

// The norm kernels may use dynamic shared memory beyond 48 KiB (kMaxNormSharedBytes): set once.
template <typename Kernel, size_t N>
cudaError_t OptInSharedMemory(const std::array<Kernel, N>& kernels) {
  for (auto* k : kernels) {
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kMaxNormSharedBytes));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <typename T, size_t... I>
std::array<void (*)(NormParams<T>), sizeof...(I)> NormMmaKernelTable(std::index_sequence<I...>) {
  return {&NormMmaGemvKernel<T, static_cast<int>(I) + 1>...};
}

// Whether the tensor-core path takes the problem: 2..8 rows of a 2-byte float, w and x rows
// 16-byte aligned, k whole 16-byte vectors, and not turned off (GemvArgs::tensor_cores).
template <typename T>
bool UseMma(const GemvArgs& a, const Params<T>& p) {
  static_assert(sizeof(T) == 2, "the tensor-core path takes float16 and bfloat16");
  return a.tensor_cores && a.m >= 2 && p.vec_w && p.vec_x && a.k % kVec<T> == 0;
}

// Splits of a tile's chunks over a cluster: doubled (up to 8, on sm_90) while the tile's chunks
// outnumber what the CTAs' warps take in one round and the grid is under 4 CTAs per SM.
int MmaSplits(int64_t tiles, int64_t k, int sm_count, int major) {
  if (major < 9) return 1;
  const int64_t chunks = (k + kMmaChunk - 1) / kMmaChunk;
  int splits = 1;
  while (splits < kMmaMaxSplits && int64_t{splits} * kWarps * kMmaUnroll < chunks &&
         tiles * splits < int64_t{4} * std::max(sm_count, 1)) {
    splits *= 2;
  }
  return splits;
}

// The device's compute capability major (0 and the error when it cannot be read).
cudaError_t DeviceMajor(int* major) {
  int device = 0;
  *major = 0;
  const cudaError_t e = cudaGetDevice(&device);
  return e != cudaSuccess
             ? e
             : cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device);
}

// Launches a tensor-core GEMV kernel on grid (grid_x, splits), as clusters (1, splits) when
// splits > 1, and as a programmatic dependent launch when `dependent`.
template <typename... Params, typename... Args>
cudaError_t LaunchSplit(bool dependent, void (*kernel)(Params...), int64_t grid_x, int splits,
                        size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attrs[2] = {};
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(grid_x), splits);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  if (dependent) {
    attrs[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[config.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (splits > 1) {
    attrs[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attrs[config.numAttrs].val.clusterDim.x = 1;
    attrs[config.numAttrs].val.clusterDim.y = splits;
    attrs[config.numAttrs++].val.clusterDim.z = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// A tensor-core kernel of MmaGemvKernel's grid (a CTA, or a cluster of splits, per tile) taking
// `params`, the row count and any `extra` arguments (a gated product's up half).
template <typename P, typename... Extra>
cudaError_t LaunchMmaTiles(const GemvArgs& a, void (*kernel)(P, int, Extra...), const P& params,
                           cudaStream_t stream, const Extra&... extra) {
  const int64_t tiles = (a.n + kMmaTile - 1) / kMmaTile;
  if (tiles > kMaxGrid) return cudaErrorInvalidValue;
  int major = 0;
  if (const cudaError_t e = DeviceMajor(&major); e != cudaSuccess) return e;
  return LaunchSplit(a.dependent_launch, kernel, tiles, MmaSplits(tiles, a.k, a.sm_count, major), 0,
                     stream, params, static_cast<int>(a.m), extra...);
}

template <typename T>
cudaError_t LaunchMma(const GemvArgs& a, const Params<T>& p, cudaStream_t stream) {
  return LaunchMmaTiles(a, &MmaGemvKernel<T>, p, stream);
}

// The GEMV's parameters for a norm of x's rows (np.vec: 16-byte loads of x, the norm's weight
// and bias).
template <typename T>
NormParams<T> MakeNormParams(const GemvArgs& a, const Params<T>& p) {
  const bool vec = p.vec_x && a.k % kVec<T> == 0 && RowsAligned16(a.norm_weight, 0, 1, 0) &&
                   RowsAligned16(a.norm_bias, 0, 1, 0);
  return {
      p,          a.norm, static_cast<const T*>(a.norm_weight), static_cast<const T*>(a.norm_bias),
      a.norm_eps, vec};
}

// Whether one row of a 2-byte float folds its norm into the column sums (FoldedNormGemvKernel).
template <typename T>
bool FoldsNorm(const GemvArgs& a, const NormParams<T>& np) {
  return !std::is_same_v<T, float> && a.fold_norm && a.m == 1 && np.vec && np.gemv.vec_w;
}

// Whether 2..8 rows of bfloat16 on the tensor-core path fold their norm into it
// (FoldedRmsMmaGemvKernel, FoldedLayerMmaGemvKernel): γ and β 16-byte aligned.
template <typename T>
bool FoldsNormOnTensorCores(const GemvArgs& a, const NormParams<T>& np) {
  return a.fold_norm && np.vec;
}

// The gated product's up half (GemvArgs::w_up) as the kernels read it.
template <typename T>
UpHalf<T> UpHalfOf(const GemvArgs& a) {
  return {static_cast<const T*>(a.w_up), static_cast<const T*>(a.bias_up)};
}

template <typename T>
cudaError_t LaunchNormed(const GemvArgs& a, const Params<T>& p, int64_t tiles,
                         cudaStream_t stream) {
  static const auto kernels = NormKernelTable<T>(std::make_index_sequence<kGemvMaxRows>());
  static const auto gated = GatedNormKernelTable<T>(std::make_index_sequence<kGemvMaxRows>());
  const bool gate = a.w_up != nullptr;
  const size_t smem = static_cast<size_t>(a.m * a.k) * sizeof(T);
  if (smem > kMaxNormSharedBytes) return cudaErrorInvalidValue;
  static const cudaError_t opted_in = OptInSharedMemory(kernels);
  if (opted_in != cudaSuccess) return opted_in;
  // Each CTA normalises its x rows once: fewer CTAs, each over several column tiles, pay for it
  // fewer times.
  const int64_t ctas = int64_t{std::max(a.sm_count, 1)} * kNormCtasPerSm;
  const auto grid = static_cast<unsigned>(std::min(tiles, ctas));
  const NormParams<T> np = MakeNormParams<T>(a, p);
  if constexpr (!std::is_same_v<T, float>) {
    if (FoldsNorm<T>(a, np)) {
      const dim3 plain_grid(static_cast<unsigned>(std::min(tiles, kMaxGrid)));
      const bool rms = FoldsRmsForm(np);
      if (gate) {
        return LaunchMaybeDependent(
            a.dependent_launch,
            rms ? &GatedFoldedNormGemvKernel<T, true> : &GatedFoldedNormGemvKernel<T, false>,
            plain_grid, dim3(kThreads), 0, stream, np, UpHalfOf<T>(a));
      }
      return LaunchMaybeDependent(
          a.dependent_launch,
          rms ? &FoldedNormGemvKernel<T, true> : &FoldedNormGemvKernel<T, false>, plain_grid,
          dim3(kThreads), 0, stream, np);
    }
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      if (UseMma<T>(a, p) && FoldsNormOnTensorCores(a, np)) {
        if (!gate) {
          return LaunchMmaTiles(
              a,
              a.norm == GemvNorm::kRms ? &FoldedRmsMmaGemvKernel<T> : &FoldedLayerMmaGemvKernel<T>,
              np, stream);
        }
        if (a.norm == GemvNorm::kRms) {
          return LaunchMmaTiles(a, &GatedFoldedRmsMmaGemvKernel<T>, np, stream, UpHalfOf<T>(a));
        }
      }
    }
    if (!gate && UseMma<T>(a, p)) {
      static const auto mma = NormMmaKernelTable<T>(std::make_index_sequence<kGemvMaxRows>());
      static const cudaError_t mma_opted_in = OptInSharedMemory(mma);
      if (mma_opted_in != cudaSuccess) return mma_opted_in;
      const int64_t mma_tiles = (a.n + kMmaTile - 1) / kMmaTile;
      int major = 0;
      if (const cudaError_t e = DeviceMajor(&major); e != cudaSuccess) return e;
      const int splits = MmaSplits(mma_tiles, a.k, a.sm_count, major);
      return LaunchSplit(a.dependent_launch, mma[a.m - 1],
                         std::max<int64_t>(1, std::min(mma_tiles, ctas / splits)), splits, smem,
                         stream, np);
    }
  }
  if (gate) {
    static const cudaError_t gated_opted_in = OptInSharedMemory(gated);
    if (gated_opted_in != cudaSuccess) return gated_opted_in;
    return LaunchMaybeDependent(a.dependent_launch, gated[a.m - 1], dim3(grid), dim3(kThreads),
                                smem, stream, np, UpHalfOf<T>(a));
  }
  return LaunchMaybeDependent(a.dependent_launch, kernels[a.m - 1], dim3(grid), dim3(kThreads),
                              smem, stream, np);
}

template <typename T>
Params<T> MakeParams(const GemvArgs& a) {
  return {static_cast<const T*>(a.x),
          a.ldx,
          static_cast<const T*>(a.w),
          a.ldw,
          static_cast<const T*>(a.bias),
          a.bias_stride,
          static_cast<T*>(a.out),
          static_cast<const T*>(a.residual),
          a.n,
          a.k,
          WarpsPerColumn(a.n, a.k, a.sm_count, kVec<T>),
          RowsAligned16(a.w, a.ldw, a.n, sizeof(T)) &&
              (a.w_up == nullptr || RowsAligned16(a.w_up, a.ldw, a.n, sizeof(T))),
          RowsAligned16(a.x, a.ldx, a.m, sizeof(T)),
          a.act,
          a.preload_weights};
}

// Column tiles of `p`: kWarps / wpc columns each.
template <typename T>
int64_t ColumnTileCount(const Params<T>& p) {
  const int cols = kWarps / p.wpc;
  return (p.n + cols - 1) / cols;
}

template <typename T>
cudaError_t Launch(const GemvArgs& a, cudaStream_t stream) {
  static const auto kernels = KernelTable<T>(std::make_index_sequence<kGemvMaxRows>());
  const Params<T> p = MakeParams<T>(a);
  const int64_t tiles = ColumnTileCount(p);
  if (a.norm != GemvNorm::kNone) return LaunchNormed<T>(a, p, tiles, stream);
  const auto grid = static_cast<unsigned>(std::min(tiles, kMaxGrid));
  if (a.w_up != nullptr) {
    static const auto gated = GatedKernelTable<T>(std::make_index_sequence<kGemvMaxRows>());
    return LaunchMaybeDependent(a.dependent_launch, gated[a.m - 1], dim3(grid), dim3(kThreads), 0,
                                stream, p, UpHalfOf<T>(a));
  }
  if constexpr (!std::is_same_v<T, float>) {
    if (UseMma<T>(a, p)) return LaunchMma<T>(a, p, stream);
  }
  return LaunchMaybeDependent(a.dependent_launch, kernels[a.m - 1], dim3(grid), dim3(kThreads), 0,
                              stream, p);
}

// The chain kernel's CTAs: as many as the largest step has column tiles, at most what the
// device holds at once (a cooperative launch: every CTA must be resident for the barriers).
template <typename T>
cudaError_t ChainGrid(int64_t max_tiles, int sm_count, unsigned* grid) {
  // One kernel, one block size: the occupancy is the same every call on one device (queried per
  // device: a process may drive GPUs of different kinds).
  constexpr int kDevices = 64;
  static std::atomic<int> per_device[kDevices] = {};  // 0: not queried yet
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  int per_sm = device < kDevices ? per_device[device].load(std::memory_order_relaxed) : 0;
  if (per_sm == 0) {
    const cudaError_t queried =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, GemvChainKernel<T>, kThreads, 0);
    if (queried != cudaSuccess) return queried;
    if (device < kDevices) per_device[device].store(per_sm, std::memory_order_relaxed);
  }
  if (per_sm < 1) return cudaErrorInvalidConfiguration;
  *grid = static_cast<unsigned>(std::min(max_tiles, int64_t{per_sm} * std::max(sm_count, 1)));
  return cudaSuccess;
}

// Byte ranges a one-row GEMV reads and writes, for the chain's barriers.
struct ByteRange {
  uintptr_t begin = 0, end = 0;
  bool Overlaps(const ByteRange& o) const { return begin < o.end && o.begin < end; }
};

ByteRange RangeOf(const void* p, int64_t elements, size_t elem_size) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  return {begin, p == nullptr ? begin : begin + static_cast<uintptr_t>(elements) * elem_size};
}

struct Footprint {
  ByteRange out;
  std::array<ByteRange, 6> reads;  // x, w, bias, residual, norm weight, norm bias
};

// What op (one row, non-negative strides as linear gives them) touches.
Footprint FootprintOf(const GemvArgs& a, size_t es) {
  return {RangeOf(a.out, a.n, es),
          {RangeOf(a.x, a.k, es), RangeOf(a.w, (a.n - 1) * a.ldw + a.k, es),
           RangeOf(a.bias, (a.n - 1) * a.bias_stride + 1, es), RangeOf(a.residual, a.n, es),
           RangeOf(a.norm_weight, a.k, es), RangeOf(a.norm_bias, a.k, es)}};
}

// Whether `later` must wait for `earlier`: it reads what earlier writes, or writes what earlier
// reads or writes.
bool Conflicts(const Footprint& earlier, const Footprint& later) {
  if (later.out.Overlaps(earlier.out)) return true;
  for (const ByteRange& r : later.reads) {
    if (r.Overlaps(earlier.out)) return true;
  }
  for (const ByteRange& r : earlier.reads) {
    if (r.Overlaps(later.out)) return true;
  }
  return false;
}

template <typename T>
cudaError_t LaunchChain(const GemvArgs* ops, int count, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    return cudaErrorInvalidValue;  // GemvChainTakes refuses float32
  } else {
    ChainParams<T> c{};
    c.count = count;
    int64_t max_tiles = 1, bytes = 0;
    bool prefetching = true;
    for (int i = 0; i < count; ++i) {
      const Params<T> p = MakeParams<T>(ops[i]);
      c.steps[i].np = ops[i].norm == GemvNorm::kNone
                          ? NormParams<T>{p, GemvNorm::kNone, nullptr, nullptr, 0.f, false}
                          : MakeNormParams<T>(ops[i], p);
      max_tiles = std::max(max_tiles, ColumnTileCount(p));
      bytes += ops[i].n * ops[i].k * static_cast<int64_t>(sizeof(T));
      prefetching = prefetching && bytes <= kChainPrefetchBytes;
      if (prefetching) c.prefetched = i + 1;
    }
    GemvChainBarriers(ops, count, c.barrier_before);
    unsigned grid = 0;
    if (const cudaError_t e = ChainGrid<T>(max_tiles, ops[0].sm_count, &grid); e != cudaSuccess) {
      return e;
    }
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(kThreads);
    config.stream = stream;
    config.attrs = &attr;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, GemvChainKernel<T>, c);
  }
}

// Sizes and pointers inside the GEMV's contract (gemv_kernels.h Gemv).
bool ValidGemv(const GemvArgs& a) {
  return a.m >= 1 && a.m <= kGemvMaxRows && a.n >= 1 && a.k >= 1 && a.x != nullptr &&
         a.w != nullptr && a.out != nullptr &&
         (a.norm_bias == nullptr || a.norm == GemvNorm::kLayer) &&
         (a.w_up == nullptr
              ? a.bias_up == nullptr
              : a.residual == nullptr && (a.bias == nullptr) == (a.bias_up == nullptr));
}

template <typename T>
bool ChainTakes(const GemvArgs& a) {
  if (a.m != 1 || a.w_up != nullptr) return false;
  if (a.norm == GemvNorm::kNone) return true;
  const Params<T> p = MakeParams<T>(a);
  return FoldsNorm<T>(a, MakeNormParams<T>(a, p));
}

}  // namespace

void GemvChainBarriers(const GemvArgs* ops, int count, bool* barrier_before) {
  const size_t es = count > 0 && ops[0].type == ElemType::kF32 ? 4 : 2;  // the chain's one dtype
  std::array<Footprint, kGemvChainMaxOps> fp;
  int phase_start = 0;
  for (int i = 0; i < count && i < kGemvChainMaxOps; ++i) {
    fp[i] = FootprintOf(ops[i], es);
    barrier_before[i] = false;
    for (int j = phase_start; j < i && !barrier_before[i]; ++j) {
      barrier_before[i] = Conflicts(fp[j], fp[i]);
    }
    if (barrier_before[i]) phase_start = i;
  }
  for (int i = kGemvChainMaxOps; i < count; ++i) barrier_before[i] = true;  // no chain takes them
}

bool GemvChainTakes(const GemvArgs& a) {
  if (!ValidGemv(a)) return false;
  switch (a.type) {
    case ElemType::kF16:
      return ChainTakes<__half>(a);
    case ElemType::kBF16:
      return ChainTakes<__nv_bfloat16>(a);
    default:
      return false;
  }
}

cudaError_t GemvChain(const GemvArgs* ops, int count, cudaStream_t stream, int* launches) {
  int unused = 0;
  int& launched = launches != nullptr ? *launches : unused;
  launched = 1;
  if (count < 1 || count > kGemvChainMaxOps) return cudaErrorInvalidValue;
  for (int i = 0; i < count; ++i) {
    if (!GemvChainTakes(ops[i]) || ops[i].type != ops[0].type) return cudaErrorInvalidValue;
  }
  if (count == 1) return Gemv(ops[0], stream);
  const cudaError_t chained = ops[0].type == ElemType::kF16
                                  ? LaunchChain<__half>(ops, count, stream)
                                  : LaunchChain<__nv_bfloat16>(ops, count, stream);
  if (chained == cudaSuccess) return chained;
  // A cooperative launch the device refuses (fewer SMs than reported under MPS or a green
  // context, no cooperative support): the same GEMVs, one launch each. Configuration errors are
  // not sticky: clear the one recorded.
  if (chained != cudaErrorCooperativeLaunchTooLarge && chained != cudaErrorNotSupported &&
      chained != cudaErrorInvalidConfiguration) {
    return chained;
  }
  (void)cudaGetLastError();
  launched = count;
  for (int i = 0; i < count; ++i) {
    if (const cudaError_t e = Gemv(ops[i], stream); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t Gemv(const GemvArgs& a, cudaStream_t stream) {
  if (!ValidGemv(a)) return cudaErrorInvalidValue;
  switch (a.type) {
    case ElemType::kF32:
      return Launch<float>(a, stream);
    case ElemType::kF16:
      return Launch<__half>(a, stream);
    case ElemType::kBF16:
      return Launch<__nv_bfloat16>(a, stream);
    default:
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t DeviceDelay(int64_t ns, cudaStream_t stream) {
  DelayKernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
}

cudaError_t FillAfterDelay(uint16_t* p, int64_t count, uint16_t value, int64_t ns,
                           cudaStream_t stream) {
  FillAfterDelayKernel<<<1, 256, 0, stream>>>(p, count, value, ns);
  return cudaGetLastError();
}

}  // namespace kiln::cuda_kernels
