// Rendering the kernel IR (ops/kernel_ir.h) as CUDA C++: the pieces every generated kernel family
// shares. A family's skeleton (elementwise: codegen/families/pointwise/elementwise_cuda.h; softmax:
// codegen/families/softmax/fused_softmax_cuda.h) owns the loops and the index of each load and
// store; this file prints the instruction list in between, one `const` local per value, so a value
// with several users is computed once and the source grows linearly with the program.
//
//   std::string body = RenderValues(program, [](int i) { return absl::StrCat("r", i, "[j]"); });
//   //   const float v0 = kiln_bf16_to_f(r0[j]);
//   //   const float v1 = kiln_gelu(v0, 1);
//   std::string stored = RenderStoreValue(program, 0);   // "kiln_f_to_bf16((float)(v1))"
//
// Compute types: floating and bool values are float (bool as 0/1), integer values long long; an
// instruction computes in long long when its operands are integers (or bool) and its result is an
// integer or bool, else in float. `$scalar` is the float `scalar` (or a literal) in float
// instructions and the integer `iscalar` (or an integer literal) in integer ones. Explicit casts
// round through their dtype as the eager cast does; other half-precision values stay in float32
// until stored. (The compiler's lowering, codegen/fused_kernel.cc, follows every half-precision
// op with such a cast: fused kernels round where eager does.)
#pragma once

#include <functional>
#include <string>

#include "ops/kernel_ir.h"

namespace kiln::cuda_ops {

// The device prelude of every generated source: storage types, bf16/f16 conversions, math
// helpers the registry's CUDA expressions call.
const char* KernelPrelude();
// The C type of an element in memory, and expressions converting a stored element `v` to its
// compute type and a computed value back.
std::string StorageType(DType t);
std::string LoadExpr(DType t, const std::string& v);
std::string StoreExpr(DType t, const std::string& v);
// "float" or "long long": the type a value of dtype `t` is computed in.
const char* ComputeType(DType t);

// Declarations of the program's values in order, one line each with `indent`. `load(i)` is the
// expression of kernel input i's stored element at the current position. Values are named v<N>
// (`prefix` + N with another prefix).
std::string RenderValues(const kir::Program& p, const std::function<std::string(int)>& load,
                         const std::string& indent = "    ", const std::string& prefix = "v");
// The expression storing output `o` (its value converted to the output's storage type).
std::string RenderStoreValue(const kir::Program& p, int o, const std::string& prefix = "v");
// The compute-type expression of value `v` (for skeletons that consume a value themselves, like
// the softmax reading its prologue's result).
std::string ValueRef(const kir::Program& p, int v, const std::string& prefix = "v");

// Whether integer instructions read scalar `v` as a long long (an integer within int64) rather
// than as a double.
inline bool IsIntegralScalar(double v) {
  return v >= -0x1p63 && v < 0x1p63 && v == static_cast<double>(static_cast<long long>(v));
}
inline bool IsIntegralScalar(const Scalar& s) {
  return s.is_integer() || IsIntegralScalar(s.to_double());
}

// A float literal that round-trips (inf and nan as bit patterns).
std::string FloatLiteral(double v);

}  // namespace kiln::cuda_ops
