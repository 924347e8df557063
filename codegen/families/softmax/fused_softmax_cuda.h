// Generated softmax kernels with an elementwise prologue: out[r, :] = softmax(expr(in...)[r, :])
// over the last dim, the prologue evaluated on load. The softmax fusion codegen
// (codegen/fused_softmax.h) passes the prologue as a kernel-IR program (ops/kernel_ir.h) over
// any number of inputs, rendered as the elementwise skeleton renders its body; the inputs broadcast
// to the output's shape (a [S, S] mask against [B, H, S, S] scores) and may have any strides; the
// output is contiguous.
//
//   FusedSoftmaxKernels k = CompileFusedSoftmaxKernels("kiln_fused_mul_scalar_softmax_0",
//                                                      prologue, kBFloat16, /*row_len=*/1024);
//   LaunchFusedSoftmax(k, {scores}, out);
//
// The row length is baked into the source, which picks the layout (PlanSoftmaxRows): each row
// belongs to a group of threads (a power-of-two part of a warp for rows of up to 16 loads, a warp
// up to 1024 elements, else a block of up to 512 threads) that keeps it in registers (at most 32
// values a thread, 16 unvectorised in a block): every input element is read once, exp is
// evaluated once per element, every output element written once; max and sum reduce with warp
// shuffles (and shared memory across the warps of a block). Rows too long for registers (over
// 16384 elements, 8192 unvectorised) take a three-pass loop kernel, a block per row, that
// re-reads the inputs and evaluates exp twice. Two variants per source: `<base>_vec` moves 16
// bytes per load (when the row length allows; used when every input is contiguous along the row
// and aligned) and `<base>_strided` one element at a time with any strides.
//
// Semantics are the eager softmax's (ops/cuda/reduce_kernels.h): float32 math, max ignores NaN
// (fmaxf) while the sum propagates it, and a row of all -inf (fully masked) gives NaN (0/0), like
// torch.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "ops/kernel_ir.h"
#include "runtime/nvrtc.h"

namespace kiln::cuda_ops {

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

struct FusedSoftmaxKernels {
  cudaKernel_t vec = nullptr;      // 16-byte loads; null when the row length does not allow it
  cudaKernel_t strided = nullptr;  // element loads, any strides
  SoftmaxRowLayout vec_layout, strided_layout;
  int64_t row_len = 0;  // 0: any row length (read at run time; the three-pass loop kernel)
  int num_inputs = 0;
  std::string base;  // the kernels' name without the variant suffix
};

// The CUDA source of both variants for a prologue program over the kernel's inputs whose single
// stored value is the softmax's input (exposed so tests compile it with NVRTC without a GPU).
// `row_len` 0 makes the row length a run-time parameter.
std::string RenderFusedSoftmaxSource(const std::string& kernel_base, const kir::Program& prologue,
                                     DType out_type, int64_t row_len);
// Compiles (or fetches from the caches) the kernels; throws kiln::Error with the NVRTC log.
FusedSoftmaxKernels CompileFusedSoftmaxKernels(const std::string& kernel_base,
                                               const kir::Program& prologue, DType out_type,
                                               int64_t row_len);
// The resources of both variants.
std::vector<cuda::KernelFootprint> FusedSoftmaxFootprints(const FusedSoftmaxKernels& k);
// Launches on the current stream; `out` is contiguous with the compiled row length as last dim.
void LaunchFusedSoftmax(const FusedSoftmaxKernels& k, absl::Span<const Tensor> in,
                        const Tensor& out);

}  // namespace kiln::cuda_ops
