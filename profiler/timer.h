// A timer of work as the device runs it, for users timing their own steps: on a CUDA device a
// pair of CUDA events on kiln's current stream (the time between Start and Stop on the GPU, not
// the host's launch time; no CUDA header needed); on the CPU the host clock (CPU ops run
// synchronously). Laps accumulate: each Start/Stop adds one.
//
//   kiln::DeviceTimer timer(x.device());
//   for (int i = 0; i < 10; ++i) {
//     timer.Start();
//     f({x});
//     timer.Stop();
//   }
//   double ms = timer.MedianMs();   // waits for the last Stop; also TotalMs(), LapsMs()
#pragma once

#include <memory>
#include <vector>

#include "runtime/device.h"

namespace kiln {

class DeviceTimer {
 public:
  explicit DeviceTimer(Device device = kCPU);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;

  // Start a lap (an error while one is running), Stop it (an error when none is).
  void Start();
  void Stop();
  // The laps in milliseconds, in order; waits for the device to reach the last Stop.
  std::vector<double> LapsMs() const;
  double TotalMs() const;
  double MedianMs() const;  // an error before the first lap
  int laps() const;         // stopped laps (no wait)
  // Forgets every lap (an error while one is running).
  void Reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
