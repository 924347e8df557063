// The Hopper (sm_90a) primitives every kernel family with TMA and wgmma shares: mbarriers, TMA
// copies (rank 2 and 4), wgmma's shared-memory descriptors (K-major and MN-major rows of 128
// bytes, 128-byte swizzle), group control, named barriers, TMA stores. Each wrapper is one PTX
// instruction (or its wait loop), so NVRTC compiles them in milliseconds. Host code: renders text.
//
//   std::string source = absl::StrCat(KernelPrelude(), HopperPrimitivesSource(),
//                                     RenderWgmma("kiln_wgmma", 128, DType::kBFloat16, {}), ...);
//
// Users: the GEMM family (codegen/families/gemm/gemm_source.cc) and the attention family's sm_90
// kernel (codegen/families/attention/flash_attention_sm90_source.cc).
#pragma once

#include <string>

#include "runtime/dtype.h"

namespace kiln::cuda_ops {

// The device functions above, as CUDA source (needs `kiln_u16`, which KernelPrelude defines).
const char* HopperPrimitivesSource();

// How one wgmma.mma_async takes its operands.
struct WgmmaOperands {
  // A from four 32-bit registers of two 16-bit values each (the m16n8k16 A fragment of each
  // warp's 16 rows: the accumulator layout of two n8 column groups), else from shared memory
  // through a descriptor.
  bool a_in_registers = false;
  bool b_mn_major = false;  // B's descriptor is MN-major (kiln_wgmma_desc_mn), else K-major
};

// `name(d, a, b, accumulate)`: one wgmma.mma_async m64n<n>k16 (bf16 or f16 in, float32
// accumulators) into the n / 2 accumulators of each thread; a is a descriptor
// (unsigned long long) or `const unsigned (&)[4]`, b a descriptor; accumulate 0: d = a·b, else
// d += a·b.
std::string RenderWgmma(const std::string& name, int n, DType dtype, WgmmaOperands operands);

}  // namespace kiln::cuda_ops
