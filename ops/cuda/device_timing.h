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
#pragma once

#include <functional>
#include <vector>

#include "absl/types/span.h"
#include "runtime/device.h"

namespace kiln::cuda_ops {

// The median device time in microseconds of each path, in the order given. Runs on the current
// stream, which must not be capturing; throws what a path throws.
std::vector<double> MedianDeviceUs(Device device, absl::Span<const std::function<void()>> paths,
                                   int samples = 15);

}  // namespace kiln::cuda_ops
