// generate() over a CausalLM (see generate.h): left padding, the prefill, the fixed-shape decode
// step (eager, compiled or CUDA graph) and the host loop that picks ids and stops rows.
#include "models/generate.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "codegen/compile.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/random.h"
#include "runtime/status.h"

namespace kiln {
namespace {

using Mode = GenerateOptions::Mode;

void CheckPrompts(const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& o,
                  const CausalLM::CacheSpec& spec) {
  KILN_CHECK(!prompts.empty(), "generate: no prompts");
  check_sampling_options(o.sampling);
  KILN_CHECK(o.max_new_tokens > 0, "generate: max_new_tokens must be positive, got ",
             o.max_new_tokens);
  KILN_CHECK(o.pad_token >= 0 && o.pad_token < spec.vocab, "generate: pad_token ", o.pad_token,
             " is not an id of the vocabulary [0, ", spec.vocab, ")");
  for (size_t i = 0; i < prompts.size(); ++i) {
    KILN_CHECK(!prompts[i].empty(), "generate: prompt ", i, " is empty");
    KILN_CHECK(static_cast<int64_t>(prompts[i].size()) <= spec.max_positions - o.max_new_tokens,
               "generate: prompt ", i, " has ", prompts[i].size(), " tokens; with max_new_tokens ",
               o.max_new_tokens, " that passes the model's ", spec.max_positions, " positions");
    for (int64_t id : prompts[i]) {
      KILN_CHECK(id >= 0 && id < spec.vocab, "generate: prompt ", i, " holds id ", id,
                 ", outside the vocabulary [0, ", spec.vocab, ")");
    }
  }
}

// The device tensors of one generation: inputs of the steps, written between steps.
struct Buffers {
  int64_t batch = 0, prompt_len = 0, capacity = 0;
  KvCache cache;
  Tensor prompt, prompt_positions, prompt_slots, prompt_mask;  // the prefill's inputs
  Tensor tokens;                                               // int64 [B, 1]: the next tokens
  Tensor slot;                                                 // int64 [1]: their cache slot
  Tensor pad;    // int64 [B, 1]: each row's padding length
  Tensor slots;  // int64 [S]: 0 .. S-1
  Tensor one;    // int64 [1]: 1 (the slot's step)
};

// Left-padded prompt, its positions (0 on padding) and the prefill's mask: row b's token i sees
// slot s iff pad_b <= s <= i.
Buffers MakeBuffers(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                    const GenerateOptions& o) {
  const CausalLM::CacheSpec spec = model.cache_spec();
  Buffers b;
  b.batch = static_cast<int64_t>(prompts.size());
  for (const auto& p : prompts) b.prompt_len = std::max<int64_t>(b.prompt_len, p.size());
  b.capacity = b.prompt_len + o.max_new_tokens;
  std::vector<double> ids, positions, pads, mask;
  for (const auto& p : prompts) {
    const int64_t pad = b.prompt_len - static_cast<int64_t>(p.size());
    pads.push_back(static_cast<double>(pad));
    for (int64_t i = 0; i < b.prompt_len; ++i) {
      ids.push_back(i < pad ? static_cast<double>(o.pad_token) : static_cast<double>(p[i - pad]));
      positions.push_back(static_cast<double>(std::max<int64_t>(0, i - pad)));
      for (int64_t s = 0; s < b.capacity; ++s) mask.push_back(s >= pad && s <= i ? 1 : 0);
    }
  }
  const Device d = spec.device;
  b.cache = model.NewCache(b.batch, b.capacity);
  b.prompt = from_vector(ids, {b.batch, b.prompt_len}, DType::kInt64, d);
  b.prompt_positions = from_vector(positions, {b.batch, b.prompt_len}, DType::kInt64, d);
  b.prompt_slots = arange(b.prompt_len, DType::kInt64, d);
  b.prompt_mask = from_vector(mask, {b.batch, 1, b.prompt_len, b.capacity}, DType::kBool, d);
  b.tokens = zeros({b.batch, 1}, DType::kInt64, d);
  b.slot = full({1}, static_cast<double>(b.prompt_len), DType::kInt64, d);
  b.pad = from_vector(pads, {b.batch, 1}, DType::kInt64, d);
  b.slots = arange(b.capacity, DType::kInt64, d);
  b.one = ones({1}, DType::kInt64, d);
  return b;
}

std::vector<Tensor> CacheList(const KvCache& cache) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < cache.k.size(); ++i) {
    out.push_back(cache.k[i]);
    out.push_back(cache.v[i]);
  }
  return out;
}

KvCache CacheOf(const std::vector<Tensor>& in, size_t first) {
  KvCache cache;
  for (size_t i = first; i + 1 < in.size(); i += 2) {
    cache.k.push_back(in[i]);
    cache.v.push_back(in[i + 1]);
  }
  return cache;
}

// The prefill as a function of {prompt, positions, slots, mask, k_0, v_0, ...}.
std::vector<Tensor> Prefill(CausalLM& model, const std::vector<Tensor>& in) {
  return {model.Step({in[0], in[1], in[2], in[3], CacheOf(in, 4)})};
}

// One decode step as a function of {tokens, slot, pad, slots, one, k_0, v_0, ...}: positions
// and mask are computed inside from the slot and each row's padding, so nothing but the tokens
// and the slot changes between steps, and the step itself advances the slot (in place).
std::vector<Tensor> Decode(CausalLM& model, const std::vector<Tensor>& in) {
  const Tensor &tokens = in[0], &slot = in[1], &pad = in[2], &slots = in[3], &one = in[4];
  const int64_t batch = tokens.size(0), capacity = slots.size(0);
  const Tensor positions = slot - pad;                              // [B, 1]
  const Tensor after_pad = ge(reshape(slots, {1, capacity}), pad);  // [B, S]
  const Tensor written = le(reshape(slots, {1, capacity}), slot);   // [1, S]
  const Tensor visible = where(after_pad, written, after_pad);      // both (a logical and)
  const Tensor mask = reshape(visible, {batch, 1, 1, capacity});
  const Tensor logits = model.Step({tokens, positions, slot, mask, CacheOf(in, 5)});
  copy_(slot, slot + one);
  return {logits};
}

// A step's logits must be [B, vocab] of a floating type (a model written by a user returns them).
void CheckLogits(const Tensor& logits, int64_t batch, const CausalLM::CacheSpec& spec,
                 const char* step) {
  KILN_CHECK(logits.defined() && logits.dim() == 2 && logits.size(0) == batch &&
                 logits.size(1) == spec.vocab && IsFloatingPoint(logits.dtype()),
             "generate: the model's Step must return floating logits [B, vocab] = [", batch, ", ",
             spec.vocab, "], the ", step, " returned ",
             logits.defined() ? absl::StrCat(DTypeName(logits.dtype()), logits.shape_string())
                              : "an undefined tensor");
}

// The next ids, one per row, on the host.
std::vector<int64_t> Pick(const Tensor& logits, const GenerateOptions& o, Generator& gen) {
  if (o.sampling.temperature == 0) {  // greedy: top_k and top_p change nothing
    return to_vector<int64_t>(argmax(cast(logits, DType::kFloat32), -1));
  }
  const int64_t batch = logits.size(0), vocab = logits.size(1);
  const std::vector<float> all = to_vector<float>(cast(logits, DType::kFloat32));
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<float> row(all.begin() + b * vocab, all.begin() + (b + 1) * vocab);
    ids.push_back(sample_token(row, o.sampling, gen.Uniform()));
  }
  return ids;
}

}  // namespace

GenerateResult generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& o) {
  const CausalLM::CacheSpec spec = model.CheckedCacheSpec("generate");
  KILN_CHECK(!spec.device.is_meta(), "generate: ", model.type_name(),
             " is on the meta device (shapes, no values): give it memory (to_empty) and load its "
             "weights first");
  CheckPrompts(prompts, o, spec);
  KILN_CHECK(o.mode != Mode::kCudaGraph || spec.device.is_cuda(),
             "generate: Mode::kCudaGraph needs a CUDA model, the model is on ", spec.device.str());
  Buffers b = MakeBuffers(model, prompts, o);
  std::vector<Tensor> prefill_in = {b.prompt, b.prompt_positions, b.prompt_slots, b.prompt_mask};
  std::vector<Tensor> decode_in = {b.tokens, b.slot, b.pad, b.slots, b.one};
  for (const Tensor& t : CacheList(b.cache)) {
    prefill_in.push_back(t);
    decode_in.push_back(t);
  }
  using StepFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  StepFn prefill = [&model](const std::vector<Tensor>& in) { return Prefill(model, in); };
  StepFn decode = [&model](const std::vector<Tensor>& in) { return Decode(model, in); };
  std::optional<CompiledFn> compiled_prefill, compiled_decode;
  if (o.mode != Mode::kEager) {
    CompileOptions co;
    co.mode = CompileOptions::Mode::kCompiled;
    co.freeze_weights = true;
    co.tensor_names = [&model] { return model.named_tensors(); };
    compiled_prefill.emplace(compile(prefill, prefill_in, co));
    co.cuda_graphs = o.mode == Mode::kCudaGraph;
    compiled_decode.emplace(compile(decode, decode_in, co));
    prefill = *compiled_prefill;
    decode = *compiled_decode;
  }

  GenerateResult r;
  r.tokens.resize(prompts.size());
  r.stopped.assign(prompts.size(), false);
  Generator gen(o.seed);
  Tensor logits = prefill(prefill_in)[0];
  CheckLogits(logits, b.batch, spec, "prefill");
  r.prefill_logits = clone(cast(logits, DType::kFloat32));
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    if (step > 0) {
      logits = Tensor();  // a CUDA graph's outputs may be reused once dropped
      logits = decode(decode_in)[0];
      CheckLogits(logits, b.batch, spec, "decode step");
    }
    ++r.steps;
    std::vector<int64_t> ids = Pick(logits, o, gen);
    bool any_running = false;
    for (size_t row = 0; row < ids.size(); ++row) {
      if (r.stopped[row]) {
        ids[row] = -1;
        continue;
      }
      r.tokens[row].push_back(ids[row]);
      r.stopped[row] =
          std::find(o.stop_tokens.begin(), o.stop_tokens.end(), ids[row]) != o.stop_tokens.end();
      any_running |= !r.stopped[row];
    }
    if (o.on_step && !o.on_step(step, ids)) break;
    if (!any_running || step + 1 == o.max_new_tokens) break;
    std::vector<double> next;
    for (int64_t id : ids) next.push_back(static_cast<double>(id < 0 ? o.pad_token : id));
    copy_(b.tokens, from_vector(next, {b.batch, 1}, DType::kInt64, spec.device));
  }
  if (compiled_decode && r.steps > 1) {
    r.kernels_per_decode_step = compiled_decode->report(decode_in).kernels_per_step;
  }
  return r;
}

}  // namespace kiln
