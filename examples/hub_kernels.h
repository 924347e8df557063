// The examples' stand-ins for the series' "kernels hub" packages, each built into a kernel
// package (io/kernel_package.h) and registered as a custom op (ops/custom_op.h) from the package's
// loaded binary (no NVRTC at run time):
//  - "activation" (03_mlp): a hand-written GeGLU activation kernel, out = gelu_tanh(gate) · up
//    over x = [gate | up], as the hub's `gelu_tanh_and_mul`;
//  - "flash_attn" (04_attention): kiln's own flash-attention kernel (the mma.sync one, which runs
//    on sm_80 and later), causal, bf16, head dims 64 and 128, as the hub's flash-attn.
//
//   BuildHubPackage("pkg");                              // once, on any machine with NVRTC
//   const KernelPackage pkg = KernelPackage::Load("pkg", "0.1");
//   const CustomOp act = RegisterGeluAndMul(pkg);
//   Tensor h = act({linear(x, gate_up_weight)});        // [N, 2H] -> [N, H]
#pragma once

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/families/attention/flash_attention_cuda.h"
#include "io/kernel_package.h"
#include "ops/custom_op.h"
#include "ops/ops.h"
#include "runtime/cuda.h"

namespace examples {

// bf16 as raw bits (no CUDA header needed by NVRTC): float's upper half, rounded to nearest even.
inline constexpr char kGeluAndMulSource[] = R"(
__device__ __forceinline__ float hub_bf16_to_float(unsigned b) { return __uint_as_float(b << 16); }
__device__ __forceinline__ unsigned hub_float_to_bf16(float f) {
  unsigned x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (x >> 16) | 0x40u;  // NaN stays NaN
  return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float hub_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
// Two bf16 of gate and of up (one word each) -> two bf16 results.
__device__ __forceinline__ unsigned hub_pair(unsigned g, unsigned u) {
  const float lo = hub_gelu_tanh(hub_bf16_to_float(g & 0xffffu)) * hub_bf16_to_float(u & 0xffffu);
  const float hi = hub_gelu_tanh(hub_bf16_to_float(g >> 16)) * hub_bf16_to_float(u >> 16);
  return hub_float_to_bf16(lo) | (hub_float_to_bf16(hi) << 16);
}

// x [rows, 2·hidden] bf16 (gate then up in each row) -> out [rows, hidden]; eight outputs (16
// bytes) per thread and step when the rows allow it.
extern "C" __global__ void gelu_tanh_and_mul_bf16(const unsigned short* x, unsigned short* out,
                                                  long long rows, long long hidden) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (hidden % 8 == 0 && (((unsigned long long)x | (unsigned long long)out) & 15) == 0) {
    const long long per_row = hidden / 8;
    for (long long v = first; v < rows * per_row; v += stride) {
      const long long r = v / per_row, c = (v - r * per_row) * 8;
      const uint4 g = *reinterpret_cast<const uint4*>(x + r * 2 * hidden + c);
      const uint4 u = *reinterpret_cast<const uint4*>(x + r * 2 * hidden + hidden + c);
      *reinterpret_cast<uint4*>(out + r * hidden + c) = make_uint4(
          hub_pair(g.x, u.x), hub_pair(g.y, u.y), hub_pair(g.z, u.z), hub_pair(g.w, u.w));
    }
    return;
  }
  for (long long i = first; i < rows * hidden; i += stride) {
    const long long r = i / hidden, c = i - r * hidden;
    const float y = hub_gelu_tanh(hub_bf16_to_float(x[r * 2 * hidden + c])) *
                    hub_bf16_to_float(x[r * 2 * hidden + hidden + c]);
    out[i] = (unsigned short)hub_float_to_bf16(y);
  }
}
)";

inline constexpr char kHubPackageName[] = "activation";
inline constexpr char kHubPackageVersion[] = "0.1.0";

// Writes the package into `dir` for the GPUs the series runs on (sm_90a's CUBIN for the H200,
// sm_80's for an A100, PTX for the rest).
inline void BuildHubPackage(const std::string& dir) {
  kiln::BuildKernelPackage(
      dir, kHubPackageName, kHubPackageVersion,
      {{"gelu_tanh_and_mul", "gelu_tanh_and_mul_bf16", kGeluAndMulSource, {8, 8, 8, 8}}},
      {"sm_90a", "sm_80", "compute_80"});
}

// The package's kernel as the op `gelu_tanh_and_mul`: x [..., 2H] bf16 -> [..., H].
inline kiln::CustomOp RegisterGeluAndMul(const kiln::KernelPackage& pkg) {
  if (std::optional<kiln::CustomOp> op = kiln::FindCustomOp("gelu_tanh_and_mul")) return *op;
  kiln::CustomOpSpec s;
  s.name = "gelu_tanh_and_mul";
  s.infer = [](absl::Span<const kiln::TensorType> in) -> absl::StatusOr<kiln::TensorType> {
    kiln::TensorType t = in[0];
    if (t.dtype != kiln::DType::kBFloat16 || t.shape.empty() || t.shape.back() % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat("expects bf16 [..., 2·H] (gate then up), got ",
                                                     kiln::DTypeName(t.dtype),
                                                     kiln::ShapeString(t.shape)));
    }
    t.shape.back() /= 2;
    return t;
  };
  s.launch = [](absl::Span<const kiln::Tensor> in, const kiln::Tensor& out) {
    const int64_t hidden = out.shape().back(), rows = out.numel() / std::max<int64_t>(hidden, 1);
    const int64_t work = (rows * hidden + 7) / 8;
    kiln::CustomLaunch l;
    l.block[0] = 256;
    l.grid[0] = static_cast<unsigned>(
        std::min<int64_t>((work + 255) / 256, int64_t{kiln::cuda::Props().sm_count} * 16));
    l.args.Add(in[0]).Add(out).Add<long long>(rows).Add<long long>(hidden);
    return l;
  };
  return pkg.RegisterOp("gelu_tanh_and_mul", std::move(s));
}

inline constexpr char kAttentionPackageName[] = "flash_attn";

// --build-package DIR: writes the package `build` makes into `dir`; the exit code (2 on error).
inline int WriteHubPackage(const std::string& dir, const char* name,
                           void (*build)(const std::string&)) {
  try {
    build(dir);
    std::printf("wrote kernel package %s %s to %s\n", name, kHubPackageVersion, dir.c_str());
    return 0;
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

// The package in `dir` (version 0.1.x), or, when `dir` is empty, the one `build` writes into a
// temporary folder first (with NVRTC); says which, and which binary of `kernel` this GPU takes.
// The package stays loaded for the process (its kernels outlive the ops registered from them).
inline const kiln::KernelPackage& LoadHubPackage(std::string dir, const char* name,
                                                 void (*build)(const std::string&),
                                                 const std::string& kernel) {
  if (dir.empty()) {
    dir = (std::filesystem::temp_directory_path() / (std::string("kiln_hub_") + name)).string();
    std::filesystem::remove_all(dir);
    build(dir);
    std::printf("package: built %s %s with NVRTC into %s (--package DIR loads a built one)\n", name,
                kHubPackageVersion, dir.c_str());
  }
  static auto* packages = new std::vector<std::unique_ptr<kiln::KernelPackage>>();
  packages->push_back(std::make_unique<kiln::KernelPackage>(kiln::KernelPackage::Load(dir, "0.1")));
  const kiln::KernelPackage& pkg = *packages->back();
  const kiln::PackagedKernel& k = pkg.kernel(kernel);
  std::printf("package: %s %s from %s, kernel %s (%s)\n", pkg.name().c_str(), pkg.version().c_str(),
              dir.c_str(), k.entry.c_str(), k.arch.c_str());
  return pkg;
}

// The flash kernel's configuration for causal bf16 attention of head dim `d`.
inline kiln::cuda_ops::FlashAttentionConfig HubFlashConfig(int d) {
  return kiln::cuda_ops::PlanFlashAttention(d, kiln::DType::kBFloat16, /*causal=*/true,
                                            kiln::cuda_ops::FlashMask::kNone);
}

// Writes the "flash_attn" package into `dir`: kiln's flash kernel for head dims 64 and 128 (sm_90
// and sm_80 CUBINs), named "causal_d64" and "causal_d128".
inline void BuildHubAttentionPackage(const std::string& dir) {
  std::vector<kiln::KernelSource> kernels;
  for (int d : {64, 128}) {
    const auto c = HubFlashConfig(d);
    kernels.push_back({absl::StrCat("causal_d", d),
                       kiln::cuda_ops::FlashAttentionKernelName(c),
                       kiln::cuda_ops::RenderFlashAttentionSource(c),
                       {static_cast<int>(sizeof(kiln::cuda_ops::FlashParams))}});
  }
  kiln::BuildKernelPackage(dir, kAttentionPackageName, kHubPackageVersion, kernels,
                           {"sm_90", "sm_80"});
}

// The package's kernel for head dim `d` as the op `flash_attn_causal_d<d>`: q, k, v [B, H, T, d]
// bf16 -> [B, H, T, d], causal, scale 1/sqrt(d).
inline kiln::CustomOp RegisterFlashAttention(const kiln::KernelPackage& pkg, int d) {
  const std::string name = absl::StrCat("flash_attn_causal_d", d);
  if (std::optional<kiln::CustomOp> op = kiln::FindCustomOp(name)) return *op;
  kiln::CustomOpSpec s;
  s.name = name;
  s.num_inputs = 3;
  s.infer = [d](absl::Span<const kiln::TensorType> in) -> absl::StatusOr<kiln::TensorType> {
    for (const kiln::TensorType& t : in) {
      if (t.dtype != kiln::DType::kBFloat16 || t.shape.size() != 4 || t.shape[3] != d) {
        return absl::InvalidArgumentError(absl::StrCat("expects bf16 [B, H, T, ", d, "], got ",
                                                       kiln::DTypeName(t.dtype),
                                                       kiln::ShapeString(t.shape)));
      }
    }
    if (in[1].shape != in[2].shape || in[0].shape[0] != in[1].shape[0] ||
        in[0].shape[1] != in[1].shape[1]) {
      return absl::InvalidArgumentError("q, k and v must share B and H, and k and v their shape");
    }
    return in[0];
  };
  s.launch = [d](absl::Span<const kiln::Tensor> in, const kiln::Tensor& out) {
    kiln::OpAttrs a;
    a.is_causal = true;
    a.scale = 1.0 / std::sqrt(static_cast<double>(d));
    const kiln::cuda_ops::FlashLaunchDescription f =
        kiln::cuda_ops::DescribeFlashLaunch(HubFlashConfig(d), in, a, out);
    kiln::CustomLaunch l;
    l.grid = {f.grid[0], f.grid[1], f.grid[2]};
    l.block = {f.block[0], f.block[1], f.block[2]};
    l.shared_bytes = f.shared_bytes;
    l.args.AddBytes(f.params);
    return l;
  };
  return pkg.RegisterOp(absl::StrCat("causal_d", d), std::move(s));
}

}  // namespace examples
