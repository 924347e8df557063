// kiln's GEMV for linear with few rows (token-by-token decode): out[m, n] = act(x[m, k] · w[n, k]ᵀ
// + bias[n]) (+ residual[m, n]) for 1 <= m <= kGemvMaxRows, over raw device pointers
// (ops/cuda/matmul_cuda.cc's Linear adapts kiln tensors and decides when to use it). A cuBLASLt
// GEMM with M = 1 reads the weights at about a fifth of the H200's bandwidth; this kernel is built
// to stream them once at full speed, every x row riding along.
//
//   GemvArgs a{x, ldx, w, ldw, bias, 1, out, nullptr, m, n, k, ElemType::kBF16, GemvAct::kNone,
//              sm_count};
//   cudaError_t err = Gemv(a, stream);
//
// x, w, bias and out share one dtype (float32, float16 or bfloat16); products accumulate in
// float32, the bias, the activation and the residual are applied in float32 and the result is
// rounded once. x rows and w rows are `ldx` / `ldw` elements apart with unit column stride; out
// and the residual are contiguous [m, n] (the residual may be out itself). Any k >= 1, n >= 1 and
// any element alignment of the pointers and leading dims is correct; 16-byte loads are used where
// the pointer and leading dim allow them. relu keeps NaN (as kiln's relu op does); gelu_tanh, gelu
// and silu are kiln's formulas (ops/cuda/kernel_render.cc).
//
// A gated product (a GLU MLP's gate and up projections at decode, w_up set): out[m, n] =
// act(x · wᵀ + bias) · (x · w_upᵀ + bias_up), both sums and the product in float32, rounded once,
// so the [m, 2n] linear output never reaches memory. w's rows are the gate's, w_up's (same ldw,
// same bias_stride) the up's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/elem_type.h"
#include "ops/cuda/gemv_limits.h"

namespace kiln::cuda_kernels {

enum class GemvAct { kNone, kRelu, kGeluTanh, kGelu, kSilu };
enum class GemvNorm { kNone, kLayer, kRms };  // a norm of each x row applied as it is read

struct GemvArgs {
  const void* x;  // [m, k], element (r, i) at x[r * ldx + i]
  int64_t ldx;
  const void* w;  // [n, k], element (c, i) at w[c * ldw + i]
  int64_t ldw;
  const void* bias;  // [n], element c at bias[c * bias_stride]; nullptr: no bias
  int64_t bias_stride;
  void* out;             // [m, n] contiguous
  const void* residual;  // [m, n] contiguous, added last; nullptr: none
  int64_t m, n, k;
  ElemType type;  // kF32, kF16 or kBF16
  GemvAct act;
  int sm_count;  // the device's: small n splits each column over more warps (gemv_kernels.cu)
  // Launch as a programmatic dependent launch (runtime/cuda.h): the kernel loads its first
  // weights (preload_weights) or prefetches them into L2 while the previous kernel finishes, then
  // waits for it.
  bool dependent_launch = false;
  // No kernel that may still be running writes w (matmul_cuda.cc PreloadWeights says when): each
  // thread then loads its first weight vectors into registers before the dependency wait, so that
  // their round trip to HBM overlaps the previous kernel's tail. false: only an L2 prefetch (a
  // hint, never stale) comes before the wait.
  bool preload_weights = false;
  // 2..8 rows of float16 / bfloat16 with 16-byte aligned rows and k a multiple of 8 run on tensor
  // cores (mma.m16n8k16: the weights as A, the x rows as B), the FMA loop's instructions gone;
  // false keeps the FMA loop (KILN_GEMV_MMA=off, an A/B).
  bool tensor_cores = true;
  // A layer norm or RMS norm over each x row, applied as the row is read: x is replaced by the
  // eager norm's output, (x - mean) / sqrt(var + eps) · norm_weight + norm_bias rounded to the
  // dtype (mean 0 for RMS). Every CTA computes the statistics of the x rows itself (k elements of
  // at most kGemvMaxRows rows, from L2) and normalises them once into shared memory (m·k elements,
  // at most kMaxNormSharedBytes), then loops over column tiles: cheaper than a launch, so a
  // decode step's norm and the linear after it are one kernel.
  // One row of float16 / bfloat16 (aligned rows, norm weight and bias; k whole 16-byte vectors)
  // folds the norm into its column sums instead (gemv_kernels.cu FoldedNormGemvKernel): no
  // prologue, no shared memory; the normalised row is not rounded to the dtype first. So do 2..8
  // rows of bfloat16 on tensor cores with an RMS norm (FoldedRmsMmaGemvKernel): γ·x rounded to
  // bfloat16 is the mma's B operand, each row's 1 / rms scales its sums. false keeps the prologue
  // (KILN_GEMV_NORM_FOLD=off, an A/B).
  bool fold_norm = true;
  GemvNorm norm = GemvNorm::kNone;
  const void* norm_weight = nullptr;  // [k] contiguous, or nullptr
  const void* norm_bias = nullptr;    // [k] contiguous, or nullptr (layer norm only)
  float norm_eps = 0.f;
  // The up half of a gated product (see above): [n, k] rows `ldw` apart, and its bias ([n],
  // `bias_stride` apart; set exactly when `bias` is). nullptr: a plain GEMV. A gated GEMV has no
  // residual and no chain takes it; it runs the FMA loop, but for 2..8 rows of bfloat16 after an
  // RMS norm, which run on tensor cores with the norm folded (GatedFoldedRmsMmaGemvKernel).
  const void* w_up = nullptr;
  const void* bias_up = nullptr;
};

// Launches the GEMV on `stream`; cudaErrorInvalidValue for sizes outside the contract (m not in
// [1, kGemvMaxRows], n < 1, k < 1, a null pointer, a norm bias without a layer norm, a gated
// product with a residual or with a bias on one half only), else the launch's error.
cudaError_t Gemv(const GemvArgs& args, cudaStream_t stream);

// A chain of one-row GEMVs as one cooperative launch (gemv_kernels.cu GemvChainKernel), in order:
// op i may read (as any operand) or overwrite what ops before it wrote or read; the CTAs meet at a
// grid barrier before each op whose byte ranges overlap so with an op since the last barrier, and
// pull the ops' weights into L2 up front. Each op computes what Gemv(op) computes, bit for
// bit. The ops it takes (GemvChainTakes): valid GemvArgs of one row (m == 1) of float16 or
// bfloat16, with no norm or one the GEMV folds (fold_norm, 16-byte aligned x, w rows, norm weight
// and bias, k whole 16-byte vectors); one dtype for the chain. dependent_launch is ignored (a
// cooperative launch waits for its predecessor). A single op launches as Gemv.
constexpr int kGemvChainMaxOps = 8;
bool GemvChainTakes(const GemvArgs& op);
// cudaErrorInvalidValue for count outside [1, kGemvChainMaxOps] or an op the chain does not take,
// else the launch's error.
// `launches` (may be null): the kernels it launched (1, or count where the device refused the
// cooperative launch and the GEMVs ran one by one).
cudaError_t GemvChain(const GemvArgs* ops, int count, cudaStream_t stream, int* launches = nullptr);
// Where GemvChain puts its grid barriers (host code, no device needed): barrier_before[i] when op
// i reads what an op since the last barrier writes, or writes what one reads or writes (byte
// ranges of x, w, bias, residual, the norm's weight and bias, out; one row each).
void GemvChainBarriers(const GemvArgs* ops, int count, bool* barrier_before);

// A one-thread kernel that waits `ns` nanoseconds on the device. A timing aid: launches queued
// behind it start back to back once it ends, so events around them measure device time alone,
// not the host's launch cost.
cudaError_t DeviceDelay(int64_t ns, cudaStream_t stream);
// For race tests: one CTA that lets the next kernel on `stream` start at once (the trigger of a
// programmatic dependent launch), waits `ns` nanoseconds, then writes `value` to the `count`
// 16-bit words at `p`.
cudaError_t FillAfterDelay(uint16_t* p, int64_t count, uint16_t value, int64_t ns,
                           cudaStream_t stream);

}  // namespace kiln::cuda_kernels
