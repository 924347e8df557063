// NVRTC is loaded at the first compile, never before (runtime/nvrtc.cc): a process that only
// loads prebuilt kernels does not map libnvrtc. Its own binary, one test, so that nothing else
// compiles first: a child process builds a kernel package (NVRTC maps there), this process loads
// it, registers its kernel as a custom op and runs it (on a GPU), and reads its own memory maps;
// then compiles one source and sees NVRTC mapped (the check itself works).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/kernel_package.h"
#include "ops/custom_op.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "tests/io_test_util.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

constexpr const char* kNegSource = R"(
extern "C" __global__ void kiln_lazy_neg(const float* x, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = -x[i];
}
)";

// Builds the package in a child process: this one never calls NVRTC.
void BuildInAChild(const std::string& dir, const std::vector<std::string>& archs) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      BuildKernelPackage(dir, "lazy", "1.0.0", {{"neg", "kiln_lazy_neg", kNegSource, {8, 8, 8}}},
                         archs);
      _exit(0);
    } catch (...) {
      _exit(1);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "building the package failed";
}

TEST(LazyNvrtc, LoadingAPackageNeverMapsNvrtcCompilingDoes) {
  KILN_SKIP_WITHOUT_NVRTC();
  ASSERT_FALSE(NvrtcMapped()) << "NVRTC was mapped before anything compiled";
  std::vector<std::string> archs = {"compute_80"};
  if (GpuPresent()) {
    const cuda::DeviceProps& p = cuda::Props();
    archs.push_back(absl::StrCat("sm_", p.major, p.minor));
  }
  const std::string dir = TempPath("lazy_nvrtc_pkg");
  std::filesystem::remove_all(dir);
  BuildInAChild(dir, archs);
  EXPECT_FALSE(NvrtcMapped());
  if (GpuPresent()) {
    static const KernelPackage pkg = KernelPackage::Load(dir, "1");
    CustomOpSpec s;
    s.name = "lazy_neg";
    s.entry = "kiln_lazy_neg";
    s.kernel = pkg.kernel("neg").handle;
    s.infer = [](absl::Span<const TensorType> in) -> absl::StatusOr<TensorType> { return in[0]; };
    s.launch = [](absl::Span<const Tensor> in, const Tensor& out) {
      CustomLaunch l;
      l.grid[0] = static_cast<unsigned>((out.numel() + 127) / 128);
      l.block[0] = 128;
      l.args.Add(in[0]).Add(out).Add<long long>(out.numel());
      return l;
    };
    const CustomOp neg = RegisterCustomOp(std::move(s));
    const Tensor x = to(arange(0, 300, 1, DType::kFloat32), CUDA(0));
    const std::vector<double> y = to_vector(neg({x}));
    for (int i = 0; i < 300; ++i) ASSERT_EQ(y[i], -i) << i;
  } else {
    ExpectThrowsWith([&] { KernelPackage::Load(dir, "1"); }, "no CUDA GPU");
  }
  EXPECT_FALSE(NvrtcMapped()) << "loading and running a packaged kernel mapped NVRTC";
  ASSERT_TRUE(cuda::CompileSource(kNegSource, "neg", "compute_80", false).ok());
  EXPECT_TRUE(NvrtcMapped()) << "a compile did not map NVRTC: the check above proves nothing";
}

}  // namespace
}  // namespace kiln
