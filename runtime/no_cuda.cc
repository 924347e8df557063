// runtime/cuda.h and runtime/nvrtc.h in a build without CUDA (KILN_WITH_CUDA=OFF): no device is
// ever present, so kiln behaves as the CUDA build does on a machine without a GPU. Queries answer
// "none" (no device, no memory in use, no stream); anything that would touch a GPU throws a
// kiln::Error that says kiln was built without CUDA. Nothing here is reached through a tensor: no
// CUDA tensor can be made (Storage finds no device allocator).
#include "absl/strings/str_cat.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "runtime/status.h"

namespace kiln::cuda {
namespace {

constexpr const char* kBuiltWithoutCuda =
    "CUDA is not available: this kiln was built without CUDA (KILN_WITH_CUDA=OFF)";

[[noreturn]] void ThrowNoCuda(const char* what) {
  throw Error(absl::FailedPreconditionError(absl::StrCat(what, ": ", kBuiltWithoutCuda)));
}

thread_local bool t_for_graph_replay = false;

}  // namespace

bool IsAvailable() { return false; }
int DeviceCount() { return 0; }
const DeviceProps& Props(int device) {
  KILN_CHECK(false, "cuda: no device ", device, " (0 present: kiln was built without CUDA)");
  static const DeviceProps none;
  return none;
}

StreamHandle CurrentStream() { return nullptr; }
void SetCurrentStream(StreamHandle stream) {
  if (stream != nullptr) ThrowNoCuda("cuda::SetCurrentStream");
}
void Synchronize() { ThrowNoCuda("cuda::Synchronize"); }
bool Capturing(StreamHandle) { return false; }
bool ForGraphReplay() { return t_for_graph_replay; }
ScopedGraphReplay::ScopedGraphReplay() : previous_(t_for_graph_replay) {
  t_for_graph_replay = true;
}
ScopedGraphReplay::~ScopedGraphReplay() { t_for_graph_replay = previous_; }
bool DependentLaunchEnabled(int) { return false; }
bool UseDependentLaunch(int, StreamHandle) { return false; }
ScopedPlanRun::ScopedPlanRun(const std::vector<ByteRange>& ranges)
    : read_only(ranges), previous_(nullptr) {}
ScopedPlanRun::~ScopedPlanRun() = default;
bool ReadOnlyDuringRun(const void*, size_t) { return false; }
void RelaxCaptureModeForThisThread() {}
LaunchTally CountCapturedLaunches(const std::function<void()>&) {
  return {0, 0, kBuiltWithoutCuda};
}

MemoryStats GetMemoryStats() { return {}; }
void ResetPeakMemoryStats() {}
void EmptyCache() {}
void Copy(void*, Device dst_device, const void*, Device src_device, size_t) {
  ThrowNoCuda(absl::StrCat("copy from ", src_device.str(), " to ", dst_device.str()).c_str());
}
void CopyRows(void*, size_t, const void*, size_t, size_t, size_t) {
  ThrowNoCuda("device row copy");
}
PointerInfo DescribePointer(const void*) { return {}; }
Allocator* DeviceAllocator() { return nullptr; }

Event::Event() { ThrowNoCuda("cuda::Event"); }
Event::~Event() = default;
void Event::Record(StreamHandle) { ThrowNoCuda("cuda::Event::Record"); }
void Event::Synchronize() { ThrowNoCuda("cuda::Event::Synchronize"); }
float Event::ElapsedMs(const Event&) const { ThrowNoCuda("cuda::Event::ElapsedMs"); }
Stream::Stream() { ThrowNoCuda("cuda::Stream"); }
Stream::~Stream() = default;
void Stream::Synchronize() { ThrowNoCuda("cuda::Stream::Synchronize"); }

absl::StatusOr<std::string> CompileSource(const std::string&, const std::string& name,
                                          const std::string&, bool) {
  return absl::FailedPreconditionError(
      absl::StrCat("NVRTC compile of '", name, "': ", kBuiltWithoutCuda));
}
absl::StatusOr<std::string> CompileSourceWithReport(const std::string&, const std::string& name,
                                                    const std::string&, std::string*) {
  return absl::FailedPreconditionError(
      absl::StrCat("NVRTC compile of '", name, "': ", kBuiltWithoutCuda));
}
absl::StatusOr<KernelHandle> GetKernel(const std::string&, const std::string& kernel_name,
                                       KernelTarget) {
  return absl::FailedPreconditionError(
      absl::StrCat("loading kernel '", kernel_name, "': ", kBuiltWithoutCuda));
}
absl::StatusOr<KernelHandle> GetKernelOrCompileInBackground(const std::string& source,
                                                            const std::string& kernel_name,
                                                            KernelTarget target) {
  return GetKernel(source, kernel_name, target);
}
absl::StatusOr<KernelHandle> LoadKernelImage(const std::string&, const std::string& kernel_name) {
  return absl::FailedPreconditionError(
      absl::StrCat("loading kernel '", kernel_name, "': ", kBuiltWithoutCuda));
}
absl::StatusOr<std::vector<size_t>> KernelParamSizes(KernelHandle) {
  return absl::FailedPreconditionError(kBuiltWithoutCuda);
}
absl::Status LaunchKernel(KernelHandle, const unsigned (&)[3], const unsigned (&)[3], int, void**) {
  return absl::FailedPreconditionError(kBuiltWithoutCuda);
}
absl::StatusOr<KernelFootprint> FootprintOf(KernelHandle, const std::string& name) {
  return absl::FailedPreconditionError(
      absl::StrCat("footprint of kernel '", name, "': ", kBuiltWithoutCuda));
}
absl::StatusOr<std::vector<KernelBinaryImage>> ServedKernelImages() {
  return std::vector<KernelBinaryImage>{};  // a build without CUDA runs no kernel of its own
}
void AddPrebuiltKernels(const std::vector<KernelBinaryImage>&) {}

KernelCacheStats GetKernelCacheStats() { return {}; }

}  // namespace kiln::cuda
