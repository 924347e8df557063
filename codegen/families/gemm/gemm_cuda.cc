// The GEMM family's launcher (see gemm_cuda.h): operand checks, the kernel per config (compiled
// once per process, from the disk cache after the first), TMA maps per call, a persistent grid.
#include "codegen/families/gemm/gemm_cuda.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ops/cuda/device_timing.h"
#include "ops/ops.h"
#include "runtime/cuda_api.h"
#include "runtime/nvrtc.h"
#include "runtime/settings.h"
#include "runtime/status.h"
#include "runtime/tensor_map.h"

namespace kiln::cuda_ops {
namespace {

constexpr int64_t kMaxExtent = (int64_t{1} << 31) - 1;

bool RowsAligned(const Tensor& t) {
  return t.dim() == 2 && t.stride(1) == 1 && t.stride(0) % 8 == 0 && t.stride(0) >= t.size(1) &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

std::string Describe(const Tensor& t) {
  return t.defined()
             ? absl::StrCat(t.shape_string(), " ", DTypeName(t.dtype()), " strides [",
                            t.dim() > 0 ? t.stride(0) : 0, ", ", t.dim() > 1 ? t.stride(1) : 0, "]")
             : "none";
}

// The loaded kernels by config name, each with its shared memory raised to what it needs.
struct Loaded {
  std::mutex mu;
  std::map<std::string, cudaKernel_t> kernels;
};
Loaded& TheLoaded() {
  static auto* loaded = new Loaded;
  return *loaded;
}

cudaKernel_t Remember(const GemmConfig& c, cudaKernel_t k) {
  KILN_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(k),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       c.shared_bytes()));
  Loaded& loaded = TheLoaded();
  std::lock_guard<std::mutex> lock(loaded.mu);
  return loaded.kernels.emplace(c.Name(), k).first->second;
}

cudaKernel_t LoadedKernel(const std::string& name) {
  Loaded& loaded = TheLoaded();
  std::lock_guard<std::mutex> lock(loaded.mu);
  auto it = loaded.kernels.find(name);
  return it == loaded.kernels.end() ? nullptr : it->second;
}

// The compiled kernel of `c` (compiled now if no cache has it).
cudaKernel_t KernelFor(const GemmConfig& c) {
  if (cudaKernel_t k = LoadedKernel(c.Name())) return k;
  return Remember(
      c, ValueOrThrow(cuda::GetKernel(RenderGemmSource(c), c.Name(), {.arch_specific = true})));
}

cuda::TensorMap MapOf(const Tensor& t, int box_rows) {
  return ValueOrThrow(cuda::EncodeTensorMap2D({.base = t.data_ptr(),
                                               .element_bytes = 2,
                                               .rows = t.size(0),
                                               .cols = t.size(1),
                                               .row_stride = t.stride(0),
                                               .box_rows = box_rows,
                                               .box_cols = kGemmBlockK}));
}

// The auto decisions of this process, by problem ("[8192x6144x768 bf16 bias]"), and their log.
struct Decisions {
  std::mutex mu;
  std::map<std::string, bool> use_sm90;
  std::vector<std::string> log;
};
Decisions& TheDecisions() {
  static auto* d = new Decisions;  // never destroyed: linear may run during static teardown
  return *d;
}

bool Remember(const std::string& problem, bool use, const std::string& how) {
  Decisions& d = TheDecisions();
  std::lock_guard<std::mutex> lock(d.mu);
  auto [it, inserted] = d.use_sm90.try_emplace(problem, use);
  if (inserted) d.log.push_back(absl::StrCat("sm90 gemm: ", problem, how));
  return it->second;
}

}  // namespace

bool Sm90GemmApplies(const Tensor& x2, const Tensor& w, const Tensor& bias, const Tensor& out,
                     bool geglu, const Tensor& residual) {
  const DType t = out.dtype();
  if (t != DType::kBFloat16 && t != DType::kFloat16) return false;
  if (x2.dtype() != t || w.dtype() != t || (bias.defined() && bias.dtype() != t)) return false;
  if (!out.device().is_cuda()) return false;
  const cuda::DeviceProps& p = cuda::Props(out.device().index);
  if (p.major != 9 || p.minor != 0) return false;
  if (!RowsAligned(x2) || !RowsAligned(w) || !RowsAligned(out)) return false;
  const int64_t m = x2.size(0), k = x2.size(1), n = w.size(0);
  if (w.size(1) != k || out.size(0) != m || out.size(1) != (geglu ? n / 2 : n)) return false;
  if (m < 1 || n < 1 || k < 1 || m > kMaxExtent || n > kMaxExtent || k > kMaxExtent) return false;
  if (k % 8 != 0 || n % (geglu ? 16 : 8) != 0) return false;
  // The epilogue loads the bias and the residual two elements at a time.
  const bool bias_ok =
      !bias.defined() || (bias.dim() == 1 && bias.size(0) == n && bias.stride(0) == 1 &&
                          reinterpret_cast<uintptr_t>(bias.data_ptr()) % 4 == 0);
  const bool residual_ok = !residual.defined() ||
                           (residual.dtype() == t && residual.dim() == 2 && residual.size(0) == m &&
                            residual.size(1) == out.size(1) && residual.stride(1) == 1 &&
                            residual.stride(0) % 2 == 0 && residual.stride(0) >= residual.size(1) &&
                            reinterpret_cast<uintptr_t>(residual.data_ptr()) % 4 == 0);
  return bias_ok && residual_ok;
}

kir::Program Sm90LinearEpilogue(const GemmConfig& c, Epilogue e) {
  OpAttrs act_attrs;
  const OpDef* act = EpilogueActivation(e, &act_attrs);
  if (act == nullptr) return GemmDefaultEpilogue(c);  // none, or the residual's add
  kir::Program p(c.EpilogueInputTypes());
  int y = p.Load(0);
  if (c.bias) y = p.Apply(OpId::kAdd, {y, p.Load(1)}, {}, DType::kFloat32);
  p.Store(p.Apply(act->id, {y}, act_attrs, DType::kFloat32), c.dtype);
  return p;
}

// The tile width whose waves over the SMs cost least: a wave of tiles bn wide costs about
// bn + 32 (the per-tile fixed part: prologue, epilogue), so [8192, 768] outputs take 192-wide
// tiles (256 tiles: two full waves on 132 SMs) where 256-wide ones would leave the second wave
// half empty. Stages fill the shared memory the width leaves.
GemmConfig Sm90GemmConfigFor(DType dtype, int64_t m, int64_t n, int64_t, bool bias, int sms) {
  const int64_t tiles_m = (m + 127) / 128;
  GemmConfig best{.dtype = dtype, .bias = bias};
  int64_t best_cost = -1;
  for (int bn : {256, 192, 128}) {
    const int64_t waves = (tiles_m * ((n + bn - 1) / bn) + sms - 1) / sms;
    const int64_t cost = waves * (bn + 32);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best.bn = bn;
    }
  }
  best.stages = best.MostStages();
  return best;
}

void RunSm90Gemm(const Tensor& x2, const Tensor& w, const Tensor& bias, const Tensor& out,
                 Epilogue e, const Tensor& residual) {
  GemmConfig c = Sm90GemmConfigFor(out.dtype(), x2.size(0), w.size(0), x2.size(1), bias.defined(),
                                   cuda::Props(out.device().index).sm_count);
  c.residual = residual.defined();
  if (e != Epilogue::kNone && e != Epilogue::kAdd) c.epilogue = Sm90LinearEpilogue(c, e);
  RunSm90Gemm(x2, w, bias, out, c, residual);
}

Tensor InterleaveGeglu(const Tensor& gate, const Tensor& up) {
  KILN_CHECK(gate.shape() == up.shape() && gate.dim() >= 1 && gate.dim() <= 2 &&
                 gate.size(0) % 8 == 0 && gate.dtype() == up.dtype(),
             "InterleaveGeglu: gate and up of one shape [f] or [f, k], f a multiple of 8, one "
             "dtype; got ",
             Describe(gate), " and ", Describe(up));
  const int64_t f = gate.size(0);
  if (gate.is_contiguous() && up.is_contiguous() && gate.device().is_cuda() &&
      up.device() == gate.device()) {  // two strided copies, no kernel (none to compile)
    const size_t group = 8 * (gate.dim() == 2 ? gate.size(1) : 1) * gate.element_size();
    Tensor out = Tensor::Empty(gate.dim() == 2 ? Shape{2 * f, gate.size(1)} : Shape{2 * f},
                               gate.dtype(), gate.device());
    char* dst = static_cast<char*>(out.data_ptr());
    cuda::CopyRows(dst, 2 * group, gate.data_ptr(), group, group, f / 8);
    cuda::CopyRows(dst + group, 2 * group, up.data_ptr(), group, group, f / 8);
    return out;
  }
  Shape groups = {f / 8, 8}, rows = {2 * f};
  if (gate.dim() == 2) {
    groups.push_back(gate.size(1));
    rows.push_back(gate.size(1));
  }
  return contiguous(reshape(stack({reshape(gate, groups), reshape(up, groups)}, 1), rows));
}

GemmConfig Sm90GegluConfigFor(DType dtype, int64_t m, int64_t n, int64_t k, bool bias, int sms) {
  GemmConfig c = Sm90GemmConfigFor(dtype, m, n, k, bias, sms);
  c.geglu = true;
  if (c.bn == 192) c.bn = 128;  // a tile's output columns must be whole 64-column boxes
  c.stages = c.MostStages();
  return c;
}

void PrepareSm90Gemm(const GemmConfig& c) { KernelFor(c); }

bool Sm90GemmKernelReady(const GemmConfig& c) {
  if (LoadedKernel(c.Name()) != nullptr) return true;
  const cudaKernel_t k = ValueOrThrow(
      cuda::GetKernelOrCompileInBackground(RenderGemmSource(c), c.Name(), {.arch_specific = true}));
  if (k == nullptr) return false;
  Remember(c, k);
  return true;
}

void RunSm90Geglu(const Tensor& x2, const Tensor& w, const Tensor& bias, const Tensor& out) {
  RunSm90Gemm(x2, w, bias, out,
              Sm90GegluConfigFor(out.dtype(), x2.size(0), w.size(0), x2.size(1), bias.defined(),
                                 cuda::Props(out.device().index).sm_count));
}

void RunSm90Gemm(const Tensor& x2, const Tensor& w, const Tensor& bias, const Tensor& out,
                 const GemmConfig& c, const Tensor& residual) {
  KILN_CHECK(
      Sm90GemmApplies(x2, w, bias, out, c.geglu, residual) && c.bias == bias.defined() &&
          c.residual == residual.defined() && c.dtype == out.dtype(),
      "sm_90 GEMM: needs an H100/H200-class GPU (compute capability 9.0) and bf16/f16 x ",
      "[m, k], w [n, k], out [m, n] with contiguous 16-byte-aligned rows, k and n multiples ",
      "of 8, a contiguous 4-byte-aligned bias [n] and a 4-byte-aligned residual like out with an ",
      "even row stride when the config has them; got x ", Describe(x2), ", w ", Describe(w),
      ", bias ", Describe(bias), ", residual ", Describe(residual), ", out ", Describe(out),
      c.geglu ? " (GeGLU: out [m, n / 2], n a multiple of 16)" : "", ", config ", c.Name());
  const cudaKernel_t kernel = KernelFor(c);
  cuda::TensorMap a_map = MapOf(x2, c.bm()), w_map = MapOf(w, c.bn), out_map = MapOf(out, 64);
  void* bias_ptr = bias.defined() ? const_cast<void*>(bias.data_ptr()) : nullptr;
  void* residual_ptr = residual.defined() ? const_cast<void*>(residual.data_ptr()) : nullptr;
  long long ldr = residual.defined() ? residual.stride(0) : 0;
  int m = static_cast<int>(x2.size(0)), n = static_cast<int>(w.size(0));
  int k = static_cast<int>(x2.size(1));
  void* args[] = {&a_map, &w_map, &out_map, &bias_ptr, &residual_ptr, &ldr, &m, &n, &k};
  const int64_t tiles = ((m + c.bm() - 1) / c.bm()) * ((n + c.bn - 1) / c.bn);
  const int sms = cuda::Props(out.device().index).sm_count;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, sms)));
  KILN_CUDA_CHECK(cuda::LaunchDependent(reinterpret_cast<const void*>(kernel), grid,
                                        dim3(c.threads()), args, c.shared_bytes(),
                                        cuda::CurrentStream()));
}

bool ChooseSm90Gemm(const Tensor& x2, const Tensor& w, const Tensor& bias, const Tensor& out,
                    const std::function<void(const Tensor&)>& cublas, Epilogue e,
                    const Tensor& residual) {
  const std::string mode = EnvChoice("KILN_GEMM");
  if (mode != "auto") return mode == "kiln";
  const std::string problem =
      absl::StrCat("[", x2.size(0), "x", w.size(0), "x", x2.size(1), " ", DTypeName(out.dtype()),
                   bias.defined() ? " bias" : "",
                   e != Epilogue::kNone ? absl::StrCat(" ", EpilogueName(e)) : "", "]");
  {
    Decisions& d = TheDecisions();
    std::lock_guard<std::mutex> lock(d.mu);
    if (auto it = d.use_sm90.find(problem); it != d.use_sm90.end()) return it->second;
  }
  const std::string key = absl::StrCat("sm90gemm|", problem, "|", DeviceIdentity(out.device()));
  if (std::optional<std::string> stored = LoadDecision(key);
      stored && (*stored == "sm90" || *stored == "cublasLt")) {
    return Remember(problem, *stored == "sm90", absl::StrCat(" -> ", *stored, " (stored)"));
  }
  if (cuda::Capturing()) return false;  // cuBLASLt, untimed; timed when met outside a capture
  const Tensor scratch = Tensor::Empty(out.shape(), out.dtype(), out.device());
  const std::vector<double> us = MedianDeviceUs(
      out.device(),
      {[&] { RunSm90Gemm(x2, w, bias, scratch, e, residual); }, [&] { cublas(scratch); }});
  const bool use = us[0] < us[1];
  StoreDecision(key, use ? "sm90" : "cublasLt");
  return Remember(problem, use,
                  absl::StrFormat(" %.1f µs vs cublasLt %.1f µs -> %s", us[0], us[1],
                                  use ? "sm90" : "cublasLt"));
}

std::string Sm90GemmDecisions() {
  Decisions& d = TheDecisions();
  std::lock_guard<std::mutex> lock(d.mu);
  return absl::StrJoin(d.log, "\n");
}

}  // namespace kiln::cuda_ops
