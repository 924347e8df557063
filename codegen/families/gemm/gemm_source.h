// The GEMM family's sm_90a kernel source (Hopper: TMA, mbarriers, wgmma, warp specialisation,
// persistent tiles): out[m, n] = sum_k a[m, k] * w[n, k] (+ bias[n]), a and w K-major (a linear's
// x and weight), bf16 or f16 in, float32 accumulators, the input dtype out.
//
// One CTA per SM loops over output tiles of bm x bn (grouped along M for L2 reuse). Warpgroup 0
// is the producer: one thread issues TMA copies of a's [bm, 64] and w's [bn, 64] boxes (128-byte
// swizzle) into a ring of `stages` shared-memory slots, each guarded by a "full" mbarrier (the
// copy's bytes arrived) and an "empty" one (both consumers are done with it); it gives most of its
// registers away (setmaxnreg). Warpgroups 1..consumers each own 64 rows of the tile: per slot,
// four wgmma.mma_async m64n<bn>k16 read both operands from shared memory through descriptors,
// the slot before is released once the next slot's group is issued (wgmma.wait_group 1), and at
// the tile's end the epilogue (a kernel-IR program over each element's accumulator, the bias and
// a residual: GemmConfig::epilogue) computes the outputs, rounded once, staged in shared memory and
// stored by TMA, asynchronously: the consumers go on to the next tile, whose slots the producer
// is already loading. In the ping-pong form each consumer owns whole tiles of 64 rows, taken in
// turn: consumer 0's epilogue runs while consumer 1's mainloop keeps the tensor cores busy.
//
// Host code only (renders text; gemm_cuda.h compiles and launches it). sm_90a code runs on
// compute capability 9.0 exactly: other GPUs keep cuBLASLt.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ops/kernel_ir.h"
#include "runtime/dtype.h"

namespace kiln::cuda_ops {

// One instance of the kernel: a template's parameters, baked into the source.
struct GemmConfig {
  DType dtype = DType::kBFloat16;  // a, w and out (bf16 or f16)
  int bn = 256;                    // tile columns: 64..256, a multiple of 64 (wgmma's n)
  int consumers = 2;               // consumer warpgroups, 64 tile rows each (bm = 64 * consumers)
  // Ping-pong: the two consumers take alternate tiles of 64 rows instead of sharing one of 128,
  // their mainloops in turn (named barriers), so that one's epilogue runs under the other's
  // mainloop. Needs consumers == 2.
  bool pingpong = false;
  int stages = 3;     // shared-memory slots of [bm + bn, 64] elements
  bool bias = false;  // out += bias[n] (the dtype) before rounding
  // GeGLU: w's rows interleave gate and up in groups of 8 (InterleaveGeglu, gemm_cuda.h) and
  // out [m, n / 2] = gelu_tanh(gate) * up, from the float32 accumulators, rounded once.
  bool geglu = false;
  bool residual = false;  // a [m, out columns] operand of the dtype read by the epilogue
  // The epilogue: the value stored at each output element, as a kernel-IR program whose inputs
  // are, in order, the element's float32 accumulator (GeGLU: the gate's, then the up's), its bias
  // (when `bias`; GeGLU: the gate's, then the up's) and its residual (when `residual`), and whose
  // one output is stored as the dtype (rounded once). Unset: GemmDefaultEpilogue.
  std::optional<kir::Program> epilogue;
  int bm() const { return pingpong ? 64 : 64 * consumers; }
  int out_cols() const { return geglu ? bn / 2 : bn; }  // output columns of a tile
  int threads() const { return 128 * (consumers + 1); }
  // Dynamic shared memory the kernel needs: slots, the consumers' output staging, barriers and
  // the 1024-byte alignment.
  int shared_bytes() const;
  int MostStages() const;  // the most slots (>= 2) whose shared memory fits a CTA
  // "kiln_gemm_sm90_bf16_128x256_s4" (+ "_pp", "_bias", "_geglu", "_res", and "_ep" with the
  // hash of an epilogue program other than the default)
  std::string Name() const;
  // The epilogue program's input types, in the order above.
  std::vector<DType> EpilogueInputTypes() const;
  // The epilogue in force: `epilogue`, or GemmDefaultEpilogue(*this).
  kir::Program Epilogue() const;
};

// The accumulator plus the bias (GeGLU: gelu_tanh(gate) * up, each with its bias), and the
// residual added last.
kir::Program GemmDefaultEpilogue(const GemmConfig& config);

inline constexpr int kGemmBlockK = 64;  // a slot's K extent: one 128-byte swizzled row

// The kernel's source; its one kernel is config.Name(). Throws kiln::Error for a config outside
// the ranges above, over the 227 KB of shared memory a CTA may have, or with an epilogue program
// whose inputs or output are not the config's.
std::string RenderGemmSource(const GemmConfig& config);

}  // namespace kiln::cuda_ops
