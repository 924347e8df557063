// The GPT example's model (examples/gpt.h): the KV cache against a full forward, the compiled
// prefill and decode steps against eager (in-place writes to the caches and the decode state),
// the GPT-2 loader on a hand-made HF-layout file; and a tracer regression it found.
#include "examples/gpt.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/compile.h"
#include "codegen/executable.h"
#include "io/safetensors.h"
#include "io/state_dict.h"
#include "ops/distributed.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

CompileOptions Compiled() {
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  o.freeze_weights = true;
  return o;
}

// A tensor the traced function makes (full()) after traced temporaries died must stay a
// constant: the tracer keyed placeholders by storage address, and a freed placeholder's address
// coming back for the new tensor made it read as a window of an unrelated traced value.
TEST(TraceRegression, TensorMadeAfterTemporariesDieIsAConstant) {
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor x = in[0];
    for (int i = 0; i < 16; ++i) x = x * 2.0 + 1.0;  // temporaries, freed while tracing
    const Tensor c = full({1}, 3, DType::kInt64);
    return std::vector<Tensor>{x, in[1] + c};
  };
  const std::vector<Tensor> in = {ones({4}), from_vector({5}, {1}, DType::kInt64)};
  const auto eager = fn(in);
  const auto compiled = compile(fn, in, Compiled())(in);
  EXPECT_EQ(to_vector(compiled[0]), to_vector(eager[0]));
  EXPECT_EQ(to_vector<int64_t>(compiled[1]), std::vector<int64_t>{8});
}

examples::GptConfig TinyConfig() {
  return {.layers = 2, .dim = 16, .heads = 2, .vocab = 32, .ctx = 16};
}

struct Tiny {
  Generator gen{0};
  examples::Gpt model{TinyConfig(), gen};
  Tiny() { examples::InitGpt2Weights(model, 7); }
};

Tensor Prompt() { return from_vector({3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, {2, 5}, DType::kInt64); }

void ExpectNear(const Tensor& a, const Tensor& b, double tol) {
  const auto va = to_vector(a), vb = to_vector(b);
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) ASSERT_NEAR(va[i], vb[i], tol) << "element " << i;
}

// Row t of logits [B, T, V] as [B, V].
Tensor Row(const Tensor& logits, int64_t t) { return squeeze(slice(logits, 1, t, t + 1), 1); }

TEST(GptKvCache, EachDecodeStepMatchesAFullForward) {
  Tiny t;
  const Tensor prompt = Prompt();
  examples::KvCache cache = t.model.NewCache(2);
  examples::DecodeState state = t.model.NewState(2);
  const Tensor prefill = t.model.Prefill(examples::Gpt::PrefillInputs(prompt, cache, state))[0];
  EXPECT_EQ(to_vector<int64_t>(state.pos), std::vector<int64_t>{5});
  ExpectNear(prefill, Row(t.model(prompt), 4), 1e-5);
  for (int64_t pos = 5; pos < 12; ++pos) {
    const Tensor logits = t.model.Decode(examples::Gpt::DecodeInputs(cache, state))[0];
    const Tensor seen = slice(state.ids, 1, 0, pos + 1);  // ids 0 .. pos, the last one fed now
    ExpectNear(logits, Row(t.model(seen), pos), 1e-5);
    EXPECT_EQ(to_vector<int64_t>(state.pos), std::vector<int64_t>{pos + 1});
    EXPECT_EQ(to_vector<int64_t>(state.tokens), to_vector<int64_t>(argmax(logits, -1)));
  }
}

TEST(GptKvCache, CompiledStepsMatchEagerAndCompileOnce) {
  Tiny t;
  const Tensor prompt = Prompt();
  examples::KvCache ce = t.model.NewCache(2), cc = t.model.NewCache(2);
  examples::DecodeState se = t.model.NewState(2), sc = t.model.NewState(2);
  const auto pe = examples::Gpt::PrefillInputs(prompt, ce, se);
  const auto pc = examples::Gpt::PrefillInputs(prompt, cc, sc);
  const auto de = examples::Gpt::DecodeInputs(ce, se), dc = examples::Gpt::DecodeInputs(cc, sc);
  auto& m = t.model;
  CompiledFn prefill =
      compile([&m](const std::vector<Tensor>& in) { return m.Prefill(in); }, pc, Compiled());
  CompiledFn decode =
      compile([&m](const std::vector<Tensor>& in) { return m.Decode(in); }, dc, Compiled());
  ExpectNear(prefill(pc)[0], m.Prefill(pe)[0], 1e-5);
  for (int i = 0; i < 8; ++i) ExpectNear(decode(dc)[0], m.Decode(de)[0], 1e-5);
  EXPECT_EQ(to_vector<int64_t>(sc.ids), to_vector<int64_t>(se.ids));
  EXPECT_EQ(to_vector<int64_t>(sc.pos), std::vector<int64_t>{13});
  for (size_t l = 0; l < ce.k.size(); ++l) {
    ExpectNear(cc.k[l], ce.k[l], 1e-5);
    ExpectNear(cc.v[l], ce.v[l], 1e-5);
  }
  EXPECT_EQ(decode.compilations(), 1);  // one plan serves every position
  EXPECT_EQ(prefill.compilations(), 1);
  // The caches are written in place: none of them is an intermediate or an output the step's
  // memory plan allocates (what sizes a CUDA graph's arena).
  int64_t cache_bytes = 0;
  for (const Tensor& k : cc.k) cache_bytes += 2 * k.numel() * 4;
  const CompileReport& r = decode.report(dc);
  EXPECT_LT(r.planned_peak_bytes, cache_bytes / 4)
      << "caches " << cache_bytes << " bytes; " << absl::StrJoin(r.explain, "\n");
  const int64_t logits_bytes = 2 * TinyConfig().vocab * 4;
  EXPECT_GE(decode.executable(dc).planned_output_bytes(), logits_bytes);
  EXPECT_LT(decode.executable(dc).planned_output_bytes(), logits_bytes + cache_bytes / 4);
}

TEST(GptKvCache, BadInputIsAnError) {
  Tiny t;
  examples::KvCache cache = t.model.NewCache(2);
  examples::DecodeState state = t.model.NewState(2);
  std::vector<Tensor> in = examples::Gpt::DecodeInputs(cache, state);
  in.pop_back();
  EXPECT_THROW(t.model.Decode(in), Error);
  const Tensor long_prompt = zeros({2, 16}, DType::kInt64);  // T must be < ctx
  EXPECT_THROW(t.model.Prefill(examples::Gpt::PrefillInputs(long_prompt, cache, state)), Error);
  EXPECT_THROW(examples::Gpt({.layers = 1, .dim = 10, .heads = 3, .vocab = 4, .ctx = 4}, t.gen),
               Error);
}

// Tensor parallelism over thread ranks (issue #33, CPU): the model split over 2 and 4 ranks
// (4 heads, c_attn's q/k/v blocks each split by heads) gives the whole model's logits from a full
// forward, the prefill and every decode step, eager and compiled, and the same greedy ids; its
// cache holds this rank's heads; 3 ranks are refused before anything changes.
TEST(GptTensorParallel, SplitOverRanksGivesTheWholeModelsLogitsAndIds) {
  const examples::GptConfig c = {.layers = 2, .dim = 32, .heads = 4, .vocab = 32, .ctx = 16};
  auto make = [&c] {
    Generator gen(0);
    auto m = std::make_unique<examples::Gpt>(c, gen);
    examples::InitGpt2Weights(*m, 11);
    return m;
  };
  const Tensor prompt = Prompt();
  // The whole model: full logits, then prefill and 6 decode steps, eager or compiled (a split
  // model's all-reduces are nodes of the traced graphs).
  auto run = [&prompt](examples::Gpt& m, bool compiled, std::vector<std::vector<double>>* out) {
    auto step = [&](std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn) {
      if (!compiled) return fn;
      auto f = std::make_shared<std::optional<CompiledFn>>();
      return std::function<std::vector<Tensor>(const std::vector<Tensor>&)>(
          [fn, f](const std::vector<Tensor>& in) {
            if (!f->has_value()) f->emplace(compile(fn, in, Compiled()));
            return (**f)(in);
          });
    };
    auto full = step([&m](const std::vector<Tensor>& in) { return std::vector<Tensor>{m(in[0])}; });
    auto prefill = step([&m](const std::vector<Tensor>& in) { return m.Prefill(in); });
    auto decode = step([&m](const std::vector<Tensor>& in) { return m.Decode(in); });
    out->push_back(to_vector(full({prompt})[0]));
    examples::KvCache cache = m.NewCache(2);
    examples::DecodeState state = m.NewState(2);
    out->push_back(to_vector(prefill(examples::Gpt::PrefillInputs(prompt, cache, state))[0]));
    for (int i = 0; i < 6; ++i) {
      out->push_back(to_vector(decode(examples::Gpt::DecodeInputs(cache, state))[0]));
    }
    const std::vector<double> ids = to_vector(state.ids);
    out->push_back(ids);
    return cache.k[0].size(1);
  };
  std::vector<std::vector<double>> want;
  run(*make(), false, &want);
  for (const bool compiled : {false, true}) {
    for (int n : {2, 4}) {
      std::mutex mu;
      RunThreadRanks(n, [&](ProcessGroup& pg) {
        auto m = make();
        m->ShardTensorParallel(pg);
        std::vector<std::vector<double>> got;
        const int64_t heads = run(*m, compiled, &got);
        std::lock_guard<std::mutex> lock(mu);
        const std::string at =
            absl::StrCat(compiled ? "compiled" : "eager", " n ", n, " rank ", pg.rank());
        EXPECT_EQ(heads, 4 / n) << at;
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i + 1 < want.size(); ++i) {
          ExpectClose(got[i], want[i], {2e-5, 2e-5}, at + " logits " + std::to_string(i));
        }
        EXPECT_EQ(got.back(), want.back()) << at << ": ids";
      });
    }
  }
  ExpectThrowsWith(
      [&] {
        RunThreadRanks(3, [&](ProcessGroup& pg) {
          auto m = make();
          try {
            m->ShardTensorParallel(pg);
          } catch (const Error&) {
            EXPECT_EQ(m->NewCache(1).k[0].size(1), 4);  // still whole
            throw;
          }
        });
      },
      "4 heads and 128 MLP features must split over 3 ranks");
  // A second split, even after one over a single rank, is refused before anything changes.
  auto m = make();
  RunThreadRanks(1, [&](ProcessGroup& pg) { m->ShardTensorParallel(pg); });
  ExpectThrowsWith(
      [&] { RunThreadRanks(2, [&](ProcessGroup& pg) { m->ShardTensorParallel(pg); }); },
      "already sharded over 1 ranks");
}

// Split while loading GPT-2's layout (Conv1D weights stored transposed, c_attn's q/k/v blocks
// each split by heads): built on meta, split, given memory, loaded; the whole model's logits.
TEST(GptTensorParallel, SplitWhileLoadingAHfFile) {
  const examples::GptConfig c = {.layers = 2, .dim = 32, .heads = 4, .vocab = 30, .ctx = 16};
  Generator gen(0);
  examples::Gpt whole(c, gen);
  examples::InitGpt2Weights(whole, 11);
  const std::string file = ::testing::TempDir() + "/kiln_gpt_tp_" + std::to_string(getpid());
  save_state_dict(whole, file, {.map = gpt2_save_mapping()});
  const Tensor prompt = Prompt();
  const std::vector<double> want = to_vector(whole(prompt));
  std::mutex mu;
  RunThreadRanks(4, [&](ProcessGroup& pg) {
    Generator unused(0);
    examples::Gpt m(c, unused, {.device = kMeta});
    m.ShardTensorParallel(pg);
    m.to_empty(kCPU);
    load_state_dict(m, file, {.map = gpt2_load_mapping()});
    const std::vector<double> got = to_vector(m(prompt));
    std::lock_guard<std::mutex> lock(mu);
    ExpectClose(got, want, {2e-5, 2e-5}, "rank " + std::to_string(pg.rank()));
  });
  std::remove(file.c_str());
}

// A hand-made file in Hugging Face's GPT2LMHeadModel layout: "transformer." prefixes, Conv1D
// weights [in, out], the attention-mask buffers and the tied lm_head.
TEST(GptLoader, MapsAHandMadeHfGpt2File) {
  const examples::GptConfig c{.layers = 1, .dim = 4, .heads = 2, .vocab = 6, .ctx = 3};
  Generator gen(0);
  examples::Gpt model(c, gen);
  NamedTensors file;
  std::map<std::string, Tensor> expected;  // kiln name -> kiln layout
  std::map<std::string, Tensor> hf_of;     // kiln name -> HF layout
  double next = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    const bool conv1d = absl::StrContains(name, "attn.c_") || absl::StrContains(name, "mlp.c_");
    const bool transpose = conv1d && absl::EndsWith(name, ".weight");
    std::vector<double> v(p.numel());
    for (double& x : v) x = next++;
    const Tensor hf =
        transpose ? from_vector(v, {p.size(1), p.size(0)}) : from_vector(v, p.shape());
    file.emplace_back("transformer." + name, hf);
    hf_of[name] = hf;
    expected[name] = transpose ? contiguous(t(hf)) : hf;
  }
  file.emplace_back("transformer.h.0.attn.bias", ones({1, 1, 3, 3}));
  file.emplace_back("transformer.h.0.attn.masked_bias", ones({1}));
  file.emplace_back("lm_head.weight", ones({6, 4}));
  const SafetensorsFile f = SafetensorsFile::FromBytes(serialize_safetensors(file), "hf");
  LoadOptions o;
  o.map = gpt2_load_mapping();
  const LoadReport r = load_state_dict(model, f, o);
  EXPECT_EQ(r.loaded.size(), model.named_parameters().size());
  EXPECT_EQ(r.dropped_keys.size(), 3u);
  for (const auto& [name, p] : model.named_parameters()) {
    EXPECT_EQ(to_vector(p), to_vector(expected.at(name))) << name;
  }
  // And back: gpt2_save_mapping writes the Conv1D weights [in, out] again.
  std::map<std::string, Tensor> saved;
  for (const auto& [name, w] : state_dict(model, gpt2_save_mapping())) saved[name] = w;
  ASSERT_EQ(saved.count("h.0.attn.c_attn.weight"), 1u);
  EXPECT_EQ(saved["h.0.attn.c_attn.weight"].shape(), Shape({4, 12}));
  EXPECT_EQ(to_vector(saved["h.0.mlp.c_fc.weight"]), to_vector(hf_of.at("h.0.mlp.c_fc.weight")));
}

}  // namespace
}  // namespace kiln
