// Device time of alternative ways to run one thing, for the choices kiln makes once per shape and
// then caches (ops/cuda/gemv_choice.h: kiln's GEMV or cuBLASLt for a linear with few rows;
// codegen/families/gemm_epilogue/epilogue_choice.h: a GEMM's activation fused into its epilogue or
// run apart).
//
// Each path runs once to warm up (kernel loading, cuBLASLt plans), then `samples` times,
// interleaved path by path so that every path sees the same clocks. Each call is timed alone by a
// pair of CUDA events, after a write of twice the device's L2 size: the call finds cold caches,
// as a layer whose operands other layers have pushed out of L2 does (Triton's do_bench flushes
// the same way), and the device is busy while the host queues the call, so the events time the
// device, not the host's launch cost. The flush buffer comes from the caching allocator; without
// memory for it, a delay kernel separates the calls instead (warm caches then). Measurements are
// serialised process-wide (a plan lowers its nodes in parallel threads); one started from inside
// a path's warm-up call, on the same thread, runs to its end first.
//
//   const std::vector<double> us = MedianDeviceUs(device, {[&] { a(out); }, [&] { b(out); }});
//
// The choices outlive the process: StoreDecision keeps one in the kernel cache directory
// (runtime/nvrtc.h), under a key that adds DeviceIdentity (GPU, driver, cuBLASLt and kiln
// versions) to the caller's problem key, so a warm process decides without timing and a new
// driver, library or GPU times again. KILN_RETIME=on ignores stored decisions (a choice timed
// while another process loaded the GPU must not stick forever) and stores the new ones.
//
//   const std::string key = absl::StrCat("epilogue|", shapes, "|", DeviceIdentity(device));
//   if (std::optional<std::string> v = LoadDecision(key)) return Parse(*v);
//   StoreDecision(key, Format(Time()));
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "runtime/device.h"

namespace kiln::cuda_ops {

// The median device time in microseconds of each path, in the order given. Runs on the current
// stream, which must not be capturing; throws what a path throws.
std::vector<double> MedianDeviceUs(Device device, absl::Span<const std::function<void()>> paths,
                                   int samples = 15);

// The one-time costs a compile or a first call may pay, counted process-wide since start (the
// compile report shows the differences over its compile): time spent in per-shape timings (the
// outermost MedianDeviceUs calls), how many choices were timed and how many read back stored,
// and library start-up (cuBLASLt handles).
struct OneTimeCosts {
  double timing_ms = 0, library_startup_ms = 0;
  int timed = 0, stored = 0;
};
OneTimeCosts GetOneTimeCosts();
void AddLibraryStartup(double ms);

// "NVIDIA H200 sm_90 driver 13000 cublasLt 130100 kiln 0.1.0+4fa73a3": what a stored decision
// about `device` is valid for.
std::string DeviceIdentity(Device device);
// The value stored under `key` (any string), or nullopt: none stored, no usable cache directory,
// a damaged file, or KILN_RETIME=on.
std::optional<std::string> LoadDecision(const std::string& key);
// Stores `value` (any string) under `key`; silently nothing without a usable cache directory.
void StoreDecision(const std::string& key, const std::string& value);

}  // namespace kiln::cuda_ops
