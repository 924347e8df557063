// Bad input never crashes: every case throws kiln::Error whose message names the op, the
// operand shapes and the rule broken.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>

#include "ops/dispatch.h"
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
         linear(F({4, 8}), F({2, 16, 8}));
       },
       {"linear:", "weight [out, in]"}},
      {"linear_residual_shape",  // epilogue=add, as the GEMM epilogue fusion writes it
       [] {
         OpAttrs attrs;
         attrs.epilogue = Epilogue::kAdd;
         Dispatch(OpId::kLinear, {F({4, 8}), F({16, 8}), F({16}), F({4, 1})}, attrs);
       },
       {"linear:", "residual", "[4, 16]", "[4, 1]", "no broadcasting"}},
      {"linear_residual_missing",
       [] {
         OpAttrs attrs;
         attrs.epilogue = Epilogue::kAdd;
         Dispatch(OpId::kLinear, {F({4, 8}), F({16, 8})}, attrs);
       },
       {"linear:", "epilogue=add needs the residual"}},
      {"linear_four_inputs_without_add",
       [] {
         Dispatch(OpId::kLinear, {F({4, 8}), F({16, 8}), F({16}), F({4, 16})}, {});
       },
       {"linear:", "4 inputs", "epilogue=add"}},
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
      {"full_negative_shape",
       [] {
         full({2, -1}, 0.0);
       },
       {"full:", "negative", "[2, -1]"}},
      {"arange_too_many_bytes",
       [] { arange(-1e19, 0, 2, DType::kFloat32, kMeta); },
       {"arange:", "[5000000000000000000]", "bytes"}},
      {"as_strided_negative_size",
       [] { F({4}).as_strided({-1}, {1}, 0); },
       {"as_strided:", "negative", "[-1]"}},
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
      {"module_integer_dtype",
       [] { Linear(4, 3, true, {.dtype = DType::kInt64}); },
       {"Linear: parameters must be floating point, got dtype int64 (ModuleOptions::dtype)"}},
      {"module_bool_dtype",
       [] { Embedding(4, 3, {.dtype = DType::kBool}); },
       {"Embedding: parameters must be floating point, got dtype bool"}},
      {"norm_integer_dtype",
       [] { RMSNorm(4, 1e-6, {.dtype = DType::kInt32}); },
       {"RMSNorm: parameters must be floating point, got dtype int32"}},
      {"module_too_many_elements",
       [] { Embedding(int64_t{1} << 62, 8); },
       {"Embedding: a parameter of shape [4611686018427387904, 8] has more elements than fit in "
        "int64"}},
      {"attention_rank",
       [] { causal_attention(F({4}), F({4}), F({4})); },
       {"causal_attention", "[4]"}},
      {"attention_key_width",
       [] {
         causal_attention(F({2, 3, 4}), F({2, 3, 5}), F({2, 3, 4}));
       },
       {"causal_attention: k must be [..., S, 4] (q's D)", "k [2, 3, 5]"}},
      {"attention_value_length",
       [] {
         causal_attention(F({2, 3, 4}), F({2, 3, 4}), F({2, 2, 4}));
       },
       {"causal_attention", "v [..., S, Dv] (k's S)", "v [2, 2, 4]"}},
      // Issue 14's ops.
      {"compare_broadcast",
       [] {
         lt(F({2, 3}), F({4}));
       },
       {"lt:", "[2, 3]", "[4]"}},
      {"abs_bool", [] { abs(F({2}, DType::kBool)); }, {"abs:", "bool"}},
      {"pow_int_negative_exponent",
       [] { pow(F({2}, DType::kInt64), -1); },
       {"pow_scalar:", "negative", "int64"}},
      {"pow_bool", [] { pow(F({2}, DType::kBool), F({2}, DType::kBool)); }, {"pow:", "bool"}},
      {"clamp_no_bounds", [] { clamp(F({2}), std::nullopt, std::nullopt); }, {"clamp:", "min"}},
      {"minimum_shapes", [] { minimum(F({3}), F({2})); }, {"minimum:", "[3]", "[2]"}},
      {"embedding_index_dtype",
       [] {
         embedding(F({3}), F({5, 4}));
       },
       {"embedding:", "indices must be int64 or int32", "float32"}},
      {"embedding_weight_rank",
       [] { embedding(F({3}, DType::kInt64), F({5})); },
       {"embedding:", "weight must be 2-D", "[5]"}},
      {"embedding_out_of_range",
       [] {
         embedding(from_vector({1, 5, 2}, {3}, DType::kInt64), F({5, 4}));
       },
       {"embedding:", "index 5", "out of range", "size 5", "position [1]", "int64[3]"},
       absl::StatusCode::kOutOfRange},
      {"embedding_negative_index",
       [] {
         embedding(from_vector({0, -1}, {1, 2}, DType::kInt32), F({5, 4}));
       },
       {"embedding:", "index -1", "position [0, 1]"},
       absl::StatusCode::kOutOfRange},
      {"index_select_2d_index",
       [] {
         index_select(F({4, 3}), 0, F({2, 2}, DType::kInt64));
       },
       {"index_select:", "1-D", "[2, 2]"}},
      {"index_select_out_of_range",
       [] {
         index_select(F({4, 3}), 1, from_vector({0, 3}, {2}, DType::kInt64));
       },
       {"index_select:", "index 3", "dim 1", "size 3"},
       absl::StatusCode::kOutOfRange},
      {"index_select_dim",
       [] {
         index_select(F({4, 3}), 2, F({1}, DType::kInt64));
       },
       {"index_select:", "dim 2"}},
      {"gather_rank",
       [] {
         gather(F({4, 3}), 0, F({4}, DType::kInt64));
       },
       {"gather:", "[4]", "as many dims", "[4, 3]"}},
      {"gather_index_too_large",
       [] {
         gather(F({4, 3}), 0, F({2, 5}, DType::kInt64));
       },
       {"gather:", "[2, 5]", "dim 1"}},
      {"gather_out_of_range",
       [] {
         gather(F({2, 3}), 1, from_vector({0, 1, 7, 2}, {2, 2}, DType::kInt64));
       },
       {"gather:", "index 7", "position [1, 0]", "size 3"},
       absl::StatusCode::kOutOfRange},
      {"index_copy_out_of_range",
       [] {
         index_copy_(F({4, 3}), 0, from_vector({0, 4}, {2}, DType::kInt64), F({2, 3}));
       },
       {"index_copy:", "index 4", "dim 0", "size 4"},
       absl::StatusCode::kOutOfRange},
      {"index_copy_dtype",
       [] {
         index_copy(F({4, 3}), 0, F({1}, DType::kInt64), F({1, 3}, DType::kFloat16));
       },
       {"index_copy:", "float16", "self's float32"}},
      {"index_copy_rows",
       [] {
         index_copy(F({4, 3}), 0, F({2}, DType::kInt64), F({3, 3}));
       },
       {"index_copy:", "[3, 3]", "3 slices along dim 0", "2 entries"}},
      {"index_copy_other_dims",
       [] {
         index_copy(F({4, 3}), 1, F({1}, DType::kInt64), F({2, 1}));
       },
       {"index_copy:", "[2, 1]", "must match self [4, 3]", "dim 0"}},
      {"index_copy_float_index",
       [] {
         index_copy(F({4, 3}), 0, F({1}), F({1, 3}));
       },
       {"index_copy:", "index must be int64 or int32", "float32"}},
      {"cat_shapes",
       [] {
         cat({F({2, 3}), F({2, 4})}, 0);
       },
       {"cat:", "tensor 1", "[2, 4]", "dim 0"}},
      {"cat_0d",
       [] {
         cat({F({}), F({})});
       },
       {"cat:", "zero-dimensional"}},
      {"cat_empty_list", [] { cat({}); }, {"cat:", "inputs, got 0"}},
      {"cat_dim",
       [] {
         cat({F({2}), F({2})}, 1);
       },
       {"cat:", "dim 1"}},
      {"stack_shapes",
       [] {
         stack({F({2, 3}), F({3, 2})});
       },
       {"stack:", "tensor 1", "[3, 2]"}},
      {"split_size", [] { split(F({4}), 0); }, {"split:", "positive", "[4]"}},
      {"split_with_sizes_sum",
       [] {
         split_with_sizes(F({2, 5}), {2, 2}, 1);
       },
       {"split_with_sizes:", "sum to 4", "size 5"}},
      {"chunk_zero", [] { chunk(F({4}), 0); }, {"chunk:", "positive"}},
      {"argmax_empty",
       [] {
         argmax(F({0, 3}));
       },
       {"argmax:", "empty", "[0, 3]"}},
      {"argmax_empty_dim",
       [] {
         argmax(F({0, 3}), 0);
       },
       {"argmax:", "dim 0", "size 0"}},
      {"argmax_bool", [] { argmax(F({2}, DType::kBool)); }, {"argmax:", "bool"}},
      {"topk_k",
       [] {
         topk(F({2, 3}), 4);
       },
       {"topk:", "k = 4", "size 3"}},
      {"topk_dim",
       [] {
         topk(F({2, 3}), 1, 2);
       },
       {"topk:", "dim 2"}},
      {"item_many",
       [] {
         item(F({2, 2}));
       },
       {"item:", "4 elements", "[2, 2]"}},
      {"item_meta", [] { item(F({1}, DType::kFloat32, kMeta)); }, {"item:", "meta"}},
      {"undefined_new_ops",
       [] { clamp(Tensor(), std::nullopt, std::nullopt); },
       {"clamp:", "undefined"}},
      {"undefined_cat",
       [] {
         cat({F({2}), Tensor()});
       },
       {"cat:", "undefined"}},
      {"undefined_stack", [] { stack({Tensor()}); }, {"stack:", "undefined"}},
      {"undefined_split", [] { split(Tensor(), 1); }, {"split:", "undefined"}},
      {"undefined_topk", [] { topk(Tensor(), 1); }, {"topk:", "undefined"}},
      {"undefined_item", [] { item(Tensor()); }, {"item:", "undefined"}},
      {"item_nan_to_int", [] { item<int64_t>(full({}, NAN)); }, {"item:", "nan", "integer"}},
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
