// Modules: parameter naming and init (torch's state-dict keys, recursively), each module's
// forward against the same math written with plain ops (and, for attention, against a softmax
// written out by hand), rotary embeddings against a double reference and their relative-position
// property, the decoder block's causality, several inputs, compiled blocks against eager, and bad
// sizes named by the module.
#include "ops/modules.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>

#include "codegen/compile.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/status.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

TEST(Modules, LinearParametersAndInit) {
  Generator gen(0);
  Linear fc(16, 8, true, gen);
  auto params = fc.named_parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].first, "weight");
  EXPECT_EQ(params[0].second.shape(), (Shape{8, 16}));
  for (double v : to_vector(fc.weight())) ASSERT_LE(std::fabs(v), 0.25 + 1e-6);  // 1/sqrt(16)
  Linear nobias(4, 2, false, gen);
  EXPECT_EQ(nobias.named_parameters().size(), 1u);
}

TEST(Modules, GeGLUMatchesOps) {
  Generator gen(1);
  GeGLUMLP mlp(12, 20, gen);
  const auto names = mlp.named_parameters();
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names[0].first, "gate.weight");
  EXPECT_EQ(names[2].first, "down.weight");
  Tensor x = randn({2, 3, 12}, gen);
  Tensor want =
      matmul(gelu(matmul(x, t(mlp.gate().weight())), "tanh") * matmul(x, t(mlp.up().weight())),
             t(mlp.down().weight()));
  Tensor got = mlp(x);
  ASSERT_EQ(got.shape(), (Shape{2, 3, 12}));
  ExpectClose(to_vector(got), to_vector(want), {1e-5, 1e-5}, "GeGLUMLP");
}

TEST(Modules, MLPAppliesGeluBetweenLayers) {
  Generator gen(2);
  MLP mlp({8, 16, 16, 4}, gen);
  EXPECT_EQ(mlp.named_parameters().size(), 6u);
  Tensor x = randn({5, 8}, gen);
  EXPECT_EQ(mlp(x).shape(), (Shape{5, 4}));
}

TEST(Modules, CausalAttentionIsCausalAndInPlaceAgrees) {
  Generator gen(3);
  Tensor q = randn({2, 2, 6, 4}, gen), k = randn({2, 2, 6, 4}, gen), v = randn({2, 2, 6, 4}, gen);
  Tensor out = causal_attention(q, k, v);
  Tensor out_inplace = causal_attention(q, k, v, {}, /*inplace=*/true);
  ExpectClose(to_vector(out_inplace), to_vector(out), {1e-6, 1e-6}, "inplace");
  // Row 0 attends only to position 0, so it equals v[..., 0, :].
  ExpectClose(to_vector(slice(out, 2, 0, 1)), to_vector(slice(v, 2, 0, 1)), {1e-6, 1e-6}, "row0");
  // Changing a future key/value does not change earlier outputs.
  Tensor v2 = clone(v);
  masked_fill_(slice(v2, 2, 5, 6), ones({1}, DType::kBool), 100.0);
  Tensor out2 = causal_attention(q, k, v2);
  ExpectClose(to_vector(slice(out2, 2, 0, 5)), to_vector(slice(out, 2, 0, 5)), {1e-6, 1e-6},
              "causality");
}

TEST(Modules, SelfAttentionShapesAndDtype) {
  Generator gen(4);
  CausalSelfAttention attn(16, 4, gen, {DType::kBFloat16, kCPU});
  Tensor x = cast(randn({2, 5, 16}, gen), DType::kBFloat16);
  Tensor y = attn(x);
  EXPECT_EQ(y.shape(), (Shape{2, 5, 16}));
  EXPECT_EQ(y.dtype(), DType::kBFloat16);
  attn.to(DType::kFloat32);
  EXPECT_EQ(attn.named_parameters()[0].second.dtype(), DType::kFloat32);
}

std::vector<std::string> Names(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, p] : m.named_parameters()) out.push_back(name);
  return out;
}

TEST(Modules, EmbeddingAndNorms) {
  Generator gen(5);
  Embedding emb(10, 4, gen);
  EXPECT_EQ(Names(emb), std::vector<std::string>{"weight"});
  const Tensor ids = from_vector({3, 0, 3}, {3}, DType::kInt64);
  ExpectClose(to_vector(emb(ids)), to_vector(index_select(emb.weight(), 0, ids)), {0, 0}, "emb");
  LayerNorm ln(4);
  EXPECT_EQ(Names(ln), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(Names(LayerNorm(4, 1e-5, true, /*bias=*/false)), std::vector<std::string>{"weight"});
  EXPECT_TRUE(Names(LayerNorm(4, 1e-5, /*elementwise_affine=*/false)).empty());
  const Tensor x = randn({2, 3, 4}, gen);
  ExpectClose(to_vector(ln(x)), to_vector(layer_norm(x)), {1e-6, 1e-6}, "layer_norm");
  RMSNorm rms(4, 1e-6);
  ExpectClose(to_vector(rms(x)), to_vector(rms_norm(x, {}, 1e-6)), {1e-6, 1e-6}, "rms_norm");
  EXPECT_THROW(Embedding(0, 4, gen), Error);
}

// Rotary embeddings against the formula in double: out[2i..] pairs (x_i, x_{i+half}) rotated by
// position * base^(-2i / d).
// A bad size is named by the module before any parameter is drawn (a negative one reached the
// weight's factory first: "rand: shape [3, -1] has a negative dimension"); a negative MLP size is
// not taken for the 4 * dim default; parameters convert to floating dtypes only (torch refuses
// module.to(torch.int64)).
TEST(Modules, BadSizesAreNamedByTheModule) {
  Generator gen(3);
  auto expect_error = [](const std::function<void()>& make, const std::string& words) {
    try {
      make();
      ADD_FAILURE() << "no error for " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error([&] { Linear(-1, 3, true, gen); }, "Linear: features must be positive, got in=-1");
  expect_error([&] { Linear(3, -2, false); }, "Linear: features must be positive");
  expect_error([&] { Embedding(3, -2, gen); }, "Embedding: sizes must be positive");
  expect_error([&] { LayerNorm(-5); }, "LayerNorm: dim must be positive, got -5");
  expect_error([&] { LayerNorm(-5, 1e-5, false); }, "LayerNorm: dim must be positive");
  expect_error([&] { RMSNorm(-2); }, "RMSNorm: dim must be positive, got -2");
  expect_error([&] { CausalSelfAttention(-8, 2, gen); }, "CausalSelfAttention: dim -8");
  DecoderBlockConfig c;
  c.dim = 8;
  c.heads = 2;
  c.hidden = -1;
  expect_error([&] { DecoderBlock(c, gen); }, "DecoderBlock: dim and heads must be positive");
  c.hidden = 0;
  c.dim = -8;
  expect_error([&] { DecoderBlock(c, gen); }, "got dim=-8");
  Linear lin(2, 2, true, gen);
  expect_error([&] { lin.to(DType::kInt64); }, "Linear.to: parameters convert to floating");
  expect_error([&] { lin.to(DType::kBool); }, "got bool");
  EXPECT_EQ(lin.weight().dtype(), DType::kFloat32);  // untouched by the refused call
  lin.to(DType::kBFloat16);
  EXPECT_EQ(lin.weight().dtype(), DType::kBFloat16);
}

TEST(Modules, RotaryMatchesTheFormula) {
  Generator gen(6);
  const int64_t d = 8, t_len = 5;
  RotaryEmbedding rope(d, 16, 10000.0);
  const Tensor x = randn({2, t_len, d}, gen);
  const Tensor positions = from_vector({3, 0, 7, 7, 15}, {t_len}, DType::kInt64);
  const std::vector<double> got = to_vector(rope({x, positions})[0]), xv = to_vector(x);
  const std::vector<double> pos = to_vector(positions);
  std::vector<double> want(xv.size());
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < t_len; ++t) {
      for (int64_t i = 0; i < d / 2; ++i) {
        const double a = pos[t] * std::pow(10000.0, -2.0 * i / d);
        const int64_t base = (b * t_len + t) * d;
        const double x1 = xv[base + i], x2 = xv[base + i + d / 2];
        want[base + i] = x1 * std::cos(a) - x2 * std::sin(a);
        want[base + i + d / 2] = x2 * std::cos(a) + x1 * std::sin(a);
      }
    }
  }
  ExpectClose(got, want, {1e-5, 1e-5}, "rotary");
  // forward(x) uses positions 0 .. T-1; position 0 leaves a row unchanged.
  ExpectClose(to_vector(rope(x)), to_vector(rope({x, arange(t_len)})[0]), {0, 0}, "default");
  ExpectClose(to_vector(slice(rope(x), 1, 0, 1)), to_vector(slice(x, 1, 0, 1)), {1e-7, 1e-7},
              "position 0");
  EXPECT_TRUE(rope.named_parameters().empty());
  EXPECT_EQ(rope.named_buffers().size(), 2u);
  EXPECT_THROW(rope({x, from_vector({0, 1, 2, 3, 16}, {t_len}, DType::kInt64)}), Error);
  EXPECT_THROW(RotaryEmbedding(7, 4), Error);
}

// <rope(q, m), rope(k, n)> depends on m - n only: what makes rotary positions relative.
TEST(Modules, RotaryDotProductsAreRelative) {
  Generator gen(7);
  RotaryEmbedding rope(16, 64);
  const Tensor q = randn({1, 16}, gen), k = randn({1, 16}, gen);
  auto at = [&](const Tensor& v, int64_t p) {
    return rope({v, from_vector({double(p)}, {1}, DType::kInt64)})[0];
  };
  const double d1 = item(sum(at(q, 9) * at(k, 4))), d2 = item(sum(at(q, 35) * at(k, 30)));
  EXPECT_NEAR(d1, d2, 1e-4);
  EXPECT_GT(std::fabs(d1 - item(sum(at(q, 9) * at(k, 8)))), 1e-4);  // and does depend on it
}

DecoderBlockConfig Gpt2Config() {
  return {.dim = 16,
          .heads = 4,
          .norm = NormKind::kLayerNorm,
          .mlp = MlpKind::kPlain,
          .activation = Activation::kGeluTanh,
          .bias = true,
          .rotary = false};
}

TEST(Modules, Gpt2BlockNamesAndMath) {
  Generator gen(8);
  DecoderBlock block(Gpt2Config(), gen);
  EXPECT_EQ(Names(block),
            (std::vector<std::string>{"ln_1.weight", "ln_1.bias", "attn.c_attn.weight",
                                      "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                                      "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
                                      "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"}));
  std::map<std::string, Tensor> p;
  for (const auto& [name, t] : block.named_parameters()) p[name] = t;
  EXPECT_EQ(p["mlp.c_fc.weight"].shape(), (Shape{64, 16}));  // hidden = 4 * dim
  // The block written out with ops.
  const Tensor x = randn({2, 6, 16}, gen);
  const Tensor a = layer_norm(x, p["ln_1.weight"], p["ln_1.bias"]);
  const Tensor qkv = linear(a, p["attn.c_attn.weight"], p["attn.c_attn.bias"]);
  auto heads = [](const Tensor& t) { return permute(reshape(t, {2, 6, 4, 4}), {0, 2, 1, 3}); };
  const Tensor q = heads(slice(qkv, -1, 0, 16)), k = heads(slice(qkv, -1, 16, 32)),
               v = heads(slice(qkv, -1, 32, 48));
  const Tensor y = reshape(permute(causal_attention(q, k, v), {0, 2, 1, 3}), {2, 6, 16});
  const Tensor h = x + linear(y, p["attn.c_proj.weight"], p["attn.c_proj.bias"]);
  const Tensor m = layer_norm(h, p["ln_2.weight"], p["ln_2.bias"]);
  const Tensor want = h + linear(gelu(linear(m, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"]), "tanh"),
                                 p["mlp.c_proj.weight"], p["mlp.c_proj.bias"]);
  ExpectClose(to_vector(block(x)), to_vector(want), {1e-5, 1e-5}, "gpt2 block");
}

// A GPT-2-shaped container: the state-dict keys of Hugging Face's GPT2Model.
class TinyGpt : public Module {
 public:
  TinyGpt(int64_t layers, Generator& gen)
      : wte_(RegisterModule("wte", std::make_unique<Embedding>(32, 16, gen))),
        wpe_(RegisterModule("wpe", std::make_unique<Embedding>(8, 16, gen))),
        h_(RegisterModule("h", std::make_unique<ModuleList>())),
        ln_f_(RegisterModule("ln_f", std::make_unique<LayerNorm>(16))) {
    for (int64_t i = 0; i < layers; ++i)
      h_.push_back(std::make_unique<DecoderBlock>(Gpt2Config(), gen));
  }
  Tensor forward(const Tensor& ids) override {
    const Tensor x = wte_(ids) + wpe_(arange(ids.size(-1)));
    return ln_f_(h_(x));
  }

 private:
  Embedding& wte_;
  Embedding& wpe_;
  ModuleList& h_;
  LayerNorm& ln_f_;
};

TEST(Modules, NamedParametersAreStateDictKeys) {
  Generator gen(9);
  TinyGpt gpt(2, gen);
  const std::vector<std::string> names = Names(gpt);
  ASSERT_EQ(names.size(), 2u + 2 * 12 + 2);
  EXPECT_EQ(names[0], "wte.weight");
  EXPECT_EQ(names[1], "wpe.weight");
  EXPECT_EQ(names[2], "h.0.ln_1.weight");
  EXPECT_EQ(names[4], "h.0.attn.c_attn.weight");
  EXPECT_EQ(names[14 + 11], "h.1.mlp.c_proj.bias");
  EXPECT_EQ(names.back(), "ln_f.bias");
  const Tensor logits = gpt(from_vector({1, 5, 9, 2}, {1, 4}, DType::kInt64));
  EXPECT_EQ(logits.shape(), (Shape{1, 4, 16}));
}

// Changing a later token never changes an earlier output (both block kinds).
TEST(Modules, DecoderBlocksAreCausal) {
  Generator gen(10);
  const DecoderBlockConfig llama{.dim = 16, .heads = 2, .hidden = 24};  // RMSNorm, SwiGLU, rope
  for (const DecoderBlockConfig& c : {Gpt2Config(), llama}) {
    DecoderBlock block(c, gen);
    const Tensor x = randn({1, 7, 16}, gen);
    Tensor x2 = clone(x);
    add_(slice(x2, 1, 6, 7), 5.0);
    ExpectClose(to_vector(slice(block(x2), 1, 0, 6)), to_vector(slice(block(x), 1, 0, 6)),
                {1e-6, 1e-6}, "causal");
  }
}

TEST(Modules, SeveralInputs) {
  Generator gen(11);
  DecoderBlock block({.dim = 16, .heads = 2}, gen);
  EXPECT_EQ(Names(block)[1], "attn.c_attn.weight");  // no biases
  EXPECT_EQ(block.named_buffers()[0].first, "attn.rotary.cos");
  const Tensor x = randn({2, 3, 16}, gen);
  // Explicit positions 0..T-1 equal the default; shifted positions change the result.
  ExpectClose(to_vector(block({x, arange(3)})[0]), to_vector(block(x)), {1e-6, 1e-6}, "positions");
  EXPECT_NE(to_vector(block({x, arange(4, 7, 1)})[0]), to_vector(block(x)));
  EXPECT_THROW(block({x, arange(3), arange(3)}), Error);
  // A module overriding neither forward gets an error, not endless recursion.
  struct Empty : Module {};
  Empty empty;
  EXPECT_THROW(empty(x), Error);
  EXPECT_THROW(empty({x}), Error);
}

// Names are checked as torch's register_parameter / register_buffer / add_module check them: a
// second tensor under one name was never loaded (load_state_dict wrote the first only).
TEST(Modules, RegisteredNamesAreCheckedAsTorchChecksThem) {
  struct Registering : Module {
    void Param(const std::string& name) { RegisterParameter(name, zeros({2})); }
    void Buffer(const std::string& name) { RegisterBuffer(name, zeros({2})); }
    void Child(const std::string& name) { RegisterModule(name, std::make_unique<Registering>()); }
  };
  Registering m;
  m.Param("w");
  m.Buffer("b");
  m.Child("c");
  ExpectThrowsWith([&] { m.Param("w"); },
                   "cannot register parameter \"w\": it is already a parameter");
  ExpectThrowsWith([&] { m.Buffer("w"); },
                   "cannot register buffer \"w\": it is already a parameter");
  ExpectThrowsWith([&] { m.Param("b"); }, "it is already a buffer");
  ExpectThrowsWith([&] { m.Param("c"); }, "it is already a submodule");
  ExpectThrowsWith([&] { m.Child("w"); }, "cannot register module \"w\"");
  ExpectThrowsWith([&] { m.Param(""); }, "the name is empty");
  m.Param("a.b");  // kiln's shortcut for a flat module's state-dict key
  EXPECT_EQ(m.named_parameters().size(), 2u);
  EXPECT_EQ(m.named_buffers().size(), 1u);
}

// Module::to(DType) converts floating parameters only (torch's Module.to): an integer table
// keeps its values (257 became 256 in bfloat16). A tensor registered in two modules stays one
// tensor through to() (a write through either shows in both), as a shared torch Parameter does.
TEST(Modules, ToConvertsFloatingParametersAndKeepsSharedOnesShared) {
  struct Holder : Module {
    explicit Holder(const Tensor& shared) {
      table = &RegisterParameter("table", from_vector({257, 1025, 3}, {3}, DType::kInt64));
      weight = &RegisterParameter("weight", shared);
    }
    Tensor* table;
    Tensor* weight;
  };
  struct Pair : Module {
    Pair() {
      const Tensor shared = full({4}, 1.5);
      a = &RegisterModule("a", std::make_unique<Holder>(shared));
      b = &RegisterModule("b", std::make_unique<Holder>(shared));
    }
    Holder* a;
    Holder* b;
  };
  Pair m;
  m.to(DType::kBFloat16);
  EXPECT_EQ(m.a->table->dtype(), DType::kInt64);
  EXPECT_EQ(to_vector(*m.a->table), (std::vector<double>{257, 1025, 3}));
  EXPECT_EQ(m.a->weight->dtype(), DType::kBFloat16);
  EXPECT_EQ(m.a->weight->storage(), m.b->weight->storage());
  m.to(kCPU);
  EXPECT_EQ(m.a->weight->storage(), m.b->weight->storage());
  copy_(*m.a->weight, full({4}, 2.0, DType::kBFloat16));
  EXPECT_EQ(to_vector(*m.b->weight), std::vector<double>(4, 2.0));
}

// A rotary block traced and compiled (embedding, cat and slices in the graph) equals eager, and
// eager calls after compiling still work (no traced value cached in the module).
TEST(Modules, CompiledDecoderBlockMatchesEager) {
  Generator gen(12);
  DecoderBlock block({.dim = 16, .heads = 2}, gen);
  const Tensor x = randn({2, 5, 16}, gen);
  const Tensor eager = block(x);
  CompiledFn f = compile([&block](const std::vector<Tensor>& in) { return block.forward_many(in); },
                         {x, arange(5)});
  ExpectClose(to_vector(f({x, arange(5)})[0]), to_vector(eager), {1e-5, 1e-5}, "compiled");
  ExpectClose(to_vector(block(x)), to_vector(eager), {0, 0}, "eager after compile");
  CompiledFn g = compile(block, x);
  ExpectClose(to_vector(g({x})[0]), to_vector(eager), {1e-5, 1e-5}, "compiled module");
  // The same for the older CausalSelfAttention, which caches its mask too.
  CausalSelfAttention attn(16, 2, gen);
  CompiledFn h = compile(attn, x);
  ExpectClose(to_vector(h({x})[0]), to_vector(attn(x)), {1e-5, 1e-5}, "compiled attention");
  ExpectClose(to_vector(attn(x)), to_vector(h({x})[0]), {1e-5, 1e-5}, "eager after compile");
}

TEST(ModulesCuda, DecoderBlockOnCudaMatchesCpu) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(13);
  DecoderBlock block({.dim = 32, .heads = 4}, gen);
  const Tensor x = randn({2, 9, 32}, gen);
  const Tensor want = block(x);
  block.to(CUDA(0));
  ExpectClose(to_vector(block(to(x, CUDA(0)))), to_vector(want), {1e-4, 1e-4}, "cuda block");
}

}  // namespace
}  // namespace kiln
