// Custom ops: a CUDA kernel kiln did not generate, registered as an op like any other (the
// series' hand-written and "kernels hub" kernels). The kernel comes as CUDA source (compiled by
// NVRTC for the current GPU and cached like kiln's own kernels), as a prebuilt image (CUBIN, PTX
// or fatbin bytes), or already loaded (a kernel package's PackagedKernel::handle,
// io/kernel_package.h). Its launch configuration and arguments are a function of the tensors,
// its output type a function of the input types; a CPU reference is optional.
//
//   CustomOpSpec s;
//   s.name = "scaled_square";  s.num_inputs = 1;  s.entry = "scaled_square";
//   s.source = R"(extern "C" __global__ void scaled_square(const float* x, float* y, long long n)
//                 { long long i = blockIdx.x * 256ll + threadIdx.x; if (i < n) y[i] = 2 * x[i] *
//                 x[i]; })";
//   s.infer = [](absl::Span<const TensorType> in) -> absl::StatusOr<TensorType> { return in[0]; };
//   s.launch = [](absl::Span<const Tensor> in, const Tensor& out) {
//     CustomLaunch l;  l.grid[0] = (out.numel() + 255) / 256;  l.block[0] = 256;
//     l.args.Add(in[0]).Add(out).Add<long long>(out.numel());
//     return l;
//   };
//   const CustomOp square = RegisterCustomOp(std::move(s));
//   Tensor y = square({x});
//
// A registered op is a row of the op registry (ops/op_def.h) with an id after the built-in ones:
// eager calls, the profiler's op ranges, error messages and the IR text name it by its name;
// traced, it is an opaque node (FusionKind::kOpaque): fusion stops at it with an explain line,
// a compiled plan runs it as one step and CUDA graphs capture its launch. Its kernel sees every
// input contiguous (the call makes them so: a compiled plan counts those copies as steps) and
// writes a contiguous output of the inferred type; it must launch on the current stream only
// through kiln (CustomLaunch), so that graphs capture it, and be a pure function of its inputs:
// passes may remove an unused call or merge two identical ones. Ops are registered for the
// process's lifetime (at most kMaxCustomOps); names are unique identifiers that no built-in op
// uses. Thread-safe: registering, looking up and calling may happen from any thread.
#pragma once

#include <array>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ops/op_def.h"
#include "runtime/tensor.h"

namespace kiln {

inline constexpr int kMaxCustomOps = 256;

// A kernel's arguments in order, each as the bytes of its parameter: Add(tensor) passes the
// tensor's data pointer, Add<T>(value) a trivially copyable value of the parameter's exact type
// (long long for a 64-bit count, float for a float, a parameter struct by value), AddBytes the
// bytes of one parameter as they are. Their number and sizes are checked against the kernel's
// parameters as the driver reports them at the first launch.
class KernelArgs {
 public:
  KernelArgs& Add(const Tensor& t);
  template <typename T>
  KernelArgs& Add(const T& value) {
    static_assert(std::is_trivially_copyable_v<T> && !std::is_pointer_v<T>,
                  "a kernel argument is a tensor or a trivially copyable value");
    std::string bytes(sizeof(T), '\0');
    std::memcpy(bytes.data(), &value, sizeof(T));
    args_.push_back(std::move(bytes));
    return *this;
  }
  KernelArgs& AddBytes(std::string bytes) {
    args_.push_back(std::move(bytes));
    return *this;
  }
  const std::vector<std::string>& bytes() const { return args_; }

 private:
  std::vector<std::string> args_;
};

// One launch: grid and block as {x, y, z}, dynamic shared memory in bytes, the arguments.
struct CustomLaunch {
  std::array<unsigned, 3> grid = {1, 1, 1};
  std::array<unsigned, 3> block = {1, 1, 1};
  int shared_bytes = 0;
  KernelArgs args;
};

using CustomInferFn =
    std::function<absl::StatusOr<TensorType>(absl::Span<const TensorType> inputs)>;
using CustomLaunchFn =
    std::function<CustomLaunch(absl::Span<const Tensor> inputs, const Tensor& out)>;
using CustomCpuFn = std::function<void(absl::Span<const Tensor> inputs, const Tensor& out)>;

struct CustomOpSpec {
  std::string name;    // [A-Za-z_][A-Za-z0-9_]*, at most 64 characters
  int num_inputs = 1;  // 1..8
  // The kernel: exactly one of source, image, kernel.
  std::string entry;           // the extern "C" __global__ function
  std::string source;          // CUDA C++ for NVRTC (C++17, kiln's kernel options)
  bool arch_specific = false;  // source: compile for the GPU's arch-specific target (sm_90a)
  std::string image;           // a CUBIN, PTX or fatbin for the current GPU
  void* kernel = nullptr;      // a kernel already loaded (cudaKernel_t)
  // The output's shape and dtype from the inputs' types (all on one device, already checked);
  // an error status says which rule the inputs break. The result's device is the inputs'.
  CustomInferFn infer;
  CustomLaunchFn launch;  // required
  CustomCpuFn cpu;        // optional: the CPU reference (without it the op runs on CUDA only)
};

// A registered custom op: call it like an op.
class CustomOp {
 public:
  Tensor operator()(absl::Span<const Tensor> inputs) const;
  Tensor operator()(std::initializer_list<Tensor> inputs) const {
    return (*this)(absl::Span<const Tensor>(inputs.begin(), inputs.size()));
  }
  OpId id() const { return id_; }
  const char* name() const;

 private:
  friend CustomOp RegisterCustomOp(CustomOpSpec spec);
  friend std::optional<CustomOp> FindCustomOp(const std::string& name);
  explicit CustomOp(OpId id) : id_(id) {}
  OpId id_;
};

// Registers `spec` as an op; throws kiln::Error naming the op and the rule broken (a name that
// is no identifier or is taken, not exactly one kernel, no entry, no infer or launch, an arity
// outside 1..8, the table full). Nothing is compiled or loaded until the first CUDA call.
CustomOp RegisterCustomOp(CustomOpSpec spec);
std::optional<CustomOp> FindCustomOp(const std::string& name);

// For the registry (ops/registry.cc): the rows of registered custom ops, by id or by name
// (nullptr when none), and whether `id` names any op, built-in or custom.
const OpDef* CustomOpRow(OpId id);
const OpDef* FindCustomOpRow(std::string_view name);
bool IsKnownOp(OpId id);

}  // namespace kiln
