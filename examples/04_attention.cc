// 04_attention: causal attention on q, k, v [8, 16, 1024, 64], the series' part 3:
//   --variant naive    softmax(masked_fill(q kᵀ / 8)) v, out of place (5 kernels eagerly);
//   --variant inplace  the same with masked_fill_;
//   --variant sdpa     scaled_dot_product_attention(q, k, v, is_causal) with --backend math
//                      (kiln ops composed), flash (kiln's tensor-core kernel) or auto;
//   --variant all      (default) each of them;
//   --variant package  the series' "kernels hub" row: kiln's flash kernel loaded from a kernel
//                      package (examples/hub_kernels.h; bf16, head dim 64 or 128, on a GPU) and
//                      called as a custom op. --package DIR loads the package in DIR (else one is
//                      built with NVRTC into a temporary folder first); --build-package DIR only
//                      writes it (any machine with NVRTC).
// Compiled, the naive and in-place code become one attention node (the attention fusion pass
// finds the pattern; the report's explain log says so): one flash kernel per step on a GPU.
// Prints the peak device memory of each and the backend chosen, with the reason.
//
//   04_attention [--variant naive|inplace|sdpa|all|package] [--backend math|flash|auto]
//                [--package DIR] [--build-package DIR]
//                [--device cpu|cuda] [--dtype ...] [--batch B] [--heads H] [--seq T] [--head-dim D]
//                [--compile] [--cuda-graphs] [--profile] [--sort KEY] [--trace FILE] [--compare]
//                [--dump DIR] [--warmup W] [--iters I]
// --profile prints the op table (sorted by --sort, torch's keys accepted) and, on a GPU, the kernel
// table of 3 profiled steps (wait 1, warm-up 1); --trace FILE writes a Perfetto/Chrome trace;
// --compare prints the eager-vs-compiled report.
#include "examples/common.h"
#include "examples/hub_kernels.h"
#include "ops/modules.h"

int main(int argc, char** argv) {
  using namespace kiln;
  examples::Flags f(
      "04_attention",
      "[--variant naive|inplace|sdpa|all|package] [--package DIR] [--build-package DIR] [--backend "
      "math|flash|auto] [--device cpu|cuda] [--dtype "
      "float32|float16|bfloat16] [--batch B] [--heads H] "
      "[--seq T] [--head-dim D] [--compile] [--cuda-graphs] [--profile] [--sort KEY] [--trace "
      "FILE] [--compare] "
      "[--dump DIR] [--warmup W] [--iters I]");
  examples::DefineCommonFlags(f);
  f.Define("batch", "");
  f.Define("heads", "");
  f.Define("seq", "");
  f.Define("head-dim", "64");
  f.Define("variant", "all");
  f.Define("backend", "auto");
  f.Define("package", "");
  f.Define("build-package", "");
  f.Parse(argc, argv);
  if (f.Given("build-package")) {
    return examples::WriteHubPackage(f.Str("build-package"), examples::kAttentionPackageName,
                                     examples::BuildHubAttentionPackage);
  }
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
    const std::string variant = f.Str("variant"), backend_name = f.Str("backend");
    KILN_CHECK(variant == "all" || variant == "naive" || variant == "inplace" ||
                   variant == "sdpa" || variant == "package",
               "04_attention: --variant is naive, inplace, sdpa, package or all, got ", variant);
    KILN_CHECK(backend_name == "auto" || backend_name == "math" || backend_name == "flash",
               "04_attention: --backend is math, flash or auto, got ", backend_name);
    const SdpaBackend backend = backend_name == "math"    ? SdpaBackend::kMath
                                : backend_name == "flash" ? SdpaBackend::kFlash
                                                          : SdpaBackend::kAuto;
    SdpaBackendGuard guard(backend);
    const std::string shape = "[" + std::to_string(b) + ", " + std::to_string(h) + ", " +
                              std::to_string(t) + ", " + std::to_string(d) + "] " +
                              DTypeName(dtype) + " on " + device.str();
    std::vector<std::pair<std::string, double>> peaks;
    for (const char* v : {"naive", "inplace", "sdpa", "package"}) {
      if (variant != v && (variant != "all" || std::string(v) == "package")) continue;
      const std::string name = v;
      examples::Example ex;
      ex.inputs = qkv;
      if (name == "package") {
        const CustomOp op = examples::RegisterFlashAttention(
            examples::LoadHubPackage(f.Str("package"), examples::kAttentionPackageName,
                                     examples::BuildHubAttentionPackage,
                                     "causal_d" + std::to_string(d)),
            static_cast<int>(d));
        ex.title =
            "causal attention, kernel from a package (" + std::string(op.name()) + "), " + shape;
        ex.fn = [op](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{op({in[0], in[1], in[2]})};
        };
      } else if (name == "sdpa") {
        const SdpaBackendChoice c = sdpa_backend_choice(qkv[0], qkv[1], qkv[2], {}, true);
        std::printf("sdpa backend: %s (%s)\n", SdpaBackendName(c.backend), c.reason.c_str());
        ex.title =
            "causal attention, scaled_dot_product_attention (" + backend_name + "), " + shape;
        ex.fn = [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2], {}, true)};
        };
      } else {
        const bool inplace = name == "inplace";
        ex.title = std::string("causal attention, ") +
                   (inplace ? "in-place masked_fill_" : "out-of-place masked_fill") + ", " + shape;
        ex.fn = [mask, inplace](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{causal_attention(in[0], in[1], in[2], mask, inplace)};
        };
      }
      examples::Results r;
      rc |= examples::RunExample(f, ex, &r);
      peaks.emplace_back(name, r.eager.peak_mib);
      std::printf("lesson: the compiled plan runs %d kernels per step\n", r.compiled.kernels);
      for (const std::string& line : r.explain) {  // the pattern pass: what became one kernel
        if (line.find("attention") != std::string::npos) std::printf("pass: %s\n", line.c_str());
      }
    }
    if (gpu) {
      for (const auto& [name, mib] : peaks) {
        std::printf("lesson: peak memory, %s: %.1f MiB\n", name.c_str(), mib);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return rc;
}
