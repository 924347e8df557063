// Generated elementwise CUDA kernels (see elementwise_cuda.h).
#include "codegen/families/pointwise/elementwise_cuda.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "ops/cuda/kernel_render.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "runtime/settings.h"
#include "runtime/status.h"

namespace kiln::cuda_ops {
namespace {

// Each kernel's first statement: programmatic dependent launch's wait (runtime/cuda.h).
constexpr char kEnter[] = "  kiln_grid_dependency_sync();\n";

constexpr int kMaxRank = kMaxKernelRank;

// Operands of a kernel: outputs first (0..M-1), then inputs (M..M+N-1), as in the indexers.
struct Operands {
  int in, out;
  int total() const { return in + out; }
};

Operands OperandsOf(const kir::Program& p) { return {p.num_inputs(), p.num_outputs()}; }

std::string Raw(const std::string& storage, int vec) {
  return absl::StrCat("KilnRaw<sizeof(", storage, ") * ", vec, ">");
}

int VectorWidth(const kir::Program& p) {
  int64_t widest = 1;
  for (DType t : p.input_types()) widest = std::max(widest, DTypeSize(t));
  for (DType t : p.output_types()) widest = std::max(widest, DTypeSize(t));
  return static_cast<int>(16 / widest);
}

// The kernel parameters: one pointer per output and input, the scalar (only for a program that
// reads it as a parameter: an eager row with `$scalar`), the element count.
std::string Params(const kir::Program& p) {
  std::string s;
  for (int o = 0; o < p.num_outputs(); ++o) {
    absl::StrAppend(&s, o ? ", " : "", StorageType(p.output_types()[o]), "* __restrict__ out", o);
  }
  for (int i = 0; i < p.num_inputs(); ++i) {
    absl::StrAppend(&s, ", const ", StorageType(p.input_types()[i]), "* __restrict__ in", i);
  }
  if (p.scalar_param()) s += ", float scalar, long long iscalar, double dscalar";
  return s + ", long long n";
}

// The values of the program at one position, then "<store target(o)> = <value>;" per output.
template <typename Load, typename Target>
std::string Element(const kir::Program& p, Load&& load, Target&& target, const std::string& pad) {
  std::string s = RenderValues(p, load, pad);
  for (int o = 0; o < p.num_outputs(); ++o) {
    absl::StrAppend(&s, pad, target(o), " = ", RenderStoreValue(p, o), ";\n");
  }
  return s;
}

// Register arrays r<i>[vec] / w<o>[vec] and the per-lane body over them.
std::string VectorBody(const kir::Program& p, int vec) {
  std::string s;
  for (int o = 0; o < p.num_outputs(); ++o) {
    absl::StrAppend(&s, "    ", StorageType(p.output_types()[o]), " w", o, "[", vec, "];\n");
  }
  absl::StrAppend(&s, "    #pragma unroll\n    for (int j = 0; j < ", vec, "; ++j) {\n");
  absl::StrAppend(&s,
                  Element(
                      p, [](int i) { return absl::StrCat("r", i, "[j]"); },
                      [](int o) { return absl::StrCat("w", o, "[j]"); }, "      "),
                  "    }\n");
  return s;
}

// How the contiguous and rows kernels move their vectors: independent vectors per thread per
// iteration (bytes in flight) and the streaming cache hint. The defaults are the settings table's
// (measured by before/after pairs on the H200); KILN_EW_UNROLL, KILN_EW_ROWS_UNROLL and
// KILN_EW_STREAM override them for A/B runs.
struct VectorPlan {
  int contig_unroll, rows_unroll;
  bool stream;
};

const VectorPlan& Plan() {
  static const VectorPlan plan = [] {
    VectorPlan p;
    p.contig_unroll = EnvLevel("KILN_EW_UNROLL");
    p.rows_unroll = EnvLevel("KILN_EW_ROWS_UNROLL");
    p.stream = EnvBool("KILN_EW_STREAM");
    return p;
  }();
  return plan;
}

std::string Ld(const std::string& raw, const std::string& ptr) {
  return absl::StrCat("kiln_ld<sizeof(", raw, "), ", Plan().stream ? "true" : "false", ">((const ",
                      raw, "*)(", ptr, "))");
}

std::string St(const std::string& raw, const std::string& ptr, const std::string& value) {
  return absl::StrCat("kiln_st<sizeof(", raw, "), ", Plan().stream ? "true" : "false", ">((", raw,
                      "*)(", ptr, "), *(", raw, "*)", value, ");\n");
}

// The body over `unroll` vectors: loads of all of them first (their bytes in flight together),
// then the arithmetic and stores of each. `index(u)` is the u-th vector's index expression,
// `valid(u)` whether it exists, `in_ptr(i, u)` / `out_ptr(o, u)` its operands' addresses;
// `bcast(i)`, when given, is the condition under which input i is one broadcast element.
template <typename Valid, typename InPtr, typename OutPtr, typename Bcast>
std::string UnrolledBody(const kir::Program& p, int vec, int unroll, Valid&& valid, InPtr&& in_ptr,
                         OutPtr&& out_ptr, Bcast&& bcast, const std::string& pad) {
  std::string s;
  for (int i = 0; i < p.num_inputs(); ++i) {
    const std::string st = StorageType(p.input_types()[i]);
    absl::StrAppend(&s, pad, st, " ru", i, "[", unroll, "][", vec, "];\n");
  }
  absl::StrAppend(&s, pad, "#pragma unroll\n", pad, "for (int u = 0; u < ", unroll, "; ++u) {\n",
                  pad, "  if (!(", valid(), ")) break;\n");
  for (int i = 0; i < p.num_inputs(); ++i) {
    const std::string st = StorageType(p.input_types()[i]), raw = Raw(st, vec);
    const std::string b = bcast(i);
    if (!b.empty()) {
      absl::StrAppend(&s, pad, "  if (", b, ") {\n", pad, "    const ", st, " b = *(",
                      in_ptr(i, true), ");\n", pad, "    #pragma unroll\n", pad,
                      "    for (int j = 0; j < ", vec, "; ++j) ru", i, "[u][j] = b;\n", pad,
                      "  } else {\n", pad, "    *(", raw, "*)ru", i,
                      "[u] = ", Ld(raw, in_ptr(i, false)), ";\n", pad, "  }\n");
    } else {
      absl::StrAppend(&s, pad, "  *(", raw, "*)ru", i, "[u] = ", Ld(raw, in_ptr(i, false)), ";\n");
    }
  }
  absl::StrAppend(&s, pad, "}\n", pad, "#pragma unroll\n", pad, "for (int u = 0; u < ", unroll,
                  "; ++u) {\n", pad, "  if (!(", valid(), ")) break;\n");
  for (int i = 0; i < p.num_inputs(); ++i) {
    absl::StrAppend(&s, pad, "  const ", StorageType(p.input_types()[i]), "* r", i, " = ru", i,
                    "[u];\n");
  }
  absl::StrAppend(&s, VectorBody(p, vec));
  for (int o = 0; o < p.num_outputs(); ++o) {
    const std::string raw = Raw(StorageType(p.output_types()[o]), vec);
    absl::StrAppend(&s, pad, "  ", St(raw, out_ptr(o), absl::StrCat("w", o)));
  }
  return s + pad + "}\n";
}

// Contiguous kernel: each thread handles `unroll` groups of `vec` consecutive elements per
// iteration (16-byte loads and stores), a grid stride apart.
std::string ContigKernel(const std::string& base, const kir::Program& p, int vec) {
  std::string src = absl::StrCat(
      "extern \"C\" __global__ void ", base, "_contig(", Params(p), ") {\n", kEnter,
      "  const long long groups = n / ", vec, ";\n",
      "  const long long stride = (long long)gridDim.x * blockDim.x;\n",
      "  for (long long g0 = blockIdx.x * (long long)blockDim.x + threadIdx.x; g0 < groups;",
      " g0 += stride * ", Plan().contig_unroll, ") {\n");
  absl::StrAppend(&src, UnrolledBody(
                            p, vec, Plan().contig_unroll,
                            [] { return std::string("g0 + u * stride < groups"); },
                            [&](int i, bool) {
                              return absl::StrCat("(const ",
                                                  Raw(StorageType(p.input_types()[i]), vec), "*)in",
                                                  i, " + (g0 + u * stride)");
                            },
                            [&](int o) {
                              return absl::StrCat("(", Raw(StorageType(p.output_types()[o]), vec),
                                                  "*)out", o, " + (g0 + u * stride)");
                            },
                            [](int) { return std::string(); }, "    "));
  // Tail elements after the last full group.
  absl::StrAppend(&src, "  }\n  for (long long e = groups * ", vec,
                  " + blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;",
                  " e += (long long)gridDim.x * blockDim.x) {\n",
                  Element(
                      p, [](int i) { return absl::StrCat("in", i, "[e]"); },
                      [](int o) { return absl::StrCat("out", o, "[e]"); }, "    "),
                  "  }\n}\n");
  return src;
}

// Rows kernel: operands collapsed to [rows, cols] with unit (or, for an input broadcast along the
// row, zero) inner stride and any row stride. blockIdx.y walks rows, `unroll` rows gridDim.y
// apart per iteration: no div/mod per element.
std::string RowsKernel(const std::string& base, const kir::Program& p, int vec) {
  const Operands ops = OperandsOf(p);
  std::string src = absl::StrCat(
      "struct KilnRows { long long rows, cols; long long row_stride[", ops.total(),
      "]; long long broadcast[", ops.total(), "]; };\n", "extern \"C\" __global__ void ", base,
      "_rows(", Params(p), ", KilnRows rw) {\n", kEnter, "  const long long groups = rw.cols / ",
      vec, ";\n",
      "  for (long long row0 = blockIdx.y; row0 < rw.rows; row0 += (long long)gridDim.y * ",
      Plan().rows_unroll, ") {\n",
      "  for (long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x; g < groups;",
      " g += (long long)gridDim.x * blockDim.x) {\n");
  auto row = [](int k) {
    return absl::StrCat("(row0 + u * (long long)gridDim.y) * rw.row_stride[", k, "]");
  };
  absl::StrAppend(
      &src, UnrolledBody(
                p, vec, Plan().rows_unroll,
                [] { return std::string("row0 + u * (long long)gridDim.y < rw.rows"); },
                [&](int i, bool element) {
                  const std::string base_ptr = absl::StrCat("in", i, " + ", row(ops.out + i));
                  if (element) return base_ptr;
                  return absl::StrCat("(const ", Raw(StorageType(p.input_types()[i]), vec), "*)(",
                                      base_ptr, " + g * ", vec, ")");
                },
                [&](int o) {
                  return absl::StrCat("(", Raw(StorageType(p.output_types()[o]), vec), "*)(out", o,
                                      " + ", row(o), " + g * ", vec, ")");
                },
                [&](int i) { return absl::StrCat("rw.broadcast[", ops.out + i, "]"); }, "    "));
  return src + "  }\n  }\n}\n";
}

// Strided kernels with broadcasting (stride 0 on repeated dims): 64-bit index math, and a 32-bit
// variant (cheaper div/mod) for iteration spaces under 2^31 elements. The rank loop is unrolled so
// the indexer's arrays are read with constant indices (no local-memory copy).
std::string StridedKernels(const std::string& base, const kir::Program& p) {
  const Operands ops = OperandsOf(p);
  std::string offsets, accumulate;
  for (int k = 0; k < ops.total(); ++k) {
    absl::StrAppend(&offsets, k ? ", " : "", "o", k, " = 0");
    absl::StrAppend(&accumulate, "      o", k, " += c * ix.strides[", k, "][d];\n");
  }
  std::string src = absl::StrCat("struct KilnIndexer { long long rank; long long sizes[", kMaxRank,
                                 "]; long long strides[", ops.total(), "][", kMaxRank, "]; };\n");
  const std::string element = Element(
      p, [&](int i) { return absl::StrCat("in", i, "[o", ops.out + i, "]"); },
      [](int o) { return absl::StrCat("out", o, "[o", o, "]"); }, "    ");
  for (const char* idx : {"long long", "unsigned"}) {
    const bool narrow = std::string(idx) == "unsigned";
    absl::StrAppend(&src, "extern \"C\" __global__ void ", base,
                    narrow ? "_strided32(" : "_strided(", Params(p), ", KilnIndexer ix) {\n",
                    kEnter,
                    "  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;",
                    " e += (long long)gridDim.x * blockDim.x) {\n", "    ", idx, " rem = (", idx,
                    ")e;\n    long long ", offsets, ";\n",
                    "    #pragma unroll\n    for (int d = ", kMaxRank - 1, "; d >= 0; --d) {\n",
                    "      if (d >= ix.rank) continue;\n", "      const ", idx, " size = (", idx,
                    ")ix.sizes[d];\n", "      const long long c = rem % size; rem /= size;\n",
                    accumulate, "    }\n", element, "  }\n}\n");
  }
  return src;
}

// Vectorised strided kernel: when the innermost dim is a multiple of `vec` and every operand
// is contiguous along it (or, an input, broadcast along it), each thread takes `vec` consecutive
// elements of one row: one div/mod pass per vector instead of per element, 16-byte loads and
// stores, broadcast operands read once. For broadcasts over a middle dim (a KV-cache blend
// where(onehot [T, 1], new [H, 1, D], cache [H, T, D]), which no row stride describes). 32-bit
// index math (iteration spaces under 2^31 elements).
std::string StridedVecKernel(const std::string& base, const kir::Program& p, int vec) {
  const Operands ops = OperandsOf(p);
  std::string offsets, accumulate;
  for (int k = 0; k < ops.total(); ++k) {
    absl::StrAppend(&offsets, k ? ", " : "", "o", k, " = 0");
    absl::StrAppend(&accumulate, "      o", k, " += c * ix.strides[", k, "][d];\n");
  }
  std::string src = absl::StrCat(
      "extern \"C\" __global__ void ", base, "_stridedv(", Params(p), ", KilnIndexer ix) {\n",
      kEnter, "  const long long groups = n / ", vec, ";\n",
      "  for (long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x; g < groups;",
      " g += (long long)gridDim.x * blockDim.x) {\n", "    unsigned rem = (unsigned)(g * ", vec,
      ");\n    long long ", offsets, ";\n",
      "    unsigned bcast = 0;  // inputs broadcast along the row\n",
      "    #pragma unroll\n    for (int d = ", kMaxRank - 1, "; d >= 0; --d) {\n",
      "      if (d >= ix.rank) continue;\n", "      if (d == ix.rank - 1) {\n");
  for (int i = 0; i < p.num_inputs(); ++i) {
    absl::StrAppend(&src, "        if (ix.strides[", ops.out + i, "][d] == 0) bcast |= ", 1u << i,
                    "u;\n");
  }
  absl::StrAppend(&src, "      }\n      const unsigned size = (unsigned)ix.sizes[d];\n",
                  "      const long long c = rem % size; rem /= size;\n", accumulate, "    }\n");
  for (int i = 0; i < p.num_inputs(); ++i) {
    const int k = ops.out + i;
    const std::string st = StorageType(p.input_types()[i]);
    absl::StrAppend(&src, "    ", st, " r", i, "[", vec, "];\n", "    if (bcast & ", 1u << i,
                    "u) {\n      const ", st, " b = in", i, "[o", k, "];\n",
                    "      #pragma unroll\n      for (int j = 0; j < ", vec, "; ++j) r", i,
                    "[j] = b;\n    } else {\n      *(", Raw(st, vec), "*)r", i, " = *(const ",
                    Raw(st, vec), "*)(in", i, " + o", k, ");\n    }\n");
  }
  absl::StrAppend(&src, VectorBody(p, vec));
  for (int o = 0; o < p.num_outputs(); ++o) {
    const std::string raw = Raw(StorageType(p.output_types()[o]), vec);
    absl::StrAppend(&src, "    *(", raw, "*)(out", o, " + o", o, ") = *(", raw, "*)w", o, ";\n");
  }
  return src + "  }\n}\n";
}

}  // namespace

std::string RenderElementwiseSource(const std::string& base, const kir::Program& p,
                                    ElementwiseVariants variants) {
  KILN_CHECK(p.num_outputs() >= 1 && p.num_inputs() + p.num_outputs() <= kMaxKernelOperands,
             "elementwise kernel ", base, ": needs 1..", kMaxKernelOperands,
             " operands with at least one output, got ", p.num_inputs(), " inputs and ",
             p.num_outputs(), " outputs");
  const int vec = VectorWidth(p);
  std::string src = KernelPrelude();
  if (variants & kFastVariants) src += ContigKernel(base, p, vec) + RowsKernel(base, p, vec);
  if (variants & kGeneralVariants) src += StridedKernels(base, p) + StridedVecKernel(base, p, vec);
  return src;
}

kir::Program RowProgram(const OpDef& def, const std::vector<DType>& in_types, DType out_type,
                        const OpAttrs& attrs) {
  kir::Program p(in_types);
  p.set_scalar_param(def.cuda_expr.find("$scalar") != std::string_view::npos);
  p.set_scalar_integral(IsIntegralScalar(attrs.scalar));
  absl::InlinedVector<int, 3> args;
  for (int i = 0; i < p.num_inputs(); ++i) args.push_back(p.Load(i));
  const int v = def.id == OpId::kContiguous ? args[0] : p.Apply(def.id, args, attrs, out_type);
  p.Store(v, out_type);
  return p;
}

std::vector<cuda::KernelFootprint> ElementwiseFootprints(const ElementwiseKernels& k) {
  const std::string base = k.general != nullptr ? k.general->base : "kiln_elementwise";
  std::vector<cuda::KernelFootprint> f;
  for (const auto& [kernel, suffix] :
       {std::pair{k.contig, "_contig"}, std::pair{k.rows, "_rows"}}) {
    if (kernel != nullptr) f.push_back(ValueOrThrow(cuda::FootprintOf(kernel, base + suffix)));
  }
  return f;
}

ElementwiseKernels CompileElementwiseKernels(const std::string& base, const kir::Program& p) {
  const std::string src = RenderElementwiseSource(base, p, kFastVariants);
  ElementwiseKernels k;
  k.contig = ValueOrThrow(cuda::GetKernel(src, base + "_contig"));
  k.rows = ValueOrThrow(cuda::GetKernel(src, base + "_rows"));
  k.vec = VectorWidth(p);
  k.num_inputs = p.num_inputs();
  k.num_outputs = p.num_outputs();
  k.scalar_params = p.scalar_param();
  k.general = std::make_shared<ElementwiseKernels::General>();
  k.general->source = RenderElementwiseSource(base, p, kGeneralVariants);
  k.general->base = base;
  return k;
}

namespace {

// Each operand's strides over the iteration shape (outputs first), size-1 dims dropped and dims
// merged wherever every operand is contiguous across them (a bias over [8,16,1024,1024] becomes
// rank 2), so the kernel does as few div/mods per element as possible.
struct Indexer {
  int rank = 0;
  long long sizes[kMaxRank] = {};
  absl::InlinedVector<std::array<long long, kMaxRank>, 8> strides;  // per operand
};

Indexer CollapsedIndexer(absl::Span<const Tensor> in, absl::Span<const Tensor> out) {
  const Shape& shape = out[0].shape();
  const int rank = static_cast<int>(shape.size());
  const int n_ops = static_cast<int>(in.size() + out.size());
  absl::InlinedVector<std::array<long long, kMaxRank>, 8> st(n_ops);
  for (int k = 0; k < n_ops; ++k) {
    const Tensor& t = k < static_cast<int>(out.size()) ? out[k] : in[k - out.size()];
    st[k].fill(0);
    const int lead = rank - static_cast<int>(t.dim());
    for (int d = 0; d < t.dim(); ++d) st[k][lead + d] = t.shape()[d] == 1 ? 0 : t.strides()[d];
  }
  Indexer ix;
  ix.strides.resize(n_ops);
  for (auto& s : ix.strides) s.fill(0);
  for (int d = 0; d < rank; ++d) {
    const long long size = shape[d];
    if (size == 1) continue;
    bool merge = ix.rank > 0;
    for (int k = 0; k < n_ops && merge; ++k) {
      merge = st[k][d] * size == ix.strides[k][ix.rank - 1] ||
              (st[k][d] == 0 && ix.strides[k][ix.rank - 1] == 0);
    }
    if (merge) {  // fold dim d into the previous kept dim: it becomes the faster one
      ix.sizes[ix.rank - 1] *= size;
      for (int k = 0; k < n_ops; ++k) ix.strides[k][ix.rank - 1] = st[k][d];
    } else {
      ix.sizes[ix.rank] = size;
      for (int k = 0; k < n_ops; ++k) ix.strides[k][ix.rank] = st[k][d];
      ++ix.rank;
    }
  }
  return ix;
}

// The KilnIndexer parameter block: rank, sizes[8], strides[operands][8].
std::vector<long long> IndexerParams(const Indexer& ix) {
  std::vector<long long> p = {ix.rank};
  p.insert(p.end(), ix.sizes, ix.sizes + kMaxRank);
  for (const auto& s : ix.strides) p.insert(p.end(), s.begin(), s.end());
  return p;
}

bool Aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

bool ContigApplies(absl::Span<const Tensor> in, absl::Span<const Tensor> out) {
  for (const Tensor& t : out) {
    if (t.shape() != out[0].shape() || !t.is_contiguous() || !Aligned(t.data_ptr(), 16)) {
      return false;
    }
  }
  for (const Tensor& t : in) {
    if (t.shape() != out[0].shape() || !t.is_contiguous() || !Aligned(t.data_ptr(), 16)) {
      return false;
    }
  }
  return true;
}

// The KilnRows parameter block (rows, cols, row_stride[ops], broadcast[ops]) when the collapsed
// operands are at most 2-D, every vector-loaded operand has unit inner stride, rows split into
// whole aligned vectors, and a row holds enough vectors to fill a block; nullopt otherwise.
std::optional<std::vector<long long>> RowsParams(const Indexer& ix, absl::Span<const Tensor> in,
                                                 absl::Span<const Tensor> out, int vec) {
  if (ix.rank < 1 || ix.rank > 2) return std::nullopt;
  const int inner = ix.rank - 1;
  const long long cols = ix.sizes[inner];
  if (cols % vec != 0 || cols / vec < 32) return std::nullopt;
  const size_t n_ops = in.size() + out.size();
  std::vector<long long> p(2 + 2 * n_ops, 0);
  p[0] = ix.rank == 2 ? ix.sizes[0] : 1;
  p[1] = cols;
  for (size_t k = 0; k < n_ops; ++k) {
    const bool is_out = k < out.size();
    const Tensor& t = is_out ? out[k] : in[k - out.size()];
    const long long inner_stride = ix.strides[k][inner];
    const long long row_stride = ix.rank == 2 ? ix.strides[k][0] : 0;
    p[2 + k] = row_stride;
    p[2 + n_ops + k] = inner_stride == 0 && !is_out;
    if (p[2 + n_ops + k]) continue;
    if (inner_stride != 1 || row_stride % vec != 0 ||
        !Aligned(t.data_ptr(), vec * DTypeSize(t.dtype()))) {
      return std::nullopt;
    }
  }
  return p;
}

// Whether the vectorised strided kernel runs these operands: rows a multiple of `vec` long, every
// output and non-broadcast input contiguous along them with outer strides in whole vectors and
// vector-aligned data, the other inputs broadcast along them; under 2^31 elements.
bool StridedVecApplies(const Indexer& ix, absl::Span<const Tensor> in, absl::Span<const Tensor> out,
                       int vec, int64_t n) {
  if (vec < 2 || ix.rank < 1 || n >= (int64_t{1} << 31)) return false;
  const int inner = ix.rank - 1;
  if (ix.sizes[inner] % vec != 0) return false;
  for (size_t k = 0; k < in.size() + out.size(); ++k) {
    const bool is_out = k < out.size();
    const Tensor& t = is_out ? out[k] : in[k - out.size()];
    const long long inner_stride = ix.strides[k][inner];
    if (inner_stride == 0 && !is_out) continue;
    if (inner_stride != 1 || !Aligned(t.data_ptr(), vec * DTypeSize(t.dtype()))) return false;
    for (int d = 0; d < inner; ++d) {
      if (ix.strides[k][d] % vec != 0) return false;
    }
  }
  return true;
}

void Launch(cudaKernel_t k, void** args, int64_t work) {
  const int block = 256;
  const int64_t max_grid = static_cast<int64_t>(cuda::Props(0).sm_count) * 32;
  const int64_t grid = std::max<int64_t>(1, std::min((work + block - 1) / block, max_grid));
  KILN_CUDA_CHECK(cuda::LaunchDependent(reinterpret_cast<const void*>(k), dim3(grid), dim3(block),
                                        args, 0, cuda::CurrentStream()));
}

void LaunchRows(cudaKernel_t k, void** args, long long rows, long long cols, int vec) {
  // Blocks sized so each x-block covers an equal share of a row's vectors (a 3072-wide bf16 row
  // is 384 vectors: two blocks of 192 threads, not one of 256 and one half idle).
  const int64_t groups = cols / vec;
  const int64_t blocks_x = std::min<int64_t>((groups + 255) / 256, 1024);
  const int64_t per_block = (groups + blocks_x - 1) / blocks_x;
  const int block = static_cast<int>(std::min<int64_t>(256, (per_block + 31) / 32 * 32));
  const long long row_blocks = (rows + Plan().rows_unroll - 1) / Plan().rows_unroll;
  const dim3 grid(static_cast<unsigned>(blocks_x),
                  static_cast<unsigned>(std::min<long long>(row_blocks, 65535)));
  KILN_CUDA_CHECK(cuda::LaunchDependent(reinterpret_cast<const void*>(k), grid, dim3(block), args,
                                        0, cuda::CurrentStream()));
}

// The strided kernels, compiled on first use: most operands take the contiguous or rows path.
const ElementwiseKernels::General& GeneralKernels(const ElementwiseKernels& k) {
  ElementwiseKernels::General& g = *k.general;
  std::call_once(g.once, [&g] {
    g.strided = ValueOrThrow(cuda::GetKernel(g.source, g.base + "_strided"));
    g.strided32 = ValueOrThrow(cuda::GetKernel(g.source, g.base + "_strided32"));
    g.stridedv = ValueOrThrow(cuda::GetKernel(g.source, g.base + "_stridedv"));
  });
  return g;
}

}  // namespace

void LaunchElementwise(const ElementwiseKernels& k, absl::Span<const Tensor> in,
                       absl::Span<const Tensor> out, float scalar, int64_t iscalar,
                       double dscalar) {
  KILN_CHECK(static_cast<int>(in.size()) == k.num_inputs &&
                 static_cast<int>(out.size()) == k.num_outputs && out[0].dim() <= kMaxRank,
             "elementwise kernel: compiled for ", k.num_inputs, " inputs and ", k.num_outputs,
             " outputs of rank <= ", kMaxRank, ", got ", in.size(), " and ", out.size(),
             " outputs of shape ", out.empty() ? "-" : out[0].shape_string());
  absl::InlinedVector<void*, 16> ptrs;
  for (const Tensor& t : out) ptrs.push_back(t.data_ptr());
  for (const Tensor& t : in) ptrs.push_back(const_cast<void*>(t.data_ptr()));
  long long n = out[0].numel(), int_scalar = iscalar;
  absl::InlinedVector<void*, 20> args;
  for (void*& p : ptrs) args.push_back(&p);
  if (k.scalar_params) {
    args.push_back(&scalar);
    args.push_back(&int_scalar);
    args.push_back(&dscalar);
  }
  args.push_back(&n);
  if (ContigApplies(in, out)) {
    Launch(k.contig, args.data(), std::max<int64_t>(n / k.vec, n % k.vec));
    return;
  }
  const Indexer ix = CollapsedIndexer(in, out);
  if (std::optional<std::vector<long long>> rw = RowsParams(ix, in, out, k.vec)) {
    args.push_back(rw->data());
    LaunchRows(k.rows, args.data(), (*rw)[0], (*rw)[1], k.vec);
    return;
  }
  std::vector<long long> params = IndexerParams(ix);
  args.push_back(params.data());
  const auto& g = GeneralKernels(k);
  if (StridedVecApplies(ix, in, out, k.vec, n)) {
    Launch(g.stridedv, args.data(), n / k.vec);
    return;
  }
  Launch(n < (int64_t{1} << 31) ? g.strided32 : g.strided, args.data(), n);
}

namespace {

// A row's scalar is a kernel parameter: only whether it is integral shapes the source.
OpAttrs SourceAttrs(const OpAttrs& a) {
  OpAttrs attrs = a;
  attrs.scalar = IsIntegralScalar(a.scalar) ? 0 : 0.5;
  return attrs;
}

// Bit-exact key of everything a row's rendered source depends on: the op, the dtypes and every
// attribute but the scalar's value.
std::string RowKey(const OpDef& def, absl::Span<const Tensor> in, DType out, const OpAttrs& a) {
  std::string key;
  key.push_back(static_cast<char>(def.id));
  key.push_back(static_cast<char>(static_cast<int>(def.id) >> 8));
  key.push_back(static_cast<char>(out));
  for (const Tensor& t : in) key.push_back(static_cast<char>(t.dtype()));
  kir::AppendAttrKey(SourceAttrs(a), &key);
  return key;
}

// The compiled kernels of every row key, shared by all threads; entries are never removed, so a
// pointer to one stays valid.
const ElementwiseKernels& SharedKernelsFor(const OpDef& def, absl::Span<const Tensor> in, DType out,
                                           const OpAttrs& a) {
  static std::mutex mu;  // guards `kernels` (not held while compiling)
  static auto& kernels = *new std::unordered_map<std::string, ElementwiseKernels>();
  const std::string key = RowKey(def, in, out, a);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = kernels.find(key); it != kernels.end()) return it->second;
  }
  std::vector<DType> types;
  std::string base = absl::StrCat("kiln_", def.name);
  for (const Tensor& t : in) {
    types.push_back(t.dtype());
    absl::StrAppend(&base, "_", DTypeName(t.dtype()));
  }
  absl::StrAppend(&base, "_to_", DTypeName(out));
  ElementwiseKernels k = CompileElementwiseKernels(base, RowProgram(def, types, out, a));
  std::lock_guard<std::mutex> lock(mu);
  return kernels.emplace(key, std::move(k)).first->second;  // a racing compile's result is kept
}

// The rows this thread launched last, compared field by field (the same facts as RowKey): a hit
// skips the key string, its hash and the shared lock, which an eager op otherwise pays each call.
struct RecentRow {
  const OpDef* def = nullptr;
  DType out = DType::kFloat32;
  absl::InlinedVector<DType, 4> in;
  OpAttrs attrs;  // the call's, scalar included: only whether it is integral shapes the source
  const ElementwiseKernels* kernels = nullptr;

  bool Is(const OpDef& d, absl::Span<const Tensor> ins, DType o, const OpAttrs& a) const {
    if (def != &d || out != o || in.size() != ins.size()) return false;
    for (size_t i = 0; i < ins.size(); ++i) {
      if (in[i] != ins[i].dtype()) return false;
    }
    return IsIntegralScalar(attrs.scalar) == IsIntegralScalar(a.scalar) &&
           kir::SameAttrsButScalar(attrs, a);
  }
};

const ElementwiseKernels& KernelsFor(const OpDef& def, absl::Span<const Tensor> in, DType out,
                                     const OpAttrs& a) {
  constexpr size_t kRecent = 8;
  thread_local std::array<RecentRow, kRecent> recent;
  thread_local size_t next = 0;
  for (const RecentRow& r : recent) {
    if (r.kernels != nullptr && r.Is(def, in, out, a)) return *r.kernels;
  }
  const ElementwiseKernels& k = SharedKernelsFor(def, in, out, a);
  RecentRow& r = recent[next++ % kRecent];
  r.def = &def;
  r.out = out;
  r.in.clear();
  for (const Tensor& t : in) r.in.push_back(t.dtype());
  r.attrs = a;
  r.kernels = &k;
  return k;
}

}  // namespace

void Elementwise(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out,
                 const OpAttrs& a) {
  KILN_CHECK(out.dim() <= kMaxRank && static_cast<int>(in.size()) < kMaxKernelOperands, def.name,
             ": CUDA elementwise kernels support up to rank ", kMaxRank, ", got ",
             out.shape_string());
  LaunchElementwise(KernelsFor(def, in, out.dtype(), a), in, {out}, static_cast<float>(a.scalar),
                    ScalarAsInt64(a), a.scalar);
}

void Copy(const OpDef& def, absl::Span<const Tensor> in, const Tensor& out, const OpAttrs& a) {
  Elementwise(def, in, out, a);
}

}  // namespace kiln::cuda_ops
