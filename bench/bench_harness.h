// The measuring side of kiln_bench (bench/kiln_bench.cc): the figures of one step, the kernel
// count, the correctness files and the lock-step protocol that interleaves repetitions of kiln,
// PyTorch and libtorch. bench/torch_baseline.py and bench/libtorch_baseline.cc implement the same
// method (their headers say so); docs/BENCHMARKS.md describes it for readers.
//
//   kiln::bench::Config cfg;
//   kiln::bench::Figures f = kiln::bench::Measure(step, cfg);   // one repetition of one row
//   kiln::bench::KernelCount k = kiln::bench::CountKernels(step, 5);
//
// The figures of one repetition (every sample starts with a cold L2: a kernel reads a 256 MiB
// buffer first, outside the timed span, so no input is found in L2 and nothing dirty is left in
// it to write back during the step):
//   device_us      median CUDA-event time around single steps while the GPU is kept busy (the
//                  steps wait behind a spin kernel, so the host's launch rate does not show)
//   latency_us     median of (sync; t0; step; sync; t1): what one call costs a caller who waits
//   throughput_us  (t1 - t0) / N over N back-to-back steps with one sync at the end
//   host_us        median time of the call that enqueues one step (no sync inside)
// Kernel count: CUPTI activity records (kernels, memsets, memcpys, with kernel names) of N steps
// divided by N, the same instrument as torch.profiler / Kineto on the PyTorch side; graph
// replays are counted node by node.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/tensor.h"

namespace kiln::bench {

using Outputs = std::vector<Tensor>;
using Step = std::function<Outputs()>;

struct Config {
  bool quick = false;
  bool prequeue = true;
  bool count_kernels = true;
  int repetitions = 3;
  int warmup = 5;  // steps before each repetition's timing
  int latency_samples = 25;
  int device_samples = 40;
  int throughput_steps = 40;
  int count_steps = 5;  // steps recorded by CUPTI for the kernel count
  int chunk = 40;       // device samples enqueued behind one spin kernel
  size_t flush_bytes = size_t{256} << 20;
};

struct Figures {
  double host_us, latency_us, device_us, throughput_us;
};

// One repetition of one row: warm-up, then the four figures above.
Figures Measure(const Step& step, const Config& cfg);

struct KernelCount {
  double kernels = -1, memsets = -1, memcpys = -1;  // per step; -1: not counted
  std::map<std::string, double> names;              // kernel name -> launches per step
  std::string error;
};
// CUPTI records of `steps` steps (after a sync); error set when CUPTI is unavailable.
KernelCount CountKernels(const Step& step, int steps);
// Starts and stops CUPTI once, so that CUDA graphs captured afterwards are traced node by node.
void InitCupti();

// MiB kiln's allocator handed out during one step on top of what was allocated before it.
double PeakExtraMiB(const Step& step);

// Correctness files for bench/torch_baseline.py (format in bench/bench_common.py): per workload a
// folder with manifest.txt, the inputs (raw little-endian; bf16 as its 16 bits, bool as bytes)
// and each mode's outputs.
class CheckWriter {
 public:
  explicit CheckWriter(std::string dir) : dir_(std::move(dir)) {}  // "" = off
  bool enabled() const { return !dir_.empty(); }
  // Writes the inputs of `workload` (once) and the outputs of `mode`; throws kiln::Error when a
  // file cannot be written.
  void Write(const std::string& workload, const std::vector<std::pair<std::string, Tensor>>& inputs,
             const std::string& mode, const Outputs& outputs);

 private:
  std::string dir_;
  std::map<std::string, int> modes_written_;  // per workload
};

// The lock-step protocol with scripts/gpu-run: the side writes DIR/ready.SIDE after its set-up,
// waits for DIR/go.SIDE.R before repetition R and writes DIR/done.SIDE.R after it. dir "" = off
// (repetitions run back to back).
class LockStep {
 public:
  LockStep(std::string dir, std::string side) : dir_(std::move(dir)), side_(std::move(side)) {}
  void Ready() const;
  bool WaitGo(int rep) const;  // false after 30 minutes without a go
  void Done(int rep) const;

 private:
  std::string dir_, side_;
};

// Small helpers shared by the driver.
double Median(std::vector<double> v);
std::string JsonString(const std::string& s);
std::string JsonNumber(double v);  // null for NaN/inf
std::string JsonList(const std::vector<double>& v);
std::string IsoNow();
void Spin(double us);  // a GPU busy-wait of about `us` microseconds on the current stream
void FlushL2(const Config& cfg);

}  // namespace kiln::bench
