// The GEMM family on the GPU: compiling (NVRTC, sm_90a, cached) and launching the Hopper kernel of
// gemm_source.h for a linear: out [m, n] = x [m, k] · w [n, k]ᵀ (+ bias [n]), with linear's
// epilogues (relu, tanh GELU, or + residual [m, n]) inside the kernel.
//
//   if (Sm90GemmApplies(x2, w, bias, out)) RunSm90Gemm(x2, w, bias, out);
//
// It applies on compute capability 9.0 exactly (sm_90a code runs nowhere else), to bf16 or f16
// operands of one dtype whose rows are contiguous and 16-byte aligned (TMA's rule: k and the row
// strides multiples of 8 elements, n a multiple of 8 for the epilogue's stores), with m, n, k
// below 2^31 and k > 0, a bias (if any) contiguous and 4-byte aligned, and a residual (if any) of
// out's shape and dtype, 4-byte aligned with unit column stride and an even row stride.
// Elsewhere linear keeps cuBLASLt.
//
// Which of the two runs a linear is chosen per problem (KILN_GEMM, runtime/settings.cc): `cublas`
// never runs the kernel, `kiln` always where it applies, `auto` times both once per problem (m, n,
// k, dtype, bias, epilogue) on the device (ops/cuda/device_timing.h: cold L2, interleaved) and
// keeps the faster, stored in the kernel cache directory for later processes; a problem first met
// while the stream captures a CUDA graph takes cuBLASLt (nothing can be timed there).
#pragma once

#include <functional>
#include <string>

#include "codegen/families/gemm/gemm_source.h"
#include "ops/op_def.h"
#include "runtime/tensor.h"

namespace kiln::cuda_ops {

// Whether RunSm90Gemm takes these operands (bias may be undefined; x2, w, out 2-D on one device).
// `geglu`: w (and bias) interleaved by InterleaveGeglu and out [m, n / 2]. `residual`: [m, out
// columns], may be undefined.
bool Sm90GemmApplies(const Tensor& x2, const Tensor& w, const Tensor& bias, const Tensor& out,
                     bool geglu = false, const Tensor& residual = Tensor());

// The GeGLU layout of a linear's gate and up halves: rows (bias elements) of `gate` [f, k] and
// `up` [f, k] in alternating groups of 8 ([2f, k]: gate 0..7, up 0..7, gate 8..15, ...), so that
// a thread's wgmma accumulators hold a gate value and its up value. f must be a multiple of 8.
// One copy (a kernel), on gate's device.
Tensor InterleaveGeglu(const Tensor& gate, const Tensor& up);

// The config linear uses for an [m, n, k] problem on a GPU of `sms` SMs (the tile width whose
// waves cost least, stages to fill shared memory).
GemmConfig Sm90GemmConfigFor(DType dtype, int64_t m, int64_t n, int64_t k, bool bias, int sms);
// The same for RunSm90Geglu (n: the interleaved weight's rows, 2f).
GemmConfig Sm90GegluConfigFor(DType dtype, int64_t m, int64_t n, int64_t k, bool bias, int sms);
// Linear's epilogue `e` as the config's epilogue program: relu or tanh GELU of the accumulator
// plus the bias; none and add (config.residual) are the default program.
kir::Program Sm90LinearEpilogue(const GemmConfig& config, Epilogue e);
// Compiles (or loads from the caches) the kernel of `config` now, so that a first run does not.
void PrepareSm90Gemm(const GemmConfig& config);
// PrepareSm90Gemm for a caller with a fallback: true when the kernel of `config` is loaded or a
// cache has it (loaded now); false when it must be compiled, which then starts on a background
// thread (cuda::GetKernelOrCompileInBackground) and a later call returns true once it is done.
// A RunSm90Gemm meanwhile waits for that compile.
bool Sm90GemmKernelReady(const GemmConfig& config);

// Runs the kernel on the current stream (compiling it on first use): linear with epilogue `e`
// (kAdd: `residual` added), or one config. Throws kiln::Error naming the operands when
// Sm90GemmApplies is false or the config does not match them, and for CUDA or NVRTC failures.
void RunSm90Gemm(const Tensor& x2, const Tensor& w, const Tensor& bias, const Tensor& out,
                 Epilogue e = Epilogue::kNone, const Tensor& residual = Tensor());
void RunSm90Gemm(const Tensor& x2, const Tensor& w, const Tensor& bias, const Tensor& out,
                 const GemmConfig& config, const Tensor& residual = Tensor());
// out [m, f] = gelu_tanh(x2 · gateᵀ + b_gate) * (x2 · upᵀ + b_up) with w = InterleaveGeglu(gate,
// up) (bias likewise, or undefined): one kernel, the [m, 2f] product never leaves the SM.
void RunSm90Geglu(const Tensor& x2, const Tensor& w, const Tensor& bias, const Tensor& out);

// True when linear should run RunSm90Gemm for these operands (already checked by
// Sm90GemmApplies) rather than `cublas` (see above); `cublas` runs cuBLASLt into its argument.
bool ChooseSm90Gemm(const Tensor& x2, const Tensor& w, const Tensor& bias, const Tensor& out,
                    const std::function<void(const Tensor&)>& cublas, Epilogue e = Epilogue::kNone,
                    const Tensor& residual = Tensor());

// The auto decisions made so far, one line each: "sm90 gemm: [8192x6144x768 bf16] 98.1 µs vs
// cublasLt 110.2 µs -> sm90". "" before the first.
std::string Sm90GemmDecisions();

}  // namespace kiln::cuda_ops
