// torch-style printing of tensors (see ops/factories.h): the values, summarised like torch beyond
// 1000 elements, then the dtype and the device.
//
// A summarised dim shows its first and last kEdgeItems entries. Only those elements are read:
// the tensor is cut into one strided block per combination of leading/trailing edge (at most
// 2^rank small copies, each of printed elements only), so printing a 100M-element CUDA tensor
// moves a few hundred values, not the tensor.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {
namespace {

constexpr int64_t kSummarizeAbove = 1000;
constexpr int64_t kEdgeItems = 3;

// The printed elements in row-major order of the summarised shape, as doubles and (exactly) as
// int64 for integer dtypes.
struct Printed {
  Shape shape;                 // per dim: all entries, or 2 * kEdgeItems when elided
  std::vector<bool> elided;    // per dim: "..." between the two edges
  std::vector<double> floats;  // floating dtypes
  std::vector<int64_t> ints;   // integer and bool dtypes
};

// One contiguous run of a dim: entries [start, start + len) go to [dst, dst + len).
struct Run {
  int64_t start, len, dst;
};

std::vector<std::vector<Run>> RunsPerDim(const Tensor& x, bool summarize, Printed* p) {
  std::vector<std::vector<Run>> runs;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const int64_t n = x.size(d);
    const bool elide = summarize && n > 2 * kEdgeItems;
    p->elided.push_back(elide);
    p->shape.push_back(elide ? 2 * kEdgeItems : n);
    runs.push_back(
        elide ? std::vector<Run>{{0, kEdgeItems, 0}, {n - kEdgeItems, kEdgeItems, kEdgeItems}}
              : std::vector<Run>{{0, n, 0}});
  }
  return runs;
}

// Copies the block `pick` (one run per dim) of x to the host and into p at its place.
void ReadBlock(const Tensor& x, const std::vector<std::vector<Run>>& runs,
               const std::vector<size_t>& pick, Printed* p) {
  Tensor block = x;
  for (size_t d = 0; d < pick.size(); ++d) {
    const Run& r = runs[d][pick[d]];
    block = slice(block, static_cast<int64_t>(d), r.start, r.start + r.len);
  }
  const Tensor host = contiguous(to(block, kCPU));
  const int64_t n = host.numel(), rank = host.dim();
  const bool ints = !IsFloatingPoint(host.dtype());
  const Strides dst_strides = ContiguousStrides(p->shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t dst = 0;
    for (int64_t d = rank - 1, rest = i; d >= 0; --d) {
      const int64_t idx = rest % host.size(d);
      rest /= host.size(d);
      dst += (runs[d][pick[d]].dst + idx) * dst_strides[d];
    }
    if (ints) {
      p->ints[dst] = IntLoaderFor(host.dtype())(host.data_ptr(), i);
    } else {
      p->floats[dst] = LoaderFor(host.dtype())(host.data_ptr(), i);
    }
  }
}

Printed ReadPrinted(const Tensor& x, bool summarize) {
  ScopedDispatchHook eager(nullptr);  // a real tensor printed while tracing: nothing to record
  Printed p;
  const std::vector<std::vector<Run>> runs = RunsPerDim(x, summarize, &p);
  const int64_t count = NumElements(p.shape);
  if (IsFloatingPoint(x.dtype())) {
    p.floats.assign(count, 0);
  } else {
    p.ints.assign(count, 0);
  }
  if (count == 0) return p;
  std::vector<size_t> pick(runs.size(), 0);
  while (true) {  // every combination of runs, like an odometer
    ReadBlock(x, runs, pick, &p);
    size_t d = pick.size();
    while (d > 0 && ++pick[d - 1] == runs[d - 1].size()) pick[--d] = 0;
    if (d == 0) return p;
  }
}

std::string FormatValue(const Printed& p, int64_t i, DType dtype) {
  if (dtype == DType::kBool) return p.ints[i] != 0 ? "True" : "False";
  if (!IsFloatingPoint(dtype)) return absl::StrCat(p.ints[i]);
  const double v = p.floats[i];
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf),
                std::fabs(v) >= 1e5 || (v != 0 && std::fabs(v) < 1e-4) ? "%.4e" : "%.4f", v);
  return buf;
}

void FormatDim(const Printed& p, int64_t dim, int64_t offset, DType dtype, std::string* out) {
  const int64_t rank = static_cast<int64_t>(p.shape.size());
  if (rank == 0) {
    absl::StrAppend(out, FormatValue(p, 0, dtype));
    return;
  }
  const int64_t n = p.shape[dim];
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < rank; ++d) inner *= p.shape[d];
  // torch joins the slices of a dim (and its "...") with "," plus one newline per inner dim.
  const std::string sep =
      dim == rank - 1 ? ", "
                      : ",\n" + std::string(rank - dim - 2, '\n') + std::string(8 + dim, ' ');
  absl::StrAppend(out, "[");
  for (int64_t i = 0; i < n; ++i) {
    if (p.elided[dim] && i == kEdgeItems) absl::StrAppend(out, "...", sep);
    if (dim == rank - 1) {
      absl::StrAppend(out, FormatValue(p, offset + i, dtype));
    } else {
      FormatDim(p, dim + 1, offset + i * inner, dtype, out);
    }
    if (i + 1 < n) absl::StrAppend(out, sep);
  }
  absl::StrAppend(out, "]");
}

}  // namespace

std::string ToString(const Tensor& x) {
  if (!x.defined()) return "tensor(undefined)";
  CheckReadable("print", x);
  std::string out = "tensor(";
  if (x.device().is_meta()) {
    absl::StrAppend(&out, "..., size=", x.shape_string());
  } else if (x.numel() == 0) {  // like torch: "[]", and the size unless the tensor is 1-D
    absl::StrAppend(&out, "[]", x.dim() != 1 ? absl::StrCat(", size=", x.shape_string()) : "");
  } else {
    const bool summarize = x.numel() > kSummarizeAbove;
    FormatDim(ReadPrinted(x, summarize), 0, 0, x.dtype(), &out);
    if (summarize) absl::StrAppend(&out, ", size=", x.shape_string());
  }
  absl::StrAppend(&out, ", dtype=", DTypeName(x.dtype()), ", device=", x.device().str(), ")");
  return out;
}

std::ostream& operator<<(std::ostream& os, const Tensor& x) { return os << ToString(x); }

}  // namespace kiln
