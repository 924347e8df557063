// Tensor parallelism where it pays (issue #33): a Llama-style model from a seeded config split over
// 1, 2, 4 and 8 ranks (as many as there are GPUs; thread ranks with --device cpu), its prefill
// and its decode rate at each size, every size's logits checked against one rank's.
//
//   tp_bench [--preset 8b|1b|tiny] [--layers L --dim D --hidden H --heads N --kv-heads K
//            --vocab V] [--tp 1,2,4,8] [--prompt 2048] [--decode-prompt 128] [--new-tokens 64]
//            [--reps 3] [--device cuda|cpu] [--dtype bf16|f32]
//
// Weights: every parameter drawn on its device from a seed of its name (norm weights 1, the rest
// N(0, 0.02)), the same at every size, then each rank keeps its share (ShardTensorParallel).
// Prefill: the compiled full forward over [1, prompt] tokens (median of --reps calls after one
// warm-up, wall time to the result); decode: generate() over a [1, decode-prompt] prompt, the
// decode step compiled and replayed as a CUDA graph, ms per step from its third step on. Check:
// the last position's logits and the greedy ids of each size against size 1's (bf16: the argmax
// and the largest difference are reported), and on GPUs the collectives' share of rank 0's kernel
// time in 8 decode steps (kiln's profiler, CUPTI). A line "TP {json}" per size carries the figures.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "codegen/compile.h"
#include "models/generate.h"
#include "models/llama.h"
#include "ops/distributed.h"
#include "ops/factories.h"
#include "ops/nccl.h"
#include "ops/ops.h"
#include "profiler/profiler.h"
#include "runtime/cuda.h"
#include "runtime/random.h"

namespace {

using kiln::Tensor;
using Clock = std::chrono::steady_clock;

constexpr int64_t kProfiledTokens = 12;  // the profiled generation's new tokens

std::map<std::string, std::string> ParseFlags(int argc, char** argv) {
  std::map<std::string, std::string> f = {
      {"preset", "8b"},     {"tp", "1,2,4,8"}, {"prompt", "2048"}, {"decode-prompt", "128"},
      {"new-tokens", "64"}, {"reps", "3"},     {"device", "cuda"}, {"dtype", "bf16"}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (!absl::StartsWith(a, "--") || i + 1 >= argc) {
      std::fprintf(stderr, "tp_bench: expected --flag value, got '%s'\n", a.c_str());
      std::exit(2);
    }
    f[a.substr(2)] = argv[++i];
  }
  return f;
}

int64_t Int(const std::map<std::string, std::string>& f, const std::string& name) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(f.at(name), &v)) {
    std::fprintf(stderr, "tp_bench: --%s must be an integer, got '%s'\n", name.c_str(),
                 f.at(name).c_str());
    std::exit(2);
  }
  return v;
}

// A preset's shape (Llama-3-8B's for "8b"), each field overridable by its flag.
kiln::LlamaConfig Config(std::map<std::string, std::string>& f) {
  const std::string p = f.at("preset");
  auto def = [&](const char* name, const char* v8b, const char* v1b, const char* vtiny) {
    if (!f.count(name)) f[name] = p == "8b" ? v8b : p == "1b" ? v1b : vtiny;
  };
  if (p != "8b" && p != "1b" && p != "tiny") {
    std::fprintf(stderr, "tp_bench: --preset is 8b, 1b or tiny\n");
    std::exit(2);
  }
  def("layers", "32", "16", "2");
  def("dim", "4096", "2048", "64");
  def("hidden", "14336", "8192", "128");
  def("heads", "32", "32", "8");
  def("kv-heads", "8", "8", "8");
  def("vocab", "128256", "128256", "97");
  kiln::LlamaConfig c;
  c.layers = Int(f, "layers");
  c.dim = Int(f, "dim");
  c.hidden = Int(f, "hidden");
  c.heads = Int(f, "heads");
  c.kv_heads = Int(f, "kv-heads");
  c.vocab = Int(f, "vocab");
  c.rope.base = 500000;
  c.rope.max_positions =
      std::max(Int(f, "prompt"),
               Int(f, "decode-prompt") + std::max<int64_t>(Int(f, "new-tokens"), kProfiledTokens));
  return c;
}

// The seeded model on `device`: each parameter drawn where it lives from its name's seed.
std::unique_ptr<kiln::LlamaForCausalLM> SeededModel(const kiln::LlamaConfig& c, kiln::Device device,
                                                    kiln::DType dtype) {
  auto model = std::make_unique<kiln::LlamaForCausalLM>(
      c, kiln::ModuleOptions{.dtype = dtype, .device = device, .init = kiln::Init::kNone});
  for (const auto& [name, p] : model->named_parameters()) {
    if (absl::EndsWith(name, "norm.weight")) {
      kiln::copy_(p, kiln::full(p.shape(), 1.0, dtype, device));
      continue;
    }
    kiln::Generator gen(std::hash<std::string>()(name) & 0xffffffffu);
    kiln::copy_(p, kiln::mul(kiln::randn(p.shape(), gen, dtype, device), 0.02));
  }
  return model;
}

Tensor Tokens(int64_t len, int64_t vocab, uint64_t seed, kiln::Device device) {
  kiln::Generator gen(seed);
  std::vector<double> u = kiln::to_vector(kiln::rand({1, len}, gen));
  for (double& x : u) x = std::min<double>(std::floor(x * vocab), vocab - 1);
  return kiln::from_vector(u, {1, len}, kiln::DType::kInt64, device);
}

// The collectives' share of `device`'s kernel time in `r`'s recorded steps, as text.
std::string CollectiveShare(const kiln::profiler::ProfileResult& r, int device) {
  if (!r.device_available) return r.device_status;
  int64_t all = 0, nccl = 0;
  for (const kiln::profiler::DeviceRecord& k : r.device) {
    if (k.kind != kiln::profiler::DeviceKind::kKernel || static_cast<int>(k.device) != device) {
      continue;
    }
    all += k.duration_ns();
    if (absl::StrContains(k.name, "nccl")) nccl += k.duration_ns();
  }
  return absl::StrFormat("%.1f%% (%.1f of %.1f us a step)", all > 0 ? 100.0 * nccl / all : 0.0,
                         nccl / 1e3 / std::max(r.steps_recorded, 1),
                         all / 1e3 / std::max(r.steps_recorded, 1));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct SizeResult {
  int tp = 0;
  std::vector<double> prefill_ms;
  double decode_ms = 0;
  std::string collective_share = "-";  // of rank 0's device time in profiled decode steps
  std::vector<double> last_logits;     // float, the prefill's last position
  std::vector<int64_t> ids;            // greedy decode
};

SizeResult RunSize(int tp, const kiln::LlamaConfig& c, kiln::Device device, kiln::DType dtype,
                   const std::map<std::string, std::string>& f) {
  SizeResult out;
  out.tp = tp;
  const bool gpu = device.is_cuda();
  auto rank_body = [&](kiln::ProcessGroup& pg) {
    const kiln::Device d = gpu ? kiln::CUDA(pg.rank()) : device;
    std::unique_ptr<kiln::LlamaForCausalLM> model = SeededModel(c, d, dtype);
    if (tp > 1) model->ShardTensorParallel(pg);
    auto sync = [gpu] {
      if (gpu) kiln::cuda::Synchronize();
    };
    // Prefill: the compiled full forward.
    const Tensor tokens = Tokens(Int(f, "prompt"), c.vocab, 1, d);
    const kiln::CompiledFn forward =
        kiln::compile(*model, tokens, {.mode = kiln::CompileOptions::Mode::kCompiled});
    Tensor logits = forward({tokens})[0];
    sync();
    std::vector<double> ms;
    for (int64_t i = 0; i < Int(f, "reps"); ++i) {
      logits = Tensor();
      const auto t0 = Clock::now();
      logits = forward({tokens})[0];
      sync();
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    const int64_t last = logits.size(1) - 1;
    const Tensor row = kiln::cast(kiln::slice(logits, 1, last, last + 1), kiln::DType::kFloat32);
    logits = Tensor();
    // Decode: generate() with the step replayed as a CUDA graph (compiled on the CPU).
    const std::vector<double> p =
        kiln::to_vector(Tokens(Int(f, "decode-prompt"), c.vocab, 2, kiln::kCPU));
    kiln::GenerateOptions o;
    o.max_new_tokens = Int(f, "new-tokens");
    o.mode = gpu ? kiln::GenerateOptions::Mode::kCudaGraph : kiln::GenerateOptions::Mode::kCompiled;
    std::vector<double> step_end_ms;
    const auto t0 = Clock::now();
    o.on_step = [&](int64_t, const std::vector<int64_t>&) {
      step_end_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      return true;
    };
    const kiln::GenerateResult r =
        kiln::generate(*model, {std::vector<int64_t>(p.begin(), p.end())}, o);
    // Where rank 0's device time goes in 8 decode steps after the first three (CUPTI sees every
    // rank's GPU; rank 0's are counted): the collectives' kernels (NCCL's) against all of them.
    std::optional<kiln::profiler::Profiler> prof;
    if (gpu && pg.rank() == 0) {
      prof.emplace(kiln::profiler::Profiler::Options{.wait = 3, .active = 8});
      prof->Start();
    }
    kiln::GenerateOptions profiled = o;
    profiled.max_new_tokens = kProfiledTokens;
    profiled.on_step = [&](int64_t, const std::vector<int64_t>&) {
      if (prof) prof->Step();
      return true;
    };
    kiln::generate(*model, {std::vector<int64_t>(p.begin(), p.end())}, profiled);
    if (pg.rank() != 0) return;
    if (prof) out.collective_share = CollectiveShare(prof->Stop(), d.index);
    out.prefill_ms = ms;
    constexpr size_t kFirstSteady = 2;
    if (step_end_ms.size() > kFirstSteady + 1) {
      out.decode_ms = (step_end_ms.back() - step_end_ms[kFirstSteady]) /
                      static_cast<double>(step_end_ms.size() - 1 - kFirstSteady);
    }
    out.last_logits = kiln::to_vector(row);
    out.ids = r.tokens[0];
  };
  kiln::RunLocalRanks(tp, device, rank_body);
  return out;
}

int64_t ArgMax(const std::vector<double>& v) {
  return std::max_element(v.begin(), v.end()) - v.begin();
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> f = ParseFlags(argc, argv);
  const kiln::LlamaConfig c = Config(f);
  const kiln::Device device = f.at("device") == "cpu" ? kiln::kCPU : kiln::CUDA(0);
  const kiln::DType dtype = f.at("dtype") == "f32" ? kiln::DType::kFloat32 : kiln::DType::kBFloat16;
  if (device.is_cuda() && !kiln::cuda::IsAvailable()) {
    std::printf("tp_bench: no CUDA device (--device cpu runs thread ranks)\n");
    return 0;
  }
  const int gpus = device.is_cuda() ? kiln::cuda::DeviceCount() : 1 << 20;
  std::vector<int> sizes;
  for (absl::string_view s : absl::StrSplit(f.at("tp"), ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 1) {
      std::fprintf(stderr, "tp_bench: --tp lists sizes like 1,2,4\n");
      return 2;
    }
    if (n <= gpus) sizes.push_back(n);
  }
  std::printf("== tp_bench: %" PRId64 " layers, dim %" PRId64 ", hidden %" PRId64 ", %" PRId64
              " heads (%" PRId64 " key/value), vocab %" PRId64
              ", %s on %s; prefill [1, %s], "
              "decode %s tokens after [1, %s] ==\n",
              c.layers, c.dim, c.hidden, c.heads, c.kv_heads, c.vocab, kiln::DTypeName(dtype),
              device.is_cuda() ? absl::StrCat(gpus, " GPU(s)").c_str() : "thread ranks",
              f.at("prompt").c_str(), f.at("new-tokens").c_str(), f.at("decode-prompt").c_str());
  std::vector<SizeResult> results;
  bool ok = true;
  for (int n : sizes) {
    try {
      results.push_back(RunSize(n, c, device, dtype, f));
    } catch (const kiln::Error& e) {
      std::fprintf(stderr, "tp_bench: tp %d: %s\n", n, e.what());
      return 2;
    }
    const SizeResult& r = results.back();
    const SizeResult& one = results.front();
    double diff = 0, scale = 0;
    for (size_t i = 0; i < r.last_logits.size(); ++i) {
      diff = std::max(diff, std::abs(r.last_logits[i] - one.last_logits[i]));
      scale = std::max(scale, std::abs(one.last_logits[i]));
    }
    const bool same_argmax = ArgMax(r.last_logits) == ArgMax(one.last_logits);
    const bool same_ids = r.ids == one.ids;
    const bool f32 = dtype == kiln::DType::kFloat32;
    const bool close = diff <= (f32 ? 1e-4 : 3.2e-2) * std::max(1.0, scale);
    std::printf(
        "tp %d: prefill %.2f ms (%.2f..%.2f), decode %.3f ms/token (%.1f tokens/s); "
        "vs tp %d: logits max |diff| %.3g (max |ref| %.3g) %s, argmax %s, ids %s; "
        "collectives' share of a decode step's kernel time: %s\n",
        r.tp, Median(r.prefill_ms), *std::min_element(r.prefill_ms.begin(), r.prefill_ms.end()),
        *std::max_element(r.prefill_ms.begin(), r.prefill_ms.end()), r.decode_ms,
        1000.0 / r.decode_ms, one.tp, diff, scale, close ? "OK" : "MISMATCH",
        same_argmax ? "same" : "differs", same_ids ? "same" : (f32 ? "MISMATCH" : "differ"),
        r.collective_share.c_str());
    ok &= close && (same_ids || !f32);
    std::printf(
        "TP {\"tp\": %d, \"prefill_ms\": %.3f, \"decode_ms_per_token\": %.4f, "
        "\"prefill_speedup\": %.3f, \"decode_speedup\": %.3f}\n",
        r.tp, Median(r.prefill_ms), r.decode_ms, Median(one.prefill_ms) / Median(r.prefill_ms),
        one.decode_ms / r.decode_ms);
  }
  return ok ? 0 : 1;
}
