// The elementwise kernel family's CUDA source (see elementwise_cuda.h): the contig, rows and
// strided skeletons rendered around a kernel-IR program, and the eager rows' one-instruction
// programs. Host code only (a build without CUDA renders the same sources for its dumps).
#include <algorithm>
#include <array>
#include <cstdlib>
#include <optional>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "codegen/families/pointwise/elementwise_cuda.h"
#include "ops/cuda/kernel_render.h"
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

}  // namespace

int ElementwiseVectorWidth(const kir::Program& p) {
  int64_t widest = 1;
  for (DType t : p.input_types()) widest = std::max(widest, DTypeSize(t));
  for (DType t : p.output_types()) widest = std::max(widest, DTypeSize(t));
  return static_cast<int>(16 / widest);
}

namespace {

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

}  // namespace

int ElementwiseRowsUnroll() { return Plan().rows_unroll; }

namespace {

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

// The unrolled body over vectors `index` of contiguous operands (valid while `valid` holds).
std::string ContigVectors(const kir::Program& p, int vec, int unroll, const std::string& valid,
                          const std::string& index, const std::string& pad) {
  return UnrolledBody(
      p, vec, unroll, [&] { return valid; },
      [&](int i, bool) {
        return absl::StrCat("(const ", Raw(StorageType(p.input_types()[i]), vec), "*)in", i, " + ",
                            index);
      },
      [&](int o) {
        return absl::StrCat("(", Raw(StorageType(p.output_types()[o]), vec), "*)out", o, " + ",
                            index);
      },
      [](int) { return std::string(); }, pad);
}

// The program at element e of contiguous operands (the scalar tails).
std::string ElementAtE(const kir::Program& p) {
  return Element(
      p, [](int i) { return absl::StrCat("in", i, "[e]"); },
      [](int o) { return absl::StrCat("out", o, "[e]"); }, "    ");
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
  absl::StrAppend(&src, ContigVectors(p, vec, Plan().contig_unroll, "g0 + u * stride < groups",
                                      "(g0 + u * stride)", "    "));
  // Tail elements after the last full group.
  absl::StrAppend(&src, "  }\n  for (long long e = groups * ", vec,
                  " + blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;",
                  " e += (long long)gridDim.x * blockDim.x) {\n", ElementAtE(p), "  }\n}\n");
  return src;
}

// Small kernel: work of one block (LaunchSmall in elementwise_cuda.cc), one 16-byte vector a thread
// and the scalar tail in the thread after the last full vector: straight-line code, 32-bit indices.
// A 16-element add through the _contig kernel (its loops, 64-bit index math and tail loop) stalled
// ~780 cycles a warp waiting for instructions after an L2 flush, PyTorch's kernel ~320 (ncu, H200).
std::string SmallKernel(const std::string& base, const kir::Program& p, int vec) {
  std::string src =
      absl::StrCat("extern \"C\" __global__ void ", base, "_small(", Params(p), ") {\n", kEnter,
                   "  const int g = threadIdx.x, groups = (int)n / ", vec, ";\n");
  absl::StrAppend(&src, ContigVectors(p, vec, 1, "g < groups", "g", "  "),
                  "  if (g != groups) return;\n  for (int e = groups * ", vec,
                  "; e < (int)n; ++e) {\n", ElementAtE(p), "  }\n}\n");
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

// The program at element `e` of a strided iteration space (indexer `ix`, a kernel parameter read
// by name: a reference to one would copy it to local memory): the offsets of every
// operand by div/mod over the dims, with `idx` index math, then the values and stores. The rank
// loop is unrolled so the indexer's arrays are read with constant indices (no local-memory copy).
std::string StridedElement(const kir::Program& p, const std::string& idx,
                           const std::string& ix = "ix") {
  const Operands ops = OperandsOf(p);
  std::string offsets, accumulate;
  for (int k = 0; k < ops.total(); ++k) {
    absl::StrAppend(&offsets, k ? ", " : "", "o", k, " = 0");
    absl::StrAppend(&accumulate, "      o", k, " += c * ", ix, ".strides[", k, "][d];\n");
  }
  return absl::StrCat("    ", idx, " rem = (", idx, ")e;\n    long long ", offsets, ";\n",
                      "    #pragma unroll\n    for (int d = ", kMaxRank - 1, "; d >= 0; --d) {\n",
                      "      if (d >= ", ix, ".rank) continue;\n", "      const ", idx, " size = (",
                      idx, ")", ix, ".sizes[d];\n",
                      "      const long long c = rem % size; rem /= size;\n", accumulate, "    }\n",
                      Element(
                          p, [&](int i) { return absl::StrCat("in", i, "[o", ops.out + i, "]"); },
                          [](int o) { return absl::StrCat("out", o, "[o", o, "]"); }, "    "));
}

// The KilnIndexer struct of a program's operands (named `name`).
std::string IndexerStruct(const kir::Program& p, const std::string& name) {
  return absl::StrCat("struct ", name, " { long long rank; long long sizes[", kMaxRank,
                      "]; long long strides[", OperandsOf(p).total(), "][", kMaxRank, "]; };\n");
}

// Strided kernels with broadcasting (stride 0 on repeated dims): 64-bit index math, and a 32-bit
// variant (cheaper div/mod) for iteration spaces under 2^31 elements.
std::string StridedKernels(const std::string& base, const kir::Program& p) {
  std::string src = IndexerStruct(p, "KilnIndexer");
  for (const char* idx : {"long long", "unsigned"}) {
    const bool narrow = std::string(idx) == "unsigned";
    absl::StrAppend(
        &src, "extern \"C\" __global__ void ", base, narrow ? "_strided32(" : "_strided(",
        Params(p), ", KilnIndexer ix) {\n", kEnter,
        "  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;",
        " e += (long long)gridDim.x * blockDim.x) {\n", StridedElement(p, idx), "  }\n}\n");
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

// Segment k's kernel parameters: its operands' pointers, its element count and its indexer.
std::string SegmentParams(const kir::Program& p, int k) {
  std::string s;
  for (int o = 0; o < p.num_outputs(); ++o) {
    absl::StrAppend(&s, StorageType(p.output_types()[o]), "* __restrict__ s", k, "_out", o, ", ");
  }
  for (int i = 0; i < p.num_inputs(); ++i) {
    absl::StrAppend(&s, "const ", StorageType(p.input_types()[i]), "* __restrict__ s", k, "_in", i,
                    ", ");
  }
  return absl::StrCat(s, "long long s", k, "_n, KilnIndexer", k, " s", k, "_ix");
}

// Segment k's element `e`: its operands and indexer under the names StridedElement reads.
std::string SegmentElement(const kir::Program& p, int k) {
  std::string s = "    {\n";
  for (int o = 0; o < p.num_outputs(); ++o) {
    absl::StrAppend(&s, "    ", StorageType(p.output_types()[o]), "* const out", o, " = s", k,
                    "_out", o, ";\n");
  }
  for (int i = 0; i < p.num_inputs(); ++i) {
    absl::StrAppend(&s, "    const ", StorageType(p.input_types()[i]), "* const in", i, " = s", k,
                    "_in", i, ";\n");
  }
  return absl::StrCat(s, StridedElement(p, "unsigned", absl::StrCat("s", k, "_ix")), "    }\n");
}

}  // namespace

std::string RenderComboSource(const std::string& base, const std::vector<kir::Program>& segments) {
  int operands = 0;
  for (const kir::Program& p : segments) operands += p.num_inputs() + p.num_outputs();
  KILN_CHECK(segments.size() >= 2 && operands <= kMaxKernelOperands, "combo kernel ", base,
             ": needs 2 or more segments of ", kMaxKernelOperands, " operands in all, got ",
             segments.size(), " segments of ", operands);
  std::string src = KernelPrelude(), params, total;
  for (size_t k = 0; k < segments.size(); ++k) {
    KILN_CHECK(!segments[k].scalar_param() && segments[k].num_outputs() >= 1, "combo kernel ", base,
               ": segment ", k, " needs an output and no scalar parameter");
    absl::StrAppend(&src, IndexerStruct(segments[k], absl::StrCat("KilnIndexer", k)));
    absl::StrAppend(&params, k ? ", " : "", SegmentParams(segments[k], static_cast<int>(k)));
    absl::StrAppend(&total, k ? " + " : "", "s", k, "_n");
  }
  absl::StrAppend(&src, "extern \"C\" __global__ void ", base, "_combo(", params, ") {\n", kEnter,
                  "  const long long total = ", total, ";\n",
                  "  for (long long e0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;",
                  " e0 < total; e0 += (long long)gridDim.x * blockDim.x) {\n",
                  "    long long e = e0;\n");
  for (size_t k = 0; k < segments.size(); ++k) {  // e becomes the index within segment k
    absl::StrAppend(&src,
                    k == 0 ? "    if (e < s0_n)\n"
                           : absl::StrCat("    else if ((e -= s", k - 1, "_n) < s", k, "_n)\n"),
                    SegmentElement(segments[k], static_cast<int>(k)));
  }
  return src + "  }\n}\n";
}

std::string RenderElementwiseSource(const std::string& base, const kir::Program& p,
                                    ElementwiseVariants variants) {
  KILN_CHECK(p.num_outputs() >= 1 && p.num_inputs() + p.num_outputs() <= kMaxKernelOperands,
             "elementwise kernel ", base, ": needs 1..", kMaxKernelOperands,
             " operands with at least one output, got ", p.num_inputs(), " inputs and ",
             p.num_outputs(), " outputs");
  const int vec = ElementwiseVectorWidth(p);
  std::string src = KernelPrelude();
  if (variants & kFastVariants) {
    src += ContigKernel(base, p, vec) + SmallKernel(base, p, vec) + RowsKernel(base, p, vec);
  }
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

}  // namespace kiln::cuda_ops
