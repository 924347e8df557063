// Generated elementwise CUDA kernels (see elementwise_cuda.h).
#include "ops/cuda/elementwise_cuda.h"

#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "runtime/status.h"

namespace kiln::cuda_ops {
namespace {

constexpr int kMaxRank = 8;
constexpr int kMaxOperands = 4;  // out + 3 inputs

// Device helpers shared by every generated kernel: storage types, conversions, math.
constexpr char kPrelude[] = R"(
typedef unsigned short kiln_u16;
typedef unsigned char kiln_bool;
__device__ __forceinline__ float kiln_bf16_to_f(kiln_u16 b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ kiln_u16 kiln_f_to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (kiln_u16)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (kiln_u16)(u >> 16);
}
__device__ __forceinline__ float kiln_f16_to_f(kiln_u16 h) {
  float f; asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ kiln_u16 kiln_f_to_f16(float f) {
  kiln_u16 h; asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f)); return h;
}
template <typename T> __device__ __forceinline__ T kiln_relu(T x) { return x > T(0) || x != x ? x : T(0); }
__device__ __forceinline__ float kiln_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float kiln_silu(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float kiln_gelu(float x, int approx_tanh) {
  if (approx_tanh) return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  return 0.5f * x * (1.f + erff(x * 0.7071067811865476f));
}
struct KilnIndexer { int rank; long long sizes[8]; long long strides[4][8]; };
template <int N> struct alignas(N) KilnRaw { unsigned char b[N]; };
)";

struct TypeInfo {
  const char* storage;  // C type of an element in memory
  const char* load;     // expression turning `v` (storage) into the compute type
  const char* store;    // expression turning `v` (compute) into storage
};

TypeInfo Info(DType t) {
  switch (t) {
    case DType::kFloat32:
      return {"float", "v", "(float)(v)"};
    case DType::kFloat16:
      return {"kiln_u16", "kiln_f16_to_f(v)", "kiln_f_to_f16((float)(v))"};
    case DType::kBFloat16:
      return {"kiln_u16", "kiln_bf16_to_f(v)", "kiln_f_to_bf16((float)(v))"};
    case DType::kBool:
      return {"kiln_bool", "(v != 0)", "(kiln_bool)((v) != 0)"};
    case DType::kInt32:
      return {"int", "v", "(int)(v)"};
    case DType::kInt64:
      return {"long long", "v", "(long long)(v)"};
  }
  return {"float", "v", "v"};
}

std::string Load(DType t, const std::string& v) {
  return absl::StrReplaceAll(Info(t).load, {{"v", v}});
}

std::string Store(DType t, const std::string& v) {
  return absl::StrReplaceAll(Info(t).store, {{"v", v}});
}

// The operand list of the kernel signatures.
std::string Params(const std::vector<DType>& in, DType out) {
  std::string s = absl::StrCat(Info(out).storage, "* __restrict__ out");
  for (size_t i = 0; i < in.size(); ++i) {
    absl::StrAppend(&s, ", const ", Info(in[i]).storage, "* __restrict__ in", i);
  }
  return s + ", float scalar, long long n";
}

// Computes result `r` for element reads in{i}[off_i] and stores it at out[off_out].
std::string Body(const std::string& expr, const std::vector<DType>& in, DType out,
                 const std::string& out_idx, const std::vector<std::string>& in_idx) {
  bool all_float = true;
  for (DType t : in) all_float &= IsFloatingPoint(t) || t == DType::kBool;
  const char* acc = all_float ? "float" : "double";
  std::string s;
  for (size_t i = 0; i < in.size(); ++i) {
    absl::StrAppend(&s, "    const ", acc, " a", i, " = (", acc, ")",
                    Load(in[i], absl::StrCat("in", i, "[", in_idx[i], "]")), ";\n");
  }
  absl::StrAppend(&s, "    out[", out_idx, "] = ", Store(out, expr), ";\n");
  return s;
}

int VectorWidth(const std::vector<DType>& in, DType out) {
  int64_t widest = DTypeSize(out);
  for (DType t : in) widest = std::max(widest, DTypeSize(t));
  return static_cast<int>(16 / widest);
}

}  // namespace

const char* KernelPrelude() { return kPrelude; }
std::string StorageType(DType t) { return Info(t).storage; }
std::string LoadExpr(DType t, const std::string& v) { return Load(t, v); }
std::string StoreExpr(DType t, const std::string& v) { return Store(t, v); }

std::string RenderElementwiseSource(const std::string& base, const std::string& expr_template,
                                    const std::vector<DType>& in, DType out) {
  std::string expr = expr_template;
  for (size_t i = 0; i < in.size(); ++i) {
    expr = absl::StrReplaceAll(expr, {{absl::StrCat("$", i), absl::StrCat("a", i)}});
  }
  expr = absl::StrReplaceAll(expr, {{"$scalar", "scalar"}});
  const int vec = VectorWidth(in, out);
  std::string src = kPrelude;
  // Contiguous kernel: each thread handles `vec` consecutive elements with wide loads/stores.
  absl::StrAppend(
      &src, "extern \"C\" __global__ void ", base, "_contig(", Params(in, out), ") {\n",
      "  const long long groups = n / ", vec, ";\n",
      "  for (long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x; g < groups;",
      " g += (long long)gridDim.x * blockDim.x) {\n");
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string st = Info(in[i]).storage;
    absl::StrAppend(&src, "    ", st, " r", i, "[", vec, "]; *(KilnRaw<sizeof(", st, ") * ", vec,
                    ">*)r", i, " = ((const KilnRaw<sizeof(", st, ") * ", vec, ">*)in", i,
                    ")[g];\n");
  }
  absl::StrAppend(&src, "    ", Info(out).storage, " w[", vec, "];\n", "    #pragma unroll\n",
                  "    for (int j = 0; j < ", vec, "; ++j) {\n");
  std::vector<std::string> reg_idx;
  for (size_t i = 0; i < in.size(); ++i) reg_idx.push_back("j");
  std::string body = Body(expr, in, out, "j", reg_idx);
  for (size_t i = 0; i < in.size(); ++i) {
    body = absl::StrReplaceAll(body, {{absl::StrCat("in", i, "[j]"), absl::StrCat("r", i, "[j]")}});
  }
  body = absl::StrReplaceAll(body, {{"out[j]", "w[j]"}});
  absl::StrAppend(&src, body, "    }\n    ((KilnRaw<sizeof(", Info(out).storage, ") * ", vec,
                  ">*)out)[g] = *(KilnRaw<sizeof(", Info(out).storage, ") * ", vec, ">*)w;\n  }\n");
  // Tail elements after the last full group.
  std::vector<std::string> tail_idx(in.size(), "i");
  absl::StrAppend(&src, "  for (long long i = groups * ", vec,
                  " + blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;",
                  " i += (long long)gridDim.x * blockDim.x) {\n",
                  Body(expr, in, out, "i", tail_idx), "  }\n}\n");
  // Strided kernels with broadcasting (stride 0 on repeated dims): 64-bit index math, and a
  // 32-bit variant (cheaper div/mod) for tensors under 2^31 elements.
  std::vector<std::string> off_idx;
  for (size_t i = 0; i < in.size(); ++i) off_idx.push_back(absl::StrCat("o", i + 1));
  for (const char* idx : {"long long", "unsigned"}) {
    const bool narrow = std::string(idx) == "unsigned";
    absl::StrAppend(&src, "extern \"C\" __global__ void ", base,
                    narrow ? "_strided32(" : "_strided(", Params(in, out), ", KilnIndexer ix) {\n",
                    "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;",
                    " i += (long long)gridDim.x * blockDim.x) {\n", "    ", idx, " rem = (", idx,
                    ")i; long long o0 = 0, o1 = 0, o2 = 0, o3 = 0;\n",
                    "    for (int d = ix.rank - 1; d >= 0; --d) {\n", "      const ", idx,
                    " size = (", idx, ")ix.sizes[d];\n",
                    "      const long long c = rem % size; rem /= size;\n",
                    "      o0 += c * ix.strides[0][d]; o1 += c * ix.strides[1][d];\n",
                    "      o2 += c * ix.strides[2][d]; o3 += c * ix.strides[3][d];\n", "    }\n",
                    Body(expr, in, out, "o0", off_idx), "  }\n}\n");
  }
  return src;
}

namespace {

using KernelPair = ElementwiseKernels;

// Compiled kernels per (op, dtypes, approximate); the hot path is one locked map lookup.
KernelPair& KernelsFor(const OpDef& def, const std::string& expr_template,
                       absl::Span<const Tensor> in, DType out, const OpAttrs& a) {
  uint64_t key = static_cast<uint64_t>(def.id) | (static_cast<uint64_t>(out) << 16) |
                 (static_cast<uint64_t>(a.approximate) << 20);
  std::vector<DType> types;
  for (size_t i = 0; i < in.size(); ++i) {
    types.push_back(in[i].dtype());
    key |= (static_cast<uint64_t>(in[i].dtype()) + 1) << (24 + 4 * i);
  }
  static std::mutex mu;
  static std::unordered_map<uint64_t, KernelPair> kernels;
  std::lock_guard<std::mutex> lock(mu);
  auto it = kernels.find(key);
  if (it != kernels.end()) return it->second;
  const std::string expr = absl::StrReplaceAll(
      expr_template, {{"$approximate", a.approximate == GeluApprox::kTanh ? "1" : "0"}});
  std::string base = absl::StrCat("kiln_", def.name);
  for (DType t : types) absl::StrAppend(&base, "_", DTypeName(t));
  absl::StrAppend(&base, "_to_", DTypeName(out));
  return kernels.emplace(key, CompileElementwiseKernels(base, expr, types, out)).first->second;
}

struct Indexer {
  int rank;
  long long sizes[kMaxRank];
  long long strides[kMaxOperands][kMaxRank];
};

// Operand strides over the output's shape with size-1 dims dropped and dims merged wherever
// every operand is contiguous across them (a bias over [8,16,1024,1024] becomes rank 2), so the
// kernel does as few div/mods per element as possible.
Indexer CollapsedIndexer(absl::Span<const Tensor> in, const Tensor& out) {
  const int rank = static_cast<int>(out.dim()), ops = static_cast<int>(in.size()) + 1;
  long long st[kMaxOperands][kMaxRank] = {};
  for (int d = 0; d < rank; ++d) st[0][d] = out.strides()[d];
  for (int i = 0; i + 1 < ops; ++i) {
    const int lead = rank - static_cast<int>(in[i].dim());
    for (int d = 0; d < in[i].dim(); ++d) {
      st[i + 1][lead + d] = in[i].shape()[d] == 1 ? 0 : in[i].strides()[d];
    }
  }
  Indexer ix{};
  for (int d = 0; d < rank; ++d) {
    const long long size = out.shape()[d];
    if (size == 1) continue;
    bool merge = ix.rank > 0;
    for (int i = 0; i < ops && merge; ++i) {
      merge = st[i][d] * size == ix.strides[i][ix.rank - 1] ||
              (st[i][d] == 0 && ix.strides[i][ix.rank - 1] == 0);
    }
    if (merge) {  // fold dim d into the previous kept dim: it becomes the faster one
      ix.sizes[ix.rank - 1] *= size;
      for (int i = 0; i < ops; ++i) ix.strides[i][ix.rank - 1] = st[i][d];
    } else {
      ix.sizes[ix.rank] = size;
      for (int i = 0; i < ops; ++i) ix.strides[i][ix.rank] = st[i][d];
      ++ix.rank;
    }
  }
  return ix;
}

bool FastPathApplies(absl::Span<const Tensor> in, const Tensor& out, int vec) {
  if (!out.is_contiguous()) return false;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(out.data_ptr())) return false;
  for (const Tensor& t : in) {
    if (t.shape() != out.shape() || !t.is_contiguous() || !aligned(t.data_ptr())) return false;
  }
  return true;
}

void Launch(cudaKernel_t k, void** args, int64_t work) {
  const int block = 256;
  const int64_t max_grid = static_cast<int64_t>(cuda::Props(0).sm_count) * 32;
  const int64_t grid = std::max<int64_t>(1, std::min((work + block - 1) / block, max_grid));
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(grid), dim3(block), args,
                                   0, cuda::CurrentStream()));
}

void Run(const OpDef& def, const std::string& expr, absl::Span<const Tensor> in, const Tensor& out,
         const OpAttrs& a) {
  KILN_CHECK(out.dim() <= kMaxRank && in.size() + 1 <= kMaxOperands, def.name,
             ": CUDA elementwise kernels support up to rank ", kMaxRank, ", got ",
             out.shape_string());
  LaunchElementwise(KernelsFor(def, expr, in, out.dtype(), a), in, out,
                    static_cast<float>(a.scalar));
}

}  // namespace

ElementwiseKernels CompileElementwiseKernels(const std::string& base, const std::string& expr,
                                             const std::vector<DType>& in, DType out) {
  const std::string src = RenderElementwiseSource(base, expr, in, out);
  ElementwiseKernels k;
  k.contig = ValueOrThrow(cuda::GetKernel(src, base + "_contig"));
  k.strided = ValueOrThrow(cuda::GetKernel(src, base + "_strided"));
  k.strided32 = ValueOrThrow(cuda::GetKernel(src, base + "_strided32"));
  k.vec = VectorWidth(in, out);
  return k;
}

void LaunchElementwise(const ElementwiseKernels& k, absl::Span<const Tensor> in, const Tensor& out,
                       float scalar) {
  KILN_CHECK(out.dim() <= kMaxRank && in.size() + 1 <= kMaxOperands,
             "elementwise kernel: supports rank <= ", kMaxRank, " and <= ", kMaxOperands - 1,
             " inputs, got ", out.shape_string(), " with ", in.size(), " inputs");
  void* out_ptr = out.data_ptr();
  const void* ptrs[3] = {nullptr, nullptr, nullptr};
  for (size_t i = 0; i < in.size(); ++i) ptrs[i] = in[i].data_ptr();
  long long n = out.numel();
  std::vector<void*> args = {&out_ptr};
  for (size_t i = 0; i < in.size(); ++i) args.push_back(&ptrs[i]);
  args.push_back(&scalar);
  args.push_back(&n);
  if (FastPathApplies(in, out, k.vec)) {
    Launch(k.contig, args.data(), std::max<int64_t>(n / k.vec, n % k.vec));
    return;
  }
  Indexer ix = CollapsedIndexer(in, out);
  args.push_back(&ix);
  Launch(n < (int64_t{1} << 31) ? k.strided32 : k.strided, args.data(), n);
}

void Elementwise(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                 const OpAttrs& a) {
  Run(def, std::string(def.cuda_expr), in, out, a);
}

void Copy(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  Run(def, "$0", in, out, a);
}

}  // namespace kiln::cuda_ops
