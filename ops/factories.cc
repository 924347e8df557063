// Factories, host conversion and printing (see factories.h).
#include "ops/factories.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "ops/cuda/random_kernels.h"
#include "ops/ops.h"
#include "runtime/cuda.h"
#include "runtime/status.h"

namespace kiln {
namespace {

// Fills a new contiguous CPU tensor element by element, then moves it to `device`.
template <typename F>
Tensor FillOnHost(IntList shape, DType dtype, Device device, F&& value_at) {
  Tensor host = Tensor::Empty(shape, dtype, device.is_meta() ? kMeta : kCPU);
  if (device.is_meta()) return host;
  const StoreFn store = StorerFor(dtype);
  const int64_t n = host.numel();
  for (int64_t i = 0; i < n; ++i) store(host.data_ptr(), i, value_at(i));
  return to(host, device);
}

}  // namespace

Tensor empty(IntList shape, DType dtype, Device device) {
  return Tensor::Empty(shape, dtype, device);
}

Tensor full(IntList shape, double value, DType dtype, Device device) {
  return FillOnHost(shape, dtype, device, [value](int64_t) { return value; });
}
Tensor zeros(IntList shape, DType dtype, Device device) { return full(shape, 0, dtype, device); }
Tensor ones(IntList shape, DType dtype, Device device) { return full(shape, 1, dtype, device); }

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  KILN_CHECK(step != 0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
             "arange: step must be non-zero and bounds finite, got start=", start, " end=", end,
             " step=", step);
  const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((end - start) / step)));
  return FillOnHost({n}, dtype, device, [&](int64_t i) { return start + i * step; });
}

Tensor arange(int64_t end, DType dtype, Device device) { return arange(0, end, 1, dtype, device); }

namespace {

// A Philox draw of numel(shape) samples (uniform or normal) from `gen`: on CUDA filled by the
// device kernel, elsewhere on the host, with the same numbers (runtime/philox.h).
Tensor RandomDraw(IntList shape, Generator& gen, DType dtype, Device device, bool normal) {
  KILN_CHECK(IsFloatingPoint(dtype), normal ? "randn" : "rand",
             ": dtype must be floating point, got ", DTypeName(dtype));
  Tensor out = Tensor::Empty(shape, dtype, device);
  const int64_t n = out.numel();
  const uint64_t base = gen.Reserve(static_cast<uint64_t>((n + 3) / 4));
  if (device.is_meta() || n == 0) return out;
  if (device.is_cuda()) {
    const auto t = dtype == DType::kFloat32   ? cuda_kernels::ElemType::kF32
                   : dtype == DType::kFloat16 ? cuda_kernels::ElemType::kF16
                                              : cuda_kernels::ElemType::kBF16;
    KILN_CUDA_CHECK(cuda_kernels::FillRandom(out.data_ptr(), n, t, gen.key(), base, normal,
                                             cuda::CurrentStream()));
    return out;
  }
  const StoreFn store = StorerFor(dtype);
  for (int64_t b = 0; 4 * b < n; ++b) {
    const philox::Uint4 r = philox::Block(gen.key(), base + static_cast<uint64_t>(b));
    float v[4];
    if (normal) {
      const philox::Normal2 z0 = philox::BoxMuller(r.x, r.y), z1 = philox::BoxMuller(r.z, r.w);
      v[0] = z0.a, v[1] = z0.b, v[2] = z1.a, v[3] = z1.b;
    } else {
      for (int lane = 0; lane < 4; ++lane) v[lane] = philox::ToUniform(philox::Lane(r, lane));
    }
    for (int lane = 0; lane < 4 && 4 * b + lane < n; ++lane)
      store(out.data_ptr(), 4 * b + lane, v[lane]);
  }
  return out;
}

}  // namespace

Tensor randn(IntList shape, Generator& gen, DType dtype, Device device) {
  return RandomDraw(shape, gen, dtype, device, /*normal=*/true);
}

Tensor rand(IntList shape, Generator& gen, DType dtype, Device device) {
  return RandomDraw(shape, gen, dtype, device, /*normal=*/false);
}

Tensor from_vector(const std::vector<double>& values, IntList shape, DType dtype, Device device) {
  KILN_CHECK(static_cast<int64_t>(values.size()) == NumElements(shape),
             "from_vector: ", values.size(), " values do not fill shape ", ShapeString(shape), " (",
             NumElements(shape), " elements)");
  return FillOnHost(shape, dtype, device, [&values](int64_t i) { return values[i]; });
}

std::vector<double> to_vector(const Tensor& x) {
  KILN_CHECK(!x.device().is_meta(), "to_vector: a meta tensor ", Describe(x.type()),
             " holds no data");
  const Tensor host = contiguous(to(x, kCPU));
  std::vector<double> out(static_cast<size_t>(host.numel()));
  const LoadFn load = LoaderFor(host.dtype());
  for (size_t i = 0; i < out.size(); ++i) out[i] = load(host.data_ptr(), static_cast<int64_t>(i));
  return out;
}

namespace {

constexpr int64_t kSummarizeAbove = 1000;
constexpr int64_t kEdgeItems = 3;

std::string FormatValue(double v, DType dtype) {
  if (dtype == DType::kBool) return v != 0 ? "True" : "False";
  if (!IsFloatingPoint(dtype)) return absl::StrCat(static_cast<int64_t>(v));
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf),
                std::fabs(v) >= 1e5 || (v != 0 && std::fabs(v) < 1e-4) ? "%.4e" : "%.4f", v);
  return buf;
}

void FormatDim(const std::vector<double>& values, IntList shape, int64_t dim, int64_t offset,
               bool summarize, DType dtype, std::string* out) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank == 0) {
    absl::StrAppend(out, FormatValue(values[0], dtype));
    return;
  }
  const int64_t n = shape[dim];
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < rank; ++d) inner *= shape[d];
  absl::StrAppend(out, "[");
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
      absl::StrAppend(out, dim == rank - 1 ? "..., " : "...,\n" + std::string(8 + dim, ' '));
      i = n - kEdgeItems;
    }
    if (dim == rank - 1) {
      absl::StrAppend(out, FormatValue(values[offset + i], dtype));
    } else {
      FormatDim(values, shape, dim + 1, offset + i * inner, summarize, dtype, out);
    }
    if (i + 1 < n) {
      absl::StrAppend(out, dim == rank - 1 ? ", "
                                           : ",\n" + std::string(rank - dim - 2, '\n') +
                                                 std::string(8 + dim, ' '));
    }
  }
  absl::StrAppend(out, "]");
}

}  // namespace

std::string ToString(const Tensor& x) {
  if (!x.defined()) return "tensor(undefined)";
  std::string out = "tensor(";
  if (x.device().is_meta()) {
    absl::StrAppend(&out, "..., size=", x.shape_string());
  } else {
    FormatDim(to_vector(x), x.shape(), 0, 0, x.numel() > kSummarizeAbove, x.dtype(), &out);
    if (x.numel() > kSummarizeAbove) absl::StrAppend(&out, ", size=", x.shape_string());
  }
  absl::StrAppend(&out, ", dtype=", DTypeName(x.dtype()), ", device=", x.device().str(), ")");
  return out;
}

std::ostream& operator<<(std::ostream& os, const Tensor& x) { return os << ToString(x); }

}  // namespace kiln
