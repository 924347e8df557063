// Whole models split over thread ranks (issue #33, on the CPU): a Llama-style model with
// grouped-query heads and every bias, sharded in place on 1, 2 and 4 ranks, gives the single
// model's logits (full forward and cached steps) and generate()'s greedy ids; the cache holds
// this rank's key/value heads; a split that does not divide is refused before anything changes;
// compiled (the forward, generate()'s compiled mode) a split model gives the same logits and ids;
// a tied LM head over a vocabulary that does not divide is split with padding, the logits whole;
// split while loading (meta model, to_empty, the whole checkpoint); sampled ids; bf16 logits
// within the numerics policy; a model that outlives its group says so.
#include <gtest/gtest.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/compile.h"
#include "io/state_dict.h"
#include "models/generate.h"
#include "models/llama.h"
#include "ops/distributed.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/random.h"
#include "tests/io_test_util.h"
#include "tests/numerics_policy.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

// 8 heads over 4 key/value heads: splits over 1, 2 and 4 ranks with the grouping kept.
LlamaConfig SplittableLlama() {
  LlamaConfig c;
  c.vocab = 96;
  c.dim = 64;
  c.hidden = 96;
  c.layers = 2;
  c.heads = 8;
  c.kv_heads = 4;
  c.qkv_bias = true;
  c.out_bias = true;
  c.mlp_bias = true;
  c.rope.max_positions = 64;
  return c;
}

// The same weights on every call (each rank builds its own copy, as each process would load
// the same checkpoint).
std::unique_ptr<LlamaForCausalLM> SeededLlama(const LlamaConfig& c) {
  Generator gen(33);
  return std::make_unique<LlamaForCausalLM>(c, ModuleOptions{.generator = &gen});
}

// The same seeded weights, this rank's part of them kept.
std::unique_ptr<LlamaForCausalLM> SplitLlama(const LlamaConfig& c, ProcessGroup& pg) {
  auto model = SeededLlama(c);
  model->ShardTensorParallel(pg);
  return model;
}

const std::vector<std::vector<int64_t>> kPrompts = {{5, 17, 2, 40, 33}, {9, 81, 4}};

// The single (unsplit) model's logits of `tokens` and greedy ids of kPrompts (6 new tokens).
std::pair<std::vector<double>, GenerateResult> WholeModelResults(const LlamaConfig& c,
                                                                 const Tensor& tokens) {
  auto whole = SeededLlama(c);
  return {to_vector((*whole)(tokens)), generate(*whole, kPrompts, {.max_new_tokens = 6})};
}

TEST(TensorParallelModels, LlamaSplitOverRanksGivesTheWholeModelsLogitsAndIds) {
  const LlamaConfig c = SplittableLlama();
  const Tensor tokens = from_vector({5, 17, 2, 40, 33, 9, 81, 4, 60, 1}, {2, 5}, DType::kInt64);
  const auto [want_logits, want] = WholeModelResults(c, tokens);
  for (int n : {1, 2, 4}) {
    std::mutex mu;
    RunThreadRanks(n, [&](ProcessGroup& pg) {
      auto model = SplitLlama(c, pg);
      const std::vector<double> logits = to_vector((*model)(tokens));
      const GenerateResult got = generate(*model, kPrompts, {.max_new_tokens = 6});
      const CausalLM::CacheSpec spec = model->cache_spec();
      std::lock_guard<std::mutex> lock(mu);
      const std::string at = "n " + std::to_string(n) + " rank " + std::to_string(pg.rank());
      EXPECT_EQ(spec.kv_heads, c.kv_heads / n) << at;
      ExpectClose(logits, want_logits, {2e-5, 2e-5}, at + " logits");
      ExpectClose(to_vector(got.prefill_logits), to_vector(want.prefill_logits), {2e-5, 2e-5},
                  at + " prefill logits");
      EXPECT_EQ(got.tokens, want.tokens) << at;
    });
  }
}

// Tied embeddings and a vocabulary that does not divide (97 over 2 and 4 ranks): the LM head is
// split by the vocabulary with zero rows padding the last rank, and the gathered logits are the
// single model's, eager and compiled.
TEST(TensorParallelModels, ATiedHeadSplitsAVocabularyThatDoesNotDivide) {
  LlamaConfig c = SplittableLlama();
  c.vocab = 97;
  c.tie_word_embeddings = true;
  const Tensor tokens = from_vector({5, 17, 2, 96, 33, 9, 81, 4, 60, 1}, {2, 5}, DType::kInt64);
  const auto [want_logits, want] = WholeModelResults(c, tokens);
  for (int n : {2, 4}) {
    std::mutex mu;
    RunThreadRanks(n, [&](ProcessGroup& pg) {
      auto model = SplitLlama(c, pg);
      const std::vector<double> logits = to_vector((*model)(tokens));
      GenerateOptions o;
      o.max_new_tokens = 6;
      o.mode = GenerateOptions::Mode::kCompiled;
      const GenerateResult got = generate(*model, kPrompts, o);
      std::lock_guard<std::mutex> lock(mu);
      const std::string at = "n " + std::to_string(n) + " rank " + std::to_string(pg.rank());
      ExpectClose(logits, want_logits, {2e-5, 2e-5}, at + " logits");
      ExpectClose(to_vector(got.prefill_logits), to_vector(want.prefill_logits), {1e-4, 1e-4},
                  at + " compiled prefill logits");
      EXPECT_EQ(got.tokens, want.tokens) << at;
    });
  }
}

// A split model used after its group is gone: a clear error, not a dangling group.
TEST(TensorParallelModels, AModelThatOutlivesItsGroupSaysSo) {
  const LlamaConfig c = SplittableLlama();
  auto model = SeededLlama(c);
  RunThreadRanks(1, [&](ProcessGroup& pg) { model->ShardTensorParallel(pg); });
  const Tensor tokens = from_vector({7, 8, 9}, {1, 3}, DType::kInt64);
  ExpectThrowsWith([&] { (*model)(tokens); }, "no longer exists",
                   "a split model must not outlive its group");
}

// Split while loading: each rank builds the model on the meta device (no memory), splits it,
// gives it memory (to_empty) and loads the whole checkpoint, which writes only its parts: no rank
// ever holds a whole layer; the logits are the single model's. Tied (the head's rows taken from
// the loaded embedding) and untied heads, a vocabulary that does not divide.
TEST(TensorParallelModels, SplitWhileLoadingGivesTheWholeModelsLogits) {
  for (const bool tied : {false, true}) {
    LlamaConfig c = SplittableLlama();
    c.vocab = 97;
    c.tie_word_embeddings = tied;
    auto whole = SeededLlama(c);
    const std::string file = TempPath(tied ? "tp_tied.safetensors" : "tp_untied.safetensors");
    save_state_dict(*whole, file, {.map = llama_save_mapping()});
    const Tensor tokens = from_vector({5, 17, 2, 96, 33, 9, 81, 4, 60, 1}, {2, 5}, DType::kInt64);
    const std::vector<double> want = to_vector((*whole)(tokens));
    for (int n : {2, 4}) {
      std::mutex mu;
      RunThreadRanks(n, [&](ProcessGroup& pg) {
        LlamaForCausalLM model(c, {.device = kMeta});
        model.ShardTensorParallel(pg);
        model.to_empty(kCPU);
        ExpectThrowsWith([&] { model(tokens); }, "never written");  // not loaded yet
        const LoadReport r = load_state_dict(model, file, {.map = llama_load_mapping()});
        const std::vector<double> got = to_vector(model(tokens));
        int64_t q_rows = 0;
        for (const auto& [name, p] : model.named_parameters()) {
          if (name == "layers.0.self_attn.q_proj.weight") q_rows = p.size(0);
        }
        std::lock_guard<std::mutex> lock(mu);
        const std::string at =
            absl::StrCat(tied ? "tied" : "untied", " n ", n, " rank ", pg.rank());
        EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty()) << at << " " << r.str();
        EXPECT_EQ(q_rows, c.dim / n) << at;
        ExpectClose(got, want, {2e-5, 2e-5}, at);
      });
    }
    std::remove(file.c_str());
  }
}

// A split model's own save (each rank's parts) loads back into a split model as it is.
TEST(TensorParallelModels, ARanksOwnSaveLoadsBack) {
  const LlamaConfig c = SplittableLlama();
  const Tensor tokens = from_vector({7, 8, 9, 10}, {1, 4}, DType::kInt64);
  std::mutex mu;
  RunThreadRanks(2, [&](ProcessGroup& pg) {
    auto saved = SplitLlama(c, pg);
    const std::string file = TempPath(absl::StrCat("tp_rank_", pg.rank(), ".safetensors"));
    save_state_dict(*saved, file);
    LlamaForCausalLM loaded(c, {.device = kMeta});
    loaded.ShardTensorParallel(pg);
    loaded.to_empty(kCPU);
    load_state_dict(loaded, file);
    const std::vector<double> got = to_vector(loaded(tokens)), want = to_vector((*saved)(tokens));
    std::remove(file.c_str());
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(got, want) << "rank " << pg.rank();
  });
}

// A checkpoint of another model's shape is refused naming the split, before anything is written.
TEST(TensorParallelModels, SplitLoadingRefusesAnotherShape) {
  LlamaConfig c = SplittableLlama(), other = c;
  other.hidden = 128;
  const std::string file = TempPath("tp_other.safetensors");
  save_state_dict(*SeededLlama(other), file, {.map = llama_save_mapping()});
  ExpectThrowsWith(
      [&] {
        RunThreadRanks(2, [&](ProcessGroup& pg) {
          LlamaForCausalLM model(c, {.device = kMeta});
          model.ShardTensorParallel(pg);
          model.to_empty(kCPU);
          load_state_dict(model, file, {.map = llama_load_mapping()});
        });
      },
      "size mismatch",
      "float32[64, 48] (this rank's part of [64, 96]), the checkpoint holds F32[64, 128]");
  std::remove(file.c_str());
}

// Sampled generation split over ranks: every rank draws from its own copy of the same logits with
// the same seed, so all ranks choose the single model's ids (eager and compiled).
TEST(TensorParallelModels, SampledIdsAreTheSingleModelsOnEveryRank) {
  const LlamaConfig c = SplittableLlama();
  GenerateOptions o;
  o.max_new_tokens = 8;
  o.sampling.temperature = 0.9;
  o.sampling.top_k = 20;
  o.seed = 7;
  const GenerateResult want = generate(*SeededLlama(c), kPrompts, o);
  for (const auto mode : {GenerateOptions::Mode::kEager, GenerateOptions::Mode::kCompiled}) {
    std::vector<GenerateResult> got(2);
    RunThreadRanks(2, [&](ProcessGroup& pg) {
      auto model = SplitLlama(c, pg);
      GenerateOptions mine = o;
      mine.mode = mode;
      got[pg.rank()] = generate(*model, kPrompts, mine);
    });
    EXPECT_EQ(got[0].tokens, want.tokens);
    EXPECT_EQ(got[1].tokens, want.tokens);
  }
}

// bf16: the split model's logits, eager and compiled, against the float32 reference (the same
// rounded weights in float32) within the numerics policy, relative to the single bf16 model's
// own error (the row-parallel sums round each rank's part before the reduction).
TEST(TensorParallelModels, Bf16SplitLogitsAreWithinTheNumericsPolicy) {
  const LlamaConfig c = SplittableLlama();
  const Tensor tokens = from_vector({5, 17, 2, 40, 33, 9, 81, 4, 60, 1}, {2, 5}, DType::kInt64);
  auto single = SeededLlama(c);
  single->to(DType::kBFloat16);
  auto reference = SeededLlama(c);
  reference->to(DType::kBFloat16);
  reference->to(DType::kFloat32);
  const Tensor eager = (*single)(tokens), want = (*reference)(tokens);
  for (int n : {2, 4}) {
    std::mutex mu;
    RunThreadRanks(n, [&](ProcessGroup& pg) {
      auto model = SeededLlama(c);
      model->to(DType::kBFloat16);
      model->ShardTensorParallel(pg);
      const Tensor got = (*model)(tokens);
      const Tensor compiled =
          compile(*model, tokens, {.mode = CompileOptions::Mode::kCompiled})({tokens})[0];
      std::lock_guard<std::mutex> lock(mu);
      const std::string at = absl::StrCat("n ", n, " rank ", pg.rank());
      ExpectWithinPolicy({got}, {eager}, {want}, at + " eager");
      ExpectWithinPolicy({compiled}, {eager}, {want}, at + " compiled");
    });
  }
}

// A split model converted after the split (Module::to) computes exactly what one converted
// before it does: its tied head reads the converted embedding (a view of its rows, not a copy
// made at the split).
TEST(TensorParallelModels, ASplitTiedModelConvertedAfterTheSplit) {
  LlamaConfig c = SplittableLlama();
  c.vocab = 97;
  c.tie_word_embeddings = true;
  const Tensor tokens = from_vector({5, 17, 2, 96, 33, 9}, {1, 6}, DType::kInt64);
  std::mutex mu;
  RunThreadRanks(2, [&](ProcessGroup& pg) {
    auto after = SeededLlama(c), before = SeededLlama(c);
    after->ShardTensorParallel(pg);
    after->to(DType::kBFloat16);
    before->to(DType::kBFloat16);
    before->ShardTensorParallel(pg);
    const Tensor got = (*after)(tokens), want = (*before)(tokens);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(got.dtype(), DType::kBFloat16);
    EXPECT_EQ(to_vector(got), to_vector(want)) << "rank " << pg.rank();
  });
}

TEST(TensorParallelModels, EveryRankGetsTheSameBits) {
  const LlamaConfig c = SplittableLlama();
  const Tensor tokens = from_vector({3, 1, 4, 1, 5, 9}, {1, 6}, DType::kInt64);
  std::vector<std::vector<double>> per_rank(2);
  RunThreadRanks(2, [&](ProcessGroup& pg) {
    auto model = SplitLlama(c, pg);
    per_rank[pg.rank()] = to_vector((*model)(tokens));
  });
  EXPECT_EQ(per_rank[0], per_rank[1]);
}

TEST(TensorParallelModels, ASplitThatDoesNotDivideLeavesTheModelWhole) {
  const LlamaConfig c = SplittableLlama();
  const Tensor tokens = from_vector({7, 8, 9}, {1, 3}, DType::kInt64);
  ExpectThrowsWith(
      [&] {
        RunThreadRanks(3, [&](ProcessGroup& pg) {
          auto model = SeededLlama(c);
          const std::vector<double> before = to_vector((*model)(tokens));
          try {
            model->ShardTensorParallel(pg);
          } catch (const Error&) {
            // Refused before any layer changed: the model still computes the whole result.
            EXPECT_EQ(to_vector((*model)(tokens)), before);
            EXPECT_EQ(model->cache_spec().kv_heads, c.kv_heads);
            throw;
          }
        });
      },
      "8 heads, 4 key/value heads and 96 MLP features must all split over 3 ranks");
  ExpectThrowsWith(
      [&] {
        RunThreadRanks(2, [&](ProcessGroup& pg) {
          auto model = SeededLlama(c);
          model->ShardTensorParallel(pg);
          model->ShardTensorParallel(pg);
        });
      },
      "already sharded over 2 ranks");
}

// Compiled: the all-reduces are nodes of the traced graphs (fusion stops at them), so a split
// model's forward compiles, and generate()'s compiled mode (prefill and one decode plan) gives the
// single model's ids.
TEST(TensorParallelModels, CompiledSplitModelGivesTheWholeModelsLogitsAndIds) {
  const LlamaConfig c = SplittableLlama();
  const Tensor tokens = from_vector({5, 17, 2, 40, 33, 9, 81, 4, 60, 1}, {2, 5}, DType::kInt64);
  const auto [want_logits, want] = WholeModelResults(c, tokens);
  for (int n : {2, 4}) {
    std::mutex mu;
    RunThreadRanks(n, [&](ProcessGroup& pg) {
      auto model = SplitLlama(c, pg);
      const CompiledFn forward = compile(*model, tokens, {.mode = CompileOptions::Mode::kCompiled});
      const std::vector<double> logits = to_vector(forward({tokens})[0]);
      const std::string graph = forward.report({tokens}).final_graph;
      GenerateOptions o;
      o.max_new_tokens = 6;
      o.mode = GenerateOptions::Mode::kCompiled;
      const GenerateResult got = generate(*model, kPrompts, o);
      std::lock_guard<std::mutex> lock(mu);
      const std::string at = "n " + std::to_string(n) + " rank " + std::to_string(pg.rank());
      ExpectClose(logits, want_logits, {1e-4, 1e-4}, at + " compiled logits");
      EXPECT_EQ(got.tokens, want.tokens) << at;
      // Two all-reduces a layer (attention's and the MLP's last projections), each its own node.
      size_t count = 0;
      for (size_t at_pos = graph.find("all_reduce("); at_pos != std::string::npos;
           at_pos = graph.find("all_reduce(", at_pos + 1)) {
        ++count;
      }
      EXPECT_EQ(count, 2u * c.layers) << graph;
    });
  }
}

}  // namespace
}  // namespace kiln
