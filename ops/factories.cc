// Factories and host conversion (see factories.h; printing is in ops/print.cc).
#include "ops/factories.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ops/cuda/factories_cuda.h"
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "runtime/build_config.h"
#include "runtime/status.h"

namespace kiln {

void CheckReadable(const char* what, const Tensor& x) {
  if (!x.is_placeholder()) return;
  throw Error(absl::FailedPreconditionError(absl::StrCat(
      what, ": cannot read the data of ", Describe(x.type()),
      " while tracing: it is a placeholder of a function being traced by kiln::compile; return "
      "it from the function and read the compiled function's output instead")));
}

namespace {

// Tensor::Empty for the factory `what`: a shape no tensor can have (a negative dim, more
// elements or bytes than int64 counts) raises naming the factory rather than empty().
Tensor NewTensor(const char* what, IntList shape, DType dtype, Device device) {
  KILN_CHECK(static_cast<int>(dtype) < kNumDTypes, what, ": unknown dtype ",
             static_cast<int>(dtype));
  const absl::StatusOr<int64_t> numel = CheckedNumElements(shape);
  KILN_CHECK(numel.ok(), what, ": ", numel.status().message());
  int64_t bytes = 0;
  KILN_CHECK(!__builtin_mul_overflow(*numel, DTypeSize(dtype), &bytes), what, ": shape ",
             ShapeString(shape), " of ", DTypeName(dtype), " needs more than 2^63 - 1 bytes");
  return Tensor::Empty(shape, dtype, device);
}

// Whether an element of a filled-in tensor (from_vector, arange) may hold `v`: an integer dtype
// must hold it (torch: "value cannot be converted ... without overflow"); a floating dtype rounds
// it, to the infinity when beyond its range, as torch.tensor does (full and fills check the
// range: FitsDType).
bool FitsElement(double v, DType dtype) { return IsFloatingPoint(dtype) || FitsDType(v, dtype); }

// Fills a new contiguous CPU tensor element by element, then moves it to `device`.
template <typename F>
Tensor FillOnHost(const char* what, IntList shape, DType dtype, Device device, F&& value_at) {
  Tensor host = NewTensor(what, shape, dtype, device.is_meta() ? kMeta : kCPU);
  if (device.is_meta()) return host;
  const StoreFn store = StorerFor(dtype);
  const int64_t n = host.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double v = value_at(i);
    KILN_CHECK(FitsElement(v, dtype), what, ": the value ", v, " cannot be converted to ",
               DTypeName(dtype), " without overflow");
    store(host.data_ptr(), i, v);
  }
  return to(host, device);
}

// Whether an integer scalar is one every double between it and 0 counts exactly (|v| <= 2^53).
bool ExactInDouble(const Scalar& v) {
  const int64_t i = v.to_int64();
  return i >= -(int64_t{1} << 53) && i <= (int64_t{1} << 53);
}

// arange's rules on its bounds (in int64 or double): a non-zero step whose sign leads from start
// to end.
template <typename T>
void CheckArangeSteps(T start, T end, T step) {
  KILN_CHECK(step != 0, "arange: step must be non-zero, got start=", start, " end=", end,
             " step=", step);
  KILN_CHECK(end == start || (end > start) == (step > 0), "arange: the bounds start=", start,
             " end=", end, " are inconsistent with the sign of step=", step, " (as in torch)");
}

// arange of integers past 2^53, counted and filled in int64 as torch does (double arithmetic
// would repeat and skip values there).
Tensor IntegerArange(const char* what, int64_t start, int64_t end, int64_t step, DType dtype,
                     Device device) {
  CheckArangeSteps(start, end, step);
  const __int128 span = static_cast<__int128>(end) - start;
  const __int128 count = (span + step + (step > 0 ? -1 : 1)) / step;  // ceil(span / step)
  KILN_CHECK(count < (static_cast<__int128>(1) << 62), what, ": [", start, ", ", end,
             ") with step ", step, " has too many elements");
  const int64_t n = static_cast<int64_t>(count);
  auto value = [&](int64_t i) {
    return static_cast<int64_t>(start + static_cast<__int128>(i) * step);
  };
  for (const int64_t v : {start, value(n - 1)}) {  // monotonic: the two ends decide
    KILN_CHECK(n == 0 || Scalar(v).FitsIn(dtype), what, ": the value ", v,
               " cannot be converted to ", DTypeName(dtype), " without overflow");
  }
  Tensor host = NewTensor(what, {n}, dtype, device.is_meta() ? kMeta : kCPU);
  if (device.is_meta()) return host;
  const IntStoreFn store = IntStorerFor(dtype);
  for (int64_t i = 0; i < n; ++i) store(host.data_ptr(), i, value(i));
  return to(host, device);
}

}  // namespace

Tensor empty(IntList shape, DType dtype, Device device) {
  return Tensor::Empty(shape, dtype, device);
}

// A constant: checked and stored once, then the element's bytes are repeated: on CUDA by a fill
// kernel (or a memset for zero bytes) on the current stream, never staged on the host; on the
// CPU the filled bytes double by memcpy (a million-element fill costs microseconds).
Tensor full(IntList shape, Scalar value, DType dtype, Device device) {
  KILN_CHECK(value.FitsIn(dtype), "full: the value ", value.ToString(), " cannot be converted to ",
             DTypeName(dtype), " without overflow");
  Tensor out = NewTensor("full", shape, dtype, device);  // on CUDA: out of memory raises here
  const size_t element = DTypeSize(dtype), total = element * static_cast<size_t>(out.numel());
  if (device.is_meta() || total == 0) return out;
  uint64_t pattern = 0;
  if (value.is_integer() && !IsFloatingPoint(dtype)) {
    IntStorerFor(dtype)(&pattern, 0, value.to_int64());  // exact past 2^53
  } else {
    StorerFor(dtype)(&pattern, 0, value.to_double());
  }
  if constexpr (kWithCuda) {
    if (device.is_cuda()) {
      cuda_ops::FillBytes(out, pattern);
      return out;
    }
  }
  char* bytes = static_cast<char*>(out.data_ptr());
  std::memcpy(bytes, &pattern, element);
  for (size_t done = element; done < total;) {
    const size_t n = std::min(done, total - done);
    std::memcpy(bytes + done, bytes, n);
    done += n;
  }
  return out;
}
Tensor zeros(IntList shape, DType dtype, Device device) { return full(shape, 0, dtype, device); }
Tensor ones(IntList shape, DType dtype, Device device) { return full(shape, 1, dtype, device); }

Tensor arange(Scalar start_scalar, Scalar end_scalar, Scalar step_scalar,
              std::optional<DType> given, Device device) {
  // torch's rule: int64 when every argument is an integer, float32 otherwise.
  const bool integers =
      start_scalar.is_integer() && end_scalar.is_integer() && step_scalar.is_integer();
  const DType dtype = given.value_or(integers ? DType::kInt64 : DType::kFloat32);
  if (integers && !IsFloatingPoint(dtype) &&
      !(ExactInDouble(start_scalar) && ExactInDouble(end_scalar) && ExactInDouble(step_scalar))) {
    return IntegerArange("arange", start_scalar.to_int64(), end_scalar.to_int64(),
                         step_scalar.to_int64(), dtype, device);
  }
  const double start = start_scalar.to_double(), end = end_scalar.to_double(),
               step = step_scalar.to_double();
  KILN_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
             "arange: the bounds and step must be finite, got start=", start, " end=", end,
             " step=", step);
  CheckArangeSteps(start, end, step);
  const double count = std::ceil((end - start) / step);
  KILN_CHECK(std::isfinite(count) && count < 0x1p63, "arange: [", start, ", ", end, ") with step ",
             step, " has ", count, " elements, more than fit in int64");
  const int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;  // (-1e30 does not fit int64)
  if (!device.is_cuda()) {
    return FillOnHost("arange", {n}, dtype, device, [&](int64_t i) { return start + i * step; });
  }
  // On CUDA the device computes the values (the same double arithmetic); they run from start to
  // the last one monotonically, so the two ends decide whether all fit the dtype.
  for (const double end_value : {start, start + static_cast<double>(n - 1) * step}) {
    KILN_CHECK(n == 0 || FitsElement(end_value, dtype), "arange: the value ", end_value,
               " cannot be converted to ", DTypeName(dtype), " without overflow");
  }
  Tensor out = NewTensor("arange", {n}, dtype, device);
  if constexpr (kWithCuda) cuda_ops::FillArange(out, start, step);
  return out;
}

Tensor arange(int64_t end, DType dtype, Device device) { return arange(0, end, 1, dtype, device); }

namespace {

// A Philox draw of numel(shape) samples (uniform or normal) from `gen`: on CUDA filled by the
// device kernel, elsewhere on the host, with the same numbers (runtime/philox.h).
Tensor RandomDraw(IntList shape, Generator& gen, DType dtype, Device device, bool normal) {
  const char* name = normal ? "randn" : "rand";
  // Traced, the draw would be a constant of the plan: every call would reuse the same numbers
  // (torch.compile draws anew on each call).
  KILN_CHECK(CurrentDispatchHook() == nullptr, name,
             ": a random draw inside a compiled function would be traced as a constant (every call "
             "would reuse the same numbers); draw it outside and pass it as an input");
  KILN_CHECK(IsFloatingPoint(dtype), name, ": dtype must be floating point, got ",
             DTypeName(dtype));
  Tensor out = NewTensor(name, shape, dtype, device);
  const int64_t n = out.numel();
  const uint64_t base = gen.Reserve(static_cast<uint64_t>((n + 3) / 4));
  if (device.is_meta() || n == 0) return out;
  if constexpr (kWithCuda) {
    if (device.is_cuda()) {
      cuda_ops::FillRandom(out, gen.key(), base, normal);  // floating: checked above
      return out;
    }
  }
  const StoreFn store = StorerFor(dtype);
  // Uniform draws exact in the dtype (none rounds up to 1), as the CUDA kernel draws them.
  const int digits = dtype == DType::kFloat16 ? 11 : dtype == DType::kBFloat16 ? 8 : 24;
  for (int64_t b = 0; 4 * b < n; ++b) {
    const philox::Uint4 r = philox::Block(gen.key(), base + static_cast<uint64_t>(b));
    float v[4];
    if (normal) {
      const philox::Normal2 z0 = philox::BoxMuller(r.x, r.y), z1 = philox::BoxMuller(r.z, r.w);
      v[0] = z0.a, v[1] = z0.b, v[2] = z1.a, v[3] = z1.b;
    } else {
      for (int lane = 0; lane < 4; ++lane)
        v[lane] = philox::ToUniform(philox::Lane(r, lane), digits);
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
  const absl::StatusOr<int64_t> numel = CheckedNumElements(shape);
  KILN_CHECK(numel.ok(), "from_vector: ", numel.status().message());
  KILN_CHECK(static_cast<int64_t>(values.size()) == *numel, "from_vector: ", values.size(),
             " values do not fill shape ", ShapeString(shape), " (", *numel, " elements)");
  return FillOnHost("from_vector", shape, dtype, device,
                    [&values](int64_t i) { return values[i]; });
}

std::vector<int64_t> to_integers(const Tensor& x, int64_t lo, int64_t hi, const char* type) {
  CheckDefined("to_vector", x);
  KILN_CHECK(!x.device().is_meta(), "to_vector: a meta tensor ", Describe(x.type()),
             " holds no data");
  CheckReadable("to_vector", x);
  ScopedDispatchHook eager(nullptr);
  const Tensor host = contiguous(to(x, kCPU));
  std::vector<int64_t> out(static_cast<size_t>(host.numel()));
  const bool integral = !IsFloatingPoint(host.dtype());
  const LoadFn load = LoaderFor(host.dtype());
  for (size_t i = 0; i < out.size(); ++i) {
    const auto at = static_cast<int64_t>(i);
    if (integral) {
      out[i] = IntLoaderFor(host.dtype())(host.data_ptr(), at);
    } else {
      const double v = std::trunc(load(host.data_ptr(), at));
      // [-2^63, 2^63) as doubles: the int64 range without rounding at its ends.
      KILN_CHECK(v >= -9223372036854775808.0 && v < 9223372036854775808.0, "to_vector: element ", i,
                 " of ", Describe(x.type()), " is ", load(host.data_ptr(), at), ", which ", type,
                 " cannot hold");
      out[i] = static_cast<int64_t>(v);
    }
    KILN_CHECK(out[i] >= lo && out[i] <= hi, "to_vector: element ", i, " of ", Describe(x.type()),
               " is ", out[i], ", outside the range of ", type, " [", lo, ", ", hi, "]");
  }
  return out;
}

std::vector<double> to_vector(const Tensor& x) {
  CheckDefined("to_vector", x);
  KILN_CHECK(!x.device().is_meta(), "to_vector: a meta tensor ", Describe(x.type()),
             " holds no data");
  CheckReadable("to_vector", x);
  ScopedDispatchHook eager(nullptr);  // a real tensor read while tracing: nothing to record
  const Tensor host = contiguous(to(x, kCPU));
  std::vector<double> out(static_cast<size_t>(host.numel()));
  const LoadFn load = LoaderFor(host.dtype());
  for (size_t i = 0; i < out.size(); ++i) out[i] = load(host.data_ptr(), static_cast<int64_t>(i));
  return out;
}

}  // namespace kiln
