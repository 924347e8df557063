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
// template flag of the loads.
//
// Indexing is int64 throughout (a w of n·k > 2^31 elements is the LM head of a large vocabulary);
// CTAs stride over column tiles, so the grid stays within limits for any n.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
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

// Elements [v·kVec, (v + 1)·kVec) of x row `row` as floats, or zeros when `valid` is false.
// kShared: `row` is in shared memory (the normalised rows), which takes a plain load.
template <typename T, bool kVecX, bool kShared = false>
__device__ __forceinline__ void LoadX(const T* row, int64_t v, bool valid, float (&f)[kVec<T>]) {
  if constexpr (kVecX) {
    if constexpr (kShared) {
      Unpack<T>(valid ? reinterpret_cast<const uint4*>(row)[v] : make_uint4(0, 0, 0, 0), f);
    } else {
      Unpack<T>(valid ? __ldg(reinterpret_cast<const uint4*>(row) + v) : make_uint4(0, 0, 0, 0), f);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kVec<T>; ++i) f[i] = valid ? ToFloat(row[v * kVec<T> + i]) : 0.f;
  }
}

// acc[r] += w[i]·x[r, i] over this thread's 16-byte vectors of the row: t, t + stride, ... below
// k / kVec. `w` is 16-byte aligned, and so is every x row when kVecX. Straight-line code per
// kUnroll vectors: the w loads are all issued first, then per x row its loads, then the FMAs;
// vectors past the end count as zeros (both operands: a NaN in x must not meet a padding 0).
template <typename T, int M, bool kVecX, bool kSharedX>
__device__ __forceinline__ void DotVectors(const Params<T>& p, const T* w, int t, int stride,
                                           float (&acc)[M]) {
  constexpr int V = kVec<T>;
  const int64_t nvec = p.k / V;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  for (int64_t v0 = t; v0 < nvec; v0 += int64_t{kUnroll} * stride) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + int64_t{u} * stride;
      raw[u] = v < nvec ? __ldcs(wv + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int r = 0; r < M; ++r) {
      float xf[kUnroll][V];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = v0 + int64_t{u} * stride;
        LoadX<T, kVecX, kSharedX>(p.x + r * p.ldx, v, v < nvec, xf[u]);
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
}

// acc[r] += w[i]·x[r, i] for this thread's elements begin + t, begin + t + stride, ... below k.
template <typename T, int M>
__device__ __forceinline__ void DotElements(const Params<T>& p, const T* w, int64_t begin, int t,
                                            int stride, float (&acc)[M]) {
#pragma unroll 4
  for (int64_t i = begin + t; i < p.k; i += stride) {
    const float wf = ToFloat(w[i]);
#pragma unroll
    for (int r = 0; r < M; ++r) acc[r] = fmaf(wf, ToFloat(p.x[r * p.ldx + i]), acc[r]);
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

// out[r, col] = act(acc[r] + bias[col]) (+ residual[r, col]) for every row, lane r storing row r.
template <typename T, int M>
__device__ __forceinline__ void Store(const Params<T>& p, int64_t col, int lane,
                                      const float (&acc)[M]) {
  const bool has_bias = p.bias != nullptr;
  const float b = has_bias ? ToFloat(p.bias[col * p.bias_stride]) : 0.f;
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (lane == r) {
      float v = Activate(has_bias ? acc[r] + b : acc[r], p.act);
      if (p.residual != nullptr) v += ToFloat(p.residual[r * p.n + col]);
      p.out[r * p.n + col] = FromFloat<T>(v);
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

// The CTA's column tiles: dot products over p.x (in shared memory when kSharedX), bias,
// activation, residual and store.
template <typename T, int M, bool kSharedX>
__device__ __forceinline__ void ColumnTiles(const Params<T>& p, float (&partial)[kWarps][M]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cols = kWarps / p.wpc;  // columns per CTA
  const int part = warp % p.wpc;    // this warp's share of the column's k
  const int t = part * 32 + lane, stride = p.wpc * 32;
  const int64_t tiles = (p.n + cols - 1) / cols;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // uniform over the CTA
    const int64_t col = tile * cols + warp / p.wpc;
    float acc[M];
#pragma unroll
    for (int r = 0; r < M; ++r) acc[r] = 0.f;
    if (col < p.n) {  // uniform over the warp: every lane reaches the shuffles below
      const T* w = p.w + col * p.ldw;
      int64_t begin = 0;
      if (p.vec_w) {
        if (p.vec_x) {
          DotVectors<T, M, true, kSharedX>(p, w, t, stride, acc);
        } else {
          DotVectors<T, M, false, kSharedX>(p, w, t, stride, acc);
        }
        begin = p.k - p.k % kVec<T>;
      }
      DotElements<T, M>(p, w, begin, t, stride, acc);
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
      __syncthreads();  // `partial` is written again for the next tile
    }
    if (col < p.n && part == 0) Store<T, M>(p, col, lane, acc);
  }
}

// The first column tile's weight rows into L2 (every warp its own), before the dependency wait.
template <typename T>
__device__ __forceinline__ void PrefetchFirstTile(const Params<T>& p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cols = kWarps / p.wpc;
  PrefetchRow(p, int64_t{blockIdx.x} * cols + warp / p.wpc, (warp % p.wpc) * 32 + lane, p.wpc * 32);
}

template <typename T, int M>
__global__ void __launch_bounds__(kThreads) GemvKernel(Params<T> p) {
  __shared__ float partial[kWarps][M];
  PrefetchFirstTile(p);
  GridDependencySync();  // x, residual and out may be earlier kernels' buffers
  ColumnTiles<T, M, false>(p, partial);
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

// The GEMV of the normalised x rows: statistics and the normalised rows in shared memory once per
// CTA (m·k elements of dynamic shared memory), then the plain kernel's column loop over them.
template <typename T, int M>
__global__ void __launch_bounds__(kThreads, 1) NormGemvKernel(NormParams<T> np) {
  __shared__ float partial[kWarps][M];
  __shared__ RowNorm norms[M];
  extern __shared__ uint4 normed_words[];
  PrefetchFirstTile(np.gemv);
  GridDependencySync();  // x, residual and out may be earlier kernels' buffers
  ComputeRowNorms<T, M>(np, norms);
  T* normed = reinterpret_cast<T*>(normed_words);
  NormalizeRows<T, M>(np, norms, normed);
  Params<T> p = np.gemv;
  p.x = normed;
  p.ldx = p.k;
  p.vec_x = p.k % kVec<T> == 0;  // rows of whole vectors stay 16-byte aligned
  ColumnTiles<T, M, true>(p, partial);
}

// Waits on the device until `ns` nanoseconds have passed since it started.
__global__ void DelayKernel(int64_t ns) {
  auto now = [] {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  };
  const uint64_t start = now();
  while (now() - start < static_cast<uint64_t>(ns)) __nanosleep(1000);
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
std::array<void (*)(NormParams<T>), sizeof...(I)> NormKernelTable(std::index_sequence<I...>) {
  return {&NormGemvKernel<T, static_cast<int>(I) + 1>...};
}

// The norm kernels may use dynamic shared memory beyond 48 KiB (kMaxNormSharedBytes): set once.
template <typename T, size_t N>
cudaError_t OptInSharedMemory(const std::array<void (*)(NormParams<T>), N>& kernels) {
  for (auto* k : kernels) {
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kMaxNormSharedBytes));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t LaunchNormed(const GemvArgs& a, const Params<T>& p, int64_t tiles,
                         cudaStream_t stream) {
  static const auto kernels = NormKernelTable<T>(std::make_index_sequence<kGemvMaxRows>());
  const size_t smem = static_cast<size_t>(a.m * a.k) * sizeof(T);
  if (smem > kMaxNormSharedBytes) return cudaErrorInvalidValue;
  static const cudaError_t opted_in = OptInSharedMemory<T>(kernels);
  if (opted_in != cudaSuccess) return opted_in;
  // Each CTA normalises its x rows once: fewer CTAs, each over several column tiles, pay for it
  // fewer times.
  const int64_t ctas = int64_t{std::max(a.sm_count, 1)} * kNormCtasPerSm;
  const auto grid = static_cast<unsigned>(std::min(tiles, ctas));
  const bool vec = p.vec_x && a.k % kVec<T> == 0 && RowsAligned16(a.norm_weight, 0, 1, 0) &&
                   RowsAligned16(a.norm_bias, 0, 1, 0);
  const NormParams<T> np{
      p,          a.norm, static_cast<const T*>(a.norm_weight), static_cast<const T*>(a.norm_bias),
      a.norm_eps, vec};
  return LaunchMaybeDependent(a.dependent_launch, kernels[a.m - 1], dim3(grid), dim3(kThreads),
                              smem, stream, np);
}

template <typename T>
cudaError_t Launch(const GemvArgs& a, cudaStream_t stream) {
  static const auto kernels = KernelTable<T>(std::make_index_sequence<kGemvMaxRows>());
  const Params<T> p{static_cast<const T*>(a.x),
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
                    RowsAligned16(a.w, a.ldw, a.n, sizeof(T)),
                    RowsAligned16(a.x, a.ldx, a.m, sizeof(T)),
                    a.act};
  const int cols = kWarps / p.wpc;
  const int64_t tiles = (a.n + cols - 1) / cols;
  if (a.norm != GemvNorm::kNone) return LaunchNormed<T>(a, p, tiles, stream);
  const auto grid = static_cast<unsigned>(std::min(tiles, kMaxGrid));
  return LaunchMaybeDependent(a.dependent_launch, kernels[a.m - 1], dim3(grid), dim3(kThreads), 0,
                              stream, p);
}

}  // namespace

cudaError_t Gemv(const GemvArgs& a, cudaStream_t stream) {
  if (a.m < 1 || a.m > kGemvMaxRows || a.n < 1 || a.k < 1 || a.x == nullptr || a.w == nullptr ||
      a.out == nullptr || (a.norm_bias != nullptr && a.norm != GemvNorm::kLayer)) {
    return cudaErrorInvalidValue;
  }
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

}  // namespace kiln::cuda_kernels
