// When CUDA linear runs kiln's GEMV (ops/cuda/gemv_kernels.h) instead of cuBLASLt. Only problems
// the GEMV can run reach the choice (matmul_cuda.cc: at most kGemvMaxRows flattened rows, unit
// column stride of x and w). The rule, per distinct GemvProblem:
//  - KILN_GEMV=on / off, or SetGemvMode(kOn / kOff) (matmul_cuda.h): always the GEMV / cuBLASLt.
//  - auto (the default), a problem seen before: the cached decision; else one an earlier process
//    stored for this problem, GPU, driver and library versions (device_timing.h; not with
//    KILN_RETIME=on).
//  - auto, first seen outside a CUDA graph capture: both paths run on the actual operands into a
//    scratch output, 15 calls each, timed as ops/cuda/device_timing.h says (interleaved, each
//    alone by CUDA events, after a write of twice the L2: cold caches, as in a decode step whose
//    other layers' weights have passed through L2, and device time alone). The GEMV is kept
//    unless cuBLASLt's median is at least 10 % smaller when the work is for a CUDA graph replay
//    (cuda::ForGraphReplay(): a graph replays the GEMV's one kernel with less overhead than
//    cuBLASLt's split-K GEMM and reduce, so a close call goes to the GEMV); otherwise, and
//    against kiln's own kernels (a norm's kernel then the GEMV, the linear then the product),
//    the faster median wins. The decision is kept for the process and stored for later ones (graph
//    and plain runs apart); GemvDecisions() lists the timings.
//  - auto, first seen while the current stream is capturing (nothing can be timed there): the
//    GEMV, which streams the weights at near full bandwidth where cuBLASLt with M <= 8 reaches
//    about a fifth; the problem is timed the next time it comes outside a capture. Plans run once
//    before they are captured (codegen/cuda_graph.h), so this is only met by graphs whose operands
//    change alignment class between the run and the capture.
//
//   auto gemv = [&](const Tensor& o) { ... }, cublas = [&](const Tensor& o) { ... };
//   if (ChooseGemv(problem, out, gemv, cublas)) gemv(out); else cublas(out);
//
// Thread-safe: the decisions live in one process-wide table under a mutex; timing runs unlocked,
// so two threads meeting a new problem at once may both time it (the first result is kept).
#pragma once

#include <cstdint>
#include <functional>

#include "ops/cuda/gemv_kernels.h"
#include "ops/op_def.h"

namespace kiln::cuda_ops {

// What the decision is cached on. The alignments are those of the pointers and row strides in
// bytes, capped at 16 (the GEMV's vector loads need 16; cuBLASLt's kernels differ below it).
struct GemvProblem {
  int device = 0;
  DType dtype = DType::kFloat32;
  int64_t m = 0, n = 0, k = 0;
  bool tf32 = false;  // float32 and set_allow_tf32(true): cuBLASLt may pick other kernels
  bool bias = false;
  bool graph = false;  // issued for a CUDA graph replay (cuda::ForGraphReplay())
  Epilogue act = Epilogue::kNone;
  // A norm of x's rows inside the GEMV (the norm-linear family), timed against the norm's kernel
  // followed by the linear instead of against cuBLASLt alone.
  cuda_kernels::GemvNorm norm = cuda_kernels::GemvNorm::kNone;
  // A gated product (GemvArgs::w_up) with this gate activation; kNone: none. n is the product's
  // columns (the merged linear's half).
  cuda_kernels::GemvAct gate_act = cuda_kernels::GemvAct::kNone;
  bool gated() const { return gate_act != cuda_kernels::GemvAct::kNone; }
  uint32_t align_x = 16, align_w = 16, align_bias = 16, align_out = 16;
  bool operator==(const GemvProblem&) const = default;
};

// One way of running the problem's linear into `out` (the real output or the timing scratch).
using LinearPath = std::function<void(const Tensor& out)>;

// True when the GEMV should run `p` (see the rule above); `out` is the real output, whose type
// the timing scratch takes. Throws kiln::Error for a KILN_GEMV value other than on/off/auto and
// for failures of either path while timing.
bool ChooseGemv(const GemvProblem& p, const Tensor& out, const LinearPath& gemv,
                const LinearPath& cublas);

}  // namespace kiln::cuda_ops
