// Helpers of the typed elementwise CPU kernels (see typed_elementwise.h).
#include "ops/cpu/typed_elementwise.h"

#include "ops/infer.h"
#include "runtime/status.h"

namespace kiln::cpu {
DType CommonDType(absl::Span<const Tensor> in, const OpAttrs& a) {
  if (in.size() > 1) return PromoteTypes(in[0].dtype(), in[1].dtype());
  return infer::ScalarResultType(in[0].dtype(), a.scalar);
}

int64_t ReadInt(DType t, const void* base, int64_t i) {
  switch (t) {
    case DType::kBool:
      return static_cast<const uint8_t*>(base)[i] != 0;
    case DType::kInt32:
      return static_cast<const int32_t*>(base)[i];
    case DType::kInt64:
      return static_cast<const int64_t*>(base)[i];
    default:  // a floating operand never meets an integer common type (promotion)
      return static_cast<int64_t>(LoaderFor(t)(base, i));
  }
}

double ReadFloat(DType t, DType common, const void* base, int64_t i) {
  const double v = LoaderFor(t)(base, i);
  return t == common ? v : RoundToDType(common, v);
}

void WriteInt(DType t, void* base, int64_t i, int64_t v) {
  switch (t) {
    case DType::kBool:
      static_cast<uint8_t*>(base)[i] = v != 0;
      return;
    case DType::kInt32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);  // modulo 2^32, like torch
      return;
    case DType::kInt64:
      static_cast<int64_t*>(base)[i] = v;
      return;
    default:
      StorerFor(t)(base, i, static_cast<double>(v));
  }
}

double ScalarFloat(const Scalar& s, DType common) { return RoundToDType(common, s.to_double()); }

void ThrowIntegerDivisionByZero(const char* op) {
  KILN_FAIL(op, ": integer division by zero (torch raises ZeroDivisionError); on CUDA such an ",
            "element gives -1");
}

}  // namespace kiln::cpu
