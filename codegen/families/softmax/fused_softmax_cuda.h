// Generated softmax kernels with an elementwise prologue: out[r, :] = softmax(expr(in...)[r, :])
// over the last dim, the prologue evaluated on load. The softmax fusion codegen
// (codegen/fused_softmax.h) passes the prologue as a kernel-IR program (ops/kernel_ir.h) over
// any number of inputs, rendered as the elementwise skeleton renders its body; the inputs broadcast
// to the output's shape (a [S, S] mask against [B, H, S, S] scores) and may have any strides; the
// output is contiguous.
//
//   FusedSoftmaxKernels k = CompileFusedSoftmaxKernels("kiln_fused_mul_scalar_softmax_0",
//                                                      prologue, kBFloat16, {.row_len = 1024});
//   LaunchFusedSoftmax(k, {scores}, out);
//
// Eager softmax and log_softmax run this skeleton too, with a one-load prologue
// (EagerSoftmaxLastDim): one implementation of the row softmax in kiln.
//
// The row length is baked into the source (or, for eager rows, the longest length of a class of
// lengths, with the length itself read at run time), which picks the layout (PlanSoftmaxRows): each
// row belongs to a group of threads (a power-of-two part of a warp for rows of up to 16 loads, a
// warp up to 1024 elements, else a block of up to 512 threads) that keeps it in registers (at most
// 32 values a thread, 16 unvectorised in a block): every input element is read once, exp is
// evaluated once per element, every output element written once; max and sum reduce with warp
// shuffles (and shared memory across the warps of a block). Rows too long for registers (over
// 16384 elements, 8192 unvectorised) take a three-pass loop kernel, a block per row, that
// re-reads the inputs and evaluates exp twice. Two variants per source: `<base>_vec` moves 16
// bytes per load (when the row length allows; used when every input is contiguous along the row
// and aligned) and `<base>_strided` one element at a time with any strides.
//
// Semantics (torch's, and the CPU kernels'): float32 math (log_softmax sums the exponentials in
// double: log(1 + tiny) keeps the tiny part), max ignores NaN (fmaxf) while the sum propagates it,
// a row of all -inf (fully masked) gives NaN (0/0), and in a row whose max is +inf the +inf
// elements give NaN and the finite ones 0 (log_softmax: -inf).
#pragma once

#include <string>
#include <vector>

#include "ops/kernel_ir.h"
#include "runtime/nvrtc.h"

namespace kiln::cuda_ops {

// Rank of the output, at most (the eager caller flattens contiguous rows to [rows, n] first).
inline constexpr int kMaxSoftmaxRank = 8;

// What a softmax source computes, over rows of which lengths.
struct SoftmaxForm {
  // > 0: every row has this length, baked into the source; 0: the length is read at run time.
  int64_t row_len = 0;
  // With row_len 0: the longest row the register kernels hold (their layout is planned for it,
  // shorter rows pad with -inf), so one source serves a class of lengths at register speed, as
  // eager softmax needs; 0: any length, the three-pass loop kernel.
  int64_t max_row_len = 0;
  bool log = false;  // log_softmax: x - max - log(sum of exp)
  int64_t planned_len() const { return row_len > 0 ? row_len : max_row_len; }
  bool Holds(int64_t len) const;  // whether kernels of this form take rows of `len`
  std::string Describe() const;   // "1024", "at most 2048 (run time)", "any length"
};

// How a kernel variant spreads rows over threads.
struct SoftmaxRowLayout {
  int vec = 1;        // elements per load
  int group = 32;     // threads sharing a row: 1..32 (within a warp) or the whole block
  int iters = 1;      // loads each thread keeps in registers; 0: the three-pass loop kernel
  int threads = 128;  // threads per block
  int rows_per_block() const { return threads / group; }
};
// The layout of rows of `row_len` elements loaded `vec` at a time (row_len % vec == 0).
SoftmaxRowLayout PlanSoftmaxRows(int64_t row_len, int vec);

// The load width of the `_vec` variant for these dtypes and row length: 16 bytes of the widest
// dtype; 0 when there is no such variant (a row length it does not divide, or the loop kernel).
int FusedSoftmaxVectorWidth(const std::vector<DType>& in_types, DType out_type, int64_t row_len);
// The layout of the one-element-a-load (`_strided`) variant: registers for the planned length,
// else the three-pass loop kernel.
SoftmaxRowLayout StridedSoftmaxLayout(const SoftmaxForm& form);

struct FusedSoftmaxKernels {
  cuda::KernelHandle vec = nullptr;  // 16-byte loads; null when the row length does not allow it
  cuda::KernelHandle strided = nullptr;  // element loads, any strides
  SoftmaxRowLayout vec_layout, strided_layout;
  SoftmaxForm form;
  int num_inputs = 0;
  std::string base;  // the kernels' name without the variant suffix
};

// The CUDA source of both variants for a prologue program over the kernel's inputs whose single
// stored value is the softmax's input (exposed so tests compile it with NVRTC without a GPU).
std::string RenderFusedSoftmaxSource(const std::string& kernel_base, const kir::Program& prologue,
                                     DType out_type, const SoftmaxForm& form);
// Compiles (or fetches from the caches) the kernels; throws kiln::Error with the NVRTC log.
FusedSoftmaxKernels CompileFusedSoftmaxKernels(const std::string& kernel_base,
                                               const kir::Program& prologue, DType out_type,
                                               const SoftmaxForm& form);
// The resources of both variants.
std::vector<cuda::KernelFootprint> FusedSoftmaxFootprints(const FusedSoftmaxKernels& k);
// Launches on the current stream; `out` is contiguous with a row length the form holds as its
// last dim.
void LaunchFusedSoftmax(const FusedSoftmaxKernels& k, absl::Span<const Tensor> in,
                        const Tensor& out);

// The eager softmax (log_softmax when `log`) of `x` over its last dim into `out` (contiguous, of
// x's shape and a floating dtype; x any strides, rank <= kMaxSoftmaxRank unless contiguous). The
// kernels of a one-load prologue are compiled once per dtype, log and class of row lengths (the
// next power of two up to 16384, run-time lengths in registers; longer rows one three-pass
// kernel) and kept for the process.
void EagerSoftmaxLastDim(const Tensor& x, const Tensor& out, bool log);

}  // namespace kiln::cuda_ops
