// The measuring side of kiln_bench (see bench_harness.h).
#include "bench/bench_harness.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <thread>

#include "ops/ops.h"
#include "profiler/device.h"
#include "runtime/cuda_api.h"
#include "runtime/nvrtc.h"
#include "runtime/status.h"

namespace kiln::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kCyclesPerUs = 2000.0;  // spin-kernel cycles per microsecond (~1.98 GHz boost)

// The same loop as torch.cuda._sleep (at::cuda::sleep).
constexpr char kSpinSource[] = R"(
extern "C" __global__ void kiln_spin(long long cycles) {
  const long long start = clock64();
  long long elapsed = 0;
  while (elapsed < cycles) elapsed = clock64() - start;
}
)";

// Reads a zeroed buffer 16 bytes per thread per iteration; the store that can never happen keeps
// the loads alive. Reading (not writing) leaves L2 holding clean lines: the next step pays no
// write-back for them.
constexpr char kFlushSource[] = R"(
struct __align__(16) Quad { unsigned a, b, c, d; };
extern "C" __global__ void kiln_l2_flush(const Quad* p, long long n, unsigned* sink) {
  unsigned acc = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const Quad q = p[i];
    acc ^= q.a ^ q.b ^ q.c ^ q.d;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}
)";

cudaKernel_t Kernel(const char* source, const char* name) {
  return ValueOrThrow(cuda::GetKernel(source, name));
}

void Sync() { cuda::Synchronize(); }

double UsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// The flush buffer (zeroed once) and a word the kernel never writes; cudaMalloc'd outside kiln's
// allocator so that memory statistics do not see it.
struct FlushBuffer {
  void* data = nullptr;
  unsigned* sink = nullptr;
  size_t bytes = 0;
};

const FlushBuffer& Flush(size_t bytes) {
  static FlushBuffer buf;
  if (buf.bytes < bytes) {
    if (buf.data != nullptr) KILN_CUDA_CHECK(cudaFree(buf.data));
    KILN_CUDA_CHECK(cudaMalloc(&buf.data, bytes));
    KILN_CUDA_CHECK(cudaMemset(buf.data, 0, bytes));
    if (buf.sink == nullptr)
      KILN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&buf.sink), sizeof(unsigned)));
    buf.bytes = bytes;
  }
  return buf;
}

double HostAndLatency(const Step& step, const Config& cfg, double* host_us) {
  std::vector<double> host, latency;
  for (int i = 0; i < cfg.latency_samples; ++i) {
    FlushL2(cfg);
    Sync();
    const auto t0 = Clock::now();
    Outputs out = step();
    const auto t1 = Clock::now();
    Sync();
    const auto t2 = Clock::now();
    out.clear();
    host.push_back(UsBetween(t0, t1));
    latency.push_back(UsBetween(t0, t2));
  }
  *host_us = Median(host);
  return Median(latency);
}

double DeviceTime(const Step& step, const Config& cfg, double host_us) {
  const int n = cfg.device_samples;
  std::unique_ptr<cuda::Event[]> start(new cuda::Event[n]), end(new cuda::Event[n]);
  const cudaStream_t stream = cuda::CurrentStream();
  Sync();
  for (int c0 = 0; c0 < n; c0 += cfg.chunk) {
    const int c1 = std::min(n, c0 + cfg.chunk);
    // Long enough for the host to enqueue the chunk (flushes and events included).
    if (cfg.prequeue) Spin(2.0 * (c1 - c0) * (host_us + 15.0));
    for (int i = c0; i < c1; ++i) {
      FlushL2(cfg);
      start[i].Record(stream);
      step();
      end[i].Record(stream);
    }
  }
  Sync();
  std::vector<double> samples;
  for (int i = 0; i < n; ++i) samples.push_back(end[i].ElapsedMs(start[i]) * 1000.0);
  return Median(samples);
}

double Throughput(const Step& step, const Config& cfg) {
  FlushL2(cfg);
  Sync();
  const auto t0 = Clock::now();
  for (int i = 0; i < cfg.throughput_steps; ++i) step();
  Sync();
  return UsBetween(t0, Clock::now()) / cfg.throughput_steps;
}

const char* CheckDTypeName(DType t) {
  switch (t) {
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
    case DType::kFloat32:
      return "float32";
    case DType::kBool:
      return "bool";
    default:
      return DTypeName(t);
  }
}

// "bfloat16 2,256,512 in0.bin" after writing t's bytes (contiguous, on the host) to dir/file.
std::string WriteTensor(const std::filesystem::path& dir, const std::string& file,
                        const Tensor& t) {
  const Tensor host = to(contiguous(t), kCPU);
  std::ofstream f(dir / file, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(host.data_ptr()), host.numel() * host.element_size());
  KILN_CHECK(f.good(), "kiln_bench: cannot write ", (dir / file).string());
  std::ostringstream line;
  line << CheckDTypeName(host.dtype()) << " ";
  for (int64_t i = 0; i < host.dim(); ++i) line << (i ? "," : "") << host.shape()[i];
  if (host.dim() == 0) line << "-";
  line << " " << file;
  return line.str();
}

}  // namespace

void Spin(double us) {
  static const cudaKernel_t k = Kernel(kSpinSource, "kiln_spin");
  us = std::min(std::max(us, 20.0), 100000.0);
  long long cycles = static_cast<long long>(us * kCyclesPerUs);
  void* args[] = {&cycles};
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(1), dim3(1), args, 0,
                                   cuda::CurrentStream()));
}

void FlushL2(const Config& cfg) {
  static const cudaKernel_t k = Kernel(kFlushSource, "kiln_l2_flush");
  const FlushBuffer& buf = Flush(cfg.flush_bytes);
  const void* data = buf.data;
  long long quads = static_cast<long long>(buf.bytes / 16);
  unsigned* sink = buf.sink;
  void* args[] = {&data, &quads, &sink};
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(1056), dim3(512), args, 0,
                                   cuda::CurrentStream()));
}

Figures Measure(const Step& step, const Config& cfg) {
  for (int i = 0; i < cfg.warmup; ++i) step();
  Sync();
  Figures f{};
  f.latency_us = HostAndLatency(step, cfg, &f.host_us);
  f.device_us = DeviceTime(step, cfg, f.host_us);
  f.throughput_us = Throughput(step, cfg);
  return f;
}

void InitCupti() {
  auto source = profiler::MakeCuptiSource();
  if (source->Start().ok()) source->Stop();
}

KernelCount CountKernels(const Step& step, int steps) {
  KernelCount k;
  Sync();
  auto source = profiler::MakeCuptiSource();
  const absl::Status started = source->Start();
  if (!started.ok()) {
    k.error = "CUPTI: " + started.ToString();
    return k;
  }
  try {
    for (int i = 0; i < steps; ++i) step();
    Sync();
  } catch (const std::exception& e) {
    source->Stop();
    k.error = std::string("step failed while counting: ") + e.what();
    return k;
  }
  int kernels = 0, memsets = 0, memcpys = 0;
  for (const profiler::DeviceRecord& r : source->Stop()) {
    if (r.kind == profiler::DeviceKind::kKernel) {
      ++kernels;
      k.names[r.name] += 1.0 / steps;
    } else if (r.kind == profiler::DeviceKind::kMemset) {
      ++memsets;
    } else if (r.kind == profiler::DeviceKind::kMemcpy) {
      ++memcpys;
    }
  }
  k.kernels = static_cast<double>(kernels) / steps;
  k.memsets = static_cast<double>(memsets) / steps;
  k.memcpys = static_cast<double>(memcpys) / steps;
  return k;
}

double PeakExtraMiB(const Step& step) {
  Sync();
  const double base = static_cast<double>(cuda::GetMemoryStats().allocated);
  cuda::ResetPeakMemoryStats();
  Outputs out = step();  // kept alive while the peak is read
  Sync();
  return (static_cast<double>(cuda::GetMemoryStats().peak_allocated) - base) / kMiB;
}

void CheckWriter::Write(const std::string& workload,
                        const std::vector<std::pair<std::string, Tensor>>& inputs,
                        const std::string& mode, const Outputs& outputs) {
  if (!enabled()) return;
  const std::filesystem::path dir = std::filesystem::path(dir_) / workload;
  std::filesystem::create_directories(dir);
  const std::filesystem::path manifest = dir / "manifest.txt";
  int& written = modes_written_[workload];
  if (written == 0) {
    std::ofstream m(manifest, std::ios::trunc);
    for (size_t i = 0; i < inputs.size(); ++i) {
      m << "input " << i << " " << inputs[i].first << " "
        << WriteTensor(dir, "in" + std::to_string(i) + ".bin", inputs[i].second) << "\n";
    }
    KILN_CHECK(m.good(), "kiln_bench: cannot write ", manifest.string());
  }
  std::ofstream m(manifest, std::ios::app);
  for (size_t j = 0; j < outputs.size(); ++j) {
    const std::string file = "out" + std::to_string(written) + "_" + std::to_string(j) + ".bin";
    m << "output " << mode << " " << j << " " << WriteTensor(dir, file, outputs[j]) << "\n";
  }
  KILN_CHECK(m.good(), "kiln_bench: cannot write ", manifest.string());
  ++written;
}

void LockStep::Ready() const {
  if (dir_.empty()) return;
  std::ofstream(std::filesystem::path(dir_) / ("ready." + side_)) << "ready\n";
}

bool LockStep::WaitGo(int rep) const {
  if (dir_.empty()) return true;
  const auto go = std::filesystem::path(dir_) / ("go." + side_ + "." + std::to_string(rep));
  const auto deadline = Clock::now() + std::chrono::minutes(30);
  while (!std::filesystem::exists(go)) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

void LockStep::Done(int rep) const {
  if (dir_.empty()) return;
  std::ofstream(std::filesystem::path(dir_) / ("done." + side_ + "." + std::to_string(rep)))
      << "done\n";
}

double Median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::string JsonString(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c == '\n') {
      o += "\\n";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

std::string JsonNumber(double v) {
  if (std::isnan(v) || std::isinf(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string JsonList(const std::vector<double>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + JsonNumber(v[i]);
  return o + "]";
}

std::string IsoNow() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S+00:00", &tm);
  return buf;
}

}  // namespace kiln::bench
