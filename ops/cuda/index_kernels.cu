// CUDA kernels of the indexing and selection rows (see index_kernels.h).
//
// RunIndexPlan: one thread per output element (grid-stride), div/mod over at most 8 dims. Rows
// that one index value moves whole (embedding and index_select rows, index_copy's rows) move as
// 16-, 8- or 4-byte words where sizes, strides and pointers allow (WidenRows).
// ArgMaxRows: a block per row; each thread keeps its best (key, index), then a warp-shuffle and
// shared-memory reduction; few long rows take a thread-block cluster per row on sm_90 (its CTAs
// meet in rank 0's shared memory: one launch), before it many blocks that meet in a 64-bit
// atomicMax of (key, ~index) (a memset, the split kernel and an unpack kernel). TopKRows: a block
// per row; radix select on order-preserving integer keys finds the k-th key in 4 (32-bit keys) or 8
// (int64) passes over the row, one more pass collects the winners (those equal to the k-th key in
// index order, through a block scan), and a bitonic sort in shared memory orders them by (key
// descending, index ascending). ScatterAddPlan: one thread per index element over a scatter plan,
// adding with atomicAdd. CumsumRows: a block per row, kThreads elements at a time through a block
// scan whose carry (the running total, kept by the scan's prefix callback) joins the chunks.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <type_traits>
#include <utility>

#include "ops/cuda/float_convert.cuh"
#include "ops/cuda/index_kernels.h"

namespace kiln::cuda_kernels {
namespace {

__device__ unsigned g_index_error = 0;

constexpr int kThreads = 256;
constexpr int kTopKThreads = 512;
constexpr int64_t kMaxGrid = 65535;

// ---- The gather family ------------------------------------------------------------------

// The offsets of plan element i before the index: output, source and index.
struct PlanOffsets {
  int64_t o = 0, s = 0, x = 0;
};
__device__ __forceinline__ PlanOffsets OffsetsOf(const IndexPlan& p, int64_t i) {
  PlanOffsets r;
#pragma unroll
  for (int d = kIndexPlanMaxRank - 1; d >= 0; --d) {
    if (d >= p.rank) continue;
    const int64_t c = i % p.sizes[d];
    i /= p.sizes[d];
    r.o += c * p.out_strides[d];
    r.s += c * p.src_strides[d];
    r.x += c * p.idx_strides[d];
  }
  return r;
}

// One element of a plan: o, s and x are the output, source and index offsets before the index.
// A gather reads the index, then the source (zero for a bad index); a scatter reads its source
// element first, independent of the index, so the two loads are in flight together, then writes
// only for a good index.
template <typename W>
__device__ __forceinline__ void MoveElement(const IndexPlan& p, char* out, int64_t o,
                                            const char* src, int64_t s, const void* index,
                                            int64_t x, unsigned* bad) {
  W* dst = reinterpret_cast<W*>(out);
  const W* from = reinterpret_cast<const W*>(src);
  if (!p.has_index) {
    dst[o] = from[s];
    return;
  }
  const W value = p.scatter ? from[s] : W{};
  const int64_t v = p.index_is_int64 ? static_cast<const int64_t*>(index)[x]
                                     : static_cast<const int32_t*>(index)[x];
  const bool ok = v >= 0 && v < p.bound;
  if (!ok) *(bad != nullptr ? bad : &g_index_error) = 1u;
  if (p.scatter) {
    if (ok) dst[o + v * p.select_stride] = value;
  } else {
    dst[o] = ok ? from[s + v * p.select_stride] : W{};
  }
}

__global__ void IndexPlanKernel(IndexPlan p, int64_t n, char* out, const char* src,
                                const void* index, unsigned* bad) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PlanOffsets at = OffsetsOf(p, i);
    const int64_t o = at.o, s = at.s, x = at.x;
    switch (p.elem_size) {
      case 1:
        MoveElement<uint8_t>(p, out, o, src, s, index, x, bad);
        break;
      case 2:
        MoveElement<uint16_t>(p, out, o, src, s, index, x, bad);
        break;
      case 4:
        MoveElement<uint32_t>(p, out, o, src, s, index, x, bad);
        break;
      case 8:
        MoveElement<uint64_t>(p, out, o, src, s, index, x, bad);
        break;
      default:
        MoveElement<uint4>(p, out, o, src, s, index, x, bad);
    }
  }
}

__device__ __forceinline__ void AtomicAddTo(int64_t* p, int64_t v) {  // wraps, as int64 adds do
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}
template <typename T>
__device__ __forceinline__ void AtomicAddTo(T* p, T v) {
  atomicAdd(p, v);
}

template <typename T>
__global__ void ScatterAddKernel(IndexPlan p, int64_t n, T* out, const T* src, const void* index,
                                 unsigned* bad) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PlanOffsets at = OffsetsOf(p, i);
    const T value = src[at.s];
    const int64_t v = p.index_is_int64 ? static_cast<const int64_t*>(index)[at.x]
                                       : static_cast<const int32_t*>(index)[at.x];
    if (v < 0 || v >= p.bound) {
      *(bad != nullptr ? bad : &g_index_error) = 1u;
      continue;
    }
    AtomicAddTo(out + at.o + v * p.select_stride, value);
  }
}

__global__ void IndexRangeKernel(const void* index, int64_t n, int64_t stride, bool is64,
                                 int64_t bound, unsigned* bad) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = is64 ? static_cast<const int64_t*>(index)[i * stride]
                           : static_cast<const int32_t*>(index)[i * stride];
    if (v < 0 || v >= bound) *bad = 1u;
  }
}

// ---- Order-preserving keys ----------------------------------------------------------------

// A float as an unsigned key whose integer order is the value order: NaN above +inf, -0 == +0.
__device__ __forceinline__ uint32_t FloatKey(float f) {
  if (f != f) return 0xFFFFFFFFu;
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <typename T>
__device__ __forceinline__ auto KeyOf(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return FloatKey(v);
  } else if constexpr (std::is_same_v<T, __half>) {
    return FloatKey(__half2float(v));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return FloatKey(__bfloat162float(v));
  } else if constexpr (std::is_same_v<T, int32_t>) {
    return static_cast<uint32_t>(v) ^ 0x80000000u;
  } else {
    return static_cast<unsigned long long>(v) ^ 0x8000000000000000ull;
  }
}

template <typename T>
using KeyType_t = decltype(KeyOf(T{}));

// (key, index) ranks above (other_key, other_index): the larger key, or the lower index.
template <typename K>
__device__ __forceinline__ bool Before(K key, int64_t i, K other_key, int64_t other_i) {
  return key > other_key || (key == other_key && i < other_i);
}

// ---- argmax -------------------------------------------------------------------------------

// The best (key, index) of row[begin, end) over the warp's lanes, each lane striding by `stride`
// from begin + its thread's offset `first`: lane 0 ends with the warp's best (best_i = LLONG_MAX
// when the warp saw nothing; every real index ranks above it on equal keys).
template <typename T, typename K = KeyType_t<T>>
__device__ void WarpBest(const T* row, int64_t first, int64_t end, int64_t stride, K* best_key,
                         int64_t* best_index) {
  K best = 0;
  int64_t best_i = LLONG_MAX;
  // kBatch loads issued together (bounds as predicates, not branches), then compared in index
  // order: a row read one dependent load at a time is latency-bound.
  constexpr int kBatch = 8;
  for (int64_t i = first; i < end; i += kBatch * stride) {
    T v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) v[u] = i + u * stride < end ? row[i + u * stride] : T{};
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const K key = KeyOf(v[u]);
      if (i + u * stride < end && (best_i == LLONG_MAX || key > best)) {
        best = key, best_i = i + u * stride;
      }
    }
  }
  for (int off = 16; off > 0; off /= 2) {
    const K k2 = __shfl_down_sync(0xFFFFFFFFu, best, off);
    const int64_t i2 = __shfl_down_sync(0xFFFFFFFFu, best_i, off);
    if (i2 != LLONG_MAX && (best_i == LLONG_MAX || Before(k2, i2, best, best_i))) {
      best = k2, best_i = i2;
    }
  }
  *best_key = best;
  *best_index = best_i;
}

template <typename T>
__global__ void ArgMaxKernel(const T* x, int64_t* out, int64_t rows, int64_t n) {
  using K = KeyType_t<T>;
  __shared__ K warp_key[kThreads / 32];
  __shared__ int64_t warp_idx[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    K best;
    int64_t best_i;
    WarpBest<T>(x + r * n, threadIdx.x, n, blockDim.x, &best, &best_i);
    if (lane == 0) warp_key[warp] = best, warp_idx[warp] = best_i;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
        if (warp_idx[w] != LLONG_MAX &&
            (best_i == LLONG_MAX || Before(warp_key[w], warp_idx[w], best, best_i))) {
          best = warp_key[w], best_i = warp_idx[w];
        }
      }
      out[r] = best_i;
    }
    __syncthreads();
  }
}

// Few long rows (the logits of one token over a 50257-word vocabulary: one block per row walks
// 50257 elements alone, 64 us on the H200): each block takes kSplitChunk elements of a row and
// each of its warps folds its best (key, index) into the row's 64-bit word key << 32 | ~index
// with atomicMax (the larger key wins; on equal keys the lower index, whose complement is
// larger); the words live in `out` itself (zeroed first) and one thread per row then unpacks the
// index. For 32-bit keys and rows shorter than 2^32 - 1 (every packed candidate is above 0).
constexpr int64_t kSplitChunk = 2048;
constexpr int64_t kSplitMinLength = 8192, kSplitMaxRows = 256;

template <typename T>
__global__ void ArgMaxSplitKernel(const T* x, unsigned long long* packed, int64_t n) {
  const int64_t r = blockIdx.y, start = blockIdx.x * kSplitChunk;
  const int64_t end = min(start + kSplitChunk, n);
  uint32_t best;
  int64_t best_i;
  WarpBest<T, uint32_t>(x + r * n, start + threadIdx.x, end, blockDim.x, &best, &best_i);
  if (threadIdx.x % 32 == 0 && best_i != LLONG_MAX) {
    atomicMax(&packed[r], (static_cast<unsigned long long>(best) << 32) |
                              static_cast<uint32_t>(~static_cast<uint32_t>(best_i)));
  }
}

__global__ void ArgMaxUnpackKernel(int64_t* out, int64_t rows) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r < rows) {
    const unsigned long long w = reinterpret_cast<const unsigned long long*>(out)[r];
    out[r] = static_cast<uint32_t>(~static_cast<uint32_t>(w & 0xFFFFFFFFu));
  }
}

// Few long rows on sm_90: a thread-block cluster of kArgMaxCtas CTAs per row, each over a
// contiguous share of it; every CTA's best (key, index) goes into CTA rank 0's shared memory
// (distributed shared memory) and rank 0 writes the row's index. One launch, no memset, no
// atomics; any key width (int64 too). The shares are taken in rank order and each
// CTA's in index order, so the lowest index wins a tie as everywhere else.
constexpr int kArgMaxCtas = 8, kArgMaxThreads = 1024;

// The best (key, index) of the 32 lanes' in lane 0 (best_i = LLONG_MAX: nothing seen).
template <typename K>
__device__ __forceinline__ void WarpReduceBest(K* best, int64_t* best_i) {
  for (int off = 16; off > 0; off /= 2) {
    const K k2 = __shfl_down_sync(0xFFFFFFFFu, *best, off);
    const int64_t i2 = __shfl_down_sync(0xFFFFFFFFu, *best_i, off);
    if (i2 != LLONG_MAX && (*best_i == LLONG_MAX || Before(k2, i2, *best, *best_i))) {
      *best = k2, *best_i = i2;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kArgMaxThreads)
    ArgMaxClusterKernel(const T* x, int64_t* out, int64_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using K = KeyType_t<T>;
  __shared__ K warp_key[kArgMaxThreads / 32];
  __shared__ int64_t warp_idx[kArgMaxThreads / 32];
  __shared__ K cta_key[kArgMaxCtas];  // rank 0's: each CTA's best, by rank
  __shared__ int64_t cta_idx[kArgMaxCtas];
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  // Arrived when this CTA started: the wait below, before the remote stores, then knows that
  // rank 0 has started (its shared memory exists).
  auto started = cluster.barrier_arrive();
  const unsigned rank = cluster.block_rank();
  const int64_t r = blockIdx.y, share = (n + kArgMaxCtas - 1) / kArgMaxCtas;
  const int64_t start = min(int64_t{rank} * share, n), end = min(start + share, n);
  K best;
  int64_t best_i;
  WarpBest<T>(x + r * n, start + threadIdx.x, end, kArgMaxThreads, &best, &best_i);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_key[warp] = best, warp_idx[warp] = best_i;
  __syncthreads();
  if (warp == 0) {
    best = warp_key[lane], best_i = warp_idx[lane];
    WarpReduceBest(&best, &best_i);
  }
  cluster.barrier_wait(std::move(started));
  if (threadIdx.x == 0) {
    *cluster.map_shared_rank(&cta_key[rank], 0) = best;
    *cluster.map_shared_rank(&cta_idx[rank], 0) = best_i;
  }
  cluster.sync();  // the stores are visible to rank 0
  if (rank == 0 && threadIdx.x == 0) {
    best = cta_key[0], best_i = cta_idx[0];
    for (int c = 1; c < kArgMaxCtas; ++c) {
      if (cta_idx[c] != LLONG_MAX &&
          (best_i == LLONG_MAX || Before(cta_key[c], cta_idx[c], best, best_i))) {
        best = cta_key[c], best_i = cta_idx[c];
      }
    }
    out[r] = best_i;
  }
#endif
}

// ---- topk ---------------------------------------------------------------------------------

// The k-th largest key of the row among keys (flipped for smallest-first), and how many of the
// keys equal to it belong to the top k. Radix select over 8-bit digits, most significant first.
template <typename T, typename K>
__device__ void RadixSelect(const T* row, int64_t n, int64_t k, bool flip, unsigned* hist, K* kth,
                            int64_t* take_equal) {
  __shared__ K s_prefix;
  __shared__ int64_t s_remaining;
  K prefix = 0, mask = 0;
  int64_t remaining = k;
  for (int shift = static_cast<int>(sizeof(K)) * 8 - 8; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const K key = flip ? static_cast<K>(~KeyOf(row[i])) : KeyOf(row[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFF], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t above = 0;
      int b = 255;
      for (; b > 0 && above + hist[b] < remaining; --b) above += hist[b];
      s_prefix = prefix | (static_cast<K>(b) << shift);
      s_remaining = remaining - above;
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= static_cast<K>(0xFF) << shift;
  }
  *kth = prefix;
  *take_equal = remaining;
}

// Sorts p (a power of two) (key, index) pairs in shared memory: Before-order first.
template <typename K>
__device__ void BitonicSort(K* keys, int64_t* idx, int p) {
  for (int size = 2; size <= p; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int t = threadIdx.x; t < p / 2; t += blockDim.x) {
        const int lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
        const bool up = (lo & size) == 0;
        const bool swap = up ? Before(keys[hi], idx[hi], keys[lo], idx[lo])
                             : Before(keys[lo], idx[lo], keys[hi], idx[hi]);
        if (swap) {
          const K k = keys[lo];
          keys[lo] = keys[hi], keys[hi] = k;
          const int64_t i = idx[lo];
          idx[lo] = idx[hi], idx[hi] = i;
        }
      }
    }
  }
  __syncthreads();
}

template <typename T>
__global__ void TopKKernel(const T* x, int64_t* out, int64_t rows, int64_t n, int64_t k,
                           bool largest) {
  using K = KeyType_t<T>;
  using Scan = cub::BlockScan<int, kTopKThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ unsigned hist[256];
  __shared__ K sel_key[kTopKMaxK];
  __shared__ int64_t sel_idx[kTopKMaxK];
  __shared__ unsigned s_count;
  int p = 1;
  while (p < k) p <<= 1;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * n;
    K kth;
    int64_t take_equal;
    RadixSelect<T, K>(row, n, k, !largest, hist, &kth, &take_equal);
    if (threadIdx.x == 0) s_count = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {  // keys above the k-th: any order
      const K key = largest ? KeyOf(row[i]) : static_cast<K>(~KeyOf(row[i]));
      if (key > kth) {
        const unsigned slot = atomicAdd(&s_count, 1u);
        sel_key[slot] = key, sel_idx[slot] = i;
      }
    }
    __syncthreads();
    const int64_t above = k - take_equal;
    int64_t taken = 0;  // keys equal to the k-th, in index order (uniform across the block)
    for (int64_t base = 0; base < n && taken < take_equal; base += blockDim.x) {
      const int64_t i = base + threadIdx.x;
      const K key = i < n ? (largest ? KeyOf(row[i]) : static_cast<K>(~KeyOf(row[i]))) : K{0};
      const int eq = i < n && key == kth ? 1 : 0;
      int rank = 0, total = 0;
      Scan(scan).ExclusiveSum(eq, rank, total);
      if (eq && taken + rank < take_equal) {
        sel_key[above + taken + rank] = kth, sel_idx[above + taken + rank] = i;
      }
      taken += total;
      __syncthreads();
    }
    for (int j = threadIdx.x; j < p; j += blockDim.x) {
      if (j >= k) sel_key[j] = 0, sel_idx[j] = LLONG_MAX;  // padding sorts last
    }
    BitonicSort(sel_key, sel_idx, p);
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) out[r * k + j] = sel_idx[j];
    __syncthreads();
  }
}

// Calls f(T{}) with the device type of an element type.
template <typename F>
cudaError_t WithType(ElemType t, F&& f) {
  switch (t) {
    case ElemType::kF32:
      return f(float{});
    case ElemType::kF16:
      return f(__half{});
    case ElemType::kBF16:
      return f(__nv_bfloat16{});
    case ElemType::kI32:
      return f(int32_t{});
    case ElemType::kI64:
      return f(int64_t{});
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchArgMaxCluster(const void* x, int64_t* out, int64_t rows, int64_t n, ElemType t,
                                cudaStream_t stream) {
  return WithType(t, [&](auto tag) {
    using T = decltype(tag);
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = kArgMaxCtas;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(kArgMaxCtas, static_cast<unsigned>(rows));
    config.blockDim = dim3(kArgMaxThreads);
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, &ArgMaxClusterKernel<T>, static_cast<const T*>(x), out, n);
  });
}

// The plan over words of w bytes instead of elements when the innermost dim moves whole with one
// index value (unit stride in out and source, index stride 0) and every size, stride and pointer
// it touches is a multiple of w; else the plan as it is. `n` follows.
IndexPlan WidenRows(const IndexPlan& p, int64_t* n, const void* out, const void* src) {
  const int inner = p.rank - 1;
  if (p.rank < 1 || p.out_strides[inner] != 1 || p.src_strides[inner] != 1 ||
      p.idx_strides[inner] != 0) {
    return p;
  }
  for (int w = 16; w > p.elem_size; w /= 2) {
    const int64_t k = w / p.elem_size;
    bool fits = p.sizes[inner] % k == 0 && p.select_stride % k == 0 &&
                reinterpret_cast<uintptr_t>(out) % w == 0 &&
                reinterpret_cast<uintptr_t>(src) % w == 0;
    for (int d = 0; d < inner && fits; ++d) {
      fits = p.out_strides[d] % k == 0 && p.src_strides[d] % k == 0;
    }
    if (!fits) continue;
    IndexPlan wide = p;
    wide.elem_size = w;
    wide.sizes[inner] /= k;
    wide.select_stride /= k;
    for (int d = 0; d < inner; ++d) {
      wide.out_strides[d] /= k;
      wide.src_strides[d] /= k;
    }
    *n /= k;
    return wide;
  }
  return p;
}

}  // namespace

cudaError_t RunIndexPlan(const IndexPlan& given, int64_t n, void* out, const void* src,
                         const void* index, unsigned* bad, cudaStream_t stream) {
  if (n < 0 || given.rank > kIndexPlanMaxRank) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const IndexPlan plan = WidenRows(given, &n, out, src);
  const int64_t grid = std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxGrid);
  IndexPlanKernel<<<static_cast<int>(grid), kThreads, 0, stream>>>(
      plan, n, static_cast<char*>(out), static_cast<const char*>(src), index, bad);
  return cudaGetLastError();
}

cudaError_t ScatterAddPlan(const IndexPlan& plan, int64_t n, void* out, const void* src,
                           const void* index, ElemType t, unsigned* bad, cudaStream_t stream) {
  if (n < 0 || plan.rank > kIndexPlanMaxRank || !plan.scatter) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int grid = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxGrid));
  return WithType(t, [&](auto tag) {
    using T = decltype(tag);
    ScatterAddKernel<T><<<grid, kThreads, 0, stream>>>(plan, n, static_cast<T*>(out),
                                                       static_cast<const T*>(src), index, bad);
    return cudaGetLastError();
  });
}

cudaError_t CheckIndexRange(const void* index, int64_t n, int64_t stride, bool is64, int64_t bound,
                            unsigned* bad, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t grid = std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxGrid);
  IndexRangeKernel<<<static_cast<int>(grid), kThreads, 0, stream>>>(index, n, stride, is64, bound,
                                                                    bad);
  return cudaGetLastError();
}

cudaError_t TakeGlobalIndexError(bool* seen, cudaStream_t stream) {
  unsigned flag = 0;
  const unsigned zero = 0;
  cudaError_t err = cudaMemcpyFromSymbolAsync(&flag, g_index_error, sizeof(flag), 0,
                                              cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err == cudaSuccess && flag != 0) {
    err = cudaMemcpyToSymbolAsync(g_index_error, &zero, sizeof(zero), 0, cudaMemcpyHostToDevice,
                                  stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  }
  *seen = flag != 0;
  return err;
}

cudaError_t GlobalIndexErrorFlag(unsigned** flag) {
  return cudaGetSymbolAddress(reinterpret_cast<void**>(flag), g_index_error);
}

cudaError_t ArgMaxRows(const void* x, int64_t* out, int64_t rows, int64_t n, ElemType t,
                       bool clusters, cudaStream_t stream) {
  if (rows < 0 || n < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (clusters && n >= kSplitMinLength && rows <= kSplitMaxRows) {
    return LaunchArgMaxCluster(x, out, rows, n, t, stream);
  }
  return WithType(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) <= 4) {  // 32-bit keys (int64 keys take the one-block path)
      if (n >= kSplitMinLength && n < 0xFFFFFFFFll && rows <= kSplitMaxRows) {
        const cudaError_t err = cudaMemsetAsync(out, 0, rows * sizeof(int64_t), stream);
        if (err != cudaSuccess) return err;
        const dim3 grid(static_cast<unsigned>((n + kSplitChunk - 1) / kSplitChunk),
                        static_cast<unsigned>(rows));
        ArgMaxSplitKernel<T><<<grid, kThreads, 0, stream>>>(
            static_cast<const T*>(x), reinterpret_cast<unsigned long long*>(out), n);
        ArgMaxUnpackKernel<<<static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads, 0,
                             stream>>>(out, rows);
        return cudaGetLastError();
      }
    }
    const int grid = static_cast<int>(std::min<int64_t>(rows, kMaxGrid));
    ArgMaxKernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), out, rows, n);
    return cudaGetLastError();
  });
}

cudaError_t TopKRows(const void* x, int64_t* out, int64_t rows, int64_t n, int64_t k, bool largest,
                     ElemType t, cudaStream_t stream) {
  if (rows < 0 || k < 1 || k > n || k > kTopKMaxK) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return WithType(t, [&](auto tag) {
    using T = decltype(tag);
    const int grid = static_cast<int>(std::min<int64_t>(rows, kMaxGrid));
    TopKKernel<T>
        <<<grid, kTopKThreads, 0, stream>>>(static_cast<const T*>(x), out, rows, n, k, largest);
    return cudaGetLastError();
  });
}

// ---- cumsum ------------------------------------------------------------------------------

namespace {

template <typename T>
struct ScanTypes {  // floats sum in float32 and keep their type; integers sum in int64
  using Acc = std::conditional_t<std::is_integral_v<T>, long long, float>;
  using Out = std::conditional_t<std::is_integral_v<T>, long long, T>;
};

// An element into the sum's type (float_convert.cuh's ToFloat for the floating types), and back.
template <typename T>
__device__ __forceinline__ typename ScanTypes<T>::Acc ToAcc(T v) {
  if constexpr (std::is_integral_v<T>) {
    return v;
  } else {
    return ToFloat(v);
  }
}

template <typename T>
__device__ __forceinline__ typename ScanTypes<T>::Out FromAcc(typename ScanTypes<T>::Acc v) {
  if constexpr (std::is_integral_v<T>) {
    return v;
  } else {
    return FromFloat<T>(v);
  }
}

// The block scan's prefix callback: thread 0 of the first warp calls it once per chunk with the
// chunk's total and gets the total of the chunks before.
template <typename Acc>
struct RunningTotal {
  Acc total;
  __device__ Acc operator()(Acc chunk) {
    const Acc before = total;
    if constexpr (std::is_integral_v<Acc>) {  // wraps, as torch's int64
      total = static_cast<Acc>(static_cast<unsigned long long>(total) +
                               static_cast<unsigned long long>(chunk));
    } else {
      total = total + chunk;
    }
    return before;
  }
};

template <typename T>
__global__ void CumsumKernel(const T* x, typename ScanTypes<T>::Out* out, int64_t rows, int64_t n) {
  using Acc = typename ScanTypes<T>::Acc;
  using Scan = cub::BlockScan<Acc, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    RunningTotal<Acc> carry{Acc(0)};
    for (int64_t base = 0; base < n; base += kThreads) {
      const int64_t i = base + threadIdx.x;
      Acc v = i < n ? ToAcc(x[r * n + i]) : Acc(0);
      Scan(temp).InclusiveSum(v, v, carry);
      __syncthreads();  // temp is reused by the next chunk
      if (i < n) out[r * n + i] = FromAcc<T>(v);
    }
  }
}

}  // namespace

cudaError_t CumsumRows(const void* x, void* out, int64_t rows, int64_t n, ElemType t,
                       cudaStream_t stream) {
  if (rows < 0 || n < 0) return cudaErrorInvalidValue;
  if (rows == 0 || n == 0) return cudaSuccess;
  return WithType(t, [&](auto tag) {
    using T = decltype(tag);
    const int grid = static_cast<int>(std::min<int64_t>(rows, kMaxGrid));
    CumsumKernel<T><<<grid, kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<typename ScanTypes<T>::Out*>(out), rows, n);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda_kernels
