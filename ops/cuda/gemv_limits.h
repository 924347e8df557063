// The GEMV's limits (gemv_kernels.h), apart from its launcher so that code deciding whether the
// GEMV applies needs no CUDA header (the norm-linear family's operand check, in every build).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::cuda_kernels {

inline constexpr int64_t kGemvMaxRows = 8;
// With a norm (GemvArgs::norm) each CTA keeps the normalised x rows in shared memory: m·k
// elements of the dtype, at most this many bytes (else cudaErrorInvalidValue).
inline constexpr size_t kMaxNormSharedBytes = 96 * 1024;

}  // namespace kiln::cuda_kernels
