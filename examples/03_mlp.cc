// 03_mlp: the GeGLU MLP of the series, x [64·128, 768] -> 3072 -> 768, no bias, tanh GELU:
// down(gelu(gate(x)) * up(x)). Eager runs 5 kernels (3 GEMMs, gelu, mul); compiled runs 3
// (one GEMM over the concatenated gate/up weights, one fused gelu·mul kernel, the down GEMM).
// Also the 3-layer Linear+bias+GELU MLP (--variant mlp3), and the series' "kernels hub" row
// (--variant package): the same MLP with gelu(gate)·up computed by a kernel loaded from a kernel
// package (examples/hub_kernels.h, registered as a custom op; bf16 on a GPU): eager and compiled
// run 3 kernels (the gate/up GEMM, the package's kernel, the down GEMM). --package DIR loads the
// package in DIR (else one is built with NVRTC into a temporary folder first);
// --build-package DIR only writes the package (any machine with NVRTC, no GPU needed).
//
//   03_mlp [--device cpu|cuda] [--dtype ...] [--tokens N] [--dim D] [--hidden H]
//          [--variant geglu|mlp3|package] [--package DIR] [--build-package DIR] [--compile]
//          [--cuda-graphs] [--profile] [--sort KEY] [--trace FILE] [--compare]
//          [--dump DIR] [--warmup W] [--iters I]
// Defaults reproduce the series' shapes on a GPU (8192 tokens, bf16) and scale the token count
// down on the CPU (256 tokens, float32), and say so.
// --profile prints the op table (sorted by --sort, torch's keys accepted) and, on a GPU, the kernel
// table of 3 profiled steps (wait 1, warm-up 1); --trace FILE writes a Perfetto/Chrome trace;
// --compare prints the eager-vs-compiled report.
#include "examples/common.h"
#include "examples/hub_kernels.h"
#include "ops/modules.h"

int main(int argc, char** argv) {
  using namespace kiln;
  examples::Flags f("03_mlp",
                    "[--device cpu|cuda] [--dtype float32|float16|bfloat16] [--tokens N] [--dim D] "
                    "[--hidden H] [--variant geglu|mlp3|package] [--package DIR] [--build-package "
                    "DIR] [--compile] [--cuda-graphs] [--profile] [--sort KEY] "
                    "[--trace FILE] [--compare] [--dump DIR] [--warmup W] "
                    "[--iters I]");
  examples::DefineCommonFlags(f);
  f.Define("tokens", "");
  f.Define("dim", "768");
  f.Define("hidden", "3072");
  f.Define("variant", "geglu");
  f.Define("package", "");
  f.Define("build-package", "");
  f.Parse(argc, argv);
  if (f.Given("build-package")) {
    return examples::WriteHubPackage(f.Str("build-package"), examples::kHubPackageName,
                                     examples::BuildHubPackage);
  }
  const auto [device, dtype] = examples::DeviceAndDType(f);
  const bool gpu = device.is_cuda();
  const std::string variant = f.Str("variant");
  if (variant != "geglu" && variant != "mlp3" && variant != "package") {
    f.Usage("--variant must be geglu, mlp3 or package");
  }
  if (variant == "package" && dtype != DType::kBFloat16) {
    f.Usage("--variant package runs the package's bf16 kernel: give --dtype bfloat16");
  }
  if (!f.Given("tokens")) {
    f.Define("tokens", gpu ? "8192" : "256");
    std::printf("shapes: %s\n",
                gpu ? "the series' 64·128 tokens" : "256 tokens instead of 8192 (no GPU)");
  }
  const int64_t tokens = f.Int("tokens"), dim = f.Int("dim"), hidden = f.Int("hidden");
  try {
    Generator gen(0);
    const ModuleOptions o{dtype, device};
    std::shared_ptr<Module> model;
    std::optional<CustomOp> act;  // --variant package: the package's kernel as an op
    Tensor gate_up;               // and the gate and up weights as one [2·hidden, dim] matrix
    if (variant == "mlp3") {
      model = std::make_shared<MLP>(std::vector<int64_t>{dim, hidden, hidden, dim}, gen, o);
    } else {
      model = std::make_shared<GeGLUMLP>(dim, hidden, gen, o);
    }
    if (variant == "package") {
      act = examples::RegisterGeluAndMul(
          examples::LoadHubPackage(f.Str("package"), examples::kHubPackageName,
                                   examples::BuildHubPackage, "gelu_tanh_and_mul"));
      auto& geglu = static_cast<GeGLUMLP&>(*model);
      gate_up = cat({geglu.gate().weight(), geglu.up().weight()}, 0);
    }
    examples::Example ex;
    ex.title = (variant == "mlp3"      ? "3-layer MLP"
                : variant == "package" ? "GeGLU MLP, activation from a kernel package"
                                       : "GeGLU MLP") +
               std::string(": x [") + std::to_string(tokens) + ", " + std::to_string(dim) +
               "] -> " + std::to_string(hidden) + " -> " + std::to_string(dim) + ", " +
               DTypeName(dtype) + " on " + device.str();
    ex.inputs = {randn({tokens, dim}, gen, dtype, device)};
    ex.fn = [model](const std::vector<Tensor>& in) { return std::vector<Tensor>{(*model)(in[0])}; };
    ex.tensor_names = [model] { return model->named_tensors(); };
    if (variant == "package") {
      auto* geglu = static_cast<GeGLUMLP*>(model.get());
      ex.fn = [geglu, act, gate_up](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{
            linear((*act)({linear(in[0], gate_up)}), geglu->down().weight())};
      };
      ex.tensor_names = [model, gate_up] {
        auto names = model->named_tensors();
        names.emplace_back("gate_up.weight", gate_up);
        return names;
      };
    }
    // GeGLU: three [dim x hidden] GEMMs; mlp3: dim -> hidden -> hidden -> dim.
    ex.flops = variant != "mlp3" ? 2.0 * tokens * dim * hidden * 3
                                 : 2.0 * tokens * (dim * hidden + hidden * hidden + hidden * dim);
    examples::Results r;
    const int rc = examples::RunExample(f, ex, &r);
    std::printf("lesson: the compiled plan runs %d kernels per step (eager: %s)\n",
                r.compiled.kernels,
                variant == "geglu"     ? "5 — 3 GEMMs, gelu, mul"
                : variant == "package" ? "3 — 2 GEMMs and the package's kernel"
                                       : "3 GEMMs + 2 gelu");
    if (r.ran_compiled) {
      const double e = gpu ? r.eager.timing.device_us : r.eager.timing.wall_us;
      const double c = gpu ? r.compiled.timing.device_us : r.compiled.timing.wall_us;
      std::printf("lesson: compiled/eager time per step %.3f (%.1f vs %.1f us)\n", c / e, c, e);
    }
    if (r.ran_graphed) {
      std::printf(
          "lesson: a CUDA graph replay costs %.1f us of host time per step (compiled %.1f, "
          "eager %.1f); wall %.1f us\n",
          r.graphed.timing.host_us, r.compiled.timing.host_us, r.eager.timing.host_us,
          r.graphed.timing.wall_us);
    }
    return rc;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
