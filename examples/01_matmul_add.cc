// 01_matmul_add: add(matmul(x, w), b) with x, w, b all N×N (the bias is a full matrix), from the
// first part of the "Profiling in PyTorch" series. N = 64 is overhead-bound (host time per step
// far above device time), N = 4096 compute-bound; the first (cold) step pays for one-time work.
//
//   01_matmul_add [--device cpu|cuda] [--dtype ...] [--n N] [--compile] [--cuda-graphs] [--profile]
//   [--sort KEY]
//   [--trace FILE] [--compare] [--dump DIR]
//                 [--warmup W] [--iters I]
// Defaults: bf16 with N = 64 and 4096 on a GPU; float32 with N = 64 and 512 on the CPU.
// --profile prints the op table (sorted by --sort, torch's keys accepted) and, on a GPU, the kernel
// table of 3 profiled steps (wait 1, warm-up 1); --trace FILE writes a Perfetto/Chrome trace;
// --compare prints the eager-vs-compiled report.
#include "examples/common.h"

int main(int argc, char** argv) {
  using namespace kiln;
  examples::Flags f(
      "01_matmul_add",
      "[--device cpu|cuda] [--dtype float32|float16|bfloat16] [--n N] [--compile] [--cuda-graphs] "
      "[--profile] [--sort KEY] [--trace FILE] [--compare] "
      "[--dump DIR] [--warmup W] [--iters I]");
  examples::DefineCommonFlags(f);
  f.Define("n", "");
  f.Parse(argc, argv);
  const auto [device, dtype] = examples::DeviceAndDType(f);
  const bool gpu = device.is_cuda();
  std::vector<int64_t> sizes = f.Given("n") ? std::vector<int64_t>{f.Int("n")}
                               : gpu        ? std::vector<int64_t>{64, 4096}
                                            : std::vector<int64_t>{64, 512};
  if (!f.Given("n")) {
    std::printf("sizes: %s\n",
                gpu ? "the series' N = 64 and 4096" : "N = 64 and 512 (CPU: 4096 scaled down)");
  }
  int rc = 0;
  try {
    for (int64_t n : sizes) {
      Generator gen(0);
      examples::Example ex;
      ex.title = "matmul + add, N = " + std::to_string(n) + ", " + DTypeName(dtype) + " on " +
                 device.str();
      ex.inputs = {randn({n, n}, gen, dtype, device), randn({n, n}, gen, dtype, device),
                   randn({n, n}, gen, dtype, device)};
      ex.fn = [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{matmul(in[0], in[1]) + in[2]};
      };
      ex.flops = 2.0 * n * n * n;
      examples::Results r;
      rc |= examples::RunExample(f, ex, &r);
      std::printf("lesson: cold first step %.0f us vs warm %.0f us\n", r.cold_first_step_us,
                  r.eager.timing.wall_us);
      if (gpu) {
        const bool overhead = r.eager.timing.host_us > r.eager.timing.device_us;
        std::printf("lesson: %s: host %.1f us vs device %.1f us per step\n",
                    overhead ? "overhead-bound" : "compute-bound", r.eager.timing.host_us,
                    r.eager.timing.device_us);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return rc;
}
