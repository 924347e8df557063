// Llama-style models and generation (models/): the grouped-query Attention module against the
// math written out, rotary tables in float32 and their scaling rules, modules made without
// values (Init::kNone) and loads into them, checkpoint mappings that join and split tensors,
// LlamaForCausalLM's cached steps against its full forward, generate() (left-padded batches equal
// each prompt alone, compiled equals eager, stop tokens), sampling against its distribution
// (a chi-square test over 10,000 draws) and the same ids from one seed on CPU and CUDA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "io/state_dict.h"
#include "models/generate.h"
#include "models/llama.h"
#include "models/sampling.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/random.h"
#include "runtime/status.h"
#include "tests/io_test_util.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

std::map<std::string, Tensor> Params(const Module& m) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : m.named_parameters()) out[name] = t;
  return out;
}

// k/v heads [B, Hkv, T, D] repeated to [B, Hkv * g, T, D] (head h reads kv head h / g).
Tensor RepeatHeads(const Tensor& t, int64_t g) {
  const int64_t b = t.size(0), h = t.size(1), n = t.size(2), d = t.size(3);
  return reshape(expand(unsqueeze(t, 2), {b, h, g, n, d}), {b, h * g, n, d});
}

TEST(Attention, GroupedQueryHeadsMatchTheMathWrittenOut) {
  Generator gen(1);
  const AttentionConfig c{.dim = 32, .heads = 4, .kv_heads = 2, .rotary = true};
  Attention attn(c, {.generator = &gen});
  std::vector<std::string> names;
  for (const auto& [name, t] : attn.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"q_proj.weight", "k_proj.weight", "v_proj.weight",
                                             "o_proj.weight"}));
  auto p = Params(attn);
  EXPECT_EQ(p["k_proj.weight"].shape(), (Shape{16, 32}));  // kv_heads * head_dim
  const Tensor x = randn({2, 5, 32}, gen);
  auto heads = [](const Tensor& t, int64_t n) {
    return permute(reshape(t, {2, 5, n, 8}), {0, 2, 1, 3});
  };
  RotaryEmbedding rope(8, RopeOptions{});
  const Tensor q = rope(heads(linear(x, p["q_proj.weight"]), 4));
  const Tensor k = rope(heads(linear(x, p["k_proj.weight"]), 2));
  const Tensor v = heads(linear(x, p["v_proj.weight"]), 2);
  const Tensor y = causal_attention(q, RepeatHeads(k, 2), RepeatHeads(v, 2));
  const Tensor want = linear(reshape(permute(y, {0, 2, 1, 3}), {2, 5, 32}), p["o_proj.weight"]);
  ExpectClose(to_vector(attn(x)), to_vector(want), {1e-5, 1e-5}, "gqa attention");
  // A mask with undefined positions: the positions are 0 .. T-1, as forward's.
  const Tensor causal = logical_not(triu(ones({5, 5}, DType::kBool), 1));
  ExpectClose(to_vector(attn.forward_many({x, Tensor(), causal})[0]), to_vector(want), {1e-5, 1e-5},
              "mask, positions undefined");
  EXPECT_NE(ErrorOf([] {
              Attention({.dim = 32, .heads = 4, .kv_heads = 3});
            }).find("kv_heads divide heads"),
            std::string::npos);
}

// Qwen3's q/k norms: RMSNorm over each head's head_dim (one weight [head_dim] shared by the
// heads) after the projections and before the rotary embedding, written out.
TEST(Attention, QkNormsNormaliseEachHeadBeforeTheRotation) {
  Generator gen(11);
  constexpr double eps = 1e-6;
  const AttentionConfig c{
      .dim = 32, .heads = 4, .kv_heads = 2, .head_dim = 8, .qk_norm = true, .qk_norm_eps = eps};
  Attention attn(c, {.generator = &gen});
  std::vector<std::string> names;
  for (const auto& [name, t] : attn.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"q_proj.weight", "k_proj.weight", "v_proj.weight",
                                             "o_proj.weight", "q_norm.weight", "k_norm.weight"}));
  auto p = Params(attn);
  EXPECT_EQ(p["q_norm.weight"].shape(), (Shape{8}));
  copy_(p["q_norm.weight"], randn({8}, gen));
  copy_(p["k_norm.weight"], randn({8}, gen));
  const Tensor x = randn({2, 5, 32}, gen);
  auto heads = [](const Tensor& t, int64_t n, const Tensor& w) {
    Tensor h = reshape(t, {2, 5, n, 8});
    if (w.defined()) h = h * rsqrt(mean(h * h, {-1}, true) + eps) * w;
    return permute(h, {0, 2, 1, 3});
  };
  RotaryEmbedding rope(8, RopeOptions{});
  const Tensor q = rope(heads(linear(x, p["q_proj.weight"]), 4, p["q_norm.weight"]));
  const Tensor k = rope(heads(linear(x, p["k_proj.weight"]), 2, p["k_norm.weight"]));
  const Tensor v = heads(linear(x, p["v_proj.weight"]), 2, {});
  const Tensor y = causal_attention(q, RepeatHeads(k, 2), RepeatHeads(v, 2));
  const Tensor want = linear(reshape(permute(y, {0, 2, 1, 3}), {2, 5, 32}), p["o_proj.weight"]);
  ExpectClose(to_vector(attn(x)), to_vector(want), {1e-5, 1e-5}, "qk-normed attention");
}

// The cached form over a cache written in two steps equals the full causal forward.
void CachedStepsEqualTheFullForward(const AttentionConfig& c) {
  Generator gen(2);
  Attention attn(c, {.generator = &gen});
  for (const auto& [name, p] : attn.named_parameters()) {
    if (name.find("norm") != std::string::npos) copy_(p, randn(p.shape(), gen));
  }
  const Tensor x = randn({1, 6, 16}, gen);
  const Tensor full_y = attn(x);
  Attention::Cache cache{zeros({1, 1, 8, 4}), zeros({1, 1, 8, 4})};
  auto mask_for = [](int64_t first, int64_t t) {  // token first + i sees slots 0 .. first + i
    return reshape(le(reshape(arange(8), {1, 8}), reshape(arange(first, first + t, 1), {t, 1})),
                   {1, 1, t, 8});
  };
  const Tensor y0 = attn.Cached(slice(x, 1, 0, 4), arange(4), cache, arange(4), mask_for(0, 4));
  const Tensor y1 =
      attn.Cached(slice(x, 1, 4, 6), arange(4, 6, 1), cache, arange(4, 6, 1), mask_for(4, 2));
  ExpectClose(to_vector(cat({y0, y1}, 1)), to_vector(full_y), {1e-5, 1e-5}, "cached");
}

TEST(Attention, CachedStepsEqualTheFullForward) {
  for (const bool qk_norm : {false, true}) {
    SCOPED_TRACE(qk_norm ? "q/k norms" : "plain");
    CachedStepsEqualTheFullForward({.dim = 16, .heads = 4, .kv_heads = 1, .qk_norm = qk_norm});
  }
}

// The cached form's inputs: a bool mask (a float one would be added to the scores, an absent one
// would attend to unwritten rows), slots of the cache's rows, a cache within a sliding window.
TEST(Attention, CachedRefusesWhatWouldGiveAWrongAnswer) {
  Generator gen(3);
  Attention attn({.dim = 16, .heads = 4, .kv_heads = 1}, {.generator = &gen});
  const Tensor x = randn({1, 3, 16}, gen);
  Attention::Cache cache{zeros({1, 1, 8, 4}), zeros({1, 1, 8, 4})};
  const Tensor bool_mask = ones({1, 1, 3, 8}, DType::kBool);
  EXPECT_NE(ErrorOf([&] {
              attn.Cached(x, arange(3), cache, arange(3), ones({1, 1, 3, 8}));
            }).find("Attention::Cached: mask must be a bool tensor"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf([&] { attn.Cached(x, arange(3), cache, arange(3), Tensor()); }).find("got undefined"),
      std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              attn.Cached(x, arange(3), cache, arange(6, 9, 1), bool_mask);
            }).find("Attention::Cached: slots must be rows of the cache's S = 8: index_copy"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              attn.Cached(x, arange(3), cache, arange(2), bool_mask);
            }).find("slots must be [T] = [3]"),
            std::string::npos);
  Attention::Cache half{zeros({1, 1, 8, 4}, DType::kBFloat16), zeros({1, 1, 8, 4})};
  EXPECT_NE(ErrorOf([&] {
              attn.Cached(x, arange(3), half, arange(3), bool_mask);
            }).find("the caches must hold the keys' and values' dtype float32, got k bfloat16"),
            std::string::npos);
  EXPECT_EQ(to_vector(cache.k), std::vector<double>(32, 0.0));  // nothing was written
  Attention windowed({.dim = 16, .heads = 4, .sliding_window = 4}, {.generator = &gen});
  EXPECT_EQ(windowed(slice(x, 1, 0, 3)).shape(), (Shape{1, 3, 16}));  // within the window
  EXPECT_NE(ErrorOf([&] {
              windowed(randn({1, 5, 16}, gen));
            }).find("a sequence of 5 positions exceeds the sliding window of 4"),
            std::string::npos);
  Attention::Cache big{zeros({1, 4, 8, 4}), zeros({1, 4, 8, 4})};
  EXPECT_NE(ErrorOf([&] {
              windowed.Cached(x, arange(3), big, arange(3), bool_mask);
            }).find("a KV cache of 8 positions exceeds the sliding window of 4"),
            std::string::npos);
}

// Positions: integers within the table (the error names the rotary embedding, not the lookup);
// [1, T] broadcasts over the batch as transformers' position_ids do.
TEST(Rotary, PositionsAreCheckedAndOneRowBroadcasts) {
  Generator gen(4);
  RotaryEmbedding rope(8, RopeOptions{.max_positions = 16});
  const Tensor x = randn({2, 3, 4, 8}, gen);
  EXPECT_NE(ErrorOf([&] {
              rope.Rotate(x, arange(14, 18, 1));
            }).find("RotaryEmbedding: positions must lie in [0, max_positions = 16): embedding"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              rope.Rotate(x, cast(arange(4), DType::kFloat32));
            }).find("positions must be an int64 or int32 tensor, got float32"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { rope.Rotate(x, Tensor()); }).find("got undefined"), std::string::npos);
  const Tensor one_row = reshape(arange(4), {1, 4});
  ExpectClose(to_vector(rope.Rotate(x, one_row)), to_vector(rope.Rotate(x, arange(4))), {0, 0},
              "[1, T] positions");
}

// causal_attention with fewer queries than keys (or more) masks as SDPA's is_causal: query i
// sees keys 0..i, aligned at the top left.
TEST(CausalAttention, QueriesAndKeysOfDifferentLengthsMaskAsSdpa) {
  Generator gen(9);
  for (const auto& [t_len, s_len] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 3}, {2, 5}, {4, 2}}) {
    const Tensor q = randn({2, 3, t_len, 8}, gen), k = randn({2, 3, s_len, 8}, gen),
                 v = randn({2, 3, s_len, 4}, gen);
    ExpectClose(to_vector(causal_attention(q, k, v)),
                to_vector(scaled_dot_product_attention(q, k, v, {}, /*is_causal=*/true)),
                {1e-5, 1e-5}, absl::StrCat("T ", t_len, " S ", s_len));
  }
}

// apply_rotary: the halves' rotation written out, element by element; an odd last dim is an error.
TEST(Rotary, ApplyRotaryRotatesTheHalves) {
  Generator gen(5);
  const Tensor x = randn({2, 1, 3, 4}, gen), cos = randn({1, 1, 3, 2}, gen),
               sin = randn({1, 1, 3, 2}, gen);
  const std::vector<double> xs = to_vector(x), c = to_vector(cos), s = to_vector(sin),
                            got = to_vector(apply_rotary(x, cos, sin));
  std::vector<double> want(xs.size());
  for (size_t row = 0; row < xs.size() / 4; ++row) {
    const size_t t = row % 3;
    for (size_t i = 0; i < 2; ++i) {
      const double x1 = xs[row * 4 + i], x2 = xs[row * 4 + 2 + i];
      want[row * 4 + i] = x1 * c[t * 2 + i] - x2 * s[t * 2 + i];
      want[row * 4 + 2 + i] = x2 * c[t * 2 + i] + x1 * s[t * 2 + i];
    }
  }
  ExpectClose(got, want, {1e-6, 1e-6}, "apply_rotary");
  EXPECT_NE(ErrorOf([&] {
              apply_rotary(randn({2, 3}, gen), cos, sin);
            }).find("apply_rotary: x's last dim must be even, got [2, 3]"),
            std::string::npos);
  // Tables of the whole head dim (HF's layout), of another length, or that would grow x.
  const std::vector<std::pair<Tensor, std::string>> bad = {
      {randn({1, 1, 3, 4}, gen),
       "apply_rotary: cos [1, 1, 3, 4] must broadcast to x's half "
       "[2, 1, 3, 2] (x [2, 1, 3, 4]; its last dim is head_dim / 2 = 2)"},
      {randn({1, 1, 5, 2}, gen), "apply_rotary: cos [1, 1, 5, 2] must broadcast"},
      {randn({4, 1, 3, 2}, gen), "apply_rotary: cos [4, 1, 3, 2] must broadcast"},
      {Tensor(), "apply_rotary: cos is undefined"}};
  for (const auto& [table, want] : bad) {
    EXPECT_NE(ErrorOf([&] { apply_rotary(x, table, sin); }).find(want), std::string::npos) << want;
  }
  EXPECT_NE(ErrorOf([&] {
              apply_rotary(x, cos, randn({1, 2, 1}, gen));
            }).find("apply_rotary: sin [1, 2, 1] must broadcast"),
            std::string::npos);
}

// Tables in float32, step by step as transformers computes them.
TEST(Rotary, TablesAreComputedInFloat32LikeHuggingFace) {
  RotaryEmbedding rope(8, RopeOptions{.base = 500000, .max_positions = 4096});
  const auto buffers = rope.named_buffers();
  const std::vector<double> cos_t = to_vector(buffers[0].second);
  for (int64_t p : {1, 1000, 4095}) {
    for (int64_t i = 0; i < 4; ++i) {
      const float inv = 1.0f / std::pow(500000.0f, static_cast<float>(2 * i) / 8.0f);
      EXPECT_EQ(cos_t[p * 4 + i], static_cast<double>(std::cos(static_cast<float>(p) * inv)))
          << "position " << p << " frequency " << i;
    }
  }
}

TEST(Rotary, ScalingRulesAndGivenTables) {
  const RopeOptions plain{.base = 10000};
  RopeOptions linear_rule = plain;
  linear_rule.scaling = RopeOptions::Scaling::kLinear;
  linear_rule.factor = 4;
  const std::vector<double> a = to_vector(rope_inverse_frequencies(64, plain));
  const std::vector<double> b = to_vector(rope_inverse_frequencies(64, linear_rule));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_FLOAT_EQ(b[i], a[i] / 4);
  // llama3: short wavelengths (high frequencies) kept, long ones divided by factor, between them
  // a blend.
  RopeOptions llama3 = plain;
  llama3.scaling = RopeOptions::Scaling::kLlama3;
  llama3.factor = 8;
  llama3.original_max_positions = 1024;
  const std::vector<double> c = to_vector(rope_inverse_frequencies(64, llama3));
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double wavelen = 2 * M_PI / a[i];
    if (wavelen < 1024 / 4.0) {
      EXPECT_EQ(c[i], a[i]);
      ++kept;
    } else if (wavelen > 1024 / 1.0) {
      EXPECT_FLOAT_EQ(c[i], a[i] / 8);
      ++divided;
    } else {
      EXPECT_LT(c[i], a[i]);
      EXPECT_GT(c[i], a[i] / 8);
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  // yarn: dims below the ramp keep the original frequency, those above are divided by factor,
  // those on it blend; the tables are scaled by the attention factor (0.1 ln(factor) + 1, or a
  // given one). dynamic: the default frequencies.
  RopeOptions yarn = plain;
  yarn.scaling = RopeOptions::Scaling::kYarn;
  yarn.factor = 4;
  yarn.original_max_positions = 2048;
  yarn.max_positions = 8;
  const std::vector<double> y = to_vector(rope_inverse_frequencies(64, yarn));
  // The ramp's ends: the dims where 32 and 1 rotations fit into 2048 positions (floor, ceil).
  const double low = std::floor(64 * std::log(2048 / (32 * 2 * M_PI)) / (2 * std::log(10000.0)));
  const double high = std::ceil(64 * std::log(2048 / (1 * 2 * M_PI)) / (2 * std::log(10000.0)));
  for (size_t i = 0; i < y.size(); ++i) {
    if (i <= low) {
      EXPECT_FLOAT_EQ(y[i], a[i]) << i;
    } else if (i >= high) {
      EXPECT_FLOAT_EQ(y[i], a[i] / 4) << i;
    } else {
      EXPECT_LT(y[i], a[i]) << i;
      EXPECT_GT(y[i], a[i] / 4) << i;
    }
  }
  EXPECT_DOUBLE_EQ(rope_attention_scaling(yarn), 0.1 * std::log(4.0) + 1);
  const RotaryEmbedding yarn_rope(64, yarn);
  EXPECT_FLOAT_EQ(to_vector(yarn_rope.named_buffers()[0].second)[0], 0.1 * std::log(4.0) + 1);
  RopeOptions deepseek = yarn;  // mscale over mscale_all_dim
  deepseek.mscale = 0.707;
  deepseek.mscale_all_dim = 1;
  EXPECT_DOUBLE_EQ(rope_attention_scaling(deepseek),
                   (0.0707 * std::log(4.0) + 1) / (0.1 * std::log(4.0) + 1));
  deepseek.attention_factor = 1.25;
  EXPECT_EQ(rope_attention_scaling(deepseek), 1.25);
  RopeOptions dynamic = plain;
  dynamic.scaling = RopeOptions::Scaling::kDynamic;
  dynamic.factor = 2;
  EXPECT_EQ(to_vector(rope_inverse_frequencies(64, dynamic)), a);
  EXPECT_EQ(rope_attention_scaling(dynamic), 1);
  // Given tables are used as they are.
  Generator gen(3);
  const Tensor cos_t = rand({16, 4}, gen), sin_t = rand({16, 4}, gen);
  RotaryEmbedding given(cos_t, sin_t);
  EXPECT_EQ(given.head_dim(), 8);
  EXPECT_EQ(to_vector(given.named_buffers()[1].second), to_vector(sin_t));
  EXPECT_THROW(RotaryEmbedding(cos_t, rand({15, 4}, gen)), Error);
}

TEST(Activations, ExplicitChoicesAndHuggingFaceNames) {
  const Tensor x = from_vector({-2, -0.5, 0, 0.5, 3}, {5});
  ExpectClose(to_vector(activate(x, Activation::kGelu)), to_vector(gelu(x)), {0, 0}, "gelu");
  ExpectClose(to_vector(activate(x, Activation::kGeluTanh)), to_vector(gelu(x, "tanh")), {0, 0},
              "gelu_tanh");
  ExpectClose(to_vector(activate(x, Activation::kSilu)), to_vector(silu(x)), {0, 0}, "silu");
  EXPECT_EQ(ActivationFromName("gelu_pytorch_tanh"), Activation::kGeluTanh);
  EXPECT_EQ(ActivationFromName("gelu"), Activation::kGelu);
  EXPECT_NE(ErrorOf([] { ActivationFromName("geluu"); }).find("known: silu"), std::string::npos);
  // The MLP uses the activation it was given (exact GELU differs from the tanh form).
  Generator g1(3), g2(3);
  FeedForward exact(8, 16, MlpKind::kPlain, Activation::kGelu, true, g1);
  FeedForward approx(8, 16, MlpKind::kPlain, Activation::kGeluTanh, true, g2);
  const Tensor in = randn({2, 8}, g1);
  EXPECT_NE(to_vector(exact(in)), to_vector(approx(in)));
}

// Code written against the first module API keeps compiling and meaning what it meant: the
// kinds that name their activation, their children's names, the rope fields, RMSNorm's default.
TEST(Compatibility, EarlierModuleConfigsMeanWhatTheyMeant) {
  Generator g1(4), g2(4);
  DecoderBlock old_style({.dim = 16,
                          .heads = 4,
                          .norm = NormKind::kLayerNorm,
                          .mlp = MlpKind::kGelu,
                          .bias = true,
                          .rotary = false},
                         g1);
  DecoderBlock explicit_style({.dim = 16,
                               .heads = 4,
                               .norm = NormKind::kLayerNorm,
                               .mlp = MlpKind::kPlain,
                               .activation = Activation::kGeluTanh,
                               .bias = true,
                               .rotary = false},
                              g2);
  const Tensor x = randn({1, 5, 16}, g1);
  EXPECT_EQ(to_vector(old_style(x)), to_vector(explicit_style(x)));
  Generator g3(5);
  FeedForward swiglu(8, 16, MlpKind::kSwiGLU, false, g3);
  EXPECT_EQ(swiglu.named_parameters()[0].first, "gate.weight");
  const Tensor h = randn({2, 8}, g3);
  auto p = Params(swiglu);
  ExpectClose(to_vector(swiglu(h)),
              to_vector(linear(silu(linear(h, p["gate.weight"])) * linear(h, p["up.weight"]),
                               p["down.weight"])),
              {1e-6, 1e-6}, "swiglu");
  EXPECT_NE(ErrorOf([&] {
              DecoderBlock b({.dim = 16, .heads = 4, .mlp = MlpKind::kGated}, g3);
            }).find("need an activation"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              FeedForward f(8, 16, MlpKind::kSwiGLU, Activation::kGelu, false, g3);
            }).find("implies silu"),
            std::string::npos);
  DecoderBlock rope({.dim = 16, .heads = 2, .max_positions = 64, .rope_base = 500}, g3);
  EXPECT_EQ(rope.named_buffers()[0].second.size(0), 64);
  RMSNorm norm(8);  // 1e-6, as before
  EXPECT_EQ(norm.named_parameters().size(), 1u);
}

TEST(Init, DefaultGeneratorIsSeededByManualSeed) {
  manual_seed(123);
  const Linear a(4, 3, true);
  manual_seed(123);
  const Linear b(4, 3, true);
  const Linear c(4, 3, true);
  EXPECT_EQ(to_vector(a.weight()), to_vector(b.weight()));
  EXPECT_NE(to_vector(b.weight()), to_vector(c.weight()));
}

LlamaConfig TinyLlama() {
  LlamaConfig c;
  c.vocab = 64;
  c.dim = 32;
  c.hidden = 48;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.rope.max_positions = 64;
  return c;
}

TEST(LlamaConfig, BadSizesAreErrors) {
  LlamaConfig negative = TinyLlama();
  negative.head_dim = -8;
  EXPECT_NE(ErrorOf([&] { LlamaForCausalLM m(negative); }).find("head_dim=-8"), std::string::npos);
  LlamaConfig gqa = TinyLlama();
  gqa.kv_heads = 3;
  EXPECT_NE(ErrorOf([&] { LlamaForCausalLM m(gqa); }).find("kv_heads divide heads"),
            std::string::npos);
}

TEST(Init, UninitialisedModulesRefuseToRunUntilLoaded) {
  LlamaForCausalLM model(TinyLlama(), {.init = Init::kNone});
  const Tensor tokens = from_vector({1, 2, 3}, {1, 3}, DType::kInt64);
  EXPECT_NE(ErrorOf([&] { model(tokens); }).find("parameter 'weight'"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { model(tokens); }).find("Init::kNone"), std::string::npos);
  // A checkpoint missing one key: the error names it, and nothing was loaded.
  Generator gen(4);
  LlamaForCausalLM source(TinyLlama(), {.generator = &gen});
  NamedTensors sd = state_dict(source, llama_save_mapping());
  NamedTensors partial;
  for (const auto& [k, t] : sd) {
    if (k != "model.layers.1.mlp.up_proj.weight") partial.emplace_back(k, t);
  }
  const std::string err =
      ErrorOf([&] { load_state_dict(model, partial, {.map = llama_load_mapping()}); });
  EXPECT_NE(err.find("layers.1.mlp.up_proj.weight"), std::string::npos) << err;
  for (const auto& [name, p] : model.named_parameters()) {
    EXPECT_TRUE(p.storage()->uninitialised()) << name << " was written by a failed load";
  }
  EXPECT_THROW(model(tokens), Error);
  // Loaded without the LM head (strict off): the error names the module by its path.
  NamedTensors no_head;
  for (const auto& [k, t] : sd) {
    if (k != "lm_head.weight") no_head.emplace_back(k, t);
  }
  load_state_dict(model, no_head, {.strict = false, .map = llama_load_mapping()});
  const std::string head = ErrorOf([&] { model(tokens); });
  EXPECT_NE(head.find("Linear (lm_head): parameter 'weight'"), std::string::npos) << head;
  // The whole checkpoint: it runs, and equals the source.
  const LoadReport r = load_state_dict(model, sd, {.map = llama_load_mapping()});
  EXPECT_EQ(r.str(), "all 21 parameters loaded");
  ExpectClose(to_vector(model(tokens)), to_vector(source(tokens)), {0, 0}, "loaded model");
}

// A tied model's checkpoint may carry the head as "lm_head.weight" too (transformers saves it
// when asked to): the same values load, different ones are an error, and the head alone serves.
TEST(LlamaTied, AHeadKeyEqualToTheEmbeddingLoadsAndADifferentOneIsRefused) {
  LlamaConfig tied = TinyLlama();
  tied.tie_word_embeddings = true;
  Generator gen(6);
  LlamaForCausalLM source(tied, {.generator = &gen});
  NamedTensors sd = state_dict(source, llama_save_mapping());
  Tensor embedding;
  for (const auto& [k, t] : sd) {
    if (k == "model.embed_tokens.weight") embedding = t;
  }
  ASSERT_TRUE(embedding.defined());
  const Tensor tokens = from_vector({1, 2, 3}, {1, 3}, DType::kInt64);
  NamedTensors with_head = sd;
  with_head.emplace_back("lm_head.weight", clone(embedding));
  LlamaForCausalLM model(tied, {.init = Init::kNone});
  EXPECT_EQ(load_state_dict(model, with_head, {.map = llama_load_mapping()}).unexpected_keys.size(),
            0u);
  ExpectClose(to_vector(model(tokens)), to_vector(source(tokens)), {0, 0}, "tied, head key");

  NamedTensors head_only;  // the embedding under the head's name only
  for (const auto& [k, t] : with_head) {
    if (k != "model.embed_tokens.weight") head_only.emplace_back(k, t);
  }
  LlamaForCausalLM from_head(tied, {.init = Init::kNone});
  load_state_dict(from_head, head_only, {.map = llama_load_mapping()});
  ExpectClose(to_vector(from_head(tokens)), to_vector(source(tokens)), {0, 0}, "head only");

  NamedTensors differing = sd;
  differing.emplace_back("lm_head.weight", mul(embedding, 2.0));
  LlamaForCausalLM other(tied, {.init = Init::kNone});
  const std::string err =
      ErrorOf([&] { load_state_dict(other, differing, {.map = llama_load_mapping()}); });
  EXPECT_NE(err.find("'lm_head.weight' names parameter 'embed_tokens.weight'"), std::string::npos)
      << err;
  EXPECT_NE(err.find("values differ"), std::string::npos) << err;
  for (const auto& [name, p] : other.named_parameters()) {
    EXPECT_TRUE(p.storage()->uninitialised()) << name << " was written by a refused load";
  }
  // A float32 head beside a bfloat16 embedding: equal only if the head holds the same numbers.
  NamedTensors mixed;
  for (const auto& [k, t] : sd)
    mixed.emplace_back(k, k == "model.embed_tokens.weight" ? cast(t, DType::kBFloat16) : t);
  mixed.emplace_back("lm_head.weight", embedding);  // float32, not rounded to bfloat16
  LlamaForCausalLM mixed_model(tied, {.init = Init::kNone});
  EXPECT_NE(ErrorOf([&] {
              load_state_dict(mixed_model, mixed, {.map = llama_load_mapping()});
            }).find("values differ"),
            std::string::npos);
}

// GPT-2's fused c_attn split into q/k/v projections on load, joined back on save.
TEST(KeyMapping, SplitsAndJoinsTensorsByRows) {
  Generator gen(5);
  const int64_t dim = 8;
  Linear fused(dim, 3 * dim, true, gen);  // "weight" [24, 8], "bias" [24]
  Attention attn({.dim = dim, .heads = 2, .qkv_bias = true, .rotary = false}, {.generator = &gen});
  auto split = [&](const std::string& key) -> KeyMappings {
    const std::string param = "." + key;  // ".weight" or ".bias"
    return std::vector<KeyMapping>{{"q_proj" + param, false, {0, dim}},
                                   {"k_proj" + param, false, {dim, dim}},
                                   {"v_proj" + param, false, {2 * dim, dim}}};
  };
  LoadReport r = load_state_dict(attn, state_dict(fused), {.strict = false, .map = split});
  EXPECT_EQ(r.loaded.size(), 6u);
  EXPECT_EQ(r.missing_keys, (std::vector<std::string>{"o_proj.weight"}));
  auto p = Params(attn);
  EXPECT_EQ(to_vector(p["k_proj.weight"]), to_vector(slice(fused.weight(), 0, dim, 2 * dim)));
  EXPECT_EQ(to_vector(p["v_proj.bias"]), to_vector(slice(fused.bias(), 0, 2 * dim, 3 * dim)));
  // Joined back: q/k/v rows into one tensor per key.
  auto join = [&](const std::string& name) -> KeyMappings {
    if (name.rfind("o_proj", 0) == 0) return std::nullopt;
    const int64_t at = name[0] == 'q' ? 0 : name[0] == 'k' ? dim : 2 * dim;
    return KeyMapping{"c_attn" + name.substr(name.find('.')), false, {}, {at, 0}};
  };
  const NamedTensors joined = state_dict(attn, join);
  ASSERT_EQ(joined.size(), 2u);
  EXPECT_EQ(joined[0].first, "c_attn.weight");
  EXPECT_EQ(to_vector(joined[0].second), to_vector(fused.weight()));
  EXPECT_EQ(to_vector(joined[1].second), to_vector(fused.bias()));
  // A mapping that leaves rows of a parameter unfilled, or fills some twice: errors naming the
  // rows, and nothing is loaded.
  Attention other({.dim = dim, .heads = 2, .qkv_bias = true, .rotary = false});
  const std::string before = Bytes(Params(other)["q_proj.weight"]);
  auto gap = [&](const std::string& key) -> KeyMappings {
    return KeyMapping{"q_proj." + key, false, {0, dim - 1}};
  };
  EXPECT_NE(ErrorOf([&] {
              load_state_dict(other, state_dict(fused), {.strict = false, .map = gap});
            }).find("no checkpoint key fills its rows [7, 8)"),
            std::string::npos);
  NamedTensors twice = state_dict(fused);
  twice.emplace_back("copy.weight", fused.weight());
  auto overlap = [&](const std::string& key) -> KeyMappings {
    if (key.find("bias") != std::string::npos) return std::nullopt;
    return KeyMapping{"q_proj.weight", false, {0, dim}, {0, dim}};
  };
  EXPECT_NE(ErrorOf([&] {
              load_state_dict(other, twice, {.strict = false, .map = overlap});
            }).find("both map to parameter 'q_proj.weight'"),
            std::string::npos);
  EXPECT_EQ(Bytes(Params(other)["q_proj.weight"]), before);
}

TEST(LlamaConfig, FromHuggingFaceJson) {
  const LlamaConfig c = LlamaConfig::FromJson(R"({
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "max_position_embeddings": 131072,
    "hidden_act": "silu", "tie_word_embeddings": true,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}})");
  EXPECT_EQ(c.vocab, 128256);
  EXPECT_EQ(c.kv_heads, 8);
  EXPECT_EQ(c.rope.base, 500000);
  EXPECT_EQ(c.rope.scaling, RopeOptions::Scaling::kLlama3);
  EXPECT_EQ(c.rope.factor, 32);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  // transformers 5's layout: one rope_parameters object.
  const LlamaConfig v5 = LlamaConfig::FromJson(R"({"rope_parameters": {"rope_theta": 500000.0,
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 128}})");
  EXPECT_EQ(v5.rope.base, 500000);
  EXPECT_EQ(v5.rope.scaling, RopeOptions::Scaling::kLlama3);
  EXPECT_EQ(v5.rope.original_max_positions, 128);
  const LlamaConfig q = LlamaConfig::FromJson(R"({"model_type": "qwen2"})");
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_FALSE(q.out_bias);
  // Each config class's own defaults for what a config leaves out (transformers').
  for (const char* type : {"qwen2", "qwen3"}) {
    const LlamaConfig d = LlamaConfig::FromJson(absl::StrCat(R"({"model_type": ")", type, "\"}"));
    EXPECT_EQ(d.vocab, 151936) << type;
    EXPECT_EQ(d.hidden, 22016) << type;
    EXPECT_EQ(d.kv_heads, 32) << type;
    EXPECT_EQ(d.rope.max_positions, 32768) << type;
  }
  const LlamaConfig m = LlamaConfig::FromJson(R"({"model_type": "mistral"})");
  EXPECT_EQ(m.vocab, 32000);
  EXPECT_EQ(m.hidden, 14336);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.rope.max_positions, 131072);
  EXPECT_EQ(LlamaConfig::FromJson("{}").rope.max_positions, 2048);
  // A rope_scaling without its type is refused (transformers 4 finds no rope function for it).
  EXPECT_NE(ErrorOf([] {
              LlamaConfig::FromJson(R"({"rope_scaling": {"factor": 4.0}})");
            }).find("rope_scaling needs its 'rope_type' (or 'type')"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              LlamaConfig::FromJson(R"({"hidden_size": "big"})");
            }).find("field 'hidden_size' has the wrong type"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              LlamaConfig::FromJson(R"({"rope_scaling": {"type": "longrope"}})");
            }).find("'longrope' is not supported"),
            std::string::npos);
  // yarn's fields, and transformers' defaults for those left out (the original length is
  // max_position_embeddings; without a factor, the ratio of the two).
  const LlamaConfig yarn = LlamaConfig::FromJson(R"({"max_position_embeddings": 4096,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
    "beta_fast": null, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": false}})");
  EXPECT_EQ(yarn.rope.scaling, RopeOptions::Scaling::kYarn);
  EXPECT_EQ(yarn.rope.original_max_positions, 1024);
  EXPECT_EQ(yarn.rope.beta_fast, 32);
  EXPECT_EQ(yarn.rope.beta_slow, 1);
  EXPECT_EQ(yarn.rope.mscale, 0.707);
  EXPECT_FALSE(yarn.rope.truncate);
  const LlamaConfig yarn_ratio = LlamaConfig::FromJson(R"({"max_position_embeddings": 4096,
    "rope_scaling": {"type": "yarn", "original_max_position_embeddings": 1024}})");
  EXPECT_EQ(yarn_ratio.rope.factor, 4);
  EXPECT_EQ(LlamaConfig::FromJson(R"({"rope_scaling": {"type": "yarn", "factor": 2}})")
                .rope.original_max_positions,
            2048);
  EXPECT_EQ(
      LlamaConfig::FromJson(R"({"rope_scaling": {"type": "dynamic", "factor": 2}})").rope.scaling,
      RopeOptions::Scaling::kDynamic);
  EXPECT_NE(ErrorOf([] {
              LlamaConfig::FromJson(R"({"rope_scaling": {"type": "dynamic"}})");
            }).find("needs the field 'factor'"),
            std::string::npos);
  EXPECT_THROW(LlamaConfig::FromJson("{"), Error);
  // A wrong value is quoted in bounded text; nesting that would exhaust a recursive printer's
  // stack is refused while parsing; a key given twice is an error, not the last one's value.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const auto& [bad, words] : std::vector<std::pair<std::string, std::string>>{
           {R"({"hidden_size": [1, [2], {"a": 3}]})",
            "field 'hidden_size' has the wrong type: it must be an integer that fits int64, got "
            "[1, [...], {...}]"},
           {absl::StrCat(R"({"hidden_size": )", deep, "}"),
            "the config nests deeper than 64 levels"},
           {absl::StrCat(R"({"rope_scaling": {"x": )", deep, "}}"), "nests deeper than 64"},
           {R"({"hidden_size": 8, "hidden_size": 16})", "holds the key 'hidden_size' twice"},
           {absl::StrCat(R"({"hidden_size": ")", std::string(200, 'x'), "\"}"),
            absl::StrCat("got \"", std::string(64, 'x'), "\"... (200 characters)")},
           {absl::StrCat(R"({"model_type": ")", std::string(1000, 'x'), "\"}"),
            "is not supported"}}) {
    const std::string error = ErrorOf([&] { LlamaConfig::FromJson(bad); });
    EXPECT_NE(error.find(words), std::string::npos) << error.substr(0, 300);
    EXPECT_LT(error.size(), 2000u) << error.substr(0, 300);
  }
  // Integer fields take JSON integers that fit int64: no truncation of 16.5, no overflow of 1e30.
  for (const char* bad : {R"({"hidden_size": 16.5})", R"({"hidden_size": 1e30})",
                          R"({"num_hidden_layers": 18446744073709551615})"}) {
    EXPECT_NE(ErrorOf([bad] { LlamaConfig::FromJson(bad); }).find("must be an integer"),
              std::string::npos)
        << bad;
  }
  // Missing fields take transformers' defaults; a scaling needs its parameters; only the model
  // types of this layout; the sliding window of Mistral, and of Qwen2 where it is used.
  EXPECT_EQ(LlamaConfig::FromJson("{}").eps, 1e-6);
  EXPECT_NE(ErrorOf([] {
              LlamaConfig::FromJson(R"({"rope_scaling": {"rope_type": "llama3", "factor": 8}})");
            }).find("rope type 'llama3' needs the field 'low_freq_factor'"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              LlamaConfig::FromJson(R"({"rope_scaling": {"type": "linear"}})");
            }).find("needs the field 'factor'"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { LlamaConfig::FromJson(R"({"model_type": "gemma2"})"); })
                .find("model_type 'gemma2' is not supported (supported: llama, mistral, qwen2, "
                      "qwen3, gemma, phi3)"),
            std::string::npos);
  // Gemma: scaled embeddings and (1 + w) norms, a tied head and head_dim 256 unless given, the
  // tanh GELU unless hidden_activation (or else hidden_act) says otherwise.
  const LlamaConfig gemma = LlamaConfig::FromJson(R"({"model_type": "gemma"})");
  EXPECT_TRUE(gemma.gemma && gemma.tie_word_embeddings);
  EXPECT_EQ(gemma.head_dim, 256);
  EXPECT_EQ(gemma.vocab, 256000);  // GemmaConfig's defaults where the config says nothing
  EXPECT_EQ(gemma.rope.max_positions, 8192);
  EXPECT_EQ(gemma.activation, Activation::kGeluTanh);
  EXPECT_FALSE(LlamaConfig::FromJson("{}").gemma);
  EXPECT_EQ(LlamaConfig::FromJson(R"({"model_type": "gemma", "hidden_act": "gelu",
                                      "hidden_activation": "gelu_pytorch_tanh"})")
                .activation,
            Activation::kGeluTanh);
  EXPECT_EQ(LlamaConfig::FromJson(R"({"model_type": "gemma", "hidden_act": "gelu",
                                      "hidden_activation": null})")
                .activation,
            Activation::kGelu);
  EXPECT_FALSE(LlamaConfig::FromJson(R"({"model_type": "gemma", "tie_word_embeddings": false})")
                   .tie_word_embeddings);
  // Phi-3: fused projections, Phi3Config's defaults, a window only where given, and no partial
  // rotary embeddings.
  const LlamaConfig phi3 = LlamaConfig::FromJson(R"({"model_type": "phi3"})");
  EXPECT_TRUE(phi3.fused_projections);
  EXPECT_EQ(phi3.vocab, 32064);
  EXPECT_EQ(phi3.eps, 1e-5);
  EXPECT_EQ(phi3.sliding_window, 0);
  EXPECT_EQ(
      LlamaConfig::FromJson(R"({"model_type": "phi3", "sliding_window": 2047})").sliding_window,
      2047);
  EXPECT_NE(ErrorOf([] {
              LlamaConfig::FromJson(R"({"model_type": "phi3", "partial_rotary_factor": 0.75})");
            }).find("partial_rotary_factor must be 1"),
            std::string::npos);
  EXPECT_EQ(
      LlamaConfig::FromJson(R"({"model_type": "mistral", "sliding_window": 4096})").sliding_window,
      4096);
  EXPECT_EQ(
      LlamaConfig::FromJson(R"({"model_type": "mistral", "sliding_window": null})").sliding_window,
      0);
  // Each model type reads only its transformers class's fields: Mistral's window defaults to
  // 4096 and it has no biases; Qwen2 has only q/k/v biases; Llama has no window.
  const LlamaConfig mistral = LlamaConfig::FromJson(
      R"({"model_type": "mistral", "attention_bias": true, "mlp_bias": true})");
  EXPECT_EQ(mistral.sliding_window, 4096);
  EXPECT_FALSE(mistral.qkv_bias || mistral.out_bias || mistral.mlp_bias);
  const LlamaConfig qwen2 =
      LlamaConfig::FromJson(R"({"model_type": "qwen2", "attention_bias": true, "mlp_bias": true})");
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_FALSE(qwen2.out_bias || qwen2.mlp_bias);
  const LlamaConfig llama =
      LlamaConfig::FromJson(R"({"sliding_window": 16, "attention_bias": true, "mlp_bias": true})");
  EXPECT_EQ(llama.sliding_window, 0);
  EXPECT_TRUE(llama.qkv_bias && llama.out_bias && llama.mlp_bias);
  EXPECT_EQ(
      LlamaConfig::FromJson(R"({"model_type": "qwen2", "sliding_window": 4096})").sliding_window,
      0);
  EXPECT_EQ(LlamaConfig::FromJson(R"({"model_type": "qwen2", "sliding_window": 4096,
                                      "use_sliding_window": true})")
                .sliding_window,
            4096);
  // Qwen3: q/k norms, attention_bias on all four projections, head_dim 128 unless given; a
  // window only where use_sliding_window makes some layer a sliding one.
  const LlamaConfig qwen3 = LlamaConfig::FromJson(
      R"({"model_type": "qwen3", "hidden_size": 64, "attention_bias": true, "mlp_bias": true})");
  EXPECT_TRUE(qwen3.qk_norm && qwen3.qkv_bias && qwen3.out_bias);
  EXPECT_FALSE(qwen3.mlp_bias || LlamaConfig::FromJson("{}").qk_norm);
  EXPECT_EQ(qwen3.head_dim, 128);
  EXPECT_EQ(LlamaConfig::FromJson(R"({"model_type": "qwen3", "head_dim": 16})").head_dim, 16);
  EXPECT_EQ(LlamaConfig::FromJson(R"({"model_type": "qwen3", "use_sliding_window": true,
                                      "num_hidden_layers": 28})")
                .sliding_window,
            0);
  EXPECT_EQ(LlamaConfig::FromJson(R"({"model_type": "qwen3", "use_sliding_window": true,
                                      "num_hidden_layers": 2, "max_window_layers": 1})")
                .sliding_window,
            4096);
  EXPECT_EQ(LlamaConfig::FromJson(R"({"model_type": "qwen2", "use_sliding_window": true,
                                      "sliding_window": 64, "num_hidden_layers": 2, "layer_types":
                                      ["full_attention", "sliding_attention"]})")
                .sliding_window,
            64);
  EXPECT_NE(ErrorOf([] {
              LlamaConfig::FromJson(R"({"model_type": "qwen3", "use_sliding_window": true,
                                        "layer_types": "sliding_attention"})");
            }).find("layer_types must be a list of num_hidden_layers = 32 entries"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              LlamaConfig::FromJson(R"({"model_type": "qwen3", "use_sliding_window": true,
                "num_hidden_layers": 2, "layer_types": ["full_attention", "bogus"]})");
            }).find("got \"bogus\""),
            std::string::npos);
  EXPECT_EQ(LlamaConfig::FromJson(R"({"model_type": "qwen3", "use_sliding_window": true,
                                      "sliding_window": null, "num_hidden_layers": 40})")
                .sliding_window,
            0);
  EXPECT_EQ(LlamaConfig::FromJson(R"({"rope_theta": 500000, "rope_parameters":
                                      {"rope_type": "default"}})")
                .rope.base,
            500000);
  EXPECT_NE(ErrorOf([] {
              Attention({.dim = 8, .heads = 4, .head_dim = int64_t{1} << 62});
            }).find("passes int64's range"),
            std::string::npos);
  EXPECT_EQ(LlamaConfig::FromJson(R"({"hidden_size": 64})").dim, 64);
  EXPECT_EQ(LlamaConfig::FromJson(R"({"rope_theta": 10000})").rope.base, 10000);  // int as double
}

// Greedy ids of the full forward, one token at a time (no cache): the reference for generate.
std::vector<int64_t> GreedyByFullForward(LlamaForCausalLM& model, std::vector<int64_t> ids,
                                         int64_t n) {
  std::vector<int64_t> out;
  const Device device = model.cache_spec().device;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> v(ids.begin(), ids.end());
    const Tensor logits =
        model(from_vector(v, {1, static_cast<int64_t>(v.size())}, DType::kInt64, device));
    const Tensor last = slice(logits, 1, logits.size(1) - 1, logits.size(1));
    const int64_t next = to_vector<int64_t>(argmax(reshape(last, {-1})))[0];
    out.push_back(next);
    ids.push_back(next);
  }
  return out;
}

// A left-padded batch through forward_many with HF's attention_mask gives each prompt's logits
// alone; positions alone would let the padding into attention.
// Phi-3's checkpoints: llama_save_mapping(c) joins q/k/v into qkv_proj and gate/up into
// gate_up_proj (in that row order), llama_load_mapping(c) splits them back, and the reloaded
// model gives the same logits; other configs keep the plain names.
TEST(LlamaCheckpoint, Phi3FusedProjectionsSplitOnLoadAndJoinOnSave) {
  Generator gen(17);
  LlamaConfig c = TinyLlama();
  c.fused_projections = true;
  LlamaForCausalLM model(c, {.generator = &gen});
  const NamedTensors saved = state_dict(model, llama_save_mapping(c));
  std::map<std::string, Tensor> by_name(saved.begin(), saved.end());
  const int64_t hd = c.dim / c.heads;
  ASSERT_TRUE(by_name.count("model.layers.1.self_attn.qkv_proj.weight"));
  EXPECT_EQ(by_name["model.layers.1.self_attn.qkv_proj.weight"].shape(),
            (Shape{(c.heads + 2 * c.kv_heads) * hd, c.dim}));
  EXPECT_EQ(by_name["model.layers.0.mlp.gate_up_proj.weight"].shape(),
            (Shape{2 * c.hidden, c.dim}));
  EXPECT_FALSE(by_name.count("model.layers.0.self_attn.q_proj.weight"));
  const auto params = model.named_parameters();
  const auto param = [&](const std::string& name) {
    return std::find_if(params.begin(), params.end(),
                        [&](const auto& e) { return e.first == name; })
        ->second;
  };
  EXPECT_EQ(to_vector(slice(by_name["model.layers.0.self_attn.qkv_proj.weight"], 0, c.heads * hd,
                            (c.heads + c.kv_heads) * hd)),
            to_vector(param("layers.0.self_attn.k_proj.weight")));
  EXPECT_EQ(to_vector(slice(by_name["model.layers.0.mlp.gate_up_proj.weight"], 0, 0, c.hidden)),
            to_vector(param("layers.0.mlp.gate_proj.weight")));
  LlamaForCausalLM reloaded(c, {.init = Init::kNone});
  const LoadReport r = load_state_dict(reloaded, saved, {.map = llama_load_mapping(c)});
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty()) << r.str();
  const Tensor tokens = from_vector({1, 7, 3}, {1, 3}, DType::kInt64);
  EXPECT_EQ(to_vector(reloaded(tokens)), to_vector(model(tokens)));
  // A fused tensor with rows to spare (a checkpoint of other head counts) is an error.
  NamedTensors spare = saved;
  for (auto& [name, t] : spare) {
    if (name == "model.layers.1.self_attn.qkv_proj.weight") t = zeros({t.size(0) + 1, c.dim});
  }
  EXPECT_NE(ErrorOf([&] {
              LlamaForCausalLM other(c, {.init = Init::kNone});
              load_state_dict(other, spare, {.map = llama_load_mapping(c)});
            }).find("qkv_proj"),
            std::string::npos);
  c.fused_projections = false;
  EXPECT_TRUE(state_dict(model, llama_save_mapping(c)).size() > saved.size());
}

TEST(LlamaForward, AttentionMaskHidesLeftPadding) {
  Generator gen(5);
  LlamaForCausalLM model(TinyLlama(), {.generator = &gen});
  const Tensor alone = model(from_vector({5, 9, 13}, {1, 3}, DType::kInt64));
  const Tensor tokens = from_vector({0, 0, 5, 9, 13, 7, 3, 8, 1, 2}, {2, 5}, DType::kInt64);
  const Tensor positions = from_vector({0, 0, 0, 1, 2, 0, 1, 2, 3, 4}, {2, 5}, DType::kInt64);
  const Tensor mask = from_vector({0, 0, 1, 1, 1, 1, 1, 1, 1, 1}, {2, 5}, DType::kInt64);
  const Tensor padded = model.forward_many({tokens, positions, mask})[0];
  const Tensor row0 = slice(slice(padded, 0, 0, 1), 1, 2, 5);
  EXPECT_LT(item<double>(max(abs(row0 - alone))), 1e-5);
  const Tensor unpadded = model(slice(tokens, 0, 1, 2));
  EXPECT_LT(item<double>(max(abs(slice(padded, 0, 1, 2) - unpadded))), 1e-5);
  const Tensor unmasked = model.forward_many({tokens, positions})[0];
  EXPECT_GT(item<double>(max(abs(slice(slice(unmasked, 0, 0, 1), 1, 2, 5) - alone))), 1e-3);
  EXPECT_NE(ErrorOf([&] {
              model.forward_many({tokens, positions, slice(mask, 1, 0, 4)});
            }).find("attention_mask must be [B, T]"),
            std::string::npos);
}

class Generate : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().is_cuda()) KILN_SKIP_WITHOUT_GPU();
  }
};

TEST_P(Generate, GreedyEqualsTheFullForwardAndBatchesEqualPromptsAlone) {
  Generator gen(6);
  LlamaForCausalLM model(TinyLlama(), {.device = GetParam(), .generator = &gen});
  const std::vector<std::vector<int64_t>> prompts = {{5, 9, 13, 2, 40}, {7}, {1, 2, 3}};
  GenerateOptions o;
  o.max_new_tokens = 12;
  const GenerateResult batch = generate(model, prompts, o);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(batch.tokens[i], GreedyByFullForward(model, prompts[i], 12)) << "prompt " << i;
    EXPECT_EQ(generate(model, {prompts[i]}, o).tokens[0], batch.tokens[i]) << "prompt " << i;
  }
  EXPECT_EQ(batch.steps, 12);
  // Compiled (and on CUDA, the decode step as a CUDA graph): the same ids.
  for (auto mode : {GenerateOptions::Mode::kCompiled, GenerateOptions::Mode::kCudaGraph}) {
    if (mode == GenerateOptions::Mode::kCudaGraph && !GetParam().is_cuda()) continue;
    o.mode = mode;
    const GenerateResult r = generate(model, prompts, o);
    EXPECT_EQ(r.tokens, batch.tokens) << "mode " << static_cast<int>(mode);
    EXPECT_GT(r.kernels_per_decode_step, 0);
  }
}

// A Qwen3-style model (q/k norms, biases on all four attention projections, a tied head):
// eager, compiled and graph-replayed decoding give the ids of the full forward.
TEST_P(Generate, QkNormModelsDecodeAsTheirFullForward) {
  Generator gen(9);
  LlamaConfig c = TinyLlama();
  c.qk_norm = c.qkv_bias = c.out_bias = c.tie_word_embeddings = true;
  c.head_dim = 16;
  LlamaForCausalLM model(c, {.device = GetParam(), .generator = &gen});
  for (const auto& [name, p] : model.named_parameters()) {
    if (name.find("_norm") != std::string::npos) copy_(p, to(randn(p.shape(), gen), p.device()));
  }
  const std::vector<int64_t> prompt = {3, 14, 15, 9};
  GenerateOptions o;
  o.max_new_tokens = 8;
  const std::vector<int64_t> want = GreedyByFullForward(model, prompt, 8);
  EXPECT_EQ(generate(model, {prompt}, o).tokens[0], want);
  for (auto mode : {GenerateOptions::Mode::kCompiled, GenerateOptions::Mode::kCudaGraph}) {
    if (mode == GenerateOptions::Mode::kCudaGraph && !GetParam().is_cuda()) continue;
    o.mode = mode;
    EXPECT_EQ(generate(model, {prompt}, o).tokens[0], want) << "mode " << static_cast<int>(mode);
  }
}

// A Gemma model is a Llama model whose norm weights are 1 + w and whose embeddings are scaled by
// sqrt(dim): in float32 the two give the same logits, and Gemma decodes as its full forward.
TEST_P(Generate, GemmaIsLlamaWithOffsetNormsAndScaledEmbeddings) {
  Generator gen(13);
  LlamaConfig c = TinyLlama();
  c.gemma = true;
  c.activation = Activation::kGeluTanh;
  LlamaForCausalLM gemma(c, {.device = GetParam(), .generator = &gen});
  c.gemma = false;
  LlamaForCausalLM llama(c, {.device = GetParam(), .generator = &gen});
  const double scale = RoundToDType(DType::kFloat32, std::sqrt(static_cast<double>(c.dim)));
  const auto llama_params = llama.named_parameters();
  for (const auto& [name, p] : gemma.named_parameters()) {
    const bool norm = name.find("norm") != std::string::npos;
    if (norm) copy_(p, to(mul(randn(p.shape(), gen), 0.1), p.device()));  // gemma's w
    const Tensor& twin = std::find_if(llama_params.begin(), llama_params.end(), [&](const auto& e) {
                           return e.first == name;
                         })->second;
    if (norm) {
      copy_(twin, add(p, 1.0));
    } else if (name == "embed_tokens.weight") {
      copy_(twin, mul(p, scale));
    } else {
      copy_(twin, p);
    }
  }
  const Tensor tokens = to(from_vector({3, 14, 15, 9, 2}, {1, 5}, DType::kInt64), GetParam());
  const Tensor g = gemma(tokens), l = llama(tokens);
  ASSERT_EQ(g.shape(), l.shape());
  EXPECT_LT(item<double>(max(abs(g - l))), 1e-5);
  const std::vector<int64_t> prompt = {3, 14, 15, 9};
  GenerateOptions o;
  o.max_new_tokens = 6;
  EXPECT_EQ(generate(gemma, {prompt}, o).tokens[0], GreedyByFullForward(gemma, prompt, 6));
}

TEST_P(Generate, StopTokensEndRowsAndOnStepSeesEveryId) {
  Generator gen(7);
  LlamaForCausalLM model(TinyLlama(), {.device = GetParam(), .generator = &gen});
  GenerateOptions o;
  o.max_new_tokens = 10;
  const std::vector<std::vector<int64_t>> prompts = {{3, 4}, {8, 1, 6}};
  const GenerateResult free_run = generate(model, prompts, o);
  const int64_t stop = free_run.tokens[0][3];  // row 0 ends at its 4th token (or earlier)
  o.stop_tokens = {stop};
  int64_t calls = 0;
  o.on_step = [&](int64_t step, const std::vector<int64_t>& ids) {
    EXPECT_EQ(step, calls++);
    EXPECT_EQ(ids.size(), 2u);
    return true;
  };
  const GenerateResult r = generate(model, prompts, o);
  EXPECT_TRUE(r.stopped[0]);
  EXPECT_EQ(r.tokens[0].back(), stop);
  EXPECT_LE(r.tokens[0].size(), 4u);
  for (size_t row = 0; row < 2; ++row) {  // up to the stop, the same ids as without one
    for (size_t i = 0; i < r.tokens[row].size(); ++i)
      EXPECT_EQ(r.tokens[row][i], free_run.tokens[row][i]);
  }
  EXPECT_EQ(calls, r.steps);
  EXPECT_NE(ErrorOf([&] {
              generate(model, {{1, 2}, {}}, o);
            }).find("prompt 1 is empty"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { generate(model, {{1, 64}}, o); }).find("holds id 64"), std::string::npos);
  o.max_new_tokens = 63;
  EXPECT_NE(ErrorOf([&] { generate(model, {{1, 2}}, o); }).find("64 positions"), std::string::npos);
  o.max_new_tokens = 4;
  o.sampling.top_p = 1.5;  // refused before any step runs
  EXPECT_NE(ErrorOf([&] {
              generate(model, {{1, 2}}, o);
            }).find("top_p must be in (0, 1]"),
            std::string::npos);
}

// A model written by a user whose Step returns logits of a given shape.
class ShapedLogitsLM : public CausalLM {
 public:
  explicit ShapedLogitsLM(Shape logits) : logits_(std::move(logits)) {}
  CacheSpec cache_spec() const override {
    return {.layers = 1, .kv_heads = 1, .head_dim = 2, .vocab = 8, .max_positions = 64};
  }
  Tensor Step(const StepInputs&) override { return zeros(logits_); }
  const char* type_name() const override { return "ShapedLogitsLM"; }

 private:
  Shape logits_;
};

// generate() reads one id per row from [B, vocab] logits: other shapes are the model's error,
// not reads past the rows or ids outside the vocabulary; limits near int64's end do not wrap.
TEST(GenerateChecks, AStepsLogitsAndTheLimitsAreChecked) {
  GenerateOptions o;
  o.max_new_tokens = 3;
  for (const Shape& bad : {Shape{66, 8}, Shape{2, 13}, Shape{2, 1, 8}}) {
    ShapedLogitsLM model(bad);
    EXPECT_NE(ErrorOf([&] {
                generate(model, {{1}, {2}}, o);
              })
                  .find("the model's Step must return floating logits [B, vocab] = [2, 8], the "
                        "prefill returned float32" +
                        ShapeString(bad)),
              std::string::npos);
  }
  ShapedLogitsLM good(Shape{2, 8});
  EXPECT_EQ(generate(good, {{1}, {2}}, o).tokens,
            (std::vector<std::vector<int64_t>>{{0, 0, 0}, {0, 0, 0}}));
  o.max_new_tokens = std::numeric_limits<int64_t>::max();
  EXPECT_NE(ErrorOf([&] { generate(good, {{1}}, o); }).find("passes the model's 64 positions"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Devices, Generate, ::testing::Values(kCPU, CUDA(0)),
                         [](const auto& info) { return info.param.is_cuda() ? "Cuda" : "Cpu"; });

// The same seed gives the same sampled ids on the CPU and on CUDA (the draws are the host's).
TEST(Sampling, SameSeedSameIdsOnCpuAndCuda) {
  KILN_SKIP_WITHOUT_GPU();
  GenerateOptions o;
  o.max_new_tokens = 16;
  o.sampling = {.temperature = 0.9, .top_k = 20, .top_p = 0.9};
  o.seed = 77;
  Generator g1(8);
  LlamaForCausalLM cpu(TinyLlama(), {.generator = &g1});
  LlamaForCausalLM gpu(TinyLlama(), {.device = CUDA(0), .init = Init::kNone});
  load_state_dict(gpu, state_dict(cpu));
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {9}};
  EXPECT_EQ(generate(cpu, prompts, o).tokens, generate(gpu, prompts, o).tokens);
}

TEST(Sampling, SeededAndDifferentSeedsDiffer) {
  Generator gen(9);
  LlamaForCausalLM model(TinyLlama(), {.generator = &gen});
  GenerateOptions o;
  o.max_new_tokens = 16;
  o.sampling.temperature = 1.5;
  o.seed = 1;
  const auto a = generate(model, {{4, 5}}, o).tokens, b = generate(model, {{4, 5}}, o).tokens;
  o.seed = 2;
  EXPECT_EQ(a, b);
  EXPECT_NE(generate(model, {{4, 5}}, o).tokens, a);
}

// The distribution, computed independently: softmax(logits / T) over the top k (ties by lower
// id), then the smallest prefix whose mass reaches p, renormalised.
std::vector<double> ExpectedDistribution(const std::vector<float>& logits, double t, int64_t k,
                                         double p) {
  std::vector<std::pair<float, int64_t>> order;
  for (size_t i = 0; i < logits.size(); ++i) order.push_back({-logits[i], static_cast<int64_t>(i)});
  std::sort(order.begin(), order.end());
  order.resize(std::min<size_t>(order.size(), k));
  double z = 0;
  for (auto& [neg, id] : order) z += std::exp(-neg / t);
  std::vector<double> probs(logits.size(), 0.0);
  double mass = 0, kept = 0;
  for (auto& [neg, id] : order) {
    if (mass >= p) break;
    probs[id] = std::exp(-neg / t) / z;
    mass += probs[id];
    kept += probs[id];
  }
  for (double& q : probs) q /= kept;
  return probs;
}

TEST(Sampling, TopKTopPDrawsFollowTheirDistribution) {
  const std::vector<float> logits = {1.0f, 3.0f, 0.5f, 2.5f, -1.0f, 2.9f, 0.0f, 1.7f, 2.0f, -3.0f};
  const SamplingOptions s{.temperature = 0.8, .top_k = 6, .top_p = 0.9};
  const std::vector<double> want = ExpectedDistribution(logits, 0.8, 6, 0.9);
  const std::vector<double> got = sampling_distribution(logits, s);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "id " << i;
  // 10,000 draws: a chi-square goodness-of-fit test against that distribution.
  Generator gen(2026);
  std::vector<int> counts(logits.size(), 0);
  const int draws = 10000;
  for (int i = 0; i < draws; ++i) ++counts[sample_token(logits, s, gen.Uniform())];
  double chi2 = 0;
  int categories = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "id " << i << " is outside top-k/top-p but was drawn";
      continue;
    }
    const double expected = draws * want[i];
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++categories;
  }
  ASSERT_GE(categories, 3);
  // The 0.999 quantile of chi-square with categories - 1 degrees of freedom (Wilson-Hilferty).
  const double df = categories - 1, z = 3.090;
  const double limit = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  EXPECT_LT(chi2, limit) << "counts do not follow the distribution";
  // Greedy: the argmax, the lower id among ties; bad options are errors.
  EXPECT_EQ(sample_token({1, 4, 4, 2}, {}, 0.99), 1);
  EXPECT_THROW(sample_token(logits, {.temperature = -1}, 0.5), Error);
  EXPECT_THROW(sample_token(logits, {.temperature = 1, .top_p = 0}, 0.5), Error);
  EXPECT_THROW(sample_token({}, {}, 0.5), Error);
  EXPECT_NE(ErrorOf([] {
              sample_token({1, NAN, 2}, {.temperature = 1}, 0.5);
            }).find("logit 1 is NaN"),
            std::string::npos);
}

// top_p = 1 keeps every id: the mass summed in double reached 1 before the smallest ids were
// counted, and 318 of 1000 ids got probability 0. Greedy is torch.argmax whatever top_k and top_p
// say: +inf and NaN logits are picked as argmax picks them, not refused.
TEST(Sampling, TopPOfOneKeepsEveryIdAndGreedyIgnoresTopKTopP) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = -0.05f * static_cast<float>(i);
  const std::vector<double> all = sampling_distribution(logits, {.temperature = 1, .top_p = 1});
  for (size_t i = 0; i < all.size(); ++i) ASSERT_GT(all[i], 0.0) << "id " << i;
  const std::vector<double> k_only =
      sampling_distribution(logits, {.temperature = 1, .top_k = 1000});
  EXPECT_EQ(all, k_only);
  const SamplingOptions greedy_k{.temperature = 0, .top_k = 5, .top_p = 0.5};
  EXPECT_EQ(sample_token({1, INFINITY, 3}, greedy_k, 0.5), 1);
  EXPECT_EQ(sample_token({1, NAN, 3, NAN}, greedy_k, 0.5), 1);  // the first NaN, as argmax
  EXPECT_EQ(sample_token({-INFINITY, -INFINITY}, greedy_k, 0.5), 0);
  EXPECT_EQ(sampling_distribution({2, 7, 7}, greedy_k), (std::vector<double>{0, 1, 0}));
}

// A model written by a user whose cache_spec() is impossible: its error names generate or
// NewCache, the model and the field, before anything is allocated.
class SpecLM : public CausalLM {
 public:
  explicit SpecLM(CacheSpec spec) : spec_(spec) {}
  CacheSpec cache_spec() const override { return spec_; }
  Tensor Step(const StepInputs&) override { return zeros({1, spec_.vocab}); }
  const char* type_name() const override { return "SpecLM"; }

 private:
  CacheSpec spec_;
};

TEST(GenerateChecks, TheModelsCacheSpecIsChecked) {
  const CausalLM::CacheSpec good{
      .layers = 1, .kv_heads = 1, .head_dim = 2, .vocab = 8, .max_positions = 64};
  GenerateOptions o;
  o.max_new_tokens = 2;
  auto with = [&](auto change) {
    CausalLM::CacheSpec s = good;
    change(s);
    return SpecLM(s);
  };
  for (auto change : std::vector<std::function<void(CausalLM::CacheSpec&)>>{
           [](auto& s) { s.kv_heads = -1; }, [](auto& s) { s.layers = -1; },
           [](auto& s) { s.head_dim = 0; }, [](auto& s) { s.vocab = 0; },
           [](auto& s) { s.max_positions = 0; }}) {
    SpecLM model = with(change);
    const std::string e = ErrorOf([&] { generate(model, {{1}}, o); });
    EXPECT_NE(e.find("generate: SpecLM::cache_spec() must give layers >= 0 and kv_heads"),
              std::string::npos)
        << e;
    EXPECT_NE(ErrorOf([&] { model.NewCache(1, 4); }).find("NewCache: SpecLM::cache_spec()"),
              std::string::npos);
  }
  SpecLM ints = with([](auto& s) { s.dtype = DType::kInt64; });
  EXPECT_NE(ErrorOf([&] { ints.NewCache(1, 4); }).find("must give a floating dtype"),
            std::string::npos);
  SpecLM fine(good);
  EXPECT_EQ(fine.NewCache(2, 4).k[0].shape(), (Shape{2, 1, 4, 2}));
  // A model built on meta (shapes only) has no weights to generate with.
  LlamaForCausalLM meta(TinyLlama(), {.device = kMeta});
  EXPECT_NE(ErrorOf([&] { generate(meta, {{1}}, o); })
                .find("generate: LlamaForCausalLM is on the meta device (shapes, no values): give "
                      "it memory (to_empty) and load its weights first"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
