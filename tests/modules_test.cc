// Modules: parameter naming and init, and each module's forward against the same math written
// with plain ops (and, for attention, against a softmax written out by hand).
#include "ops/modules.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ops/factories.h"
#include "ops/ops.h"
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

}  // namespace
}  // namespace kiln
