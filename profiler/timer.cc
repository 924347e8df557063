// DeviceTimer (see timer.h): CUDA events on the current stream, or the host clock on the CPU.
#include "profiler/timer.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/cuda.h"
#include "runtime/status.h"

namespace kiln {

struct DeviceTimer::Impl {
  Device device;
  bool running = false;
  // CUDA: one (start, stop) event pair per lap, read when asked; CPU: the laps' host times.
  std::vector<std::pair<std::unique_ptr<cuda::Event>, std::unique_ptr<cuda::Event>>> events;
  std::vector<double> host_ms;
  std::chrono::steady_clock::time_point host_start;
};

DeviceTimer::DeviceTimer(Device device) : impl_(std::make_unique<Impl>()) {
  KILN_CHECK(!device.is_meta(), "DeviceTimer: the meta device runs nothing to time");
  KILN_CHECK(!device.is_cuda() || cuda::IsAvailable(), "DeviceTimer: ", device.str(),
             " was asked for, but no CUDA device is available");
  impl_->device = device;
}

DeviceTimer::~DeviceTimer() = default;

void DeviceTimer::Start() {
  KILN_CHECK(!impl_->running, "DeviceTimer::Start: a lap is already running (call Stop first)");
  impl_->running = true;
  if (impl_->device.is_cuda()) {
    impl_->events.emplace_back(std::make_unique<cuda::Event>(), nullptr);
    impl_->events.back().first->Record(cuda::CurrentStream());
  } else {
    impl_->host_start = std::chrono::steady_clock::now();
  }
}

void DeviceTimer::Stop() {
  KILN_CHECK(impl_->running, "DeviceTimer::Stop: no lap is running (call Start first)");
  impl_->running = false;
  if (impl_->device.is_cuda()) {
    impl_->events.back().second = std::make_unique<cuda::Event>();
    impl_->events.back().second->Record(cuda::CurrentStream());
  } else {
    impl_->host_ms.push_back(std::chrono::duration<double, std::milli>(
                                 std::chrono::steady_clock::now() - impl_->host_start)
                                 .count());
  }
}

std::vector<double> DeviceTimer::LapsMs() const {
  if (!impl_->device.is_cuda()) return impl_->host_ms;
  std::vector<double> laps;
  for (const auto& [start, stop] : impl_->events) {
    if (stop == nullptr) continue;  // the running lap
    stop->Synchronize();
    laps.push_back(stop->ElapsedMs(*start));
  }
  return laps;
}

double DeviceTimer::TotalMs() const {
  double total = 0;
  for (double ms : LapsMs()) total += ms;
  return total;
}

double DeviceTimer::MedianMs() const {
  std::vector<double> laps = LapsMs();
  KILN_CHECK(!laps.empty(), "DeviceTimer::MedianMs: no lap was timed (Start, then Stop)");
  std::sort(laps.begin(), laps.end());
  return laps[laps.size() / 2];
}

int DeviceTimer::laps() const {  // counts stopped laps without waiting for the device
  if (!impl_->device.is_cuda()) return static_cast<int>(impl_->host_ms.size());
  return static_cast<int>(impl_->events.size()) - (impl_->running ? 1 : 0);
}

void DeviceTimer::Reset() {
  KILN_CHECK(!impl_->running, "DeviceTimer::Reset: a lap is running (call Stop first)");
  impl_->events.clear();
  impl_->host_ms.clear();
}

}  // namespace kiln
