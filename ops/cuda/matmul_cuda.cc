// cuBLASLt matmul and linear (see matmul_cuda.h): how each operand is read (in place through
// transpose flags and leading dims, or as a contiguous copy), batch dims split into one strided
// batch plus a host loop, the per-device handle, the per-call workspace, the plan cache
// (descriptors and the heuristic's algorithm per distinct problem), linear's epilogue (bias, relu,
// tanh GELU) with its fallback to the eager activation op, the K == 0 fills that need no GEMM, and
// linear's GEMV path for few rows (the kernel in gemv_kernels.cu, the choice in gemv_choice.cc).
//
// Row-major out[m, n] = a[m, k] @ b[k, n] is column-major outᵀ = bᵀ·aᵀ: cuBLAS's A is kiln's b
// and cuBLAS's B is kiln's a, with cuBLAS sizes (m', n', k') = (n, m, k).
#include "ops/cuda/matmul_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "codegen/families/gemm/gemm_cuda.h"
#include "ops/cuda/cublaslt_lib.h"
#include "ops/cuda/device_timing.h"
#include "ops/cuda/gemv_chain.h"
#include "ops/cuda/gemv_choice.h"
#include "ops/cuda/gemv_kernels.h"
#include "ops/dispatch.h"
#include "ops/matrix_views.h"
#include "ops/ops.h"
#include "runtime/cuda_api.h"
#include "runtime/settings.h"
#include "runtime/startup.h"
#include "runtime/status.h"

namespace kiln::cuda_ops {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kMaxDevices = 64;
constexpr size_t kMaxCachedPlans = 4096;  // dynamic shapes: start over rather than grow forever
constexpr char kMatmulName[] = "matmul";
constexpr char kLinearName[] = "linear";

[[noreturn]] void ThrowInternal(const std::string& message) {
  throw Error(absl::InternalError(message));
}

// ---- The problem: what the plan cache keys on and what error messages name. -----------------

// One GEMM in kiln's row-major terms: out[m, n] = act(a[m, k] @ b[k, n] (+ bias[n])) for `batch`
// (act kAdd: + residual[m, n], cuBLASLt's C, contiguous like out)
// matrices stride_* elements apart. A transposed operand is stored column-major (ld = its column
// stride). align_* is the byte alignment (a power of two, at most 256) of every pointer the GEMM
// will be given for that operand, loop entries included.
struct GemmKey {
  const char* op;  // kMatmulName or kLinearName
  int device;
  DType dtype;
  bool tf32, bias, trans_a, trans_b;
  Epilogue act;  // the activation of the cuBLASLt epilogue (kNone: bias only, or nothing; kAdd:
                 // none, and C is the residual with beta = 1)
  int64_t m, n, k, lda, ldb, ldo, batch, stride_a, stride_b, stride_o;
  uint32_t align_a, align_b, align_o, align_bias;
  bool operator==(const GemmKey&) const = default;
};

struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const {
    size_t h = std::hash<const void*>()(k.op);
    const int64_t flags =
        k.tf32 | k.bias << 1 | k.trans_a << 2 | k.trans_b << 3 | static_cast<int64_t>(k.act) << 4;
    for (int64_t v : {int64_t{k.device}, static_cast<int64_t>(k.dtype), flags, k.m, k.n, k.k, k.lda,
                      k.ldb, k.ldo, k.batch, k.stride_a, k.stride_b, k.stride_o, int64_t{k.align_a},
                      int64_t{k.align_b}, int64_t{k.align_o}, int64_t{k.align_bias}}) {
      h ^= std::hash<int64_t>()(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return h;
  }
};

std::string Describe(const GemmKey& k) {
  return absl::StrCat(
      k.op, " on cuda:", k.device, ", ", DTypeName(k.dtype), k.tf32 ? " (tf32)" : "", ": m=", k.m,
      " n=", k.n, " k=", k.k, " batch=", k.batch, ", a", k.trans_a ? "ᵀ" : "", " ld=", k.lda,
      " align=", k.align_a, ", b", k.trans_b ? "ᵀ" : "", " ld=", k.ldb, " align=", k.align_b,
      ", out ld=", k.ldo, " align=", k.align_o,
      k.bias ? absl::StrCat(", bias align=", k.align_bias) : "",
      k.act != Epilogue::kNone ? absl::StrCat(", epilogue=", EpilogueName(k.act)) : "");
}

std::string StatusText(cublasStatus_t status) {
  const char* name = CublasLt().GetStatusName(status);
  const char* text = CublasLt().GetStatusString(status);
  return absl::StrCat(name != nullptr ? name : "cublasStatus_t", " ", static_cast<int>(status),
                      " (", text != nullptr ? text : "unknown status", ")");
}

void CheckCublas(cublasStatus_t status, const char* call, const GemmKey& key) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  ThrowInternal(absl::StrCat(key.op, ": ", call, " failed with ", StatusText(status), " for ",
                             Describe(key)));
}

// ---- cuBLASLt objects. ----------------------------------------------------------------------

// kDestroy: the CublasLtLib member that frees a Handle.
template <typename Handle, auto kDestroy>
struct CublasDeleter {
  // Only frees host memory; cannot fail usefully.
  void operator()(Handle h) const { (CublasLt().*kDestroy)(h); }
};
using DescPtr =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>,
                    CublasDeleter<cublasLtMatmulDesc_t, &CublasLtLib::MatmulDescDestroy>>;
using LayoutPtr =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>,
                    CublasDeleter<cublasLtMatrixLayout_t, &CublasLtLib::MatrixLayoutDestroy>>;
using PrefPtr = std::unique_ptr<
    std::remove_pointer_t<cublasLtMatmulPreference_t>,
    CublasDeleter<cublasLtMatmulPreference_t, &CublasLtLib::MatmulPreferenceDestroy>>;

// Sets one attribute of a descriptor, layout or preference (`set` is the matching setter).
template <typename Obj, typename Attr, typename T>
void SetAttr(cublasStatus_t (*set)(Obj, Attr, const void*, size_t), Obj obj, Attr attr,
             const T& value, const char* call, const GemmKey& key) {
  CheckCublas(set(obj, attr, &value, sizeof(value)), call, key);
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    default:
      throw Error(absl::UnimplementedError(
          absl::StrCat("matmul (cuda): dtype ", DTypeName(t),
                       " is not supported (float32, float16 and bfloat16 are)")));
  }
}

// Everything cublasLtMatmul needs besides pointers, built once per GemmKey.
struct GemmPlan {
  DescPtr desc;
  LayoutPtr a, b, c;  // cuBLAS's A (kiln's b), B (kiln's a), C = D (out)
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;  // what `algo` needs, taken per call from the caching allocator
  mutable std::mutex bias_mu;  // the bias pointer lives in `desc`: set it and launch under this
};

// The cuBLASLt epilogue for a bias (or none) followed by `act`. cuBLASLt's GELU is the tanh
// approximation, which is why kiln's Epilogue only has kGeluTanh.
cublasLtEpilogue_t CublasEpilogue(bool bias, Epilogue act) {
  switch (act) {
    case Epilogue::kRelu:
      return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    case Epilogue::kGeluTanh:
      return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    case Epilogue::kNone:
    case Epilogue::kAdd:  // the residual is C, not an epilogue
      break;
  }
  return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

DescPtr MakeDesc(const GemmKey& key, const void* bias) {
  cublasLtMatmulDesc_t raw = nullptr;
  const cublasComputeType_t compute = key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  CheckCublas(CublasLt().MatmulDescCreate(&raw, compute, CUDA_R_32F), "cublasLtMatmulDescCreate",
              key);
  DescPtr desc(raw);
  const cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS A = kiln b
  const cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  SetAttr(CublasLt().MatmulDescSetAttribute, raw, CUBLASLT_MATMUL_DESC_TRANSA, op_a,
          "cublasLtMatmulDescSetAttribute(TRANSA)", key);
  SetAttr(CublasLt().MatmulDescSetAttribute, raw, CUBLASLT_MATMUL_DESC_TRANSB, op_b,
          "cublasLtMatmulDescSetAttribute(TRANSB)", key);
  const cublasLtEpilogue_t epilogue = CublasEpilogue(key.bias, key.act);
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    SetAttr(CublasLt().MatmulDescSetAttribute, raw, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue,
            "cublasLtMatmulDescSetAttribute(EPILOGUE)", key);
  }
  if (key.bias) {  // bias[n] runs along D's rows (n' = n), as CUBLASLT_EPILOGUE_*BIAS expects
    // The heuristic reads the bias pointer's alignment; calls then set their own pointer.
    SetAttr(CublasLt().MatmulDescSetAttribute, raw, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias,
            "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", key);
  }
  return desc;
}

// A column-major rows x cols layout with leading dim `ld`, strided over key.batch matrices.
LayoutPtr MakeLayout(const GemmKey& key, int64_t rows, int64_t cols, int64_t ld, int64_t stride) {
  cublasLtMatrixLayout_t raw = nullptr;
  CheckCublas(CublasLt().MatrixLayoutCreate(&raw, CudaType(key.dtype), static_cast<uint64_t>(rows),
                                            static_cast<uint64_t>(cols), ld),
              "cublasLtMatrixLayoutCreate", key);
  LayoutPtr layout(raw);
  if (key.batch > 1) {
    const int32_t count = static_cast<int32_t>(key.batch);  // SplitBatch keeps it <= INT32_MAX
    SetAttr(CublasLt().MatrixLayoutSetAttribute, raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count,
            "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)", key);
    SetAttr(CublasLt().MatrixLayoutSetAttribute, raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            stride, "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)", key);
  }
  return layout;
}

PrefPtr MakePreference(const GemmKey& key) {
  cublasLtMatmulPreference_t raw = nullptr;
  CheckCublas(CublasLt().MatmulPreferenceCreate(&raw), "cublasLtMatmulPreferenceCreate", key);
  PrefPtr pref(raw);
  constexpr const char* kCall = "cublasLtMatmulPreferenceSetAttribute";
  const uint64_t workspace = kWorkspaceBytes;
  SetAttr(CublasLt().MatmulPreferenceSetAttribute, raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
          workspace, kCall, key);
  // Without these the heuristic assumes 256-byte aligned pointers (cuBLAS's A is kiln's b).
  SetAttr(CublasLt().MatmulPreferenceSetAttribute, raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
          key.align_b, kCall, key);
  SetAttr(CublasLt().MatmulPreferenceSetAttribute, raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          key.align_a, kCall, key);
  SetAttr(CublasLt().MatmulPreferenceSetAttribute, raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
          key.align_o, kCall, key);
  SetAttr(CublasLt().MatmulPreferenceSetAttribute, raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
          key.align_o, kCall, key);
  if (key.dtype != DType::kFloat32) {
    // Split-K partial sums stay float32 (kiln computes half types in float32): no scheme that
    // adds partials up in the 16-bit output type.
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    SetAttr(CublasLt().MatmulPreferenceSetAttribute, raw,
            CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, mask, kCall, key);
  }
  return pref;
}

// Descriptors plus the heuristic's best algorithm; nullptr when cuBLASLt has none for `key`.
std::shared_ptr<GemmPlan> CreatePlan(const GemmKey& key, const void* bias,
                                     cublasLtHandle_t handle) {
  auto plan = std::make_shared<GemmPlan>();
  plan->desc = MakeDesc(key, bias);
  plan->a = key.trans_b ? MakeLayout(key, key.k, key.n, key.ldb, key.stride_b)
                        : MakeLayout(key, key.n, key.k, key.ldb, key.stride_b);
  plan->b = key.trans_a ? MakeLayout(key, key.m, key.k, key.lda, key.stride_a)
                        : MakeLayout(key, key.k, key.m, key.lda, key.stride_a);
  plan->c = MakeLayout(key, key.n, key.m, key.ldo, key.stride_o);
  const PrefPtr pref = MakePreference(key);
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t status = CublasLt().MatmulAlgoGetHeuristic(
      handle, plan->desc.get(), plan->a.get(), plan->b.get(), plan->c.get(), plan->c.get(),
      pref.get(), 1, &result, &count);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return nullptr;
  CheckCublas(status, "cublasLtMatmulAlgoGetHeuristic", key);
  if (count < 1 || result.state != CUBLAS_STATUS_SUCCESS) return nullptr;
  if (result.workspaceSize > kWorkspaceBytes) {
    ThrowInternal(absl::StrCat(key.op, ": cuBLASLt chose an algorithm needing ",
                               result.workspaceSize, " workspace bytes for ", Describe(key)));
  }
  plan->algo = result.algo;
  plan->workspace_bytes = result.workspaceSize;
  return plan;
}

// ---- Per-device state: one handle, never freed. ----------------------------------------------
//
// The handle holds no stream and no workspace, so threads share it. Each GEMM takes the workspace
// its algorithm needs from the caching allocator on the current stream and frees it there right
// after (stream-ordered): GEMMs of several threads or streams never share a workspace (a shared
// one gave wrong results when streams overlapped), and under CUDA graph capture it becomes graph
// memory.

struct DeviceContext {
  cublasLtHandle_t handle = nullptr;
};

DeviceContext* CreateContext(int device) {  // the current device is `device`
  cublasLtHandle_t handle = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  const cublasStatus_t status = CublasLt().Create(&handle);
  if (!cuda::OnStartupThread()) {  // in the background it delays nothing (runtime/startup.h)
    AddLibraryStartup(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  if (status != CUBLAS_STATUS_SUCCESS) {
    ThrowInternal(absl::StrCat("matmul (cuda): cublasLtCreate failed with ", StatusText(status),
                               " on cuda:", device));
  }
  return new DeviceContext{handle};
}

const DeviceContext& ContextFor(int device) {
  if (device < 0 || device >= kMaxDevices) {
    ThrowInternal(absl::StrCat("matmul (cuda): device index ", device, " out of range"));
  }
  static std::array<std::atomic<DeviceContext*>, kMaxDevices> contexts{};
  static auto* mu = new std::mutex;  // serialises creating a context (the slots are atomics)
  DeviceContext* ctx = contexts[device].load(std::memory_order_acquire);
  if (ctx != nullptr) return *ctx;
  std::lock_guard<std::mutex> lock(*mu);
  ctx = contexts[device].load(std::memory_order_relaxed);
  if (ctx == nullptr) {
    ctx = CreateContext(device);  // throws, leaving the slot empty for a later retry
    contexts[device].store(ctx, std::memory_order_release);
  }
  return *ctx;
}

// Makes `device` current for the guard's lifetime. cudaSetDevice also makes the device's primary
// context current on this thread, which cuBLASLt needs and a thread that has made no CUDA runtime
// call yet lacks (cublasLtMatmul then fails with CUDA_ERROR_INVALID_CONTEXT, seen on the H200), so
// the guard calls it once per thread and device even when `device` is already current.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    thread_local uint64_t bound = 0;             // bit d: this thread has called cudaSetDevice(d)
    const uint64_t bit = uint64_t{1} << device;  // device < kMaxDevices = 64 (CheckOperands)
    KILN_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device_ || (bound & bit) == 0) {
      KILN_CUDA_CHECK(cudaSetDevice(device_));
      bound |= bit;
    }
  }
  ~DeviceGuard() {
    if (prev_ != device_) cudaSetDevice(prev_);  // best effort: a destructor must not throw
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int prev_ = -1;
};

// ---- The plan cache. -----------------------------------------------------------------------

struct PlanCache {
  std::mutex mu;
  std::unordered_map<GemmKey, std::shared_ptr<const GemmPlan>, GemmKeyHash> plans
      ABSL_GUARDED_BY(mu);
};

// The cached plan for `key`, created on first use; nullptr if cuBLASLt has no algorithm (cached
// too, so that a GEMM falling back, e.g. from an epilogue cuBLASLt lacks, asks only once).
std::shared_ptr<const GemmPlan> PlanFor(const GemmKey& key, const void* bias,
                                        const DeviceContext& ctx) {
  static auto* cache = new PlanCache;  // never destroyed: GEMMs may run during static teardown
  {
    std::lock_guard<std::mutex> lock(cache->mu);
    auto it = cache->plans.find(key);
    if (it != cache->plans.end()) return it->second;
  }
  std::shared_ptr<const GemmPlan> plan = CreatePlan(key, bias, ctx.handle);  // slow: unlocked
  std::lock_guard<std::mutex> lock(cache->mu);
  if (cache->plans.size() >= kMaxCachedPlans) cache->plans.clear();  // users hold shared_ptrs
  return cache->plans.try_emplace(key, std::move(plan)).first->second;
}

// D = out; C = residual with beta = 1 when there is one (same layout as D), else out with 0.
void Launch(const GemmPlan& plan, const GemmKey& key, const DeviceContext& ctx, const void* a,
            const void* b, void* out, const void* bias, const void* residual, void* workspace,
            cudaStream_t stream) {
  static constexpr float kOne = 1.0f, kZero = 0.0f;
  auto matmul = [&] {
    return CublasLt().Matmul(ctx.handle, plan.desc.get(), &kOne, b, plan.a.get(), a, plan.b.get(),
                             residual != nullptr ? &kOne : &kZero,
                             residual != nullptr ? residual : out, plan.c.get(), out, plan.c.get(),
                             &plan.algo, workspace, plan.workspace_bytes, stream);
  };
  if (bias == nullptr) return CheckCublas(matmul(), "cublasLtMatmul", key);
  std::lock_guard<std::mutex> lock(plan.bias_mu);
  SetAttr(CublasLt().MatmulDescSetAttribute, plan.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER,
          bias, "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", key);
  CheckCublas(matmul(), "cublasLtMatmul", key);
}

// ---- Start-up in the background (runtime/startup.h). ---------------------------------------

// What a process's first GEMMs pay once, paid on a startup thread from the device's first
// allocation: the device's handle (the one every GEMM uses) and the heuristic's first query of
// each dtype, which loads its tables (~100 ms per dtype on the H200, against 0.2 ms for a later
// query and 2.5-9 ms for a kernel's first launch: docs/BENCHMARKS.md). Host work only: no kernel,
// no device memory, so nothing of it shows in a profile or a timing.
void WarmUpCublasLt(int device) {
  constexpr int64_t kSide = 64;
  DeviceGuard guard(device);
  const DeviceContext& ctx = ContextFor(device);
  for (DType dtype : {DType::kBFloat16, DType::kFloat32, DType::kFloat16}) {
    GemmKey key{};
    key.op = kMatmulName;
    key.device = device;
    key.dtype = dtype;
    key.act = Epilogue::kNone;
    key.m = key.n = key.k = key.lda = key.ldb = key.ldo = kSide;
    key.batch = 1;
    key.align_a = key.align_b = key.align_o = 256;
    CreatePlan(key, nullptr, ctx.handle);  // the plan is dropped: only the query's tables stay
  }
}

const bool kWarmUpRegistered = (cuda::RegisterStartupTask(&WarmUpCublasLt), true);

// ---- Operands: layouts, batch strides, alignment. --------------------------------------------

// How cuBLAS reads a 2-D matrix in place: row-major (element (r, c) at r * ld + c) or, when
// `trans`, column-major (at r + c * ld).
struct MatrixLayout {
  int64_t ld;
  bool trans;
};

// The in-place layout of t's last two dims, if it has one (a stride of a size-1 dim is free).
std::optional<MatrixLayout> InPlaceLayout(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1), rs = t.stride(-2), cs = t.stride(-1);
  if ((cols <= 1 || cs == 1) && (rows <= 1 || rs >= std::max<int64_t>(cols, 1))) {
    return MatrixLayout{rows <= 1 ? std::max<int64_t>(cols, 1) : rs, false};
  }
  if ((rows <= 1 || rs == 1) && (cols <= 1 || cs >= std::max<int64_t>(rows, 1))) {
    return MatrixLayout{cols <= 1 ? std::max<int64_t>(rows, 1) : cs, true};
  }
  return std::nullopt;
}

// `t` when cuBLAS can read it in place, else a contiguous copy; `layout` says how to read it.
Tensor ReadableOperand(const Tensor& t, MatrixLayout* layout) {
  if (std::optional<MatrixLayout> l = InPlaceLayout(t)) {
    *layout = *l;
    return t;
  }
  const Tensor copy = kiln::contiguous(t);
  const std::optional<MatrixLayout> l = InPlaceLayout(copy);
  if (!l.has_value()) {
    ThrowInternal(absl::StrCat("matmul (cuda): contiguous() of ", t.shape_string(),
                               " is not readable by cuBLAS"));
  }
  *layout = *l;
  return copy;
}

// The single stride s with which flat index i of dims `sizes` sits at i * s, if there is one
// (size-1 dims are free; 0 when every dim has size 1).
std::optional<int64_t> CollapsedStride(IntList sizes, IntList strides) {
  int64_t base = 0, count = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] == 1) continue;
    if (strides[d] < 0) return std::nullopt;
    if (count == 1) {
      base = strides[d];
    } else if (strides[d] != base * count) {
      return std::nullopt;
    }
    count *= sizes[d];
  }
  return base;
}

// The strides of t's batch dims (all but the last two) broadcast to `batch` (0 where t has 1).
Strides BatchStrides(const Tensor& t, IntList batch) {
  const int64_t rank = static_cast<int64_t>(batch.size()), t_rank = t.dim() - 2;
  Strides strides(rank, 0);
  for (int64_t i = 0; i < t_rank; ++i) {
    const int64_t d = rank - t_rank + i, size = t.shape()[i];
    if (size == 1) continue;
    if (d < 0 || size != batch[d]) {
      ThrowInternal(absl::StrCat("matmul (cuda): operand ", t.shape_string(),
                                 " does not broadcast to batch ", ShapeString(batch)));
    }
    strides[d] = t.strides()[i];
  }
  return strides;
}

// Batch dims [split, rank) form one strided batch of `count` matrices, matrix i of operand j
// (a, b, out) at i * stride[j]; dims [0, split) are looped over on the host.
struct BatchSplit {
  size_t split;
  int64_t count;
  std::array<int64_t, 3> stride;
};

BatchSplit SplitBatch(IntList batch, const std::array<Strides, 3>& strides) {
  BatchSplit best{batch.size(), 1, {0, 0, 0}};
  for (size_t s = batch.size(); s-- > 0;) {
    BatchSplit next{s, best.count * batch[s], {0, 0, 0}};
    if (next.count > INT32_MAX) break;  // cuBLASLt's batch count is an int32
    for (int j = 0; j < 3; ++j) {
      const std::optional<int64_t> st =
          CollapsedStride(batch.subspan(s), IntList(strides[j]).subspan(s));
      if (!st.has_value()) return best;
      next.stride[j] = *st;
    }
    best = next;
  }
  return best;
}

// The largest power of two, at most 256, dividing `ptr` and all of `offset_bits`.
uint32_t Alignment(const void* ptr, uint64_t offset_bits) {
  const uint64_t v = reinterpret_cast<uintptr_t>(ptr) | offset_bits | 256;
  return static_cast<uint32_t>(v & (~v + 1));
}

// ---- A prepared GEMM: operands as read, the key and the host loop. ---------------------------

struct GemmJob {
  GemmKey key;
  Tensor a, b, out, bias;  // as handed to cuBLAS (copies when needed), alive until launched
  Tensor residual;         // act kAdd: C, [m, n] contiguous (no batch loop)
  Shape loop;              // sizes of the host-looped batch dims
  std::array<Strides, 3> loop_strides;  // their strides for a, b, out (elements)
};

GemmKey MakeKey(const char* op, const GemmJob& job, MatrixLayout la, MatrixLayout lb,
                const std::array<Strides, 3>& strides, IntList batch, const BatchSplit& split,
                Epilogue act) {
  const int64_t esz = job.out.element_size();
  auto offset_bits = [&](int j) {  // every batch offset the operand's pointer moves by
    uint64_t bits = 0;
    for (size_t d = 0; d < batch.size(); ++d) {
      if (batch[d] > 1) bits |= static_cast<uint64_t>(strides[j][d] * esz);
    }
    return bits;
  };
  GemmKey k{};
  k.op = op;
  k.device = job.out.device().index;
  k.dtype = job.out.dtype();
  k.tf32 = k.dtype == DType::kFloat32 && allow_tf32();
  k.bias = job.bias.defined();
  k.trans_a = la.trans;
  k.trans_b = lb.trans;
  k.act = act;
  k.m = job.a.size(-2);
  k.n = job.b.size(-1);
  k.k = job.a.size(-1);
  k.lda = la.ld;
  k.ldb = lb.ld;
  k.ldo = std::max<int64_t>(k.n, 1);  // out is contiguous
  k.batch = split.count;
  k.stride_a = split.stride[0];
  k.stride_b = split.stride[1];
  k.stride_o = split.stride[2];
  k.align_a = Alignment(job.a.data_ptr(), offset_bits(0));
  k.align_b = Alignment(job.b.data_ptr(), offset_bits(1));
  k.align_o = Alignment(job.out.data_ptr(), offset_bits(2));
  if (job.residual.defined()) {  // C shares D's layout and the preference's alignment of both
    k.align_o = std::min(k.align_o, Alignment(job.residual.data_ptr(), offset_bits(2)));
  }
  k.align_bias = k.bias ? Alignment(job.bias.data_ptr(), 0) : 0;
  return k;
}

// out[batch..., m, n] = act(a[..., m, k] @ b[..., k, n] (+ bias[n])); a, b broadcast over
// `batch`.
GemmJob PrepareJob(const char* op, const Tensor& a, const Tensor& b, const Tensor& out,
                   IntList batch, const Tensor& bias, Epilogue act, const Tensor& residual) {
  GemmJob job;
  MatrixLayout la{}, lb{};
  job.a = ReadableOperand(a, &la);
  job.b = ReadableOperand(b, &lb);
  job.out = out;
  job.bias = bias.defined() ? kiln::contiguous(bias) : Tensor();
  if (act == Epilogue::kAdd) {
    if (!residual.defined() || !batch.empty() || residual.shape() != out.shape() ||
        !residual.is_contiguous()) {
      ThrowInternal(absl::StrCat(op, " (cuda): the residual must be a contiguous ",
                                 out.shape_string(), " matrix"));
    }
    job.residual = residual;
  }
  const std::array<Strides, 3> strides = {BatchStrides(job.a, batch), BatchStrides(job.b, batch),
                                          BatchStrides(out, batch)};
  const BatchSplit split = SplitBatch(batch, strides);
  job.loop.assign(batch.begin(), batch.begin() + split.split);
  for (int j = 0; j < 3; ++j) {
    job.loop_strides[j].assign(strides[j].begin(), strides[j].begin() + split.split);
  }
  job.key = MakeKey(op, job, la, lb, strides, batch, split, act);
  return job;
}

const void* BiasPointer(const GemmJob& job) {
  return job.bias.defined() ? job.bias.data_ptr() : nullptr;
}

void RunJob(const GemmJob& job, const GemmPlan& plan, const DeviceContext& ctx) {
  const int64_t esz = job.out.element_size();
  const char* a = static_cast<const char*>(job.a.data_ptr());
  const char* b = static_cast<const char*>(job.b.data_ptr());
  char* out = static_cast<char*>(job.out.data_ptr());
  const void* bias = BiasPointer(job);
  const void* residual = job.residual.defined() ? job.residual.data_ptr() : nullptr;
  const cudaStream_t stream = cuda::CurrentStream();
  // Freed when this returns, on `stream`, after the GEMMs below (see DeviceContext).
  const Storage workspace(plan.workspace_bytes, job.out.device());
  const int64_t entries = NumElements(job.loop);
  for (int64_t i = 0; i < entries; ++i) {
    int64_t off[3] = {0, 0, 0};
    for (int64_t d = static_cast<int64_t>(job.loop.size()) - 1, rest = i; d >= 0; --d) {
      const int64_t idx = rest % job.loop[d];
      rest /= job.loop[d];
      for (int j = 0; j < 3; ++j) off[j] += idx * job.loop_strides[j][d];
    }
    Launch(plan, job.key, ctx, a + off[0] * esz, b + off[1] * esz, out + off[2] * esz, bias,
           residual, workspace.data(), stream);  // a residual comes without a batch loop
  }
}

bool Misaligned(const GemmKey& k) {
  return k.align_a < 16 || k.align_b < 16 || (k.bias && k.align_bias < 16);
}

// The prepared job and cached plan for one GEMM; plan is nullptr when cuBLASLt has no algorithm,
// even on well aligned copies of the inputs.
struct PlannedGemm {
  GemmJob job;
  std::shared_ptr<const GemmPlan> plan;
};

PlannedGemm PlanGemm(const char* op, const Tensor& a, const Tensor& b, const Tensor& out,
                     IntList batch, const Tensor& bias, Epilogue act, const Tensor& residual,
                     const DeviceContext& ctx) {
  PlannedGemm g{PrepareJob(op, a, b, out, batch, bias, act, residual), nullptr};
  g.plan = PlanFor(g.job.key, BiasPointer(g.job), ctx);
  if (g.plan == nullptr && Misaligned(g.job.key)) {
    // No algorithm for these alignments: retry on fresh (well aligned) copies of the inputs.
    g.job = PrepareJob(op, kiln::clone(a), kiln::clone(b), out, batch,
                       bias.defined() ? kiln::clone(bias) : bias, act, residual);
    g.plan = PlanFor(g.job.key, BiasPointer(g.job), ctx);
  }
  return g;
}

// Runs out[batch..., m, n] = act(a @ b (+ bias)) (kAdd: + residual) with cuBLASLt; `out` is
// contiguous. Returns false when cuBLASLt has no algorithm with `act` in the epilogue (a dtype or
// layout it does not support): the GEMM then ran with the bias alone and the caller must apply
// the epilogue.
bool BatchedGemm(const char* op, const Tensor& a, const Tensor& b, const Tensor& out, IntList batch,
                 const Tensor& bias, Epilogue act = Epilogue::kNone,
                 const Tensor& residual = Tensor()) {
  const DeviceContext& ctx = ContextFor(out.device().index);
  PlannedGemm g = PlanGemm(op, a, b, out, batch, bias, act, residual, ctx);
  const bool fused = g.plan != nullptr;
  if (!fused && act != Epilogue::kNone) {
    g = PlanGemm(op, a, b, out, batch, bias, Epilogue::kNone, Tensor(), ctx);
  }
  if (g.plan == nullptr) {
    ThrowInternal(absl::StrCat(op, ": cublasLtMatmulAlgoGetHeuristic returned no algorithm for ",
                               Describe(g.job.key)));
  }
  RunJob(g.job, *g.plan, ctx);
  return fused;
}

// Applies linear's epilogue to `out` in place with the eager op: the activation, or kAdd's
// residual (the fallback when the GEMM could not, and after the K == 0 fill).
void ApplyEpilogue(const Tensor& out, Epilogue act, const Tensor& residual) {
  if (act == Epilogue::kAdd) {
    DispatchInPlace(OpId::kAdd, {out, residual}, {});
    return;
  }
  OpAttrs attrs;
  const OpDef* def = EpilogueActivation(act, &attrs);
  if (def != nullptr) DispatchInPlace(def->id, {out}, attrs);
}

// out[m, n] = bias broadcast over the rows, or zeros without a bias: the K == 0 product.
void FillWithoutGemm(const Tensor& out, const Tensor& bias, int64_t m, int64_t n) {
  const cudaStream_t stream = cuda::CurrentStream();
  const size_t row = static_cast<size_t>(n * out.element_size());
  char* dst = static_cast<char*>(out.data_ptr());
  if (!bias.defined()) {
    KILN_CUDA_CHECK(cudaMemsetAsync(dst, 0, m * row, stream));
    return;
  }
  const Tensor b = kiln::contiguous(bias);
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, b.data_ptr(), row, cudaMemcpyDeviceToDevice, stream));
  for (int64_t done = 1; done < m; done *= 2) {  // each copy doubles the rows written
    const size_t bytes = static_cast<size_t>(std::min(done, m - done)) * row;
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(dst + done * row, dst, bytes, cudaMemcpyDeviceToDevice, stream));
  }
}

// ---- Argument checks and views shared by the two kernels. -----------------------------------

// Inputs [min_in, max_in) beyond min_in are optional (linear's bias) and may be undefined.
void CheckOperands(const char* op, absl::Span<const Tensor> in, size_t min_in, size_t max_in,
                   const Tensor& out) {
  auto fail = [op](const std::string& why) { ThrowInternal(absl::StrCat(op, " (cuda): ", why)); };
  if (in.size() < min_in || in.size() > max_in) fail(absl::StrCat("got ", in.size(), " inputs"));
  if (!out.defined() || !out.device().is_cuda()) fail("the output must be a CUDA tensor");
  if (out.device().index < 0 || out.device().index >= kMaxDevices)
    fail("device index out of range");
  if (!out.is_contiguous()) fail("the output must be contiguous");
  CudaType(out.dtype());  // throws kUnimplemented for other dtypes
  for (size_t i = 0; i < in.size(); ++i) {
    const Tensor& t = in[i];
    if (!t.defined() && i >= min_in) continue;  // an absent optional bias
    if (!t.defined() || t.device() != out.device() || t.dtype() != out.dtype()) {
      fail(absl::StrCat("input ", i, " must be a ", DTypeName(out.dtype()), " tensor on ",
                        out.device().str()));
    }
  }
}

// x [..., k] as a matrix [m, k] without a copy, when its leading dims collapse to one stride.
std::optional<Tensor> RowsView(const Tensor& x, int64_t m, int64_t k) {
  const IntList sizes = IntList(x.shape()).subspan(0, x.dim() - 1);
  const IntList strides = IntList(x.strides()).subspan(0, x.dim() - 1);
  const std::optional<int64_t> row_stride = CollapsedStride(sizes, strides);
  if (!row_stride.has_value()) return std::nullopt;
  return x.as_strided({m, k}, {*row_stride, x.stride(-1)}, x.offset());
}

// x [..., k] as a matrix [m, k]: the view where there is one, else a contiguous copy.
Tensor FlattenRows(const Tensor& x, int64_t m, int64_t k) {
  if (std::optional<Tensor> view = RowsView(x, m, k)) return *view;
  const Tensor c = kiln::contiguous(x);
  return c.as_strided({m, k}, {k, 1}, c.offset());
}

// ---- linear with few rows: kiln's GEMV. -------------------------------------------------------

// Whether the GEMV can run linear on x2 [m, k] and w [n, k]: few rows, unit column strides (a
// column stride is never used when k == 1).
bool GemvFits(const Tensor& x2, const Tensor& w, int64_t m, int64_t k) {
  return m >= 1 && m <= cuda_kernels::kGemvMaxRows &&
         (k == 1 || (x2.stride(1) == 1 && w.stride(1) == 1));
}

// The byte alignment, at most 16, of every row of a [rows, ...] operand `stride` elements apart.
uint32_t RowAlignment(const Tensor& t, int64_t rows, int64_t stride) {
  const uint64_t bits = rows > 1 ? static_cast<uint64_t>(stride * t.element_size()) : 0;
  return std::min<uint32_t>(16, Alignment(t.data_ptr(), bits));
}

GemvProblem MakeGemvProblem(const Tensor& x2, const Tensor& w, const Tensor& bias,
                            const Tensor& out, Epilogue act) {  // kAdd: the residual is like out
  GemvProblem p;
  p.device = out.device().index;
  p.dtype = out.dtype();
  p.m = x2.size(0);
  p.n = w.size(0);
  p.k = w.size(1);
  p.tf32 = p.dtype == DType::kFloat32 && allow_tf32();
  p.bias = bias.defined();
  p.graph = cuda::ForGraphReplay();
  p.act = act;
  p.align_x = RowAlignment(x2, p.m, x2.stride(0));
  p.align_w = RowAlignment(w, p.n, w.stride(0));
  p.align_bias = p.bias ? RowAlignment(bias, p.n, bias.stride(0)) : 16;
  p.align_out = RowAlignment(out, p.m, p.n);
  return p;
}

// A norm of x's rows for the GEMV to apply as it reads them (GemvArgs::norm).
struct GemvNormOperands {
  cuda_kernels::GemvNorm kind = cuda_kernels::GemvNorm::kNone;
  Tensor weight, bias;  // [k] contiguous, or undefined
  double eps = 0;
};

// Whether the GEMV may load its first weights before its dependency wait: only where no kernel
// that may still be running writes them. A plain launch starts after every earlier kernel ended.
// A dependent one overlaps only the kernel launched right before it (every kiln kernel lets its
// dependent start after its own wait, so the one before that has ended), and inside a compiled
// plan's run that kernel writes no constant of the plan, nor does the user's last kernel before
// the run, since the run's first launch is plain (cuda::ScopedPlanRun). KILN_GEMV_PRELOAD: off
// for A/B; always breaks the rule, to check that the race test catches it.
bool PreloadWeights(const cuda_kernels::GemvArgs& a, const Tensor& w) {
  static const std::string mode = EnvChoice("KILN_GEMV_PRELOAD");
  if (mode == "off") return false;
  if (mode == "always" || !a.dependent_launch) return true;
  // A gated product's up half (a separate up_proj, or the merged weight's other half) is loaded
  // before the wait too, and is laid out as w.
  const size_t bytes = static_cast<size_t>((a.n - 1) * a.ldw + a.k) * w.element_size();
  return cuda::ReadOnlyDuringRun(a.w, bytes) &&
         (a.w_up == nullptr || cuda::ReadOnlyDuringRun(a.w_up, bytes));
}

// The up half of a gated product for the GEMV (GemvArgs::w_up): its weight rows, its bias (or
// undefined), and the gate's activation.
struct GemvUpHalf {
  Tensor w, bias;
  cuda_kernels::GemvAct act = cuda_kernels::GemvAct::kNone;
};

// out [m, n] (contiguous) = act(x2 [m, k] · w [n, k]ᵀ + bias) (kAdd: + residual [m, n],
// contiguous) with the GEMV kernel, x2's rows normalised first when `norm` says so; with `up`, the
// gated product act(x2 · wᵀ + bias) · (x2 · up.wᵀ + up.bias) instead.
void RunGemv(const Tensor& x2, const Tensor& w, const Tensor& bias, const Tensor& residual,
             const Tensor& out, Epilogue act, const GemvNormOperands& norm = {},
             const GemvUpHalf* up = nullptr) {
  using cuda_kernels::GemvAct;
  cuda_kernels::GemvArgs a{};
  a.x = x2.data_ptr();
  a.ldx = x2.stride(0);
  a.w = w.data_ptr();
  a.ldw = w.stride(0);
  a.bias = bias.defined() ? bias.data_ptr() : nullptr;
  a.bias_stride = bias.defined() ? bias.stride(0) : 0;
  a.out = out.data_ptr();
  a.residual = act == Epilogue::kAdd ? residual.data_ptr() : nullptr;
  a.m = x2.size(0);
  a.n = w.size(0);
  a.k = w.size(1);
  a.type = *cuda_kernels::ElemTypeOf(out.dtype());  // float32, float16 or bfloat16 (CheckOperands)
  a.act = act == Epilogue::kRelu       ? GemvAct::kRelu
          : act == Epilogue::kGeluTanh ? GemvAct::kGeluTanh
                                       : GemvAct::kNone;
  a.sm_count = cuda::Props(out.device().index).sm_count;
  static const bool tensor_cores = EnvBool("KILN_GEMV_MMA");
  a.tensor_cores = tensor_cores;
  static const bool fold_norm = EnvBool("KILN_GEMV_NORM_FOLD");
  a.fold_norm = fold_norm;
  a.norm = norm.kind;
  a.norm_weight = norm.weight.defined() ? norm.weight.data_ptr() : nullptr;
  a.norm_bias = norm.bias.defined() ? norm.bias.data_ptr() : nullptr;
  a.norm_eps = static_cast<float>(norm.eps);
  if (up != nullptr) {
    a.act = up->act;
    a.w_up = up->w.data_ptr();
    a.bias_up = up->bias.defined() ? up->bias.data_ptr() : nullptr;
  }
  // Inside a compiled plan's chain region (which takes no gated product): launched later, with the
  // next GEMVs (plainly, and nothing loaded before a wait).
  if (DeferringGemvs() &&
      DeferGemv(a, cuda::CurrentStream(), {x2, w, bias, residual, out, norm.weight, norm.bias})) {
    return;
  }
  // Asked right before the launch: a plan's first ask is its first launch (cuda::ScopedPlanRun).
  a.dependent_launch = cuda::UseDependentLaunch(out.device().index);
  a.preload_weights = PreloadWeights(a, w);
  KILN_CUDA_CHECK(cuda_kernels::Gemv(a, cuda::CurrentStream()));
}

// linear's residual operand as the contiguous [m, n] matrix the GEMM and the GEMV read.
Tensor ResidualMatrix(const Tensor& residual, int64_t m, int64_t n) {
  const Tensor r = residual.is_contiguous() ? residual : kiln::contiguous(residual);
  return r.as_strided({m, n}, {n, 1}, r.offset());
}

}  // namespace

void Matmul(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& attrs) {
  CheckOperands(kMatmulName, in, 2, 2, out);
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index);
  const Tensor a = AsMatrix(attrs.transpose_a ? SwapLast2(in[0]) : in[0], true);
  const Tensor b = AsMatrix(attrs.transpose_b ? SwapLast2(in[1]) : in[1], false);
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  // out viewed as [batch..., m, n] (a 1-D operand dropped its dim from the real output).
  const int64_t batch_rank = out.dim() - (in[0].dim() == 1 ? 0 : 1) - (in[1].dim() == 1 ? 0 : 1);
  if (batch_rank < 0 || b.size(-2) != k) {
    ThrowInternal(absl::StrCat("matmul (cuda): operands ", in[0].shape_string(), " and ",
                               in[1].shape_string(), " do not give ", out.shape_string()));
  }
  const Shape batch(out.shape().begin(), out.shape().begin() + batch_rank);
  Shape shape = batch;
  shape.push_back(m);
  shape.push_back(n);
  if (NumElements(shape) != out.numel()) ThrowInternal("matmul (cuda): output size mismatch");
  const Tensor o = out.as_strided(shape, ContiguousStrides(shape), out.offset());
  if (k == 0) return FillWithoutGemm(o, Tensor(), out.numel() / n, n);
  BatchedGemm(kMatmulName, a, b, o, batch, Tensor());
}

void Linear(const OpDef&, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& attrs) {
  CheckOperands(kLinearName, in, 2, 4, out);
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index);
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  const bool has_residual = HasResidual(attrs);
  const Tensor bias = LinearHasBias(in.size(), attrs) ? in[2] : Tensor();  // may be undefined
  const Tensor residual = has_residual ? in.back() : Tensor();
  if (x.dim() < 1 || w.dim() != 2 || x.size(-1) != w.size(1) || out.size(-1) != w.size(0) ||
      (bias.defined() && (bias.dim() != 1 || bias.size(0) != w.size(0))) ||
      (has_residual && (!residual.defined() || residual.shape() != out.shape()))) {
    ThrowInternal(absl::StrCat("linear (cuda): operands ", x.shape_string(), ", ", w.shape_string(),
                               has_residual ? " and residual " + residual.shape_string() : "",
                               " do not give ", out.shape_string()));
  }
  const int64_t n = w.size(0), k = w.size(1), m = out.numel() / n;
  const Tensor o = out.as_strided({m, n}, {n, 1}, out.offset());
  // The residual as a contiguous [m, n] matrix (C of the GEMM, read by the GEMV).
  const Tensor r2 = has_residual ? ResidualMatrix(residual, m, n) : Tensor();
  // Every launch but the GEMV's first launches the GEMVs a chain region holds (gemv_chain.h).
  if (k == 0) {
    FlushDeferredGemvs();
    FillWithoutGemm(o, bias, m, n);
    return ApplyEpilogue(o, attrs.epilogue, r2);
  }
  const Tensor x2 = FlattenRows(x, m, k);
  const Tensor wt = w.as_strided({k, n}, {w.stride(1), w.stride(0)}, w.offset());  // no copy
  auto cublas = [&](const Tensor& dst) {
    FlushDeferredGemvs();
    if (!BatchedGemm(kLinearName, x2, wt, dst, {}, bias, attrs.epilogue, r2)) {
      ApplyEpilogue(dst, attrs.epilogue, r2);
    }
  };
  if (GemvFits(x2, w, m, k)) {
    auto gemv = [&](const Tensor& dst) { RunGemv(x2, w, bias, r2, dst, attrs.epilogue); };
    if (ChooseGemv(MakeGemvProblem(x2, w, bias, o, attrs.epilogue), o, gemv, cublas)) {
      return gemv(o);
    }
  }
  // kiln's Hopper GEMM (codegen/families/gemm/), the epilogue inside, when chosen.
  if (m > cuda_kernels::kGemvMaxRows && Sm90GemmApplies(x2, w, bias, o, false, r2) &&
      ChooseSm90Gemm(x2, w, bias, o, cublas, attrs.epilogue, r2)) {
    FlushDeferredGemvs();
    return RunSm90Gemm(x2, w, bias, o, attrs.epilogue, r2);
  }
  cublas(o);
}

namespace {

// The GEMV's activation for a gated product's gate, nullopt for one it has not.
std::optional<cuda_kernels::GemvAct> GateAct(const GatedProduct& g) {
  using cuda_kernels::GemvAct;
  switch (g.act) {
    case OpId::kRelu:
      return GemvAct::kRelu;
    case OpId::kSilu:
      return GemvAct::kSilu;
    case OpId::kGelu:
      return g.approximate == GeluApprox::kTanh ? GemvAct::kGeluTanh : GemvAct::kGelu;
    default:
      return std::nullopt;
  }
}

// Rows [first, first + rows) of a [r, k] weight, or elements of a [r] bias (undefined stays so).
Tensor Rows(const Tensor& t, int64_t first, int64_t rows) {
  if (!t.defined()) return t;
  Shape shape = t.shape();
  shape[0] = rows;
  return t.as_strided(shape, t.strides(), t.offset() + first * t.stride(0));
}

}  // namespace

bool NormLinearGemv(OpId norm, absl::Span<const Tensor> norm_in, double eps,
                    absl::Span<const Tensor> rest, const OpAttrs& attrs, const Tensor& out,
                    const std::function<void(const Tensor& out)>& norm_then_linear,
                    const GatedProduct* gated) {
  if (CurrentGemvMode() == GemvMode::kOff || norm_in.empty() || rest.empty()) return false;
  const Tensor& x = norm_in[0];
  const Tensor& w = rest[0];
  const Tensor bias = LinearHasBias(rest.size() + 1, attrs) ? rest[1] : Tensor();
  const Tensor residual = HasResidual(attrs) ? rest.back() : Tensor();
  GemvNormOperands nrm;
  nrm.kind = norm == OpId::kRmsNorm ? cuda_kernels::GemvNorm::kRms : cuda_kernels::GemvNorm::kLayer;
  nrm.weight = norm_in.size() > 1 ? norm_in[1] : Tensor();
  nrm.bias = norm_in.size() > 2 ? norm_in[2] : Tensor();
  nrm.eps = eps;
  const DType t = out.dtype();
  auto same = [&](const Tensor& u) {
    return !u.defined() || (u.dtype() == t && u.device() == out.device());
  };
  if ((norm != OpId::kLayerNorm && norm != OpId::kRmsNorm) || !out.device().is_cuda() ||
      !cuda_kernels::ElemTypeOf(t).has_value() || !out.is_contiguous() || x.dim() < 1 ||
      w.dim() != 2 || !same(x) || !same(w) || !same(bias) || !same(residual) || !same(nrm.weight) ||
      !same(nrm.bias)) {
    return false;
  }
  // A gated product of one linear: w holds both halves ([2n, k]), the output one ([..., n]); of
  // two: the up's weight and bias are laid out as the gate's.
  const bool two_linears = gated != nullptr && gated->up_weight.defined();
  const int64_t halves = gated != nullptr && !two_linears ? 2 : 1;
  const int64_t n = w.size(0) / halves, k = w.size(1);
  const std::optional<cuda_kernels::GemvAct> gate_act =
      gated != nullptr ? GateAct(*gated) : std::nullopt;
  if (gated != nullptr && (!gate_act.has_value() || w.size(0) != halves * n ||
                           attrs.epilogue != Epilogue::kNone || residual.defined())) {
    return false;
  }
  if (two_linears) {
    const Tensor &uw = gated->up_weight, &ub = gated->up_bias;
    if (!same(uw) || !same(ub) || uw.shape() != w.shape() || uw.strides() != w.strides() ||
        ub.defined() != bias.defined() ||
        (ub.defined() && (ub.shape() != bias.shape() || ub.strides() != bias.strides()))) {
      return false;
    }
  }
  auto row_vector = [](const Tensor& u, int64_t len) {
    return !u.defined() || (u.dim() == 1 && u.size(0) == len && (len == 1 || u.stride(0) == 1));
  };
  if (k == 0 || n == 0 || out.numel() == 0 || x.size(-1) != k || out.size(-1) != n ||
      x.numel() / k != out.numel() / n || !row_vector(nrm.weight, k) || !row_vector(nrm.bias, k) ||
      !row_vector(bias, halves * n) ||
      (residual.defined() && (residual.shape() != out.shape() || !residual.is_contiguous()))) {
    return false;
  }
  const int64_t m = out.numel() / n;
  // x's rows as one [m, k] matrix without a copy (a copy would be a launch of its own).
  const std::optional<Tensor> x2 = RowsView(x, m, k);
  if (!x2.has_value() || !GemvFits(*x2, w, m, k) ||
      static_cast<size_t>(m * k) * out.element_size() > cuda_kernels::kMaxNormSharedBytes) {
    return false;
  }
  DeviceGuard guard(out.device().index);
  const Tensor r2 = residual.defined() ? ResidualMatrix(residual, m, n) : Tensor();
  const Tensor o = out.as_strided({m, n}, {n, 1}, out.offset());
  GemvUpHalf up;
  Tensor w_rows = w, bias_rows = bias;
  if (two_linears) {
    up = {gated->up_weight, gated->up_bias, *gate_act};
  } else if (gated != nullptr) {  // the gate's rows as w, the up's as up.w
    const int64_t gate_at = gated->gate_first ? 0 : n, up_at = gated->gate_first ? n : 0;
    up = {Rows(w, up_at, n), Rows(bias, up_at, n), *gate_act};
    w_rows = Rows(w, gate_at, n);
    bias_rows = Rows(bias, gate_at, n);
  }
  auto fused = [&](const Tensor& dst) {
    RunGemv(*x2, w_rows, bias_rows, r2, dst, attrs.epilogue, nrm, gated != nullptr ? &up : nullptr);
  };
  // `norm_then_linear` writes the linear's output shape; the choice hands both paths [m, n].
  auto apart = [&](const Tensor& dst) {
    norm_then_linear(dst.as_strided(out.shape(), out.strides(), dst.offset()));
  };
  GemvProblem p = MakeGemvProblem(*x2, w_rows, bias_rows, o, attrs.epilogue);
  p.norm = nrm.kind;
  p.gate_act = gate_act.value_or(cuda_kernels::GemvAct::kNone);
  if (p.gated()) p.align_w = std::min(p.align_w, RowAlignment(up.w, n, up.w.stride(0)));
  if (!ChooseGemv(p, o, fused, apart)) return false;
  fused(o);
  return true;
}

}  // namespace kiln::cuda_ops
