// scaled_dot_product_attention: the API, shape inference, backend choice, the math form and the
// row's kernels (see attention.h).
#include "ops/attention.h"

#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/families/attention/flash_attention_cuda.h"
#include "ops/cpu/kernels.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "profiler/host.h"
#include "runtime/build_config.h"
#include "runtime/status.h"

namespace kiln {
namespace {

thread_local SdpaBackend g_backend = SdpaBackend::kAuto;

absl::Status Invalid(std::string msg) { return absl::InvalidArgumentError(std::move(msg)); }

std::string Shapes(absl::Span<const TensorType> in) {
  return absl::StrCat("query ", ShapeString(in[0].shape), ", key ", ShapeString(in[1].shape),
                      ", value ", ShapeString(in[2].shape));
}

absl::Status CheckOperandTypes(absl::Span<const TensorType> in) {
  const TensorType &q = in[0], &k = in[1], &v = in[2];
  if (q.rank() < 2 || k.rank() < 2 || v.rank() < 2) {
    return Invalid(
        absl::StrCat("query, key and value need at least 2 dims [..., T, E], got ", Shapes(in)));
  }
  if (q.rank() != k.rank() || q.rank() != v.rank()) {
    return Invalid(
        absl::StrCat("query, key and value must have the same number of dims, got ", Shapes(in)));
  }
  if (!IsFloatingPoint(q.dtype) || k.dtype != q.dtype || v.dtype != q.dtype) {
    return Invalid(absl::StrCat("query, key and value must have one floating-point dtype, got ",
                                DTypeName(q.dtype), ", ", DTypeName(k.dtype), ", ",
                                DTypeName(v.dtype)));
  }
  const int64_t r = q.rank();
  if (q.shape[r - 1] != k.shape[r - 1]) {
    return Invalid(absl::StrCat("the head dims of query (", q.shape[r - 1], ") and key (",
                                k.shape[r - 1], ") differ: ", Shapes(in)));
  }
  if (k.shape[r - 2] != v.shape[r - 2]) {
    return Invalid(absl::StrCat("key and value have different lengths (", k.shape[r - 2], " vs ",
                                v.shape[r - 2], "): ", Shapes(in)));
  }
  return absl::OkStatus();
}

// Batch dims must match; the heads (dim -3) may differ under enable_gqa when k/v heads divide
// q heads (torch's enable_gqa=True).
absl::Status CheckBatchDims(absl::Span<const TensorType> in, bool enable_gqa) {
  const TensorType &q = in[0], &k = in[1], &v = in[2];
  const int64_t r = q.rank();
  for (int64_t d = 0; d + 2 < r; ++d) {
    const int64_t hq = q.shape[d], hk = k.shape[d];
    if (hk != v.shape[d]) {
      return Invalid(absl::StrCat("key and value differ in dim ", d, ": ", Shapes(in)));
    }
    if (hq == hk) continue;
    if (d != r - 3) {
      return Invalid(absl::StrCat("query and key differ in batch dim ", d,
                                  " (kiln does not broadcast attention batch dims): ", Shapes(in)));
    }
    if (!enable_gqa) {
      return Invalid(absl::StrCat(
          "query has ", hq, " heads and key/value ", hk,
          " (dim -3); pass enable_gqa = true for grouped-query attention: ", Shapes(in)));
    }
    if (hk == 0 || hq % hk != 0) {
      return Invalid(absl::StrCat("with enable_gqa the key/value heads (", hk,
                                  ") must divide the query heads (", hq, "): ", Shapes(in)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMask(absl::Span<const TensorType> in, const OpAttrs& a) {
  const TensorType &q = in[0], &k = in[1], &m = in[3];
  if (a.is_causal) {
    return Invalid("attn_mask must not be given with is_causal = true (as in torch)");
  }
  if (m.dtype != DType::kBool && m.dtype != DType::kFloat32 && m.dtype != q.dtype) {
    return Invalid(absl::StrCat("attn_mask must be bool, float32 or the query's dtype (",
                                DTypeName(q.dtype), "), got ", DTypeName(m.dtype)));
  }
  Shape target(q.shape.begin(), q.shape.end() - 1);
  target.push_back(k.shape[k.rank() - 2]);
  bool ok = m.rank() <= static_cast<int64_t>(target.size());
  for (int64_t i = 0; ok && i < m.rank(); ++i) {
    const int64_t want = target[target.size() - m.rank() + i];
    ok = m.shape[i] == 1 || m.shape[i] == want;
  }
  if (!ok) {
    return Invalid(absl::StrCat(
        "attn_mask of shape ", ShapeString(m.shape),
        " does not broadcast to the scores' shape [..., L, S] = ", ShapeString(target)));
  }
  return absl::OkStatus();
}

// k [..., Hk, S, E] -> [..., Hk * group, S, E], each head repeated `group` times in place
// (torch's repeat_interleave on dim -3).
Tensor RepeatHeads(const Tensor& t, int64_t group) {
  Shape expanded = t.shape();
  expanded.insert(expanded.end() - 2, group);
  Shape merged = t.shape();
  merged[merged.size() - 3] *= group;
  return reshape(expand(unsqueeze(t, -3), expanded), merged);
}

// Rows of `s` whose every score is -inf (fully masked) get probability 0 instead of softmax's
// NaN, as torch's _safe_softmax. Without comparison ops: a row max m is -inf exactly when m * 0
// is NaN (m = ±inf or NaN) and sigmoid(m) is 0 (m = -inf; +inf gives 1, NaN stays NaN).
Tensor ZeroFullyMaskedRows(const Tensor& s, const Tensor& p) {
  const Tensor m = max(s, {-1}, /*keepdim=*/true);
  const Tensor not_finite = cast(mul(m, 0.0), DType::kBool);
  const Tensor pos_inf_or_nan = cast(sigmoid(m), DType::kBool);
  const Tensor fully = where(pos_inf_or_nan, full({}, 0, DType::kBool, s.device()), not_finite);
  return masked_fill(p, fully, 0.0);
}

void CopyInto(const Tensor& src, const Tensor& out) {
  const OpDef& copy = GetOpDef(OpId::kContiguous);
  (out.device().is_cuda() ? copy.cuda : copy.cpu)(copy, {src}, out, OpAttrs{});
}

// The profiler range naming the backend and the reason (opened only while a profiler records).
std::string RangeName(const SdpaBackendChoice& c) {
  return absl::StrCat("sdpa backend: ", SdpaBackendName(c.backend), " (", c.reason, ")");
}

OpAttrs SdpaAttrs(const Tensor& q, bool is_causal, std::optional<double> scale, bool enable_gqa) {
  OpAttrs a;
  const int64_t e = q.defined() && q.dim() > 0 ? q.size(-1) : 1;
  a.scale = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(e));
  a.is_causal = is_causal;
  a.enable_gqa = enable_gqa;
  return a;
}

absl::InlinedVector<Tensor, 4> Operands(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& mask) {
  absl::InlinedVector<Tensor, 4> in = {q, k, v};
  if (mask.defined()) in.push_back(mask);
  return in;
}

}  // namespace

namespace attention {

absl::StatusOr<TensorType> Infer(absl::Span<const TensorType> in, const OpAttrs& a) {
  KILN_RETURN_IF_ERROR(CheckOperandTypes(in));
  KILN_RETURN_IF_ERROR(CheckBatchDims(in, a.enable_gqa));
  if (in.size() > 3) KILN_RETURN_IF_ERROR(CheckMask(in, a));
  TensorType out = in[0];
  out.shape.back() = in[2].shape.back();
  return out;
}

SdpaBackendChoice Choose(absl::Span<const Tensor> in, const OpAttrs& a) {
  const SdpaBackend want = current_sdpa_backend();
  if (want == SdpaBackend::kMath) return {SdpaBackend::kMath, "selected by SdpaBackendGuard"};
  std::string why;
  if (in[0].device().is_cuda()) {
    why = cuda_ops::FlashAttentionUnsupportedReason(in, a);
  } else {
    std::vector<TensorType> types;
    for (const Tensor& t : in) types.push_back(t.type());
    why = cuda_ops::FlashAttentionTypesUnsupported(types);
  }
  if (why.empty()) {
    return {SdpaBackend::kFlash, want == SdpaBackend::kFlash
                                     ? "selected by SdpaBackendGuard"
                                     : "auto: the flash kernel supports these inputs"};
  }
  if (want == SdpaBackend::kFlash) {
    throw Error(absl::UnimplementedError(absl::StrCat(
        "scaled_dot_product_attention: the flash backend was selected (SdpaBackendGuard) but ",
        "cannot run these inputs: ", why, " (operands: ",
        absl::StrJoin(in, ", ",
                      [](std::string* o, const Tensor& t) { o->append(Describe(t.type())); }),
        ")")));
  }
  const Device device = in[0].device();
  const char* runs = device.is_cuda()  ? "; the math form runs"
                     : device.is_cpu() ? "; the CPU reference kernel runs"
                                       : "";  // meta tensors run nothing
  return {SdpaBackend::kMath, absl::StrCat("auto: ", why, runs)};
}

Tensor MathForm(absl::Span<const Tensor> in, const OpAttrs& a) {
  const Tensor& q = in[0];
  Tensor k = in[1], v = in[2];
  if (q.dim() >= 3 && q.size(-3) != k.size(-3)) {
    k = RepeatHeads(k, q.size(-3) / k.size(-3));
    v = RepeatHeads(v, q.size(-3) / v.size(-3));
  }
  Tensor s = mul(matmul(q, transpose(k, -2, -1)), a.scale);
  if (a.is_causal) {
    const Tensor above = triu(ones({q.size(-2), k.size(-2)}, DType::kBool, q.device()), 1);
    s = masked_fill(s, above, -INFINITY);
  }
  const bool has_mask = in.size() > 3;
  if (has_mask && in[3].dtype() == DType::kBool) {
    s = where(in[3], s, full({}, -INFINITY, s.dtype(), s.device()));
  } else if (has_mask) {
    s = add(s, in[3]);
  }
  Tensor p = softmax(s, -1);
  if (has_mask) p = ZeroFullyMaskedRows(s, p);
  return matmul(cast(p, v.dtype()), v);
}

void CpuKernel(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  const SdpaBackendChoice choice = Choose(in, a);
  std::optional<profiler::Range> range;
  if (KILN_PREDICT_FALSE(profiler::IsActive())) range.emplace(RangeName(choice));
  if (current_sdpa_backend() == SdpaBackend::kMath) {
    CopyInto(MathForm(in, a), out);
  } else {
    cpu::ScaledDotProductAttention(def, in, out, a);
  }
}

void CudaKernel(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                const OpAttrs& a) {
  if constexpr (kWithCuda) {  // the row has no CUDA kernel otherwise (ops/registry.cc)
    const SdpaBackendChoice choice = Choose(in, a);
    std::optional<profiler::Range> range;
    if (KILN_PREDICT_FALSE(profiler::IsActive())) range.emplace(RangeName(choice));
    if (choice.backend == SdpaBackend::kFlash && cuda_ops::FlashCanWrite(out)) {
      cuda_ops::LaunchFlashAttention(in, a, out);
    } else if (choice.backend == SdpaBackend::kFlash) {  // an out= tensor of another layout
      const Tensor result = NewOutput(def, out.type());
      cuda_ops::LaunchFlashAttention(in, a, result);
      CopyInto(result, out);
    } else {
      CopyInto(MathForm(in, a), out);
    }
  }
}

}  // namespace attention

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask, bool is_causal,
                                    std::optional<double> scale, bool enable_gqa) {
  return Dispatch(OpId::kScaledDotProductAttention, Operands(q, k, v, attn_mask),
                  SdpaAttrs(q, is_causal, scale, enable_gqa));
}

const char* SdpaBackendName(SdpaBackend b) {
  static constexpr const char* kNames[] = {"auto", "math", "flash"};
  return kNames[static_cast<int>(b)];
}

SdpaBackendChoice sdpa_backend_choice(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& attn_mask, bool is_causal,
                                      std::optional<double> scale, bool enable_gqa) {
  const auto in = Operands(q, k, v, attn_mask);
  const OpAttrs a = SdpaAttrs(q, is_causal, scale, enable_gqa);
  InferOrThrow(GetOpDef(OpId::kScaledDotProductAttention), in, a);
  return attention::Choose(in, a);
}

SdpaBackendGuard::SdpaBackendGuard(SdpaBackend backend) : prev_(g_backend) { g_backend = backend; }
SdpaBackendGuard::~SdpaBackendGuard() { g_backend = prev_; }
SdpaBackend current_sdpa_backend() { return g_backend; }

}  // namespace kiln
