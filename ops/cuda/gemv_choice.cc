// The GEMV-or-cuBLASLt choice for linear with few rows (see gemv_choice.h), and matmul_cuda.h's
// GemvMode / GemvDecisions.
#include "ops/cuda/gemv_choice.h"

#include <atomic>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ops/cuda/device_timing.h"
#include "ops/cuda/matmul_cuda.h"
#include "runtime/cuda.h"
#include "runtime/settings.h"
#include "runtime/status.h"

namespace kiln::cuda_ops {
namespace {

constexpr int kSamples = 15;  // timed calls of each path
// For a CUDA graph replay cuBLASLt is taken only when it times this much faster: ties and noise go
// to the GEMV, which a graph replays with less overhead (the H200 pair of 2026-12-02: a stored
// close call that picked cuBLASLt for four of a decode step's seven linears made the captured
// step 3 % slower). Plain runs take the faster median (the same pair: the margin there made a
// one-token MLP 6 % slower, its 1-row linears' split-K cuBLASLt being 5-10 % faster).
// Only against cuBLASLt: where the other path is kiln's own kernels (a norm's kernel then the
// GEMV, or the linear then the product), a graph replays both alike, and the faster median wins
// (H100, 2026-12-07: the margin kept the folded norm GEMV of Llama-1B's MLP and LM head at 4-6 %
// slower than the two kernels, and its decode step 5 % slower).
constexpr double kGraphCublasMargin = 1.1;
constexpr size_t kMaxDecisions = 4096;  // dynamic shapes: start over rather than grow forever
std::atomic<int> g_mode_override{-1};   // a GemvMode set by SetGemvMode, or -1

absl::StatusOr<GemvMode> ParseMode(const char* v) {
  const std::string s = v == nullptr ? "" : v;
  if (s.empty() || s == "auto") return GemvMode::kAuto;
  if (s == "on") return GemvMode::kOn;
  if (s == "off") return GemvMode::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("KILN_GEMV must be on, off or auto (got '", s, "')"));
}

// " glu(silu)" for a gated product, else "".
std::string GluName(const GemvProblem& p) {
  if (!p.gated()) return "";
  switch (p.gate_act) {
    case cuda_kernels::GemvAct::kRelu:
      return " glu(relu)";
    case cuda_kernels::GemvAct::kGeluTanh:
      return " glu(gelu_tanh)";
    case cuda_kernels::GemvAct::kGelu:
      return " glu(gelu)";
    case cuda_kernels::GemvAct::kSilu:
      return " glu(silu)";
    default:
      return " glu";
  }
}

const char* NormName(cuda_kernels::GemvNorm norm) {
  switch (norm) {
    case cuda_kernels::GemvNorm::kLayer:
      return " layer_norm";
    case cuda_kernels::GemvNorm::kRms:
      return " rms_norm";
    default:
      return "";
  }
}

struct GemvProblemHash {
  size_t operator()(const GemvProblem& p) const {
    size_t h = 0;
    for (int64_t v : {int64_t{p.device}, static_cast<int64_t>(p.dtype), p.m, p.n, p.k,
                      int64_t{p.graph} << 2 | int64_t{p.tf32} << 1 | int64_t{p.bias},
                      static_cast<int64_t>(p.act), static_cast<int64_t>(p.norm),
                      static_cast<int64_t>(p.gate_act), int64_t{p.align_x}, int64_t{p.align_w},
                      int64_t{p.align_bias}, int64_t{p.align_out}}) {
      h ^= std::hash<int64_t>()(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return h;
  }
};

// "[1x2304x768 bf16 bias gelu_tanh]", with the device when not 0, a norm of x's rows
// ("layer_norm " after the dtype), a gated product (" glu(silu)"), alignments below 16 and
// " graph" for a graph replay.
std::string Describe(const GemvProblem& p) {
  const char* type = p.dtype == DType::kFloat32    ? "f32"
                     : p.dtype == DType::kFloat16  ? "f16"
                     : p.dtype == DType::kBFloat16 ? "bf16"
                                                   : DTypeName(p.dtype);
  std::vector<std::string> low;
  for (const auto& [name, align] :
       {std::pair{"x", p.align_x}, std::pair{"w", p.align_w},
        std::pair{"bias", p.bias ? p.align_bias : 16u}, std::pair{"out", p.align_out}}) {
    if (align < 16) low.push_back(absl::StrCat(name, "=", align));
  }
  return absl::StrCat(
      "[", p.device != 0 ? absl::StrCat("cuda:", p.device, " ") : "", p.m, "x", p.n, "x", p.k, " ",
      type, p.tf32 ? " tf32" : "", NormName(p.norm), p.bias ? " bias" : "",
      p.act != Epilogue::kNone ? absl::StrCat(" ", EpilogueName(p.act)) : "", GluName(p),
      low.empty() ? "" : absl::StrCat(" align ", absl::StrJoin(low, ",")), p.graph ? " graph" : "",
      "]");
}

struct Decisions {
  std::mutex mu;
  std::unordered_map<GemvProblem, bool, GemvProblemHash> use_gemv ABSL_GUARDED_BY(mu);
  std::unordered_set<GemvProblem, GemvProblemHash> untimed ABSL_GUARDED_BY(mu);
  std::vector<std::string> log ABSL_GUARDED_BY(mu);
};

Decisions& TheDecisions() {
  static auto* d = new Decisions;  // never destroyed: linear may run during static teardown
  return *d;
}

struct Timing {
  double gemv_us, cublas_us;
};

// Median device times of one call of each path into a scratch output (device_timing.h).
Timing TimeBoth(const Tensor& out, const LinearPath& gemv, const LinearPath& cublas) {
  const Tensor scratch = Tensor::Empty(out.shape(), out.dtype(), out.device());
  const std::vector<double> us =
      MedianDeviceUs(out.device(), {[&] { gemv(scratch); }, [&] { cublas(scratch); }}, kSamples);
  return {us[0], us[1]};
}

// Keeps the process's decision for `p` (a racing thread's, when it decided first) and logs it as
// "gemv: <problem><how>".
bool Remember(Decisions& d, const GemvProblem& p, bool use, const std::string& how) {
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.use_gemv.size() >= kMaxDecisions) {
    d.use_gemv.clear();
    d.untimed.clear();
    d.log.clear();
  }
  auto [it, inserted] = d.use_gemv.try_emplace(p, use);
  if (inserted) d.log.push_back(absl::StrCat("gemv: ", Describe(p), how));
  return it->second;
}

}  // namespace

bool ChooseGemv(const GemvProblem& p, const Tensor& out, const LinearPath& gemv,
                const LinearPath& cublas) {
  const GemvMode mode = CurrentGemvMode();
  if (mode != GemvMode::kAuto) return mode == GemvMode::kOn;
  Decisions& d = TheDecisions();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (auto it = d.use_gemv.find(p); it != d.use_gemv.end()) return it->second;
  }
  const std::string key = absl::StrCat("gemv|", Describe(p), "|", DeviceIdentity(CUDA(p.device)));
  if (std::optional<std::string> stored = LoadDecision(key);
      stored && (*stored == "gemv" || *stored == "cublasLt")) {
    return Remember(d, p, *stored == "gemv", absl::StrCat(" -> ", *stored, " (stored)"));
  }
  if (cuda::Capturing()) {
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.untimed.insert(p).second) {
      d.log.push_back(
          absl::StrCat("gemv: ", Describe(p), " first seen in a CUDA graph capture -> gemv"));
    }
    return true;
  }
  const Timing t = TimeBoth(out, gemv, cublas);  // slow: unlocked
  // The other path: cuBLASLt, or for a norm inside the GEMV the norm's kernel and then linear.
  const bool against_cublas = !p.gated() && p.norm == cuda_kernels::GemvNorm::kNone;
  const char* other = against_cublas ? "cublasLt" : p.gated() ? "linear+product" : "norm+linear";
  const bool use =
      t.gemv_us <= t.cublas_us * (p.graph && against_cublas ? kGraphCublasMargin : 1.0);
  StoreDecision(key, use ? "gemv" : "cublasLt");
  return Remember(d, p, use,
                  absl::StrFormat(" %.1f µs vs %s %.1f µs -> %s", t.gemv_us, other, t.cublas_us,
                                  use ? "gemv" : other));
}

void SetGemvMode(GemvMode mode) {
  g_mode_override.store(static_cast<int>(mode), std::memory_order_relaxed);
}

GemvMode CurrentGemvMode() {
  const int set = g_mode_override.load(std::memory_order_relaxed);
  if (set >= 0) return static_cast<GemvMode>(set);
  static const absl::StatusOr<GemvMode> env = ParseMode(EnvChoice("KILN_GEMV").c_str());
  ThrowIfError(env.status());
  return *env;
}

std::string GemvDecisions() {
  Decisions& d = TheDecisions();
  std::lock_guard<std::mutex> lock(d.mu);
  return absl::StrJoin(d.log, "\n");
}

}  // namespace kiln::cuda_ops
