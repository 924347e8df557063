// The elementwise kernel family on CUDA: kernels generated from a kernel-IR program
// (ops/kernel_ir.h) over any number of inputs and outputs, compiled with NVRTC on first use (then
// cached in memory and on disk, see runtime/nvrtc.h). Eager elementwise ops are one-instruction
// programs; the compiler's fused groups are longer ones. Four skeletons per program:
//   _contig    16-byte vectorised loads/stores, every operand contiguous, of the iteration shape;
//   _small     the same operands when the work fits one block (one vector a thread, straight-line
//              code, 32-bit indices): a launch whose cost is mostly fixed;
//   _rows      operands collapsed to [rows, cols] with unit inner stride (or broadcast along the
//              row) and any row stride, still vectorised: slices of a merged GEMM output, a bias or
//              a mask broadcast over leading dims;
//   _strided   any strides/broadcasts, div/mod per element (64- and 32-bit index variants),
//              compiled only when first needed.
// Kernel parameters are generated per program (one pointer per operand; the rows and strided
// indexers sized to the operand count), so the index arithmetic is unrolled over the operands the
// kernel really has. The same renderer serves the contiguous() copy (a load stored as is).
//
// The sources are rendered by elementwise_source.cc (host code, in every build); compiling and
// launching them by elementwise_cuda.cc (the CUDA backend).
//
//   ElementwiseKernels k = CompileElementwiseKernels("kiln_fused_gelu_mul_0", program);
//   LaunchElementwise(k, {x, u}, {out});
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ops/kernel_ir.h"
#include "runtime/nvrtc.h"

namespace kiln::cuda_ops {

// KernelFn for every elementwise row (and kContiguous): out = row(inputs), any strides.
void Elementwise(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                 const OpAttrs& a);
void Copy(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);

// Inputs plus outputs of one generated elementwise kernel, at most (its parameters stay well
// under the 4 KiB kernel-parameter limit). The fusion pass cuts groups at this size.
inline constexpr int kMaxKernelOperands = 32;
// Rank of the iteration space, at most (after collapsing contiguous dims).
inline constexpr int kMaxKernelRank = 8;
// Threads of the _small kernel's one block, at most: contiguous work of up to this many vectors
// (the scalar tail's thread included) takes it.
inline constexpr int kSmallKernelThreads = 256;

struct ElementwiseKernels {
  cuda::KernelHandle contig = nullptr, small = nullptr, rows = nullptr;
  int vec = 1;  // elements per thread in the vectorised kernels
  int num_inputs = 0, num_outputs = 0;
  bool scalar_params = false;  // the kernels take scalar, iscalar, dscalar (before n)
  struct General {             // the strided kernels, compiled on first use
    std::once_flag once;
    std::string source, base;
    cuda::KernelHandle strided = nullptr, strided32 = nullptr, stridedv = nullptr;
  };
  std::shared_ptr<General> general;
};
// Compiles (or fetches from the caches) the kernels of `program`; throws kiln::Error with the
// NVRTC log on failure.
ElementwiseKernels CompileElementwiseKernels(const std::string& kernel_base,
                                             const kir::Program& program);
// The resources of the vectorised kernels (the strided ones compile on first use).
std::vector<cuda::KernelFootprint> ElementwiseFootprints(const ElementwiseKernels& k);
// Launches on the current stream: outputs = program(inputs) for any strides/broadcasts of the
// inputs; every output has the iteration shape (out[0]'s) and any strides.
// `scalar` feeds float instructions' $scalar, `iscalar` integer ones' when the scalar is
// integral, `dscalar` when it is not (eager rows; fused kernels bake their scalars in).
void LaunchElementwise(const ElementwiseKernels& k, absl::Span<const Tensor> in,
                       absl::Span<const Tensor> out, float scalar = 0, int64_t iscalar = 0,
                       double dscalar = 0);

// Elements per thread in the vectorised kernels of `program` (16-byte accesses of its widest
// operand).
int ElementwiseVectorWidth(const kir::Program& program);
// Rows each block-row of a _rows kernel handles per iteration (KILN_EW_ROWS_UNROLL, an A/B knob):
// the launch sizes its grid by it.
int ElementwiseRowsUnroll();

// Horizontal fusion (codegen/families/pointwise/horizontal_fusion.h): one kernel running several
// programs ("segments", each over its own iteration space, any strides) one after another: the
// threads walk segment 0's elements, then segment 1's, each through its segment's strided indexer
// (32-bit index math). For small independent kernels of a decode step (RoPE of q and of k).
struct ComboKernel {
  cuda::KernelHandle kernel = nullptr;
  std::vector<int> num_inputs, num_outputs;  // per segment
};
ComboKernel CompileComboKernel(const std::string& kernel_base,
                               const std::vector<kir::Program>& segments);
// Launches on the current stream: segment k computes outputs[k] = program k(inputs[k]), every
// output of a segment of its iteration shape (outputs[k][0]'s).
void LaunchCombo(const ComboKernel& k, const std::vector<std::vector<Tensor>>& inputs,
                 const std::vector<std::vector<Tensor>>& outputs);
std::string RenderComboSource(const std::string& kernel_base,
                              const std::vector<kir::Program>& segments);

// The CUDA source for a program (exposed so tests can compile every variant with NVRTC without a
// GPU, and for the compiler's dumps).
enum ElementwiseVariants { kFastVariants = 1, kGeneralVariants = 2, kAllVariants = 3 };
std::string RenderElementwiseSource(const std::string& kernel_base, const kir::Program& program,
                                    ElementwiseVariants variants = kAllVariants);
// The one-instruction program of an eager elementwise row (scalar as a kernel parameter).
kir::Program RowProgram(const OpDef& def, const std::vector<DType>& in_types, DType out_type,
                        const OpAttrs& attrs);

}  // namespace kiln::cuda_ops
