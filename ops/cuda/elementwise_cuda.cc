// Generated elementwise CUDA kernels (see elementwise_cuda.h).
#include "ops/cuda/elementwise_cuda.h"

#include <mutex>
#include <optional>
#include <unordered_map>

#include "absl/container/inlined_vector.h"
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
struct KilnRows { long long rows, cols; long long row_stride[4]; int broadcast[4]; };
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
  return s + ", float scalar, long long iscalar, long long n";
}

// Integer mode (issue #13): when the output and every operand are integer or bool, the kernel
// computes in long long with the integral scalar `iscalar`, exactly like the CPU integer path
// (every elementwise row with such types has an integer form, ops/op_def.h IntScalarFn).
bool IntegerMode(const std::vector<DType>& in, DType out) {
  if (IsFloatingPoint(out)) return false;
  for (DType t : in) {
    if (IsFloatingPoint(t)) return false;
  }
  return true;
}

// Computes result `r` for element reads in{i}[off_i] and stores it at out[off_out].
std::string Body(const std::string& expr, const std::vector<DType>& in, DType out,
                 const std::string& out_idx, const std::vector<std::string>& in_idx) {
  bool all_float = true;
  for (DType t : in) all_float &= IsFloatingPoint(t) || t == DType::kBool;
  const char* acc = IntegerMode(in, out) ? "long long" : all_float ? "float" : "double";
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

namespace {

std::string SubstituteOperands(const std::string& expr_template, size_t inputs, bool integer) {
  std::string expr = expr_template;
  for (size_t i = 0; i < inputs; ++i) {
    expr = absl::StrReplaceAll(expr, {{absl::StrCat("$", i), absl::StrCat("a", i)}});
  }
  return absl::StrReplaceAll(expr, {{"$scalar", integer ? "iscalar" : "scalar"}});
}

std::string Raw(const std::string& storage, int vec) {
  return absl::StrCat("KilnRaw<sizeof(", storage, ") * ", vec, ">");
}

// The per-vector body: r{i}[j] hold the loaded inputs, w[j] the results.
std::string VectorBody(const std::string& expr, const std::vector<DType>& in, DType out, int vec) {
  std::string s = absl::StrCat("    ", Info(out).storage, " w[", vec, "];\n",
                               "    #pragma unroll\n    for (int j = 0; j < ", vec, "; ++j) {\n");
  std::vector<std::string> reg_idx(in.size(), "j");
  std::string body = Body(expr, in, out, "j", reg_idx);
  for (size_t i = 0; i < in.size(); ++i) {
    body = absl::StrReplaceAll(body, {{absl::StrCat("in", i, "[j]"), absl::StrCat("r", i, "[j]")}});
  }
  return s + absl::StrReplaceAll(body, {{"out[j]", "w[j]"}}) + "    }\n";
}

// Contiguous kernel: each thread handles `vec` consecutive elements with 16-byte loads/stores.
std::string ContigKernel(const std::string& base, const std::string& expr,
                         const std::vector<DType>& in, DType out, int vec) {
  std::string src = absl::StrCat(
      "extern \"C\" __global__ void ", base, "_contig(", Params(in, out), ") {\n",
      "  const long long groups = n / ", vec, ";\n",
      "  for (long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x; g < groups;",
      " g += (long long)gridDim.x * blockDim.x) {\n");
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string st = Info(in[i]).storage;
    absl::StrAppend(&src, "    ", st, " r", i, "[", vec, "]; *(", Raw(st, vec), "*)r", i,
                    " = ((const ", Raw(st, vec), "*)in", i, ")[g];\n");
  }
  absl::StrAppend(&src, VectorBody(expr, in, out, vec), "    ((", Raw(Info(out).storage, vec),
                  "*)out)[g] = *(", Raw(Info(out).storage, vec), "*)w;\n  }\n");
  // Tail elements after the last full group.
  std::vector<std::string> tail_idx(in.size(), "i");
  absl::StrAppend(&src, "  for (long long i = groups * ", vec,
                  " + blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;",
                  " i += (long long)gridDim.x * blockDim.x) {\n",
                  Body(expr, in, out, "i", tail_idx), "  }\n}\n");
  return src;
}

// Rows kernel: operands collapsed to [rows, cols] with unit (or, for an input broadcast along
// the row, zero) inner stride and any row stride: slices of a merged GEMM's output, a bias or
// mask broadcast over leading dims. blockIdx.y walks rows, so there is no div/mod per element.
std::string RowsKernel(const std::string& base, const std::string& expr,
                       const std::vector<DType>& in, DType out, int vec) {
  std::string src = absl::StrCat(
      "extern \"C\" __global__ void ", base, "_rows(", Params(in, out), ", KilnRows rw) {\n",
      "  const long long groups = rw.cols / ", vec, ";\n",
      "  for (long long r = blockIdx.y; r < rw.rows; r += gridDim.y) {\n",
      "  for (long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x; g < groups;",
      " g += (long long)gridDim.x * blockDim.x) {\n");
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string st = Info(in[i]).storage;
    const std::string row = absl::StrCat("in", i, " + r * rw.row_stride[", i + 1, "]");
    absl::StrAppend(&src, "    ", st, " r", i, "[", vec, "];\n", "    if (rw.broadcast[", i + 1,
                    "]) {\n      const ", st, " v = *(", row, ");\n",
                    "      #pragma unroll\n      for (int j = 0; j < ", vec, "; ++j) r", i,
                    "[j] = v;\n    } else {\n      *(", Raw(st, vec), "*)r", i, " = *(const ",
                    Raw(st, vec), "*)(", row, " + g * ", vec, ");\n    }\n");
  }
  const std::string raw_out = Raw(Info(out).storage, vec);
  absl::StrAppend(&src, VectorBody(expr, in, out, vec), "    *(", raw_out,
                  "*)(out + r * rw.row_stride[0] + g * ", vec, ") = *(", raw_out, "*)w;\n",
                  "  }\n  }\n}\n");
  return src;
}

// Strided kernels with broadcasting (stride 0 on repeated dims): 64-bit index math, and a
// 32-bit variant (cheaper div/mod) for tensors under 2^31 elements. The rank loop is unrolled
// so the indexer's arrays are read with constant indices (no local-memory copy).
std::string StridedKernels(const std::string& base, const std::string& expr,
                           const std::vector<DType>& in, DType out) {
  std::vector<std::string> off_idx;
  for (size_t i = 0; i < in.size(); ++i) off_idx.push_back(absl::StrCat("o", i + 1));
  std::string src;
  for (const char* idx : {"long long", "unsigned"}) {
    const bool narrow = std::string(idx) == "unsigned";
    absl::StrAppend(&src, "extern \"C\" __global__ void ", base,
                    narrow ? "_strided32(" : "_strided(", Params(in, out), ", KilnIndexer ix) {\n",
                    "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;",
                    " i += (long long)gridDim.x * blockDim.x) {\n", "    ", idx, " rem = (", idx,
                    ")i; long long o0 = 0, o1 = 0, o2 = 0, o3 = 0;\n",
                    "    #pragma unroll\n    for (int d = 7; d >= 0; --d) {\n",
                    "      if (d >= ix.rank) continue;\n", "      const ", idx, " size = (", idx,
                    ")ix.sizes[d];\n", "      const long long c = rem % size; rem /= size;\n",
                    "      o0 += c * ix.strides[0][d]; o1 += c * ix.strides[1][d];\n",
                    "      o2 += c * ix.strides[2][d]; o3 += c * ix.strides[3][d];\n", "    }\n",
                    Body(expr, in, out, "o0", off_idx), "  }\n}\n");
  }
  return src;
}

}  // namespace

std::string RenderElementwiseSource(const std::string& base, const std::string& expr_template,
                                    const std::vector<DType>& in, DType out,
                                    ElementwiseVariants variants) {
  const std::string expr = SubstituteOperands(expr_template, in.size(), IntegerMode(in, out));
  const int vec = VectorWidth(in, out);
  std::string src = kPrelude;
  if (variants & kFastVariants) {
    src += ContigKernel(base, expr, in, out, vec) + RowsKernel(base, expr, in, out, vec);
  }
  if (variants & kGeneralVariants) src += StridedKernels(base, expr, in, out);
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

struct Indexer {  // KilnIndexer of the generated source
  int rank;
  long long sizes[kMaxRank];
  long long strides[kMaxOperands][kMaxRank];
};

struct KilnRowsArgs {  // KilnRows of the generated source
  long long rows, cols;
  long long row_stride[kMaxOperands];
  int broadcast[kMaxOperands];
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

bool Aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

bool ContigApplies(absl::Span<const Tensor> in, const Tensor& out) {
  if (!out.is_contiguous() || !Aligned(out.data_ptr(), 16)) return false;
  for (const Tensor& t : in) {
    if (t.shape() != out.shape() || !t.is_contiguous() || !Aligned(t.data_ptr(), 16)) return false;
  }
  return true;
}

// The rows kernel's arguments when the collapsed operands are at most 2-D, the output and every
// vector-loaded input have unit inner stride, rows split into whole aligned vectors, and a row
// holds enough vectors to fill a block; nullopt otherwise.
std::optional<KilnRowsArgs> RowsArgs(const Indexer& ix, absl::Span<const Tensor> in,
                                     const Tensor& out, int vec) {
  if (ix.rank < 1 || ix.rank > 2) return std::nullopt;
  const int inner = ix.rank - 1;
  KilnRowsArgs rw{};
  rw.rows = ix.rank == 2 ? ix.sizes[0] : 1;
  rw.cols = ix.sizes[inner];
  if (rw.cols % vec != 0 || rw.cols / vec < 32) return std::nullopt;
  for (size_t i = 0; i <= in.size(); ++i) {
    const Tensor& t = i == 0 ? out : in[i - 1];
    const long long inner_stride = ix.strides[i][inner];
    rw.row_stride[i] = ix.rank == 2 ? ix.strides[i][0] : 0;
    rw.broadcast[i] = inner_stride == 0 && i > 0;
    if (rw.broadcast[i]) continue;
    if (inner_stride != 1 || rw.row_stride[i] % vec != 0 ||
        !Aligned(t.data_ptr(), vec * DTypeSize(t.dtype()))) {
      return std::nullopt;
    }
  }
  return rw;
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
                    static_cast<float>(a.scalar), ScalarAsInt64(a));
}

}  // namespace

ElementwiseKernels CompileElementwiseKernels(const std::string& base, const std::string& expr,
                                             const std::vector<DType>& in, DType out) {
  const std::string src = RenderElementwiseSource(base, expr, in, out, kFastVariants);
  ElementwiseKernels k;
  k.contig = ValueOrThrow(cuda::GetKernel(src, base + "_contig"));
  k.rows = ValueOrThrow(cuda::GetKernel(src, base + "_rows"));
  k.vec = VectorWidth(in, out);
  k.general = std::make_shared<ElementwiseKernels::General>();
  k.general->source = RenderElementwiseSource(base, expr, in, out, kGeneralVariants);
  k.general->base = base;
  return k;
}

namespace {

// The strided kernels, compiled on first use: most operands take the contiguous or rows path.
const ElementwiseKernels::General& GeneralKernels(const ElementwiseKernels& k) {
  ElementwiseKernels::General& g = *k.general;
  std::call_once(g.once, [&g] {
    g.strided = ValueOrThrow(cuda::GetKernel(g.source, g.base + "_strided"));
    g.strided32 = ValueOrThrow(cuda::GetKernel(g.source, g.base + "_strided32"));
  });
  return g;
}

void LaunchRows(cudaKernel_t k, void** args, const KilnRowsArgs& rw, int vec) {
  // Blocks sized so each x-block covers an equal share of a row's vectors (a 3072-wide bf16
  // row is 384 vectors: two blocks of 192 threads, not one of 256 and one half idle).
  const int64_t groups = rw.cols / vec;
  const int64_t blocks_x = std::min<int64_t>((groups + 255) / 256, 1024);
  const int64_t per_block = (groups + blocks_x - 1) / blocks_x;
  const int block = static_cast<int>(std::min<int64_t>(256, (per_block + 31) / 32 * 32));
  const dim3 grid(static_cast<unsigned>(blocks_x),
                  static_cast<unsigned>(std::min<int64_t>(rw.rows, 65535)));
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k), grid, dim3(block), args, 0,
                                   cuda::CurrentStream()));
}

}  // namespace

void LaunchElementwise(const ElementwiseKernels& k, absl::Span<const Tensor> in, const Tensor& out,
                       float scalar, int64_t iscalar) {
  KILN_CHECK(out.dim() <= kMaxRank && in.size() + 1 <= kMaxOperands,
             "elementwise kernel: supports rank <= ", kMaxRank, " and <= ", kMaxOperands - 1,
             " inputs, got ", out.shape_string(), " with ", in.size(), " inputs");
  void* out_ptr = out.data_ptr();
  const void* ptrs[3] = {nullptr, nullptr, nullptr};
  for (size_t i = 0; i < in.size(); ++i) ptrs[i] = in[i].data_ptr();
  long long n = out.numel();
  long long int_scalar = iscalar;
  absl::InlinedVector<void*, 8> args = {&out_ptr};
  for (size_t i = 0; i < in.size(); ++i) args.push_back(&ptrs[i]);
  args.push_back(&scalar);
  args.push_back(&int_scalar);
  args.push_back(&n);
  if (ContigApplies(in, out)) {
    Launch(k.contig, args.data(), std::max<int64_t>(n / k.vec, n % k.vec));
    return;
  }
  Indexer ix = CollapsedIndexer(in, out);
  if (std::optional<KilnRowsArgs> rw = RowsArgs(ix, in, out, k.vec)) {
    args.push_back(&*rw);
    LaunchRows(k.rows, args.data(), *rw, k.vec);
    return;
  }
  args.push_back(&ix);
  const auto& g = GeneralKernels(k);
  Launch(n < (int64_t{1} << 31) ? g.strided32 : g.strided, args.data(), n);
}

void Elementwise(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                 const OpAttrs& a) {
  Run(def, std::string(def.cuda_expr), in, out, a);
}

void Copy(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  Run(def, "$0", in, out, a);
}

}  // namespace kiln::cuda_ops
