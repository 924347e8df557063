// Blocked, multi-threaded float32 GEMM for kiln's CPU backend.
//
// The structure follows the classic Goto/BLIS design:
//   * C is split into one rectangular piece per thread; each thread runs the serial algorithm
//     below on its piece with its own packing buffers, so no synchronisation is needed beyond
//     waiting for all pieces to finish. Threads come from a small persistent pool whose workers
//     spin briefly between jobs; problems below ~64^3 multiply-adds stay on the caller.
//   * The serial algorithm loops over NC-wide column blocks of op(B), KC-deep slices of K and
//     MC-tall row blocks of op(A). Each block is packed into contiguous, zero-padded micro-panels
//     (which also absorbs the transposes), then a kMr x kNr register-tiled micro-kernel sweeps
//     over the packed panels.
//   * The micro-kernel is AVX2/FMA intrinsics when the CPU supports them (detected at run time),
//     otherwise portable C++ that the compiler vectorises for the baseline ISA.

#include "ops/cpu/gemm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KILN_GEMM_X86 1
#endif

namespace kiln::cpu {
namespace {

// Register tile (rows x columns of C held in registers by the micro-kernel).
constexpr int64_t kMr = 6;
constexpr int64_t kNr = 16;
// Cache blocks: a packed kMc x kKc block of A lives in L2, a kKc x kNr micro-panel of B in L1,
// and a packed kKc x kNc block of B in L3.
constexpr int64_t kMc = 144;
constexpr int64_t kKc = 256;
constexpr int64_t kNc = 4080;
// Problems with fewer multiply-adds than this run on the calling thread only.
constexpr int64_t kMinParallelWork = 64 * 64 * 64;
// Upper bound on worker threads (also keeps task counts within ThreadPool's state encoding).
constexpr int kMaxThreads = 256;

// Computes the kMr x kNr tile C = alpha * A_panel * B_panel + beta * C over kc steps; C is not
// read when beta == 0.
using MicroKernel = void (*)(int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
                             float alpha, float beta);

// A strided matrix operand: element (r, c) lives at data[r * rs + c * cs].
struct View {
  const float* data;
  int64_t rs;
  int64_t cs;
};

// One (sub-)problem C = alpha * A * B + beta * C with A: m x k, B: k x n.
struct Problem {
  View a;
  View b;
  float* c;
  int64_t ldc;
  int64_t m;
  int64_t n;
  int64_t k;
  float alpha;
  float beta;
};

int64_t RoundUp(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

int64_t CeilDiv(int64_t x, int64_t y) { return (x + y - 1) / y; }

// ---------------------------------------------------------------------------------------------
// Micro-kernels.

// Four floats in whatever SIMD register the baseline target has (SSE2 on x86-64).
using Vec4 = float __attribute__((vector_size(16)));

Vec4 LoadVec4(const float* p) {
  Vec4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void StoreVec4(float* p, Vec4 v) { std::memcpy(p, &v, sizeof(v)); }

// Portable kernel: computes the tile as two 6x8 halves so the 12 accumulators, the B vectors
// and the A broadcast fit in 16 registers.
void KernelGeneric(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                   float beta) {
  for (int64_t half = 0; half < kNr; half += 8) {
    Vec4 acc[kMr][2] = {};
    const float* bp = b + half;
    for (int64_t p = 0; p < kc; ++p, bp += kNr) {
      const Vec4 b0 = LoadVec4(bp);
      const Vec4 b1 = LoadVec4(bp + 4);
      for (int64_t i = 0; i < kMr; ++i) {
        const float ai = a[p * kMr + i];
        acc[i][0] += ai * b0;
        acc[i][1] += ai * b1;
      }
    }
    for (int64_t i = 0; i < kMr; ++i) {
      for (int64_t v = 0; v < 2; ++v) {
        float* out = c + i * ldc + half + 4 * v;
        Vec4 r = alpha * acc[i][v];
        if (beta != 0.0f) r += beta * LoadVec4(out);
        StoreVec4(out, r);
      }
    }
  }
}

#ifdef KILN_GEMM_X86
__attribute__((target("avx2,fma"))) inline void StoreRowAvx2(float* row, __m256 lo, __m256 hi,
                                                             __m256 alpha, float beta) {
  lo = _mm256_mul_ps(lo, alpha);
  hi = _mm256_mul_ps(hi, alpha);
  if (beta != 0.0f) {
    const __m256 vbeta = _mm256_set1_ps(beta);
    lo = _mm256_fmadd_ps(vbeta, _mm256_loadu_ps(row), lo);
    hi = _mm256_fmadd_ps(vbeta, _mm256_loadu_ps(row + 8), hi);
  }
  _mm256_storeu_ps(row, lo);
  _mm256_storeu_ps(row + 8, hi);
}

__attribute__((target("avx2,fma"))) void KernelAvx2(int64_t kc, const float* a, const float* b,
                                                    float* c, int64_t ldc, float alpha,
                                                    float beta) {
  static_assert(kMr == 6 && kNr == 16, "KernelAvx2 is written for a 6x16 tile");
  __m256 acc[kMr][2];
#pragma GCC unroll 6
  for (int i = 0; i < kMr; ++i) {
    acc[i][0] = _mm256_setzero_ps();
    acc[i][1] = _mm256_setzero_ps();
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
  }
#pragma GCC unroll 4
  for (int64_t p = 0; p < kc; ++p, a += kMr, b += kNr) {
    const __m256 b0 = _mm256_load_ps(b);
    const __m256 b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kMr; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
  }
  const __m256 valpha = _mm256_set1_ps(alpha);
#pragma GCC unroll 6
  for (int i = 0; i < kMr; ++i) StoreRowAvx2(c + i * ldc, acc[i][0], acc[i][1], valpha, beta);
}
#endif  // KILN_GEMM_X86

MicroKernel SelectKernel() {
#ifdef KILN_GEMM_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return KernelAvx2;
#endif
  return KernelGeneric;
}

MicroKernel Kernel() {
  static const MicroKernel kernel = SelectKernel();
  return kernel;
}

// ---------------------------------------------------------------------------------------------
// Packing.

// Packs a panel of `lanes` (<= kWidth) vectors of length kc into dst so that
// dst[p * kWidth + l] = src[l * lane_stride + p * depth_stride]; lanes >= `lanes` are zero.
template <int64_t kWidth>
void PackPanel(const float* src, int64_t lane_stride, int64_t depth_stride, int64_t lanes,
               int64_t kc, float* dst) {
  if (lanes == kWidth && lane_stride == 1) {
    for (int64_t p = 0; p < kc; ++p) {
      std::copy_n(src + p * depth_stride, kWidth, dst + p * kWidth);
    }
  } else if (lanes == kWidth) {
    for (int64_t p = 0; p < kc; ++p) {
      for (int64_t l = 0; l < kWidth; ++l) {
        dst[p * kWidth + l] = src[l * lane_stride + p * depth_stride];
      }
    }
  } else {
    for (int64_t p = 0; p < kc; ++p) {
      for (int64_t l = 0; l < kWidth; ++l) {
        dst[p * kWidth + l] = l < lanes ? src[l * lane_stride + p * depth_stride] : 0.0f;
      }
    }
  }
}

// Packs the mc x kc block of A at `a` into kMr-row micro-panels.
void PackA(const View& a, int64_t mc, int64_t kc, float* dst) {
  for (int64_t i = 0; i < mc; i += kMr, dst += kMr * kc) {
    PackPanel<kMr>(a.data + i * a.rs, a.rs, a.cs, std::min(kMr, mc - i), kc, dst);
  }
}

// Packs the kc x nc block of B at `b` into kNr-column micro-panels.
void PackB(const View& b, int64_t kc, int64_t nc, float* dst) {
  for (int64_t j = 0; j < nc; j += kNr, dst += kNr * kc) {
    PackPanel<kNr>(b.data + j * b.cs, b.cs, b.rs, std::min(kNr, nc - j), kc, dst);
  }
}

// ---------------------------------------------------------------------------------------------
// Serial blocked algorithm.

// Runs the kernel on a partial tile via a scratch tile, then merges the valid mr x nr corner.
void EdgeTile(MicroKernel kernel, int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
              int64_t mr, int64_t nr, float alpha, float beta) {
  alignas(64) float tile[kMr * kNr];
  kernel(kc, a, b, tile, kNr, 1.0f, 0.0f);
  for (int64_t i = 0; i < mr; ++i) {
    for (int64_t j = 0; j < nr; ++j) {
      float& out = c[i * ldc + j];
      out = beta == 0.0f ? alpha * tile[i * kNr + j] : alpha * tile[i * kNr + j] + beta * out;
    }
  }
}

// C[mc x nc] = alpha * packed_a * packed_b + beta * C.
void MacroKernel(MicroKernel kernel, int64_t mc, int64_t nc, int64_t kc, const float* packed_a,
                 const float* packed_b, float* c, int64_t ldc, float alpha, float beta) {
  for (int64_t j = 0; j < nc; j += kNr) {
    const float* b = packed_b + j * kc;
    const int64_t nr = std::min(kNr, nc - j);
    for (int64_t i = 0; i < mc; i += kMr) {
      const float* a = packed_a + i * kc;
      const int64_t mr = std::min(kMr, mc - i);
      float* tile = c + i * ldc + j;
      if (mr == kMr && nr == kNr) {
        kernel(kc, a, b, tile, ldc, alpha, beta);
      } else {
        EdgeTile(kernel, kc, a, b, tile, ldc, mr, nr, alpha, beta);
      }
    }
  }
}

// Reusable, 64-byte aligned packing memory. Keeping it between calls avoids paying for fresh
// (page-faulting) multi-megabyte allocations on every GEMM.
class Scratch {
 public:
  // Returns at least `size` uninitialised floats, valid until the next call.
  float* Reserve(int64_t size) {
    if (size > capacity_) {
      storage_ = std::make_unique_for_overwrite<float[]>(size + 16);
      capacity_ = size;
      const auto addr = reinterpret_cast<uintptr_t>(storage_.get());
      data_ = storage_.get() + (RoundUp(static_cast<int64_t>(addr), 64) - addr) / sizeof(float);
    }
    return data_;
  }

 private:
  std::unique_ptr<float[]> storage_;
  float* data_ = nullptr;
  int64_t capacity_ = 0;
};

// Computes a problem with m, n, k > 0 on the calling thread.
void SerialGemm(const Problem& p, Scratch& scratch) {
  const MicroKernel kernel = Kernel();
  const int64_t kc_max = std::min(kKc, p.k);
  const int64_t a_size = RoundUp(std::min(kMc, RoundUp(p.m, kMr)) * kc_max, 16);
  const int64_t b_size = std::min(kNc, RoundUp(p.n, kNr)) * kc_max;
  float* const packed_a = scratch.Reserve(a_size + b_size);
  float* const packed_b = packed_a + a_size;
  for (int64_t jc = 0; jc < p.n; jc += kNc) {
    const int64_t nc = std::min(kNc, p.n - jc);
    for (int64_t pc = 0; pc < p.k; pc += kKc) {
      const int64_t kc = std::min(kKc, p.k - pc);
      const float beta = pc == 0 ? p.beta : 1.0f;
      PackB({p.b.data + pc * p.b.rs + jc * p.b.cs, p.b.rs, p.b.cs}, kc, nc, packed_b);
      for (int64_t ic = 0; ic < p.m; ic += kMc) {
        const int64_t mc = std::min(kMc, p.m - ic);
        PackA({p.a.data + ic * p.a.rs + pc * p.a.cs, p.a.rs, p.a.cs}, mc, kc, packed_a);
        MacroKernel(kernel, mc, nc, kc, packed_a, packed_b, p.c + ic * p.ldc + jc, p.ldc, p.alpha,
                    beta);
      }
    }
  }
}

// C = beta * C (C = 0 when beta == 0, without reading C).
void ScaleC(int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
  if (beta == 1.0f) return;
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (beta == 0.0f) {
      std::fill_n(row, n, 0.0f);
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Threading.

// Lets a sibling hyper-thread run while spinning.
inline void CpuRelax() {
#ifdef KILN_GEMM_X86
  __builtin_ia32_pause();
#endif
}

// Busy-waits up to kSpinTime for done() to hold, and returns whether it did. Waking a sleeping
// thread costs tens of microseconds, far more than a mid-sized GEMM is willing to pay.
template <typename Predicate>
bool SpinUntil(Predicate done) {
  constexpr std::chrono::microseconds kSpinTime(200);
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 1;; ++i) {
    if (done()) return true;
    CpuRelax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) return false;
  }
}

// A task of a parallel job: called with the task index and packing memory owned by its thread.
using Task = std::function<void(int, Scratch&)>;

// A minimal persistent pool. Run() executes fn(0..num_tasks-1), task 0 on the caller and task t
// on worker t - 1. Only one Run() owns the pool (workers and its scratch) at a time; a concurrent
// (or nested) caller runs its tasks inline with temporary scratch instead of waiting.
class ThreadPool {
 public:
  void Run(int num_tasks, const Task& fn) {
    std::unique_lock<std::mutex> run_lock(run_mu_, std::try_to_lock);
    if (!run_lock.owns_lock()) {
      Scratch scratch;
      for (int t = 0; t < num_tasks; ++t) fn(t, scratch);
      return;
    }
    if (num_tasks == 1) return fn(0, owner_scratch_);
    Dispatch(num_tasks, fn);
    fn(0, owner_scratch_);
    const auto all_done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
    if (SpinUntil(all_done)) return;
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, all_done);
  }

 private:
  // state_ packs (generation << kTaskBits) | num_tasks of the latest job.
  static constexpr int kTaskBits = 16;
  static constexpr uint64_t kTaskMask = (uint64_t{1} << kTaskBits) - 1;

  void Dispatch(int num_tasks, const Task& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const uint64_t state = state_.load(std::memory_order_relaxed);
      while (static_cast<int>(workers_.size()) < num_tasks - 1) {
        workers_.emplace_back(&ThreadPool::WorkerLoop, this, static_cast<int>(workers_.size()),
                              state);
      }
      job_.store(&fn, std::memory_order_relaxed);
      pending_.store(num_tasks - 1, std::memory_order_relaxed);
      const uint64_t generation = (state >> kTaskBits) + 1;
      state_.store((generation << kTaskBits) | static_cast<uint64_t>(num_tasks),
                   std::memory_order_release);
    }
    work_cv_.notify_all();
  }

  // Returns the first state that differs from `seen`, spinning first and then sleeping.
  uint64_t WaitForNewState(uint64_t seen) {
    const auto changed = [&] { return state_.load(std::memory_order_acquire) != seen; };
    if (!SpinUntil(changed)) {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, changed);
    }
    return state_.load(std::memory_order_acquire);
  }

  void WorkerLoop(int index, uint64_t seen) {
    const int task = index + 1;
    Scratch scratch;
    for (;;) {
      seen = WaitForNewState(seen);
      if (task >= static_cast<int>(seen & kTaskMask)) continue;
      (*job_.load(std::memory_order_relaxed))(task, scratch);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu_);  // Orders the wake-up after Run()'s check.
        done_cv_.notify_one();
      }
    }
  }

  std::mutex run_mu_;                               // Held by the Run() that owns the pool.
  Scratch owner_scratch_ ABSL_GUARDED_BY(run_mu_);  // Used by task 0.
  std::mutex mu_;                                   // Pairs with the condition variables.
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> state_{0};
  std::atomic<const Task*> job_{nullptr};
  std::atomic<int> pending_{0};  // Worker tasks of the current job still running.
};

ThreadPool& Pool() {
  static ThreadPool* const pool = new ThreadPool;  // Leaked: workers may outlive static dtors.
  return *pool;
}

std::atomic<int> g_num_threads{0};  // 0 = hardware_concurrency().

int NumThreads() {
  const int n = g_num_threads.load(std::memory_order_relaxed);
  if (n > 0) return std::min(n, kMaxThreads);
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, kMaxThreads);
}

// A grid of rows x cols pieces of C, each a multiple of the register tile.
struct Split {
  int64_t rows;
  int64_t cols;
  int64_t piece_m;
  int64_t piece_n;
};

// Splits C into at most `threads` pieces: the grid with the most non-empty pieces, and among
// those the smallest piece perimeter (which minimises the redundant packing each thread does).
Split ChooseSplit(int64_t m, int64_t n, int threads) {
  const int64_t tiles_m = CeilDiv(m, kMr);
  const int64_t tiles_n = CeilDiv(n, kNr);
  Split best{1, 1, m, n};
  int64_t best_pieces = 1;
  for (int64_t rows = 1; rows <= threads; ++rows) {
    const int64_t cols = threads / rows;
    if (rows > tiles_m || cols > tiles_n) continue;
    const int64_t piece_m = CeilDiv(tiles_m, rows) * kMr;
    const int64_t piece_n = CeilDiv(tiles_n, cols) * kNr;
    const int64_t pieces = CeilDiv(m, piece_m) * CeilDiv(n, piece_n);
    if (pieces > best_pieces ||
        (pieces == best_pieces && piece_m + piece_n < best.piece_m + best.piece_n)) {
      best = {CeilDiv(m, piece_m), CeilDiv(n, piece_n), piece_m, piece_n};
      best_pieces = pieces;
    }
  }
  return best;
}

// The piece of `p` at grid position (row, col) of `split`; may be empty.
Problem Piece(const Problem& p, const Split& split, int64_t row, int64_t col) {
  const int64_t m0 = std::min(p.m, row * split.piece_m);
  const int64_t n0 = std::min(p.n, col * split.piece_n);
  Problem piece = p;
  piece.a.data += m0 * p.a.rs;
  piece.b.data += n0 * p.b.cs;
  piece.c += m0 * p.ldc + n0;
  piece.m = std::min(split.piece_m, p.m - m0);
  piece.n = std::min(split.piece_n, p.n - n0);
  return piece;
}

void ParallelGemm(const Problem& p) {
  const int threads = p.m * p.n * p.k < kMinParallelWork ? 1 : NumThreads();
  const Split split = ChooseSplit(p.m, p.n, threads);
  const int pieces = static_cast<int>(split.rows * split.cols);
  Pool().Run(pieces, [&](int t, Scratch& scratch) {
    const Problem piece = Piece(p, split, t / split.cols, t % split.cols);
    if (piece.m > 0 && piece.n > 0) SerialGemm(piece, scratch);
  });
}

}  // namespace

void GemmF32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
             int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0f) return ScaleC(m, n, beta, c, ldc);
  const View va = trans_a ? View{a, 1, lda} : View{a, lda, 1};
  const View vb = trans_b ? View{b, 1, ldb} : View{b, ldb, 1};
  ParallelGemm({va, vb, c, ldc, m, n, k, alpha, beta});
}

void SetGemmThreads(int n) { g_num_threads.store(std::max(n, 0), std::memory_order_relaxed); }

}  // namespace kiln::cpu
