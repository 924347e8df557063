// CUDA kernels for the matmul and linear rows of the registry, on cuBLASLt.
//
// Row-major kiln tensors are handed to column-major cuBLASLt as Cᵀ = Bᵀ·Aᵀ. Row-major and
// transposed 2-D views are read in place (GEMM transpose flags and leading dims), uniformly
// strided batch dims (broadcast ones included) become one strided-batch GEMM, and anything else
// is made contiguous first or looped over on the host. linear's bias rides the GEMM epilogue, and
// so does its activation when attrs.epilogue is set (CUBLASLT_EPILOGUE_RELU[_BIAS] or
// GELU[_BIAS], cuBLASLt's GELU being the tanh approximation); where the heuristic has no
// algorithm with that epilogue, the GEMM runs with the bias alone and the eager relu/gelu op
// follows. Note cuBLASLt's ReLU epilogue maps NaN to 0 where the relu op keeps NaN.
// bf16/f16 accumulate in float32; float32 uses TF32 tensor cores only after set_allow_tf32(true)
// (ops/ops.h).
//
// Per device: one cuBLASLt handle, created on first use and shared by every thread. Per distinct
// problem (the epilogue included): the descriptors and the heuristic's algorithm, cached (under a
// lock), so a repeated GEMM costs a hash lookup and one cublasLtMatmul. Everything runs on
// kiln::cuda::CurrentStream(); each GEMM takes the workspace its algorithm needs (at most 32 MiB)
// from the caching allocator on that stream and frees it there, so GEMMs may run from any thread
// on any streams at once. CUDA graph capture works once a device has run one GEMM eagerly (its
// first one creates the handle). K == 0 needs no GEMM: out is zero-filled, or for linear filled
// with bias rows (then the epilogue's activation runs as the eager op).
//
// linear with at most 8 flattened rows (token-by-token decode) may run kiln's own GEMV instead
// (ops/cuda/gemv_kernels.h: one kernel, bias and activation included, relu keeping NaN), when x
// and w have unit column stride. Which of the two runs is timed once per problem on the device
// (ops/cuda/gemv_choice.h has the rule, its cache key and what happens under graph capture);
// KILN_GEMV=on|off|auto (default auto) or SetGemvMode forces it, GemvDecisions() shows it.
//
//   kiln::set_allow_tf32(true);  // float32 GEMMs may round their inputs to TF32
//   cuda_ops::SetGemvMode(cuda_ops::GemvMode::kOff);  // linear: cuBLASLt only (an A/B baseline)
#pragma once

#include <functional>
#include <string>

#include "ops/op_def.h"

namespace kiln::cuda_ops {

// KernelFns (ops/op_def.h). Inputs and `out` are CUDA tensors of one device and dtype (float32,
// float16 or bfloat16); `out` is contiguous with the type infer::Matmul / infer::Linear gave.
// matmul: torch.matmul of in[0], in[1] (1-D operands, broadcast batch dims, attrs.transpose_a/b).
// linear: act(in[0] [..., in] @ in[1]ᵀ ([out, in]) + in[2] ([out], optional)), act from
// attrs.epilogue (none, relu, gelu_tanh).
// Failures throw kiln::Error: kInternal for cuBLAS/CUDA errors (naming the call, the status and
// the problem), kResourceExhausted for out of memory, kUnimplemented for other dtypes.
void Matmul(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);
void Linear(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a);

// The norm-linear family's node on CUDA (codegen/families/norm_linear/): `out` = linear(norm(x))
// where norm is layer_norm or rms_norm over x's last dim (norm_in = {x, weight?, bias?}) and the
// linear's operands after x are `rest` ({w, bias?, residual?}, as `attrs` say), as one launch of
// kiln's GEMV that normalises x's rows itself. Returns true when it ran that; false, having run
// nothing, where the GEMV cannot (more than kGemvMaxRows rows, m·k elements over
// kMaxNormSharedBytes, the linear's GEMV conditions, KILN_GEMV=off) or loses the choice against
// `norm_then_linear` (a full run of the norm's kernel and then the linear into its argument,
// which the choice times: gemv_choice.h, once per problem in auto mode, the norm in the
// problem's key). The caller then runs the two ops.
//
// With `gated` (a GLU MLP's gate/up linear at decode): `out` [..., f] is the product
// act(gate) · up of the two halves of the linear's [..., 2f] output, as one launch that never
// writes the linear's output (GemvArgs::w_up); w is the merged [2f, k] weight (bias [2f]), the
// linear has no epilogue. With `up_weight` defined, gate and up are two linears of the normalised
// rows instead: `rest` is the gate's ({w [f, k], bias?}), up_weight (up_bias) the up's, laid out
// alike. `norm_then_linear` then writes that product the other way (it is what the choice times
// against).
struct GatedProduct {
  OpId act = OpId::kSilu;  // relu, gelu or silu, applied to the gate half
  GeluApprox approximate = GeluApprox::kNone;
  bool gate_first = true;     // the gate is the linear's first half
  Tensor up_weight, up_bias;  // two linears: the up's (undefined: halves of one linear)
};
bool NormLinearGemv(OpId norm, absl::Span<const Tensor> norm_in, double eps,
                    absl::Span<const Tensor> rest, const OpAttrs& attrs, const Tensor& out,
                    const std::function<void(const Tensor& out)>& norm_then_linear,
                    const GatedProduct* gated = nullptr);

// Whether linear with few rows may run kiln's GEMV: kAuto times it against cuBLASLt per problem,
// kOn always runs it where it applies, kOff never. Process-wide; SetGemvMode overrides the
// KILN_GEMV environment variable (read once) for linear calls issued after it. CurrentGemvMode
// throws kiln::Error (kInvalidArgument) when KILN_GEMV holds something else than on, off or auto
// and SetGemvMode was not called.
enum class GemvMode { kAuto, kOff, kOn };
void SetGemvMode(GemvMode mode);
GemvMode CurrentGemvMode();

// The kAuto decisions made so far, one line each in the order made, e.g.
// "gemv: [1x2304x768 bf16 bias] 3.1 µs vs cublasLt 5.6 µs -> gemv" (m x n x k, the dtype, bias,
// activation, alignments below 16 bytes; device times per call). "" before the first.
std::string GemvDecisions();

}  // namespace kiln::cuda_ops
