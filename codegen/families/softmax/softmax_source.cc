// The fused softmax family's CUDA source (see fused_softmax_cuda.h): the register and loop
// kernels rendered around a prologue program, and the row layouts they are planned with. Host
// code only (a build without CUDA renders the same sources for its dumps); compiling and
// launching them is fused_softmax_cuda.cc.
#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "codegen/families/softmax/fused_softmax_cuda.h"
#include "ops/cuda/kernel_render.h"
#include "runtime/status.h"

namespace kiln::cuda_ops {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 4;      // blocks of the warp layouts: 128 threads
constexpr int kMaxBlockThreads = 512;  // block-per-row layouts, at most
constexpr int kMaxPerThread = 32;      // row values a thread keeps in registers, at most
constexpr int64_t kWarpRowMax = 1024;  // longest row a warp holds
constexpr int kLoopThreads = 512;      // the three-pass loop kernel
constexpr int kMaxInputs = 31;         // like the elementwise skeleton (32 operands)
// Each kernel's first statement: programmatic dependent launch's wait (runtime/cuda.h).
constexpr char kEnter[] = "  kiln_grid_dependency_sync();\n";

// Device helpers of the fused softmax sources (after the shared prelude).
constexpr char kSoftmaxHelpers[] = R"(
__device__ __forceinline__ float kiln_neg_inf() { return __int_as_float(0xff800000); }
// Max (float, ignoring NaN, like torch) or sum (float or double) over the kGroup threads of a
// row: aligned lanes of a warp, or the whole block (every thread of it must call).
template <bool kMax, typename T>
__device__ __forceinline__ T kiln_combine(T a, T b) {
  if constexpr (kMax) return fmaxf(a, b);
  else return a + b;
}
template <int kGroup, bool kMax, typename T>
__device__ __forceinline__ T kiln_row_reduce(T v) {
  constexpr int kLanes = kGroup < 32 ? kGroup : 32;
  #pragma unroll
  for (int m = kLanes / 2; m > 0; m /= 2) {
    v = kiln_combine<kMax>(v, __shfl_xor_sync(0xffffffffu, v, m));
  }
  if constexpr (kGroup > 32) {
    __shared__ T partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();  // a previous reduction may still be reading `partial`
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < kGroup / 32 ? partial[lane] : (kMax ? T(kiln_neg_inf()) : T(0));
    #pragma unroll
    for (int m = 16; m > 0; m /= 2) {
      v = kiln_combine<kMax>(v, __shfl_xor_sync(0xffffffffu, v, m));
    }
  }
  return v;
}
// The sum of exponentials: float, or double for log_softmax (log(1 + tiny) keeps the tiny part).
template <bool kLog> struct KilnSoftmaxSum { typedef float type; };
template <> struct KilnSoftmaxSum<true> { typedef double type; };
// Softmax (kLog: log_softmax) of a row held in registers (-inf in the slots past its end): exp
// once per element.
template <int kGroup, int kIters, int kVec, bool kLog>
__device__ __forceinline__ void kiln_softmax_row(float (&v)[kIters][kVec]) {
  typedef typename KilnSoftmaxSum<kLog>::type Sum;
  float mx = kiln_neg_inf();
  #pragma unroll
  for (int it = 0; it < kIters; ++it) {
    #pragma unroll
    for (int j = 0; j < kVec; ++j) mx = fmaxf(mx, v[it][j]);
  }
  mx = kiln_row_reduce<kGroup, true>(mx);
  if (mx == kiln_neg_inf()) mx = 0.f;  // a row of all -inf gives NaN (0/0), like torch
  // A +inf max: +inf elements leave the sum, which then becomes +inf, so they give NaN and the
  // finite ones 0 (log_softmax: -inf), like torch (softmax([inf, 1]) = [nan, 0]). The select that
  // drops them costs two instructions per element, so it runs only where some row of the warp
  // needs it: the branch is uniform over the warp (a block's rows share mx), so every lane still
  // reaches the sum's shuffles.
  const bool inf_max = mx == __int_as_float(0x7f800000);
  Sum sum = 0;
  if (kGroup >= 32 ? inf_max : __any_sync(0xffffffffu, inf_max)) {
    #pragma unroll
    for (int it = 0; it < kIters; ++it) {
      #pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float d = v[it][j] - mx, e = expf(d);
        sum += v[it][j] == __int_as_float(0x7f800000) ? Sum(0) : Sum(e);
        v[it][j] = kLog ? d : e;
      }
    }
  } else {
    #pragma unroll
    for (int it = 0; it < kIters; ++it) {
      #pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float d = v[it][j] - mx, e = expf(d);
        sum += Sum(e);
        v[it][j] = kLog ? d : e;
      }
    }
  }
  sum = kiln_row_reduce<kGroup, false>(sum);
  if (inf_max) sum += Sum(mx);
  const float scale = kLog ? (float)log(sum) : 1.f / (float)sum;
  #pragma unroll
  for (int it = 0; it < kIters; ++it) {
    #pragma unroll
    for (int j = 0; j < kVec; ++j) v[it][j] = kLog ? v[it][j] - scale : v[it][j] * scale;
  }
}
)";

// KilnRowIndexer and kiln_row_offsets for `n` inputs (must match RowIndexer::Params): 32-bit
// div/mod (much cheaper) while row indices fit (`narrow` is rows < 2^32).
std::string RowIndexerSource(int n) {
  std::string zero, add;
  for (int i = 0; i < n; ++i) {
    absl::StrAppend(&zero, "o[", i, "] = 0; ");
    absl::StrAppend(&add, "    o[", i, "] += c * ix.strides[", i, "][d];\n");
  }
  return absl::StrCat(
      "struct KilnRowIndexer { long long rank; long long sizes[", kMaxSoftmaxRank - 1,
      "]; long long strides[", n, "][", kMaxSoftmaxRank - 1, "]; long long inner[", n, "]; };\n",
      "__device__ __forceinline__ void kiln_row_offsets(const KilnRowIndexer& ix, long long row,",
      " bool narrow, long long (&o)[", n, "]) {\n  ", zero, "\n",
      // Unrolled over every possible dim: an index known at compile time keeps the indexer in the
      // parameter space (a loop to ix.rank made each thread copy its 128 bytes to the stack, as
      // much memory traffic as the softmax itself on 1024-element rows).
      "  #pragma unroll\n  for (int d = ", kMaxSoftmaxRank - 2, "; d >= 0; --d) {\n",
      "    if (d >= ix.rank) continue;\n    long long c;\n",
      // The outermost dim takes what is left of the row index: no division (none at all for
      // rows that merged into one dim, the contiguous case).
      "    if (d == 0) {\n      c = row;\n    } else if (narrow) {\n",
      "      c = (unsigned)row % (unsigned)ix.sizes[d];\n",
      "      row = (unsigned)row / (unsigned)ix.sizes[d];\n    } else {\n",
      "      c = row % ix.sizes[d];\n      row /= ix.sizes[d];\n    }\n", add, "  }\n}\n");
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int NextPow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// ---- Rendering -------------------------------------------------------------------------------

}  // namespace

SoftmaxRowLayout StridedSoftmaxLayout(const SoftmaxForm& form) {
  return form.planned_len() > 0 ? PlanSoftmaxRows(form.planned_len(), 1)
                                : SoftmaxRowLayout{1, kLoopThreads, 0, kLoopThreads};
}

namespace {

std::string Params(const std::vector<DType>& in, DType out) {
  std::string s = absl::StrCat(StorageType(out), "* __restrict__ out");
  for (size_t i = 0; i < in.size(); ++i) {
    absl::StrAppend(&s, ", const ", StorageType(in[i]), "* __restrict__ in", i);
  }
  return s + ", long long rows, long long row_len, KilnRowIndexer ix";
}

// The prologue's values at one element (`element(i)`: input i's stored element there), then
// "<target> = <the softmax input>;".
template <typename F>
std::string Prologue(const kir::Program& p, F&& element, const std::string& target,
                     const std::string& pad) {
  return absl::StrCat(RenderValues(p, element, pad), pad, target, "(float)",
                      ValueRef(p, p.outputs()[0]), ";\n");
}

// The loop over a thread's slots of its row: slot `it` holds vector (or element) it * kGroup +
// lane of the row, which starts at column c.
constexpr char kSlotLoop[] =
    "    #pragma unroll\n    for (int it = 0; it < kIters; ++it) {\n"
    "      const long long c = ((long long)it * kGroup + lane) * kVec;\n"
    "      const bool ok = live && c < kN;\n";

// Loads into r<i>[it] (a 16-byte vector or one element of input i), then the prologue into
// v[it][j] (-inf past the row's end). With more than four slots every load is issued before any
// is used, as in the norms' row kernels (reduce_kernels.cu); with fewer, one loop needs fewer
// registers.
std::string RowLoads(const SoftmaxRowLayout& l, const kir::Program& p) {
  const bool vec = l.vec > 1;
  const std::vector<DType>& in = p.input_types();
  std::string decls, load;
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string r =
        vec ? absl::StrCat("KilnRaw<", DTypeSize(in[i]) * l.vec, ">") : StorageType(in[i]);
    absl::StrAppend(&decls, "    ", r, " r", i, "[kIters];\n");
    // Vectors index an array of vectors: a cast address (`*(V*)(p + c)`) lost its alignment
    // once in NVRTC's output (byte stores).
    const std::string at =
        vec ? absl::StrCat("((const ", r, "*)(in", i, " + o[", i, "]))[c / kVec]")
            : absl::StrCat("in", i, "[o[", i, "] + c * ix.inner[", i, "]]");
    absl::StrAppend(&load, "      r", i, "[it] = ok ? ", at, " : ", r, "{};\n");
  }
  const std::string prologue = Prologue(
      p,
      [&](int i) {
        return vec ? absl::StrCat("((const ", StorageType(in[i]), "*)&r", i, "[it])[j]")
                   : absl::StrCat("r", i, "[it]");
      },
      "const float x = ", "        ");
  const std::string compute =
      absl::StrCat("      #pragma unroll\n      for (int j = 0; j < kVec; ++j) {\n", prologue,
                   "        v[it][j] = ok ? x : kiln_neg_inf();\n      }\n");
  if (l.iters > 4)
    return absl::StrCat(decls, kSlotLoop, load, "    }\n", kSlotLoop, compute, "    }\n");
  return absl::StrCat(decls, kSlotLoop, load, compute, "    }\n");
}

// The row length: baked into the source (n > 0) or read at run time (n == 0, a symbolic dim).
std::string RowLength(int64_t n) {
  return n > 0 ? absl::StrCat("  constexpr long long kN = ", n, ";\n")
               : "  const long long kN = row_len;\n";
}

// Stores v[it] (the probabilities) as the output dtype, a 16-byte vector or one element a slot.
std::string RowStores(const SoftmaxRowLayout& l, DType out) {
  std::string s = absl::StrCat(kSlotLoop, "      if (!ok) continue;\n");
  if (l.vec == 1) {
    return absl::StrCat(s, "      out[row * kN + c] = ", StoreExpr(out, "v[it][0]"), ";\n    }\n");
  }
  const std::string w = absl::StrCat("KilnRaw<", DTypeSize(out) * l.vec, ">");
  return absl::StrCat(s, "      ", w, " w;\n      #pragma unroll\n",
                      "      for (int j = 0; j < kVec; ++j) ((", StorageType(out),
                      "*)&w)[j] = ", StoreExpr(out, "v[it][j]"), ";\n", "      ((", w,
                      "*)(out + row * kN))[c / kVec] = w;\n    }\n");
}

// The register-row kernel: groups of kGroup threads take rows in a block-uniform loop (a thread
// past the last row still takes part in its group's shuffles), load and transform them, run the
// softmax in registers and store.
std::string RegisterKernel(const std::string& name, const SoftmaxRowLayout& l,
                           const kir::Program& p, DType out, const SoftmaxForm& form) {
  return absl::StrCat(
      "extern \"C\" __global__ void __launch_bounds__(", l.threads, ") ", name, "(",
      Params(p.input_types(), out), ") {\n", kEnter, RowLength(form.row_len),
      "  constexpr int kVec = ", l.vec, ", kGroup = ", l.group, ", kIters = ", l.iters,
      ", kRows = ", l.rows_per_block(), ";\n", "  const int lane = threadIdx.x % kGroup;\n",
      "  for (long long first = (long long)blockIdx.x * kRows; first < rows;",
      " first += (long long)gridDim.x * kRows) {\n",
      "    const long long row = first + threadIdx.x / kGroup;\n",
      "    const bool live = row < rows;\n", "    long long o[", p.num_inputs(), "];\n",
      "    kiln_row_offsets(ix, live ? row : 0, rows < (1ll << 32), o);\n",
      "    float v[kIters][kVec];\n", RowLoads(l, p), "    kiln_softmax_row<kGroup, kIters, kVec, ",
      form.log ? "true" : "false", ">(v);\n", RowStores(l, out), "  }\n}\n");
}

// The three-pass loop kernel for rows too long for registers (or of any length known only at run
// time): max, sum, write, each pass re-reading the inputs and evaluating the prologue.
std::string LoopKernel(const std::string& name, const kir::Program& p, DType out,
                       const SoftmaxForm& form) {
  const std::string x = Prologue(
      p, [](int i) { return absl::StrCat("in", i, "[o[", i, "] + c * ix.inner[", i, "]]"); },
      "const float x = ", "      ");
  const std::string each = "    for (long long c = threadIdx.x; c < kN; c += kThreads) {\n";
  const std::string sum_type = form.log ? "double" : "float";
  const std::string result = form.log ? "(x - mx) - scale" : "expf(x - mx) * scale";
  return absl::StrCat(
      "extern \"C\" __global__ void __launch_bounds__(", kLoopThreads, ") ", name, "(",
      Params(p.input_types(), out), ") {\n", kEnter, RowLength(form.row_len),
      "  constexpr int kThreads = ", kLoopThreads, ";\n",
      "  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {\n", "    long long o[",
      p.num_inputs(), "];\n", "    kiln_row_offsets(ix, row, rows < (1ll << 32), o);\n",
      "    float mx = kiln_neg_inf();\n", each, x, "      mx = fmaxf(mx, x);\n    }\n",
      "    mx = kiln_row_reduce<kThreads, true>(mx);\n",
      "    if (mx == kiln_neg_inf()) mx = 0.f;  // a row of all -inf gives NaN, like torch\n",
      "    ", sum_type, " sum = 0;\n", each, x, "      sum += x == __int_as_float(0x7f800000) ? ",
      sum_type, "(0) : ", sum_type, "(expf(x - mx));\n    }\n",
      "    sum = kiln_row_reduce<kThreads, false>(sum);\n",
      "    if (mx == __int_as_float(0x7f800000)) sum += mx;  // a +inf max gives [nan, 0, ...]\n",
      "    const float scale = ", form.log ? "(float)log(sum)" : "1.f / (float)sum", ";\n", each, x,
      "      out[row * kN + c] = ", StoreExpr(out, result), ";\n    }\n", "  }\n}\n");
}

}  // namespace

bool SoftmaxForm::Holds(int64_t len) const {
  return row_len > 0 ? len == row_len : max_row_len == 0 || len <= max_row_len;
}

std::string SoftmaxForm::Describe() const {
  if (row_len > 0) return absl::StrCat(row_len);
  if (max_row_len > 0) return absl::StrCat("at most ", max_row_len, " (read at run time)");
  return "any length (read at run time)";
}

SoftmaxRowLayout PlanSoftmaxRows(int64_t n, int vec) {
  const int64_t vecs = CeilDiv(n, vec);
  const int warp_block = kWarpSize * kWarpsPerBlock;
  if (vecs <= kWarpSize / 2) return {vec, NextPow2(vecs), 1, warp_block};
  if (n <= kWarpRowMax) {
    return {vec, kWarpSize, static_cast<int>(CeilDiv(vecs, kWarpSize)), warp_block};
  }
  // A block: 16 values a thread unvectorised (more spill when loaded one at a time).
  const int max_iters = (vec == 1 ? kMaxPerThread / 2 : kMaxPerThread) / vec;
  if (vecs > int64_t{kMaxBlockThreads} * max_iters) return {vec, kLoopThreads, 0, kLoopThreads};
  const int threads = static_cast<int>(CeilDiv(CeilDiv(vecs, max_iters), kWarpSize) * kWarpSize);
  return {vec, threads, static_cast<int>(CeilDiv(vecs, threads)), threads};
}

int FusedSoftmaxVectorWidth(const std::vector<DType>& in, DType out, int64_t n) {
  int64_t widest = DTypeSize(out);
  for (DType t : in) widest = std::max(widest, DTypeSize(t));
  const int vec = static_cast<int>(16 / widest);
  return vec > 1 && n > 0 && n % vec == 0 && PlanSoftmaxRows(n, vec).iters > 0 ? vec : 0;
}

std::string RenderFusedSoftmaxSource(const std::string& base, const kir::Program& p, DType out,
                                     const SoftmaxForm& form) {
  KILN_CHECK(p.num_inputs() >= 1 && p.num_inputs() <= kMaxInputs && p.num_outputs() == 1 &&
                 form.row_len >= 0 && form.max_row_len >= 0,
             "fused softmax ", base, ": needs 1..", kMaxInputs,
             " inputs, one prologue value and row lengths >= 0 (0: known at run time), got ",
             p.num_inputs(), " inputs, ", p.num_outputs(), " values, row length ", form.row_len,
             " (at most ", form.max_row_len, ")");
  std::string src =
      absl::StrCat(KernelPrelude(), kSoftmaxHelpers, RowIndexerSource(p.num_inputs()));
  const SoftmaxRowLayout strided = StridedSoftmaxLayout(form);
  absl::StrAppend(&src, strided.iters == 0
                            ? LoopKernel(base + "_strided", p, out, form)
                            : RegisterKernel(base + "_strided", strided, p, out, form));
  if (const int vec = FusedSoftmaxVectorWidth(p.input_types(), out, form.planned_len()); vec > 0) {
    absl::StrAppend(&src, RegisterKernel(base + "_vec", PlanSoftmaxRows(form.planned_len(), vec), p,
                                         out, form));
  }
  return src;
}

}  // namespace kiln::cuda_ops
