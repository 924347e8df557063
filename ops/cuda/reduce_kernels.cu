// CUDA kernels and launchers for row reductions and normalisations (see reduce_kernels.h).
//
// Row kernels (the norms) load a whole row into registers, reduce across the threads that
// share it and write it back, so each element is read once and written once. A row of up to
// 1024 elements belongs to one warp (or to part of one when short); a longer one to one block of
// up to 512 threads (512 threads of up to 128 registers fill an SM's register file). When the row
// length and the pointers allow it, loads and stores move 16 bytes at a time. A thread keeps at
// most 32 values (16 when unvectorised), so rows of up to 16384 elements (8192 unvectorised) stay
// in registers; longer rows take a block-per-row loop kernel that reads the row three times (mostly
// from L2).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "float_convert.cuh"  // not "ops/cuda/...": this file also builds with plain nvcc -c
#include "grid_dependency.cuh"
#include "reduce_kernels.h"

namespace kiln::cuda_kernels {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 4;        // rows per block of the warp-per-row kernels
constexpr int kMaxBlockThreads = 512;    // threads of the block-per-row kernels, at most
constexpr int kLoopThreads = 1024;       // threads of the loop kernels
constexpr int kMaxPerThread = 32;        // row values a thread keeps in registers, at most
constexpr int64_t kWarpRowMax = 1024;    // longest row handled by one warp
constexpr int64_t kMaxBlocks = 1 << 20;  // grids stop here; kernels loop over the rest

// ---- Element conversions and vectors ------------------------------------------------------

// ToFloat / FromFloat: ops/cuda/float_convert.cuh.

// The accumulator value of an input element, and the output element of an accumulator.
template <typename A, typename T>
__device__ __forceinline__ A ToAcc(T v) {
  if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, A>) {
    return v;
  } else {
    return static_cast<A>(ToFloat(v));
  }
}
template <typename T, typename A>
__device__ __forceinline__ T FromAcc(A v) {
  if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, A>) {
    return v;
  } else {
    return FromFloat<T>(static_cast<float>(v));
  }
}

// kN consecutive elements moved by one load or store (16 bytes on the vectorised paths).
template <typename T, int kN>
struct alignas(sizeof(T) * kN) Vec {
  T v[kN];
};

// ---- Reductions across threads ------------------------------------------------------------

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};

// Reduces over aligned groups of kLanes lanes of a warp (all 32 lanes must take part).
template <int kLanes = kWarpSize, typename T, typename Op>
__device__ __forceinline__ T WarpAllReduce(T v, Op op) {
#pragma unroll
  for (int mask = kLanes / 2; mask > 0; mask /= 2) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, mask));
  }
  return v;
}

// All threads of the block (blockDim.x a multiple of 32) get op over every thread's v.
template <typename T, typename Op>
__device__ T BlockAllReduce(T v, Op op, T identity) {
  __shared__ T partial[kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = WarpAllReduce(v, op);
  __syncthreads();  // a previous call may still be reading `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / kWarpSize) ? partial[lane] : identity;
  return WarpAllReduce(v, op);
}

// The threads that share a row: kLanes lanes of a warp (32 / kLanes rows per warp, blocks of
// kWarpsPerBlock warps) or a whole block (one row per block). Loops over rows run while
// More(row, rows) holds, which is the same for all threads that reduce together; a thread whose
// own row is past the end takes part with an empty row.
template <int kLanes>
struct WarpGroup {
  static constexpr int kMaxThreads = kWarpSize * kWarpsPerBlock;
  __device__ int rank() const { return threadIdx.x % kLanes; }
  __device__ int size() const { return kLanes; }
  __device__ int64_t first_row() const {
    return (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kLanes;
  }
  __device__ int64_t row_step() const { return int64_t{gridDim.x} * blockDim.x / kLanes; }
  __device__ bool More(int64_t row, int64_t rows) const {
    return kLanes == kWarpSize ? row < rows : __any_sync(0xffffffffu, row < rows);
  }
  template <typename T, typename Op>
  __device__ T AllReduce(T v, Op op, T /*identity*/) const {
    return WarpAllReduce<kLanes>(v, op);
  }
};
struct BlockGroup {
  static constexpr int kMaxThreads = kMaxBlockThreads;
  __device__ int rank() const { return threadIdx.x; }
  __device__ int size() const { return blockDim.x; }
  __device__ int64_t first_row() const { return blockIdx.x; }
  __device__ int64_t row_step() const { return gridDim.x; }
  __device__ bool More(int64_t row, int64_t rows) const { return row < rows; }
  template <typename T, typename Op>
  __device__ T AllReduce(T v, Op op, T identity) const {
    return BlockAllReduce(v, op, identity);
  }
};

// Which vectors of its row a thread holds: vector `it * size + rank` in slot `it`.
struct RowPos {
  int rank, size;
  int64_t vecs;  // vectors in the row
  __device__ int Index(int it) const { return it * size + rank; }
  __device__ bool Valid(int it) const { return Index(it) < vecs; }
};

// ---- Row kernels (the row in registers) ---------------------------------------------------

// The row mean is summed in double and kept as hi + lo floats, so that x - mean keeps its
// relative precision when x is close to the mean (float32 sums alone miss 1e-5 there).
struct Mean {
  float hi = 0.f, lo = 0.f;
  __device__ explicit Mean(double m) : hi(static_cast<float>(m)), lo(static_cast<float>(m - hi)) {}
  __device__ float Deviation(float x) const { return (x - hi) - lo; }
};

// W: the element type of weight and bias (T or float).
template <typename T, typename W>
struct NormOp {
  const W* weight;  // [n] or null
  const W* bias;    // [n] or null
  float eps;
  bool rms;

  static __device__ float Pad() { return 0.f; }

  template <int kVec, int kIters, typename G>
  __device__ void Apply(float (&v)[kIters][kVec], const RowPos& p, const G& g, int64_t n) const {
    PrefetchParams<kVec, kIters>(p);
    double s = 0;
    if (!rms) {
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) s += v[it][j];
      }
      s = g.AllReduce(s, SumOp{}, 0.0);
    }
    const Mean mean(s / static_cast<double>(n));
    float sq = 0.f;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float d = mean.Deviation(v[it][j]);
        sq += p.Valid(it) ? d * d : 0.f;
      }
    }
    sq = g.AllReduce(sq, SumOp{}, 0.f);
    const float inv = 1.f / sqrtf(sq / static_cast<float>(n) + eps);
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      if (p.Valid(it)) Affine(v[it], p.Index(it), mean, inv);
    }
  }

  // Pulls this thread's weight and bias vectors into L1 beside x's loads, so that the affine step
  // after the two reductions reads them there instead of making a round trip to L2 of its own
  // (a few-row norm, 24 of them in a batch-8 GPT-2 decode step, is one latency chain). A hint,
  // issued after the kernel's dependency wait: the lines it brings are current. (Loading them
  // into registers instead cost up to 40 more registers a thread.)
  template <int kVec, int kIters>
  __device__ void PrefetchParams(const RowPos& p) const {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      if (!p.Valid(it)) continue;
      if (weight != nullptr) PrefetchL1(weight + int64_t{p.Index(it)} * kVec);
      if (bias != nullptr) PrefetchL1(bias + int64_t{p.Index(it)} * kVec);
    }
  }
  static __device__ void PrefetchL1(const W* at) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(at));
  }

  template <int kVec>
  __device__ void Affine(float (&v)[kVec], int64_t vec, const Mean& mean, float inv) const {
    Vec<W, kVec> w, b;
    if (weight != nullptr) w = reinterpret_cast<const Vec<W, kVec>*>(weight)[vec];
    if (bias != nullptr) b = reinterpret_cast<const Vec<W, kVec>*>(bias)[vec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float r = mean.Deviation(v[j]) * inv;
      if (weight != nullptr) r *= ToFloat(w.v[j]);
      if (bias != nullptr) r += ToFloat(b.v[j]);
      v[j] = r;
    }
  }
};

// Reads a thread's slots of its row as floats (Op::Pad() where the row has none). With more than
// four loads a thread, all are issued before any is used so that they are in flight together
// (else the compiler may wait for each in turn: 4x slower with 32 scalar loads); with fewer, the
// fused form needs fewer registers, which was faster on an H200 (bf16, 8 x 4 values a lane).
template <typename Op, typename T, int kVec, int kIters>
__device__ __forceinline__ void LoadRow(const Vec<T, kVec>* src, const RowPos& p,
                                        float (&v)[kIters][kVec]) {
  if constexpr (kIters > 4) {
    Vec<T, kVec> in[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      if (p.Valid(it)) in[it] = src[p.Index(it)];
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[it][j] = p.Valid(it) ? ToFloat(in[it].v[j]) : Op::Pad();
    }
  } else {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      Vec<T, kVec> in;
      if (p.Valid(it)) in = src[p.Index(it)];
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[it][j] = p.Valid(it) ? ToFloat(in.v[j]) : Op::Pad();
    }
  }
}

// Rows of n = vecs * kVec elements; thread slot `it` holds vector RowPos::Index(it) of its row.
template <typename T, int kVec, int kIters, typename G, typename Op>
__global__ void __launch_bounds__(G::kMaxThreads)
    RowKernel(const T* x, T* y, int64_t rows, int64_t n, Op op) {
  using V = Vec<T, kVec>;
  const G g;
  GridDependencySync();
  for (int64_t row = g.first_row(); g.More(row, rows); row += g.row_step()) {
    const RowPos p{g.rank(), g.size(), row < rows ? n / kVec : 0};
    const V* src = reinterpret_cast<const V*>(x + row * n);
    float v[kIters][kVec];
    LoadRow<Op>(src, p, v);
    op.Apply(v, p, g, n);
    V* dst = reinterpret_cast<V*>(y + row * n);
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      if (!p.Valid(it)) continue;
      V out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) out.v[j] = FromFloat<T>(v[it][j]);
      dst[p.Index(it)] = out;
    }
  }
}

// ---- Loop kernels (rows too long for registers: three passes, block per row) --------------

template <typename T, typename W>
__global__ void __launch_bounds__(kLoopThreads)
    NormLoopKernel(const T* x, T* y, int64_t rows, int64_t n, NormOp<T, W> op) {
  GridDependencySync();
  const BlockGroup g;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* src = x + row * n;
    T* dst = y + row * n;
    double s = 0;
    if (!op.rms) {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += ToFloat(src[i]);
      s = g.AllReduce(s, SumOp{}, 0.0);
    }
    const Mean mean(s / static_cast<double>(n));
    float sq = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float d = mean.Deviation(ToFloat(src[i]));
      sq += d * d;
    }
    sq = g.AllReduce(sq, SumOp{}, 0.f);
    const float inv = 1.f / sqrtf(sq / static_cast<float>(n) + op.eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float v[1] = {ToFloat(src[i])};
      op.template Affine<1>(v, i, mean, inv);
      dst[i] = FromFloat<T>(v[0]);
    }
  }
}

// ---- RowReduce ----------------------------------------------------------------------------

struct SumReduce {
  template <typename A>
  static __device__ A Identity() {
    return A{0};
  }
  template <typename A>
  __device__ A operator()(A a, A b) const {
    return a + b;
  }
  template <typename A>
  __device__ A Finalize(A acc, int64_t) const {
    return acc;
  }
};
struct MeanReduce : SumReduce {
  template <typename A>
  __device__ A Finalize(A acc, int64_t n) const {
    return acc / static_cast<A>(n);  // 0/0 = NaN for an empty row, like the CPU kernel
  }
};
struct ProdReduce {
  template <typename A>
  static __device__ A Identity() {
    return A{1};
  }
  template <typename A>
  __device__ A operator()(A a, A b) const {
    if constexpr (std::is_same_v<A, int64_t>) {  // wraps, as the CPU kernel's
      return static_cast<int64_t>(static_cast<unsigned long long>(a) *
                                  static_cast<unsigned long long>(b));
    } else {
      return a * b;
    }
  }
  template <typename A>
  __device__ A Finalize(A acc, int64_t) const {
    return acc;
  }
};
struct MaxReduce {  // NaN wins, like the CPU kernel
  template <typename A>
  static __device__ A Identity() {
    if constexpr (std::is_same_v<A, int64_t>) {
      return INT64_MIN;
    } else {
      return -INFINITY;
    }
  }
  template <typename A>
  __device__ A operator()(A a, A b) const {
    if constexpr (std::is_same_v<A, int64_t>) {
      return b > a ? b : a;
    } else {
      return (isnan(b) || b > a) ? b : a;
    }
  }
  template <typename A>
  __device__ A Finalize(A acc, int64_t) const {
    return acc;
  }
};

// y[r] = op over chunk r % chunks of row r / chunks of the [rows / chunks, inner] x, where chunk
// c covers elements [c * chunk, min((c + 1) * chunk, inner)); chunk == inner: whole rows.
// Finalize divides by `count` (mean).
template <typename T, typename A, typename TOut, int kVec, typename G, typename Op>
__global__ void __launch_bounds__(G::kMaxThreads)
    ReduceKernel(const T* x, TOut* y, int64_t rows, int64_t inner, int64_t chunk, int64_t count,
                 Op op) {
  using V = Vec<T, kVec>;
  const G g;
  const int64_t chunks = chunk > 0 ? (inner + chunk - 1) / chunk : 1;
  for (int64_t row = g.first_row(); row < rows; row += g.row_step()) {
    const int64_t begin = row % chunks * chunk, vecs = min(chunk, inner - begin) / kVec;
    const V* src = reinterpret_cast<const V*>(x + row / chunks * inner + begin);
    A acc = Op::template Identity<A>();
#pragma unroll 4
    for (int64_t i = g.rank(); i < vecs; i += g.size()) {
      const V in = src[i];
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc = op(acc, ToAcc<A>(in.v[j]));
    }
    acc = g.AllReduce(acc, op, Op::template Identity<A>());
    if (g.rank() == 0) y[row] = FromAcc<TOut>(op.Finalize(acc, count));
  }
}

// ---- Triangular masks ---------------------------------------------------------------------

template <typename E>
__global__ void TriangularKernel(const E* x, E* y, int64_t total, int64_t rows, int64_t cols,
                                 int64_t diagonal, bool upper) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t col = i % cols, row = (i / cols) % rows;
    const bool keep = upper ? col - row >= diagonal : col - row <= diagonal;
    y[i] = keep ? x[i] : E{0};
  }
}

// ---- Host-side helpers --------------------------------------------------------------------

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int NextPow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

dim3 Grid(int64_t blocks) { return dim3(static_cast<unsigned>(std::min(blocks, kMaxBlocks))); }

bool Aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
bool Aligned16(const void* p) { return Aligned(p, 16); }

// Calls f(std::integral_constant<int, K>) for K == iters (a power of two with K * kVec within
// kMax), so every register array size is a compile-time constant.
template <int kVec, int kMax, int K = 1, typename F>
cudaError_t WithIters(int iters, F&& f) {
  if constexpr (K * kVec > kMax) {
    return cudaErrorInvalidValue;
  } else {
    if (iters == K) return f(std::integral_constant<int, K>{});
    return WithIters<kVec, kMax, K * 2>(iters, f);
  }
}

// Calls f(T{}) with the device type of a floating ElemType.
template <typename F>
cudaError_t WithFloatType(ElemType t, F&& f) {
  switch (t) {
    case ElemType::kF32:
      return f(float{});
    case ElemType::kF16:
      return f(__half{});
    case ElemType::kBF16:
      return f(__nv_bfloat16{});
    default:
      return cudaErrorInvalidValue;
  }
}

// Values a thread of the block-per-row RowKernel keeps: 32 spill registers when they are loaded
// one at a time.
constexpr int BlockMaxPerThread(int vec) { return vec == 1 ? kMaxPerThread / 2 : kMaxPerThread; }
constexpr int64_t RegisterRowMax(int vec) {
  return int64_t{kMaxBlockThreads} * BlockMaxPerThread(vec);
}

// Calls f(std::integral_constant<int, K>) for K == lanes, a power of two below the warp size.
template <int K = 1, typename F>
cudaError_t WithLanes(int lanes, F&& f) {
  if constexpr (K >= kWarpSize) {
    return cudaErrorInvalidValue;
  } else {
    if (lanes == K) return f(std::integral_constant<int, K>{});
    return WithLanes<K * 2>(lanes, f);
  }
}

// Launches RowKernel for rows of n <= RegisterRowMax(kVec) elements, moved kVec at a time: rows
// of up to 16 vectors take a power-of-two part of a warp, rows of up to 1024 elements a
// warp, longer ones the fewest threads (a multiple of 32) that hold them in registers.
template <typename T, int kVec, typename Op>
cudaError_t LaunchRows(const T* x, T* y, int64_t rows, int64_t n, const Op& op, cudaStream_t s,
                       bool dependent) {
  const int64_t vecs = n / kVec;
  if (vecs <= kWarpSize / 2) {
    const int lanes = NextPow2(vecs);  // < kWarpSize
    const dim3 grid = Grid(CeilDiv(rows, kWarpsPerBlock * (kWarpSize / lanes)));
    return WithLanes(lanes, [&](auto k) {
      using G = WarpGroup<decltype(k)::value>;
      return LaunchMaybeDependent(dependent, RowKernel<T, kVec, 1, G, Op>, grid,
                                  dim3(G::kMaxThreads), 0, s, x, y, rows, n, op);
    });
  }
  if (n <= kWarpRowMax) {
    const dim3 grid = Grid(CeilDiv(rows, kWarpsPerBlock));
    return WithIters<kVec, kMaxPerThread>(NextPow2(CeilDiv(vecs, kWarpSize)), [&](auto k) {
      using G = WarpGroup<kWarpSize>;
      return LaunchMaybeDependent(dependent, RowKernel<T, kVec, decltype(k)::value, G, Op>, grid,
                                  dim3(G::kMaxThreads), 0, s, x, y, rows, n, op);
    });
  }
  constexpr int kMaxIters = BlockMaxPerThread(kVec) / kVec;
  const int threads = static_cast<int>(CeilDiv(CeilDiv(vecs, kMaxIters), kWarpSize) * kWarpSize);
  const int iters = NextPow2(CeilDiv(vecs, threads));
  return WithIters<kVec, BlockMaxPerThread(kVec)>(iters, [&](auto k) {
    return LaunchMaybeDependent(dependent, RowKernel<T, kVec, decltype(k)::value, BlockGroup, Op>,
                                Grid(rows), dim3(threads), 0, s, x, y, rows, n, op);
  });
}

template <typename T, typename W>
cudaError_t LaunchLoop(const NormOp<T, W>& op, const T* x, T* y, int64_t rows, int64_t n,
                       cudaStream_t s, bool dependent) {
  return LaunchMaybeDependent(dependent, NormLoopKernel<T, W>, Grid(rows), dim3(kLoopThreads), 0, s,
                              x, y, rows, n, op);
}

// Runs a row op: RowKernel with 16-byte vectors when n and every pointer allow it, else one
// element at a time; the loop kernel for rows too long for registers.
template <typename T, typename Op>
cudaError_t LaunchRowOp(const T* x, T* y, int64_t rows, int64_t n, const Op& op,
                        bool pointers_aligned, cudaStream_t s, bool dependent) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vectorised = pointers_aligned && n % kVec == 0;
  if (n > RegisterRowMax(vectorised ? kVec : 1)) return LaunchLoop(op, x, y, rows, n, s, dependent);
  if (vectorised) return LaunchRows<T, kVec>(x, y, rows, n, op, s, dependent);
  return LaunchRows<T, 1>(x, y, rows, n, op, s, dependent);
}

// Launches ReduceKernel (arguments as there): a warp per row (or chunk) of up to 1024 elements,
// else a block.
template <typename T, typename A, typename TOut, int kVec, typename Op>
cudaError_t LaunchReduceKernel(const T* x, TOut* y, int64_t rows, int64_t inner, int64_t chunk,
                               int64_t count, Op op, cudaStream_t s) {
  if (std::min(chunk, inner) <= kWarpRowMax) {
    ReduceKernel<T, A, TOut, kVec, WarpGroup<kWarpSize>>
        <<<Grid(CeilDiv(rows, kWarpsPerBlock)), WarpGroup<kWarpSize>::kMaxThreads, 0, s>>>(
            x, y, rows, inner, chunk, count, op);
  } else {
    const int threads = chunk >= 65536 ? kMaxBlockThreads : 256;  // long rows: more in flight
    ReduceKernel<T, A, TOut, kVec, BlockGroup>
        <<<Grid(rows), threads, 0, s>>>(x, y, rows, inner, chunk, count, op);
  }
  return cudaGetLastError();
}

// Few long rows (a full reduction, say) would leave most SMs idle with a block per row: their
// chunks are reduced by separate blocks into a stream-ordered scratch buffer of partials, which a
// second launch reduces (deterministically, no atomics).
template <typename T, int kVec, typename Op>
cudaError_t LaunchReduce(const T* x, T* y, int64_t outer, int64_t inner, Op op, cudaStream_t s) {
  using A = std::conditional_t<std::is_same_v<T, int64_t>, int64_t,
                               std::conditional_t<std::is_same_v<Op, MaxReduce>, float, double>>;
  constexpr int64_t kSplitMin = 1 << 16, kMinChunk = 1 << 14, kTargetBlocks = 2048;
  const int64_t want = std::min(CeilDiv(inner, kMinChunk), CeilDiv(kTargetBlocks, outer));
  if (inner < kSplitMin || want < 2) {
    return LaunchReduceKernel<T, A, T, kVec>(x, y, outer, inner, inner, inner, op, s);
  }
  const int64_t chunk = CeilDiv(CeilDiv(inner, want), 16) * 16;  // keeps chunks 16-byte aligned
  const int64_t chunks = CeilDiv(inner, chunk);
  A* partial = nullptr;
  cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&partial),
                                    static_cast<size_t>(outer * chunks) * sizeof(A), s);
  if (err != cudaSuccess) return err;
  using Partial = std::conditional_t<std::is_same_v<Op, MeanReduce>, SumReduce, Op>;
  err = LaunchReduceKernel<T, A, A, kVec>(x, partial, outer * chunks, inner, chunk, chunk,
                                          Partial{}, s);
  if (err == cudaSuccess) {
    err = LaunchReduceKernel<A, A, T, 1>(partial, y, outer, chunks, chunks, inner, op, s);
  }
  const cudaError_t free_err = cudaFreeAsync(partial, s);
  return err != cudaSuccess ? err : free_err;
}

template <typename T, typename Op>
cudaError_t LaunchReduceBestWidth(const void* x, void* y, int64_t outer, int64_t inner, Op op,
                                  cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const T* in = static_cast<const T*>(x);
  T* out = static_cast<T*>(y);
  if (Aligned16(x) && inner % kVec == 0) return LaunchReduce<T, kVec>(in, out, outer, inner, op, s);
  return LaunchReduce<T, 1>(in, out, outer, inner, op, s);
}

template <typename T>
cudaError_t ReduceTyped(const void* x, void* y, int64_t outer, int64_t inner, int op,
                        cudaStream_t s) {
  switch (op) {
    case kReduceSum:
      return LaunchReduceBestWidth<T>(x, y, outer, inner, SumReduce{}, s);
    case kReduceMean:
      if constexpr (std::is_same_v<T, int64_t>) {
        return cudaErrorInvalidValue;  // the mean of integers is not defined here
      } else {
        return LaunchReduceBestWidth<T>(x, y, outer, inner, MeanReduce{}, s);
      }
    case kReduceMax:
      return LaunchReduceBestWidth<T>(x, y, outer, inner, MaxReduce{}, s);
    case kReduceProd:
      return LaunchReduceBestWidth<T>(x, y, outer, inner, ProdReduce{}, s);
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename E>
cudaError_t LaunchTriangular(const void* x, void* y, int64_t total, int64_t rows, int64_t cols,
                             int64_t diagonal, bool upper, cudaStream_t s) {
  constexpr int kThreads = 256;
  TriangularKernel<E><<<Grid(CeilDiv(total, kThreads)), kThreads, 0, s>>>(
      static_cast<const E*>(x), static_cast<E*>(y), total, rows, cols, diagonal, upper);
  return cudaGetLastError();
}

// RowNorm with weight and bias of element type W.
template <typename T, typename W>
cudaError_t LaunchNorm(const void* x, const void* weight, const void* bias, void* y, int64_t rows,
                       int64_t n, double eps, bool rms, cudaStream_t s, bool dependent) {
  const size_t w_align = sizeof(W) * (16 / sizeof(T));  // a vector of weights
  const bool aligned =
      Aligned16(x) && Aligned16(y) && Aligned(weight, w_align) && Aligned(bias, w_align);
  const NormOp<T, W> op{static_cast<const W*>(weight), static_cast<const W*>(bias),
                        static_cast<float>(eps), rms};
  return LaunchRowOp(static_cast<const T*>(x), static_cast<T*>(y), rows, n, op, aligned, s,
                     dependent);
}

}  // namespace

cudaError_t RowNorm(const void* x, const void* weight, const void* bias, void* y, int64_t rows,
                    int64_t n, double eps, bool rms, ElemType t, ElemType weight_t,
                    cudaStream_t stream, bool dependent_launch) {
  if (rows < 0 || n < 0 || (weight_t != t && weight_t != ElemType::kF32)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0 || n == 0) return cudaSuccess;
  return WithFloatType(t, [&](auto tag) {
    using T = decltype(tag);
    if (weight_t == t) {
      return LaunchNorm<T, T>(x, weight, bias, y, rows, n, eps, rms, stream, dependent_launch);
    }
    return LaunchNorm<T, float>(x, weight, bias, y, rows, n, eps, rms, stream, dependent_launch);
  });
}

cudaError_t RowReduce(const void* x, void* y, int64_t outer, int64_t inner, int op, ElemType in_t,
                      ElemType out_t, cudaStream_t stream) {
  if (outer < 0 || inner < 0 || in_t != out_t) return cudaErrorInvalidValue;
  if (outer == 0) return cudaSuccess;  // inner == 0 still writes the empty-row values
  if (in_t == ElemType::kI64) return ReduceTyped<int64_t>(x, y, outer, inner, op, stream);
  return WithFloatType(
      in_t, [&](auto tag) { return ReduceTyped<decltype(tag)>(x, y, outer, inner, op, stream); });
}

cudaError_t Triangular(const void* x, void* y, int64_t batch, int64_t rows, int64_t cols,
                       int64_t diagonal, bool upper, int elem_size, cudaStream_t stream) {
  if (batch < 0 || rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (batch == 0 || rows == 0 || cols == 0) return cudaSuccess;
  const int64_t total = batch * rows * cols;
  switch (elem_size) {
    case 1:
      return LaunchTriangular<uint8_t>(x, y, total, rows, cols, diagonal, upper, stream);
    case 2:
      return LaunchTriangular<uint16_t>(x, y, total, rows, cols, diagonal, upper, stream);
    case 4:
      return LaunchTriangular<uint32_t>(x, y, total, rows, cols, diagonal, upper, stream);
    case 8:
      return LaunchTriangular<uint64_t>(x, y, total, rows, cols, diagonal, upper, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kiln::cuda_kernels
