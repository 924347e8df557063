// 05_gpt: a GPT-2-class model end to end — weights from a safetensors file in Hugging Face's
// GPT-2 layout, one prefill call over the prompt, then greedy decoding one token per call with a
// KV cache — eagerly, compiled, and compiled + CUDA graph, with kiln's profiler.
//
//   05_gpt --write-weights gpt2.safetensors [--layers 12 --dim 768 --heads 12 --vocab 50257
//          --ctx 1024 --seed 0]            seeded random weights (Conv1D weights [in, out], as HF)
//   05_gpt --weights gpt2.safetensors [--prompt-len 512 --new-tokens 64 --batch 1]
//          [--dtype f32|bf16] [--device cpu|cuda] [--compile] [--cuda-graphs]
//          [--profile] [--sort KEY] [--trace FILE] [--compare] [--out FILE] [--warmup W --iters I]
//   05_gpt --weights gpt2.safetensors --compile-latency [--cuda-graphs] [...]
//          compile to first result only (#27): one JSON line "COMPILE_LATENCY {...}"
//   05_gpt ... --tp N   also the model split over N ranks (tensor parallelism; thread ranks on
//          the CPU, one thread per GPU over NCCL), in every mode asked, against the single model
//
// Without --weights the model gets the same seeded weights in memory. The prompt is seeded ids
// (no tokenizer). Prints prefill time, decode time per token (host enqueue and wall), tokens/s,
// kernels per decode step (the compile report), peak device memory and the generated ids; checks
// the KV cache against a full forward of the generated sequence, and each mode against eager
// (ids equal in f32, logits close); --compare prints the eager-vs-compiled report of the decode
// step, or with --profile-step prefill of the prefill call (--profile, --trace and --compare
// imply --compile). --out FILE writes the prompt, the ids
// and the prefill logits and three decode steps' logits (float32) for bench/gpt_baseline.py to
// check against. A line
// "RESULT {json}" carries the figures for scripts/gpu-run.
//
// The KV cache is a fixed-capacity [B, H, ctx, Dh] per layer, one row written per token by
// index_copy_ (the position a tensor) inside the decode step, so the compiled step has static
// shapes: one compile, one CUDA graph replayed every token. examples/gpt.h says why, and what it
// costs.
#include <cinttypes>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "codegen/executable.h"
#include "examples/common.h"
#include "examples/gpt.h"
#include "io/safetensors.h"
#include "io/state_dict.h"
#include "ops/cuda/matmul_cuda.h"
#include "ops/distributed.h"
#include "ops/nccl.h"
#include "runtime/build_config.h"
#include "runtime/startup.h"

namespace {

using examples::DecodeState;
using examples::Gpt;
using examples::GptConfig;
using examples::KvCache;
using kiln::Tensor;
using StepFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void DefineFlags(examples::Flags& f) {
  examples::DefineCommonFlags(f);
  f.Define("iters", "3");
  f.Define("warmup", "1");
  for (const char* name : {"layers", "dim", "heads", "vocab", "ctx", "prompt-len", "new-tokens",
                           "batch", "weights", "write-weights", "out"}) {
    f.Define(name, "");
  }
  f.Define("seed", "0");
  f.Define("profile-step", "decode");
  f.Define("tp", "1");
  f.Define("compile-latency", "0", true);
}

const Clock::time_point g_process_t0 = Clock::now();  // about the process's start

// Flags given, else GPT-2 small on a GPU and a small model on the CPU.
GptConfig ConfigFromFlags(examples::Flags& f, bool gpu) {
  auto def = [&](const char* name, const char* gpu_value, const char* cpu_value) {
    if (!f.Given(name)) f.Define(name, gpu ? gpu_value : cpu_value);
  };
  def("layers", "12", "2");
  def("dim", "768", "64");
  def("heads", "12", "2");
  def("vocab", "50257", "128");
  def("ctx", "1024", "64");
  def("prompt-len", "512", "16");
  def("new-tokens", "64", "16");
  def("batch", "1", "2");
  GptConfig c{f.Int("layers"), f.Int("dim"), f.Int("heads"), f.Int("vocab"), f.Int("ctx")};
  if (c.dim % c.heads != 0) f.Usage("--dim must be a multiple of --heads");
  if (f.Int("prompt-len") + f.Int("new-tokens") > c.ctx) {
    f.Usage("--prompt-len + --new-tokens must be at most --ctx");
  }
  return c;
}

kiln::DType DTypeFromFlags(examples::Flags& f, bool gpu) {
  std::string s = f.Given("dtype") ? f.Str("dtype") : gpu ? "bf16" : "f32";
  if (s == "f32") s = "float32";
  if (s == "bf16") s = "bfloat16";
  if (s == "f16") s = "float16";
  return examples::ParseDType(f, s);
}

int64_t Seed(const examples::Flags& f) {
  const std::string& s = f.Str("seed");
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < 0) f.Usage("--seed must be a non-negative integer");
  return v;
}

// Seeded weights in HF's layout, with the config in the metadata (bench/gpt_baseline.py reads it).
void WriteWeights(const GptConfig& c, uint64_t seed, kiln::Device device, const std::string& path) {
  kiln::Generator gen(seed);
  Gpt model(c, gen, {kiln::DType::kFloat32, device});
  examples::InitGpt2Weights(model, seed);
  kiln::SaveOptions o;
  o.map = kiln::gpt2_save_mapping();
  o.metadata["n_layer"] = std::to_string(c.layers);
  o.metadata["n_embd"] = std::to_string(c.dim);
  o.metadata["n_head"] = std::to_string(c.heads);
  o.metadata["vocab_size"] = std::to_string(c.vocab);
  o.metadata["n_positions"] = std::to_string(c.ctx);
  kiln::save_state_dict(model, path, o);
  std::printf("wrote %s: GPT-2 layout, %" PRId64 " layers, dim %" PRId64 ", %" PRId64
              " heads, vocab %" PRId64 ", ctx %" PRId64 ", seed %" PRIu64 "\n",
              path.c_str(), c.layers, c.dim, c.heads, c.vocab, c.ctx, seed);
}

// Seeded prompt ids in [0, vocab).
Tensor MakePrompt(int64_t batch, int64_t len, int64_t vocab, uint64_t seed, kiln::Device device) {
  kiln::Generator gen(seed + 1);
  std::vector<double> u = kiln::to_vector(kiln::rand({batch, len}, gen));
  for (double& x : u) x = std::min<double>(std::floor(x * vocab), vocab - 1);
  return kiln::from_vector(u, {batch, len}, kiln::DType::kInt64, device);
}

// One generation's outputs and timings.
struct Run {
  Tensor ids;             // [B, T + N]
  Tensor prefill_logits;  // [B, vocab]
  Tensor last_logits;     // [B, vocab] of the last decode step (the prefill's when N = 1)
  // Decode step i's logits [B, vocab] (step 1 reads the prefill's token), for the steps kept:
  // the first, the middle and the last (Measure keeps them from its first run only).
  std::vector<std::pair<int64_t, Tensor>> step_logits;
  double prefill_ms = 0, decode_ms = 0, decode_host_ms = 0, peak_mib = 0;
};

// The buffers of one mode: its own caches and state, so modes never share memory.
struct Session {
  KvCache cache;
  DecodeState state;
  std::vector<Tensor> prefill_in, decode_in;
};

Session NewSession(const Gpt& model, const Tensor& prompt) {
  Session s{model.NewCache(prompt.size(0)), model.NewState(prompt.size(0)), {}, {}};
  s.prefill_in = Gpt::PrefillInputs(prompt, s.cache, s.state);
  s.decode_in = Gpt::DecodeInputs(s.cache, s.state);
  return s;
}

// The decode steps whose logits a run keeps: the first, the middle and the last.
bool KeptStep(int64_t i, int64_t new_tokens) {
  return i == 1 || i == new_tokens / 2 || i == new_tokens - 1;
}

Run Generate(const StepFn& prefill, const StepFn& decode, Session& s, int64_t new_tokens, bool gpu,
             bool keep_steps = false) {
  Run r;
  if (gpu) {
    kiln::cuda::Synchronize();
    kiln::cuda::ResetPeakMemoryStats();
  }
  const auto t0 = Clock::now();
  r.prefill_logits = prefill(s.prefill_in)[0];
  r.last_logits = r.prefill_logits;
  if (gpu) kiln::cuda::Synchronize();
  const auto t1 = Clock::now();
  for (int64_t i = 1; i < new_tokens; ++i) {
    r.last_logits = Tensor();  // a CUDA graph's outputs may be reused once dropped
    r.last_logits = decode(s.decode_in)[0];
    if (keep_steps && KeptStep(i, new_tokens)) {
      r.step_logits.emplace_back(i, kiln::clone(r.last_logits));
    }
  }
  const auto t2 = Clock::now();
  if (gpu) kiln::cuda::Synchronize();
  const auto t3 = Clock::now();
  const double steps = std::max<double>(1, new_tokens - 1);
  r.prefill_ms = Ms(t0, t1);
  r.decode_host_ms = Ms(t1, t2) / steps;
  r.decode_ms = Ms(t1, t3) / steps;
  if (gpu) r.peak_mib = kiln::cuda::GetMemoryStats().peak_allocated / double(1 << 20);
  const int64_t len = s.prefill_in[0].size(1) + new_tokens;
  r.ids = kiln::clone(kiln::slice(s.state.ids, 1, 0, len));
  return r;
}

// The first run's outputs, with the medians of `iters` more runs' timings.
Run Measure(const StepFn& prefill, const StepFn& decode, Session& s, int64_t new_tokens, bool gpu,
            int warmup, int iters) {
  Run first = Generate(prefill, decode, s, new_tokens, gpu, /*keep_steps=*/true);
  // Copies: a CUDA-graph call whose previous outputs are still held runs without its graph.
  first.prefill_logits = kiln::clone(first.prefill_logits);
  first.last_logits = kiln::clone(first.last_logits);
  for (int i = 1; i < warmup; ++i) Generate(prefill, decode, s, new_tokens, gpu);
  std::vector<double> pre, dec, host, peak;
  for (int i = 0; i < iters; ++i) {
    const Run r = Generate(prefill, decode, s, new_tokens, gpu);
    pre.push_back(r.prefill_ms);
    dec.push_back(r.decode_ms);
    host.push_back(r.decode_host_ms);
    peak.push_back(r.peak_mib);
  }
  first.prefill_ms = examples::Median(pre);
  first.decode_ms = examples::Median(dec);
  first.decode_host_ms = examples::Median(host);
  first.peak_mib = examples::Median(peak);
  return first;
}

}  // namespace

namespace {

// One way of running the steps: eager, compiled, or compiled + CUDA graph.
struct Mode {
  std::string name;
  StepFn prefill, decode;
  std::optional<kiln::CompiledFn> compiled_prefill, compiled_decode;
  Session session;
  Run run;
};

Mode EagerMode(Gpt& model, const Tensor& prompt) {
  Mode m{"eager",
         [&model](const std::vector<Tensor>& in) { return model.Prefill(in); },
         [&model](const std::vector<Tensor>& in) { return model.Decode(in); },
         std::nullopt,
         std::nullopt,
         NewSession(model, prompt),
         {}};
  return m;
}

// Weights frozen (the model never changes them after loading): GEMM merges and folding apply.
Mode CompiledMode(Gpt& model, const Tensor& prompt, bool cuda_graphs, const std::string& dump) {
  Mode m{cuda_graphs ? "compiled+graph" : "compiled",
         {},
         {},
         std::nullopt,
         std::nullopt,
         NewSession(model, prompt),
         {}};
  kiln::CompileOptions o;
  o.mode = kiln::CompileOptions::Mode::kCompiled;
  o.freeze_weights = true;
  o.cuda_graphs = cuda_graphs;
  o.tensor_names = [&model] { return model.named_tensors(); };
  o.dump_dir = dump.empty() ? "" : dump + "/prefill";  // each function in a folder of its own
  m.compiled_prefill.emplace(
      kiln::compile([&model](const std::vector<Tensor>& in) { return model.Prefill(in); },
                    m.session.prefill_in, o));
  o.dump_dir = dump.empty() ? "" : dump + "/decode";
  m.compiled_decode.emplace(
      kiln::compile([&model](const std::vector<Tensor>& in) { return model.Decode(in); },
                    m.session.decode_in, o));
  m.prefill = *m.compiled_prefill;
  m.decode = *m.compiled_decode;
  return m;
}

bool CheckClose(const std::string& what, const Tensor& a, const Tensor& ref, kiln::DType dtype) {
  const auto [err, scale] = examples::MaxError({a}, {ref});
  const bool ok = err <= examples::Tolerance(dtype) * std::max(1.0, scale);
  std::printf("check: %-44s max |diff| %.3g (max |ref| %.3g) %s\n", what.c_str(), err, scale,
              ok ? "OK" : "MISMATCH");
  return ok;
}

// The first token position where two [B, L] id tensors differ (in any row), or -1.
int64_t FirstDivergence(const Tensor& a, const Tensor& b) {
  const auto va = kiln::to_vector<int64_t>(a), vb = kiln::to_vector<int64_t>(b);
  const int64_t len = a.size(1);
  int64_t first = -1;
  for (size_t i = 0; i < va.size(); ++i) {
    if (va[i] != vb[i] && (first < 0 || int64_t(i) % len < first)) first = int64_t(i) % len;
  }
  return first;
}

// The KV cache against the model without one: logits of a full forward over the generated ids.
bool CheckCache(Gpt& model, const Run& eager, int64_t prompt_len, kiln::DType dtype) {
  const int64_t len = eager.ids.size(1);
  const Tensor ids = kiln::to(kiln::slice(eager.ids, 1, 0, len - 1), eager.prefill_logits.device());
  const Tensor full = model(ids);  // [B, len - 1, vocab]
  auto row = [&](int64_t t) { return kiln::squeeze(kiln::slice(full, 1, t, t + 1), 1); };
  bool ok = CheckClose("prefill logits vs full forward", eager.prefill_logits, row(prompt_len - 1),
                       dtype);
  ok &= CheckClose("last decode logits vs full forward", eager.last_logits, row(len - 2), dtype);
  return ok;
}

// A compiled mode against eager: ids equal (in f32; half types may round a near-tie the other
// way, so there a divergence is reported, not failed), logits close.
bool CheckMode(const Mode& m, const Run& eager, int64_t prompt_len, kiln::DType dtype) {
  bool ok = CheckClose(m.name + " prefill logits vs eager", m.run.prefill_logits,
                       eager.prefill_logits, dtype);
  const int64_t d = FirstDivergence(m.run.ids, eager.ids);
  if (d < 0) {
    ok &= CheckClose(m.name + " last decode logits vs eager", m.run.last_logits, eager.last_logits,
                     dtype);
    std::printf("check: %-44s equal OK\n", (m.name + " ids vs eager").c_str());
  } else {
    const bool f32 = dtype == kiln::DType::kFloat32;
    std::printf("check: %-44s first differ at token %" PRId64 " %s\n",
                (m.name + " ids vs eager").c_str(), d - prompt_len,
                f32 ? "MISMATCH" : "(half precision: reported, not failed)");
    ok &= !f32;
  }
  return ok;
}

}  // namespace

namespace {

void PrintTable(const std::vector<Mode*>& modes, int64_t batch, bool gpu) {
  std::printf("\n%-16s %12s %16s %16s %12s %10s\n", "mode", "prefill ms", "decode ms/token",
              "host ms/token", "tokens/s", "peak MiB");
  for (const Mode* m : modes) {
    const Run& r = m->run;
    std::printf("%-16s %12.3f %16.3f %16.3f %12.1f %10s\n", m->name.c_str(), r.prefill_ms,
                r.decode_ms, r.decode_host_ms, batch * 1000.0 / r.decode_ms,
                gpu ? std::to_string(static_cast<int>(r.peak_mib)).c_str() : "-");
  }
}

// Kernels one compiled step launches, and the inputs it copies back after the plan.
std::pair<int, int> StepKernels(const kiln::CompiledFn& fn, const std::vector<Tensor>& in) {
  const int kernels = fn.report(in).kernels_per_step;
  const int copies = fn.executable(in).input_copy_backs();
  return {kernels, copies};
}

void PrintIds(const Run& r, int64_t prompt_len) {
  const auto ids = kiln::to_vector<int64_t>(kiln::slice(r.ids, 0, 0, 1));
  std::printf("generated ids (row 0 of %" PRId64 "):", r.ids.size(0));
  for (size_t i = prompt_len; i < ids.size(); ++i) std::printf(" %" PRId64, ids[i]);
  std::printf("\n");
}

void WriteOut(const std::string& path, const Tensor& prompt, const Mode& m, kiln::DType dtype) {
  auto host_f32 = [](const Tensor& t) {
    return kiln::to(kiln::cast(t, kiln::DType::kFloat32), kiln::kCPU);
  };
  kiln::NamedTensors out = {{"prompt", kiln::to(prompt, kiln::kCPU)},
                            {"ids", kiln::to(m.run.ids, kiln::kCPU)},
                            {"prefill_logits", host_f32(m.run.prefill_logits)}};
  for (const auto& [step, logits] : m.run.step_logits) {
    out.emplace_back("decode_logits_step_" + std::to_string(step), host_f32(logits));
  }
  kiln::save_safetensors(path, out, {{"dtype", kiln::DTypeName(dtype)}, {"mode", m.name}});
  std::printf("out: %s (prompt, ids, prefill logits and %zu decode steps' logits of %s)\n",
              path.c_str(), m.run.step_logits.size(), m.name.c_str());
}

// Peak memory is measured on a GPU only: null on the CPU (0 would read as a measurement).
std::string ResultJson(const examples::Flags& f, const std::vector<Mode*>& modes, kiln::DType dtype,
                       int decode_kernels, bool ok, bool gpu) {
  std::ostringstream j;
  j << "{\"layers\": " << f.Int("layers") << ", \"dim\": " << f.Int("dim")
    << ", \"batch\": " << f.Int("batch") << ", \"prompt_len\": " << f.Int("prompt-len")
    << ", \"new_tokens\": " << f.Int("new-tokens") << ", \"dtype\": \"" << kiln::DTypeName(dtype)
    << "\", \"decode_kernels\": " << decode_kernels << ", \"ok\": " << (ok ? "true" : "false")
    << ", \"modes\": {";
  for (size_t i = 0; i < modes.size(); ++i) {
    const Run& r = modes[i]->run;
    j << (i ? ", " : "") << "\"" << modes[i]->name << "\": {\"prefill_ms\": " << r.prefill_ms
      << ", \"decode_ms_per_token\": " << r.decode_ms
      << ", \"host_ms_per_token\": " << r.decode_host_ms
      << ", \"tokens_per_s\": " << f.Int("batch") * 1000.0 / r.decode_ms
      << ", \"peak_mib\": " << (gpu ? std::to_string(r.peak_mib) : "null") << "}";
  }
  j << "}}";
  return j.str();
}

// --profile / --trace / --compare over decode steps, each mode's session reset by its prefill.
// With --profile-step prefill, the prefill call instead (each call prefills the same prompt).
void ProfileStep(const examples::Flags& f, Mode& eager, Mode& comp, Mode* graphed, bool gpu) {
  for (Mode* m : {&eager, &comp, graphed}) {
    if (m != nullptr) m->prefill(m->session.prefill_in);
  }
  const bool prefill = f.Str("profile-step") == "prefill";
  auto step = [prefill](Mode& m) {
    return [&m, prefill] {
      prefill ? m.prefill(m.session.prefill_in) : m.decode(m.session.decode_in);
    };
  };
  std::function<void()> graphed_step;
  if (graphed != nullptr) graphed_step = step(*graphed);
  const std::vector<Tensor>& in = prefill ? comp.session.prefill_in : comp.session.decode_in;
  const kiln::CompiledFn& fn = prefill ? *comp.compiled_prefill : *comp.compiled_decode;
  examples::ProfileExample(f, step(eager), step(comp), graphed_step, fn, in, gpu);
}

// --compile-latency: the prefill and decode functions compiled and each run once, timed from the
// first kiln::compile call to the decode step's first result on the host (the weights' loading
// made the CUDA context and did the device's first allocation before), one JSON line. Nothing else
// runs first: no eager generation loads cuBLASLt's kernels for the compiled functions. A second
// decode call shows the steady state the one-time costs are measured against.
int CompileLatency(Gpt& model, const Tensor& prompt, bool cuda_graphs, bool gpu) {
  auto sync = [gpu] {
    if (gpu) kiln::cuda::Synchronize();
  };
  sync();
  const double before_ms = Ms(g_process_t0, Clock::now());
  const auto t0 = Clock::now();
  Mode m = CompiledMode(model, prompt, cuda_graphs, "");
  const auto t1 = Clock::now();
  m.prefill(m.session.prefill_in);
  sync();
  const auto t2 = Clock::now();
  m.decode(m.session.decode_in);
  sync();
  const auto t3 = Clock::now();
  m.decode(m.session.decode_in);
  sync();
  const auto t4 = Clock::now();
  const kiln::CompileReport& p = m.compiled_prefill->report(m.session.prefill_in);
  const kiln::CompileReport& d = m.compiled_decode->report(m.session.decode_in);
  std::printf(
      "COMPILE_LATENCY {\"mode\": \"%s\", \"compile_ms\": %.2f, \"prefill_first_ms\": %.2f, "
      "\"decode_first_ms\": %.2f, \"to_first_result_ms\": %.2f, \"decode_second_ms\": %.2f, "
      "\"process_to_compile_ms\": %.2f, \"process_to_first_result_ms\": %.2f, "
      "\"background_startup_ms\": %.2f, \"prefill\": %s, \"decode\": %s}\n",
      m.name.c_str(), Ms(t0, t1), Ms(t1, t2), Ms(t2, t3), Ms(t0, t3), Ms(t3, t4), before_ms,
      Ms(g_process_t0, t3), kiln::cuda::StartupMs(), p.CostsJson().c_str(), d.CostsJson().c_str());
  return 0;
}

// The model on `device`: the weights file's, or seeded ones. `say`: print where they came from.
std::unique_ptr<Gpt> LoadModel(const examples::Flags& f, const GptConfig& config,
                               kiln::Device device, kiln::DType dtype, uint64_t seed, bool say) {
  kiln::Generator gen(seed);
  // With a weights file the parameters are only allocated (drawing 124M random values on the CPU
  // first took seconds of the process's start); the load writes every one of them.
  const kiln::Init init = f.Given("weights") ? kiln::Init::kNone : kiln::Init::kRandom;
  auto model = std::make_unique<Gpt>(
      config, gen, kiln::ModuleOptions{.dtype = dtype, .device = device, .init = init});
  if (f.Given("weights")) {
    kiln::LoadOptions o;
    o.map = kiln::gpt2_load_mapping();
    const kiln::LoadReport r = kiln::load_state_dict(*model, f.Str("weights"), o);
    if (say) {
      std::printf("weights: %s (%zu tensors loaded)\n", f.Str("weights").c_str(), r.loaded.size());
    }
  } else {
    examples::InitGpt2Weights(*model, seed);
    if (say) std::printf("weights: seeded in memory (seed %" PRIu64 ")\n", seed);
  }
  return model;
}

// --tp N: the model split over N ranks (Gpt::ShardTensorParallel): thread ranks on the CPU, one
// thread per GPU over NCCL on cuda:0..N-1. Every rank loads the same weights and keeps its share;
// every mode asked runs on every rank in the same order, and rank 0 prints its figures, checked
// against the single model's eager run. False when a check failed.
bool RunTensorParallel(const examples::Flags& f, int n, const GptConfig& config,
                       kiln::Device device, kiln::DType dtype, uint64_t seed, int64_t batch,
                       int64_t prompt_len, int64_t new_tokens, const Run& single) {
  const bool gpu = device.is_cuda();
  bool ok = true;
  auto rank_body = [&](kiln::ProcessGroup& pg) {
    const kiln::Device d = gpu ? kiln::CUDA(pg.rank()) : device;
    std::unique_ptr<Gpt> model = LoadModel(f, config, d, dtype, seed, false);
    model->ShardTensorParallel(pg);
    const Tensor prompt = MakePrompt(batch, prompt_len, config.vocab, seed, d);
    std::vector<Mode> modes;
    modes.push_back(EagerMode(*model, prompt));
    if (f.Bool("compile")) modes.push_back(CompiledMode(*model, prompt, false, ""));
    if (f.Bool("compile") && gpu && f.Bool("cuda-graphs")) {
      modes.push_back(CompiledMode(*model, prompt, true, ""));
    }
    const int warmup = static_cast<int>(f.Int("warmup")), iters = static_cast<int>(f.Int("iters"));
    for (Mode& m : modes) {
      m.run = Measure(m.prefill, m.decode, m.session, new_tokens, gpu, warmup, iters);
      m.name = absl::StrCat("tp ", n, " ", m.name);
    }
    if (pg.rank() != 0) return;
    std::vector<Mode*> shown;
    for (Mode& m : modes) {
      ok &= CheckMode(m, single, prompt_len, dtype);
      shown.push_back(&m);
    }
    PrintTable(shown, batch, gpu);
  };
  kiln::RunLocalRanks(n, device, rank_body);
  return ok;
}

// Loads (or initialises) the model, runs the modes, checks them, prints the figures.
int Main(const examples::Flags& f, const GptConfig& config, kiln::Device device, kiln::DType dtype,
         uint64_t seed, int64_t batch, int64_t prompt_len, int64_t new_tokens, bool profiling) {
  const bool gpu = device.is_cuda();
  std::unique_ptr<Gpt> loaded = LoadModel(f, config, device, dtype, seed, true);
  Gpt& model = *loaded;
  std::printf("== GPT: %" PRId64 " layers, dim %" PRId64 ", %" PRId64 " heads, vocab %" PRId64
              ", ctx %" PRId64 "; batch %" PRId64 ", prompt %" PRId64 ", %" PRId64
              " new tokens, %s on %s ==\n",
              config.layers, config.dim, config.heads, config.vocab, config.ctx, batch, prompt_len,
              new_tokens, kiln::DTypeName(dtype), device.str().c_str());
  const Tensor prompt = MakePrompt(batch, prompt_len, config.vocab, seed, device);
  if (f.Bool("cuda-graphs") && !gpu) {
    std::printf("note: --cuda-graphs applies to CUDA devices only; not run on %s\n",
                device.str().c_str());
  }
  const bool cuda_graphs = f.Bool("cuda-graphs") && gpu;
  if (f.Bool("compile-latency")) return CompileLatency(model, prompt, cuda_graphs, gpu);
  const int warmup = static_cast<int>(f.Int("warmup")), iters = static_cast<int>(f.Int("iters"));
  Mode eager = EagerMode(model, prompt);
  eager.run = Measure(eager.prefill, eager.decode, eager.session, new_tokens, gpu, warmup, iters);
  bool ok = CheckCache(model, eager.run, prompt_len, dtype);
  std::vector<Mode*> modes = {&eager};
  std::optional<Mode> comp, graphed;
  if (f.Bool("compile") || profiling) {
    comp.emplace(CompiledMode(model, prompt, false, f.Str("dump")));
    if (cuda_graphs) graphed.emplace(CompiledMode(model, prompt, true, ""));
  }
  for (std::optional<Mode>* m : {&comp, &graphed}) {
    if (!m->has_value()) continue;
    Mode& mode = **m;
    mode.run = Measure(mode.prefill, mode.decode, mode.session, new_tokens, gpu, warmup, iters);
    ok &= CheckMode(mode, eager.run, prompt_len, dtype);
    modes.push_back(&mode);
  }
  PrintTable(modes, batch, gpu);
  int decode_kernels = 0;
  if (comp) {
    const auto [pk, pc] = StepKernels(*comp->compiled_prefill, comp->session.prefill_in);
    const auto [dk, dc] = StepKernels(*comp->compiled_decode, comp->session.decode_in);
    decode_kernels = dk;
    std::printf("kernels per step: prefill %d, decode %d (each + %d input copy-backs)\n", pk, dk,
                dc);
    if (graphed) {
      std::printf("CUDA graph: %s\n",
                  graphed->compiled_decode->report(graphed->session.decode_in).cuda_graph.c_str());
    }
  }
  PrintIds(modes.back()->run, prompt_len);
  if (const int tp = static_cast<int>(f.Int("tp")); tp > 1) {
    ok &= RunTensorParallel(f, tp, config, device, dtype, seed, batch, prompt_len, new_tokens,
                            eager.run);
  }
  if (profiling) ProfileStep(f, eager, *comp, graphed ? &*graphed : nullptr, gpu);
  if constexpr (kiln::kWithCuda) {
    if (profiling && gpu) std::printf("%s\n", kiln::cuda_ops::GemvDecisions().c_str());
  }
  if (f.Given("out")) WriteOut(f.Str("out"), prompt, *modes.back(), dtype);
  std::printf("RESULT %s\n", ResultJson(f, modes, dtype, decode_kernels, ok, gpu).c_str());
  if (!ok) std::printf("MISMATCH: a check failed (see above)\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln;
  examples::Flags f("05_gpt",
                    "[--write-weights FILE] [--weights FILE] [--layers L] [--dim D] [--heads H] "
                    "[--vocab V] [--ctx C] [--prompt-len T] [--new-tokens N] [--batch B] "
                    "[--dtype f32|bf16] [--device cpu|cuda] [--seed S] [--compile] "
                    "[--cuda-graphs] [--profile] [--profile-step decode|prefill] [--sort KEY] "
                    "[--trace FILE] [--compare] "
                    "[--out FILE] [--dump DIR] [--warmup W] [--iters I] [--compile-latency] "
                    "[--tp N]");
  DefineFlags(f);
  f.Parse(argc, argv);
  examples::CheckCommonFlags(f);
  if (!f.Given("device")) f.Define("device", cuda::IsAvailable() ? "cuda" : "cpu");
  const Device device = examples::ParseDeviceFlag(f);
  const bool gpu = device.is_cuda();
  const DType dtype = DTypeFromFlags(f, gpu);
  const GptConfig config = ConfigFromFlags(f, gpu);
  const uint64_t seed = static_cast<uint64_t>(Seed(f));
  const int64_t batch = f.Int("batch"), prompt_len = f.Int("prompt-len"),
                new_tokens = f.Int("new-tokens");
  const bool profiling = f.Bool("profile") || f.Bool("compare") || f.Given("trace");
  if (f.Str("profile-step") != "decode" && f.Str("profile-step") != "prefill") {
    f.Usage("--profile-step must be decode or prefill");
  }
  if (profiling && prompt_len + 24 > config.ctx) {
    f.Usage(
        "--profile, --trace and --compare run 20 more decode steps: need --prompt-len + 24 "
        "<= --ctx");
  }
  try {
    if (f.Given("write-weights")) {
      WriteWeights(config, seed, device, f.Str("write-weights"));
      return 0;
    }
    return Main(f, config, device, dtype, seed, batch, prompt_len, new_tokens, profiling);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
