// MakeCuptiSource in a build without CUDA (KILN_WITH_CUDA=OFF): a source that never starts, so a
// profile says "device activity unavailable: ..." as the CUDA build does on a machine without a
// GPU, and the host side of the profiler works as everywhere.
#include "profiler/device.h"

namespace kiln::profiler {
namespace {

class NoDeviceSource final : public ActivitySource {
 public:
  std::string name() const override { return "none"; }
  absl::Status Start() override {
    return absl::UnavailableError("this kiln was built without CUDA (KILN_WITH_CUDA=OFF)");
  }
  std::vector<DeviceRecord> Flush() override { return {}; }
  std::vector<DeviceRecord> Stop() override { return {}; }
  uint64_t dropped_records() const override { return 0; }
};

}  // namespace

std::unique_ptr<ActivitySource> MakeCuptiSource() { return std::make_unique<NoDeviceSource>(); }

}  // namespace kiln::profiler
