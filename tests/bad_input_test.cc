// Bad input never crashes: every case throws kiln::Error whose message names the op, the
// operand shapes and the rule broken.
#include <gtest/gtest.h>

#include <functional>

#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {
namespace {

struct BadCase {
  const char* name;
  std::function<void()> call;
  std::vector<std::string> must_mention;
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
};

Tensor F(std::vector<int64_t> shape, DType t = DType::kFloat32, Device d = kCPU) {
  return ones(shape, t, d);
}

const std::vector<BadCase>& Cases() {
  static const auto* cases = new std::vector<BadCase>{
      {"shape_mismatch",
       [] {
         add(F({2, 3}), F({4, 3}));
       },
       {"add:", "[2, 3]", "[4, 3]", "broadcast"}},
      {"bad_broadcast_3d",
       [] {
         mul(F({2, 3, 4}), F({3, 5}));
       },
       {"mul:", "[2, 3, 4]", "[3, 5]"}},
      {"matmul_inner",
       [] {
         matmul(F({2, 3}), F({4, 5}));
       },
       {"matmul:", "[2, 3]", "[4, 5]", "inner dims"}},
      {"matmul_dtype",
       [] {
         matmul(F({2, 3}), F({3, 2}, DType::kBFloat16));
       },
       {"matmul:", "same dtype", "bfloat16"}},
      {"matmul_0d", [] { matmul(F({}), F({3})); }, {"matmul:", "at least one dim"}},
      {"linear_features",
       [] {
         linear(F({4, 8}), F({16, 7}));
       },
       {"linear:", "[4, 8]", "[16, 7]"}},
      {"linear_bias_shape",
       [] {
         linear(F({4, 8}), F({16, 8}), F({8}));
       },
       {"linear:", "bias", "[16]"}},
      {"linear_rank",
       [] {
         linear(F({4, 8}), F({8}));
       },
       {"linear:", "weight [out, in]"}},
      {"softmax_dim",
       [] {
         softmax(F({2, 3}), 2);
       },
       {"softmax:", "dim 2", "rank 2", "[2, 3]"}},
      {"sum_dim",
       [] {
         sum(F({2, 3}), {-3});
       },
       {"sum:", "dim -3"}},
      {"sum_dup_dim",
       [] {
         sum(F({2, 3}), {1, -1});
       },
       {"sum:", "twice"}},
      {"mean_int", [] { mean(F({2}, DType::kInt64)); }, {"mean:", "floating"}},
      {"transpose_dim",
       [] {
         transpose(F({2, 3}), 0, 5);
       },
       {"transpose:", "dim 5"}},
      {"permute_len",
       [] {
         permute(F({2, 3}), {0});
       },
       {"permute:", "2 dims"}},
      {"permute_repeat",
       [] {
         permute(F({2, 3}), {1, 1});
       },
       {"permute:", "repeats"}},
      {"reshape_numel",
       [] {
         reshape(F({2, 3}), {4, 2});
       },
       {"reshape:", "[4, 2]", "6 elements"}},
      {"expand_bad",
       [] {
         expand(F({2, 3}), {4, 3});
       },
       {"expand:", "[2, 3]", "[4, 3]"}},
      {"slice_step", [] { slice(F({4}), 0, 0, 4, 0); }, {"slice:", "step"}},
      {"masked_fill_mask_dtype",
       [] {
         masked_fill(F({2, 2}), F({2, 2}), 0);
       },
       {"masked_fill:", "mask must be bool"}},
      {"masked_fill_bcast",
       [] {
         masked_fill(F({2, 2}), F({3}, DType::kBool), 0);
       },
       {"masked_fill:", "[2, 2]", "[3]"}},
      {"where_cond", [] { where(F({2}), F({2}), F({2})); }, {"where:", "condition must be bool"}},
      {"inplace_broadcast_self",
       [] {
         add_(F({3}), F({2, 3}));
       },
       {"add:", "in-place", "[2, 3]", "[3]"}},
      {"inplace_expanded_view",
       [] {
         add_(expand(F({1, 3}), {4, 3}), F({4, 3}));
       },
       {"add:", "in-place", "expanded"}},
      {"inplace_float_into_int",
       [] { add_(F({3}, DType::kInt64), F({3})); },
       {"add:", "in-place", "float32", "int64"}},
      {"layer_norm_weight",
       [] {
         layer_norm(F({2, 8}), F({4}));
       },
       {"layer_norm:", "weight", "[8]", "[4]"}},
      {"layer_norm_int",
       [] {
         layer_norm(F({2, 8}, DType::kInt32));
       },
       {"layer_norm:", "floating"}},
      {"gelu_approx", [] { gelu(F({2}), "fast"); }, {"gelu:", "fast"}},
      {"device_mismatch",
       [] { add(F({2}), F({2}, DType::kFloat32, kMeta)); },
       {"add:", "one device", "cpu", "meta"}},
      {"undefined_input", [] { add(Tensor(), F({2})); }, {"add:", "undefined"}},
      {"negative_shape",
       [] {
         empty({2, -1});
       },
       {"empty:", "negative", "[2, -1]"}},
      {"from_vector_size",
       [] {
         from_vector({1, 2, 3}, {2, 2});
       },
       {"from_vector:", "3 values", "[2, 2]"}},
      {"view_needs_copy",
       [] {
         view(transpose(F({2, 3}), 0, 1), {6});
       },
       {"view:", "reshape"}},
      {"meta_to_vector", [] { to_vector(F({2}, DType::kFloat32, kMeta)); }, {"to_vector:", "meta"}},
      {"cuda_without_backend",
       [] { ones({2}, DType::kFloat32, CUDA(0)); },
       {"cuda:0"},
       absl::StatusCode::kFailedPrecondition},
      {"module_bad_heads",
       [] {
         Generator g(0);
         CausalSelfAttention a(10, 3, g);
       },
       {"CausalSelfAttention", "10", "3"}},
      {"attention_rank",
       [] { causal_attention(F({4}), F({4}), F({4})); },
       {"causal_attention", "[4]"}},
  };
  return *cases;
}

class BadInput : public ::testing::TestWithParam<size_t> {};

TEST_P(BadInput, ThrowsClearError) {
  const BadCase& c = Cases()[GetParam()];
  if (std::string(c.name) == "cuda_without_backend" && HasAllocator(DeviceType::kCUDA)) {
    GTEST_SKIP() << "a CUDA backend is present, so this is not bad input here";
  }
  try {
    c.call();
    FAIL() << c.name << ": no error was raised";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), c.code) << e.what();
    for (const std::string& word : c.must_mention) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos)
          << c.name << ": message does not mention '" << word << "': " << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, BadInput, ::testing::Range<size_t>(0, Cases().size()),
                         [](const auto& info) { return std::string(Cases()[info.param].name); });

}  // namespace
}  // namespace kiln
