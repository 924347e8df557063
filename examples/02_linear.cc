// 02_linear: Linear(32 -> 64, bias) on x [1024, 32], from the series' second part. Eager is
// already one GEMM with the bias in its epilogue; compiling has nothing to fuse and must not
// cost more host time per step than eager.
//
//   02_linear [--device cpu|cuda] [--dtype ...] [--batch B] [--in I] [--out O] [--compile]
//             [--dump DIR] [--warmup W] [--iters I]
// --profile prints the op table (sorted by --sort, torch's keys accepted) and, on a GPU, the kernel
// table of 3 profiled steps (wait 1, warm-up 1); --trace FILE writes a Perfetto/Chrome trace;
// --compare prints the eager-vs-compiled report.
#include "examples/common.h"
#include "ops/modules.h"

int main(int argc, char** argv) {
  using namespace kiln;
  examples::Flags f(
      "02_linear",
      "[--device cpu|cuda] [--dtype float32|float16|bfloat16] [--batch B] [--in I] "
      "[--out O] [--compile] [--cuda-graphs] [--profile] [--sort KEY] [--trace FILE] [--compare] "
      "[--dump DIR] [--warmup W] [--iters I]");
  examples::DefineCommonFlags(f);
  f.Define("batch", "1024");
  f.Define("in", "32");
  f.Define("out", "64");
  f.Parse(argc, argv);
  const auto [device, dtype] = examples::DeviceAndDType(f);
  try {
    Generator gen(0);
    auto fc = std::make_shared<Linear>(f.Int("in"), f.Int("out"), true, gen,
                                       ModuleOptions{dtype, device});
    examples::Example ex;
    ex.title = "Linear(" + f.Str("in") + " -> " + f.Str("out") + ", bias) on [" + f.Str("batch") +
               ", " + f.Str("in") + "], " + DTypeName(dtype) + " on " + device.str();
    ex.inputs = {randn({f.Int("batch"), f.Int("in")}, gen, dtype, device)};
    ex.fn = [fc](const std::vector<Tensor>& in) { return std::vector<Tensor>{(*fc)(in[0])}; };
    ex.tensor_names = [fc] { return fc->named_tensors(); };
    examples::Results r;
    const int rc = examples::RunExample(f, ex, &r);
    std::printf(
        "lesson: eager is one GEMM with the bias in its epilogue; the compiled plan runs %d "
        "kernel(s) per step\n",
        r.compiled.kernels);
    if (r.ran_compiled) {
      std::printf("lesson: host per step eager %.1f us vs compiled %.1f us\n",
                  r.eager.timing.host_us, r.compiled.timing.host_us);
    }
    return rc;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
