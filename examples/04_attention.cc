// 04_attention: naive causal attention on q, k, v [8, 16, 1024, 64]: softmax(mask(q kᵀ / 8)) v,
// (a) with an out-of-place masked_fill, (b) with the in-place masked_fill_, (c) compiled (scale,
// mask and softmax in one kernel, the mask constant-folded: 3 kernels per step). Prints the peak
// device memory of each, which the series does not give.
//
//   04_attention [--device cpu|cuda] [--dtype ...] [--batch B] [--heads H] [--seq T] [--head-dim D]
//                [--compile] [--cuda-graphs] [--profile] [--sort KEY] [--trace FILE] [--compare]
//                [--dump DIR]
//                [--warmup W] [--iters I]
// --profile prints the op table (sorted by --sort, torch's keys accepted) and, on a GPU, the kernel
// table of 3 profiled steps (wait 1, warm-up 1); --trace FILE writes a Perfetto/Chrome trace;
// --compare prints the eager-vs-compiled report.
#include "examples/common.h"
#include "ops/modules.h"

int main(int argc, char** argv) {
  using namespace kiln;
  examples::Flags f(
      "04_attention",
      "[--device cpu|cuda] [--dtype float32|float16|bfloat16] [--batch B] [--heads H] "
      "[--seq T] [--head-dim D] [--compile] [--cuda-graphs] [--profile] [--sort KEY] [--trace "
      "FILE] [--compare] "
      "[--dump DIR] [--warmup W] [--iters I]");
  examples::DefineCommonFlags(f);
  f.Define("batch", "");
  f.Define("heads", "");
  f.Define("seq", "");
  f.Define("head-dim", "64");
  f.Parse(argc, argv);
  const auto [device, dtype] = examples::DeviceAndDType(f);
  const bool gpu = device.is_cuda();
  if (!f.Given("seq")) {
    std::printf("shapes: %s\n", gpu ? "the series' [8, 16, 1024, 64]" : "[2, 4, 128, 64] (no GPU)");
  }
  if (!f.Given("batch")) f.Define("batch", gpu ? "8" : "2");
  if (!f.Given("heads")) f.Define("heads", gpu ? "16" : "4");
  if (!f.Given("seq")) f.Define("seq", gpu ? "1024" : "128");
  const int64_t b = f.Int("batch"), h = f.Int("heads"), t = f.Int("seq"), d = f.Int("head-dim");
  int rc = 0;
  try {
    Generator gen(0);
    const Tensor mask = triu(ones({t, t}, DType::kBool, device), 1);
    const std::vector<Tensor> qkv = {randn({b, h, t, d}, gen, dtype, device),
                                     randn({b, h, t, d}, gen, dtype, device),
                                     randn({b, h, t, d}, gen, dtype, device)};
    double peak[2] = {0, 0};
    for (bool inplace : {false, true}) {
      examples::Example ex;
      ex.title = std::string("causal attention, ") +
                 (inplace ? "in-place masked_fill_" : "out-of-place masked_fill") + ", [" +
                 std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(t) + ", " +
                 std::to_string(d) + "] " + DTypeName(dtype) + " on " + device.str();
      ex.inputs = qkv;
      ex.fn = [mask, inplace](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{causal_attention(in[0], in[1], in[2], mask, inplace)};
      };
      examples::Results r;
      rc |= examples::RunExample(f, ex, &r);
      peak[inplace] = r.eager.peak_mib;
      std::printf("lesson: the compiled plan runs %d kernels per step\n", r.compiled.kernels);
    }
    if (gpu) {
      std::printf("lesson: peak memory out-of-place %.1f MiB vs in-place %.1f MiB\n", peak[0],
                  peak[1]);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return rc;
}
