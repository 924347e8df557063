// The transformer modules of modules.h: Embedding, LayerNorm, RMSNorm, RotaryEmbedding,
// FeedForward, SelfAttention and the pre-norm DecoderBlock, all written with kiln ops (so they
// run eagerly on any device and trace into compiled functions).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {
namespace {

Tensor Full(IntList shape, double value, const ModuleOptions& o) {
  return full(shape, value, o.dtype, o.device);
}

Tensor NormalInit(IntList shape, Generator& gen, const ModuleOptions& o) {
  return randn(shape, gen, o.dtype, o.device);
}

}  // namespace

Embedding::Embedding(int64_t num, int64_t dim, Generator& gen, ModuleOptions o)
    : weight_(RegisterParameter("weight", NormalInit({num, dim}, gen, o))) {
  KILN_CHECK(num > 0 && dim > 0, "Embedding: sizes must be positive, got num_embeddings=", num,
             " dim=", dim);
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(indices, weight_); }

LayerNorm::LayerNorm(int64_t dim, double eps, bool affine, bool bias, ModuleOptions o)
    : eps_(eps),
      weight_(RegisterParameter("weight", affine ? Full({dim}, 1, o) : Tensor())),
      bias_(RegisterParameter("bias", affine && bias ? Full({dim}, 0, o) : Tensor())) {
  KILN_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, weight_, bias_, eps_); }

RMSNorm::RMSNorm(int64_t dim, double eps, ModuleOptions o)
    : eps_(eps), weight_(RegisterParameter("weight", Full({dim}, 1, o))) {
  KILN_CHECK(dim > 0, "RMSNorm: dim must be positive, got ", dim);
}

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, weight_, eps_); }

namespace {

// cos (or sin) of position * base^(-2i / head_dim) for [max_positions, head_dim / 2], float32.
Tensor RotaryTable(int64_t head_dim, int64_t max_positions, double base, bool sine, Device device) {
  const int64_t half = head_dim / 2;
  std::vector<double> v(static_cast<size_t>(max_positions * half));
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = p * std::pow(base, -2.0 * i / head_dim);
      v[p * half + i] = sine ? std::sin(angle) : std::cos(angle);
    }
  }
  return from_vector(v, {max_positions, half}, DType::kFloat32, device);
}

}  // namespace

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, int64_t max_positions, double base,
                                 ModuleOptions o)
    : head_dim_(head_dim),
      cos_(RegisterBuffer(
          "cos",
          [&] {
            KILN_CHECK(head_dim > 0 && head_dim % 2 == 0 && max_positions > 0,
                       "RotaryEmbedding: head_dim must be positive and even and max_positions ",
                       "positive, got head_dim=", head_dim, " max_positions=", max_positions);
            return RotaryTable(head_dim, max_positions, base, false, o.device);
          }())),
      sin_(RegisterBuffer("sin", RotaryTable(head_dim, max_positions, base, true, o.device))) {}

Tensor RotaryEmbedding::Rotate(const Tensor& x, const Tensor& positions) const {
  KILN_CHECK(x.dim() >= 2 && x.size(-1) == head_dim_, "RotaryEmbedding: expected x [..., T, ",
             head_dim_, "], got ", x.shape_string());
  KILN_CHECK(positions.dim() == 1 && positions.size(0) == x.size(-2),
             "RotaryEmbedding: positions must be 1-D with one position per row of x (", x.size(-2),
             "), got ", positions.shape_string());
  const int64_t half = head_dim_ / 2;
  const Tensor cos_t = cast(embedding(positions, cos_), x.dtype());  // [T, half]
  const Tensor sin_t = cast(embedding(positions, sin_), x.dtype());
  const Tensor x1 = slice(x, -1, 0, half), x2 = slice(x, -1, half, head_dim_);
  return cat({x1 * cos_t - x2 * sin_t, x2 * cos_t + x1 * sin_t}, -1);
}

Tensor RotaryEmbedding::forward(const Tensor& x) {
  KILN_CHECK(x.dim() >= 2, "RotaryEmbedding: expected x [..., T, head_dim], got ",
             x.shape_string());
  return Rotate(x, arange(x.size(-2), DType::kInt64, x.device()));
}

std::vector<Tensor> RotaryEmbedding::forward_many(const std::vector<Tensor>& inputs) {
  KILN_CHECK(inputs.size() == 1 || inputs.size() == 2,
             "RotaryEmbedding: takes {x} or {x, positions}, got ", inputs.size(), " inputs");
  return {inputs.size() == 1 ? forward(inputs[0]) : Rotate(inputs[0], inputs[1])};
}

FeedForward::FeedForward(int64_t dim, int64_t hidden, MlpKind kind, bool bias, Generator& gen,
                         ModuleOptions o)
    : kind_(kind) {
  auto add = [&](const char* name, int64_t in, int64_t out) {
    layers_.push_back(&RegisterModule(name, std::make_unique<Linear>(in, out, bias, gen, o)));
  };
  if (kind == MlpKind::kGelu) {
    add("c_fc", dim, hidden);
    add("c_proj", hidden, dim);
  } else {
    add("gate", dim, hidden);
    add("up", dim, hidden);
    add("down", hidden, dim);
  }
}

Tensor FeedForward::forward(const Tensor& x) {
  if (kind_ == MlpKind::kGelu) return (*layers_[1])(gelu((*layers_[0])(x), "tanh"));
  const Tensor g = (*layers_[0])(x);
  const Tensor act = kind_ == MlpKind::kGeGLU ? gelu(g, "tanh") : silu(g);
  return (*layers_[2])(act * (*layers_[1])(x));
}

SelfAttention::SelfAttention(const DecoderBlockConfig& c, Generator& gen, ModuleOptions o)
    : heads_(c.heads),
      c_attn_(RegisterModule("c_attn", std::make_unique<Linear>(c.dim, 3 * c.dim, c.bias, gen, o))),
      c_proj_(RegisterModule("c_proj", std::make_unique<Linear>(c.dim, c.dim, c.bias, gen, o))) {
  KILN_CHECK(c.heads > 0 && c.dim % c.heads == 0, "SelfAttention: dim ", c.dim,
             " must be a positive multiple of heads ", c.heads);
  if (c.rotary) {
    rotary_ = &RegisterModule("rotary", std::make_unique<RotaryEmbedding>(
                                            c.dim / c.heads, c.max_positions, c.rope_base, o));
  }
}

Tensor SelfAttention::Attend(const Tensor& x, const Tensor& positions) {
  KILN_CHECK(x.dim() == 3, "SelfAttention: expected x [B, T, dim], got ", x.shape_string());
  const int64_t b = x.size(0), t_len = x.size(1), dim = x.size(2), hd = dim / heads_;
  // [B, T, 3, H, hd] -> [3, B, H, T, hd]
  const Tensor qkv = permute(reshape(c_attn_(x), {b, t_len, 3, heads_, hd}), {2, 0, 3, 1, 4});
  auto part = [&](int64_t i) { return squeeze(slice(qkv, 0, i, i + 1), 0); };
  Tensor q = part(0), k = part(1);
  if (rotary_ != nullptr) {
    q = rotary_->Rotate(q, positions);
    k = rotary_->Rotate(k, positions);
  }
  // Causal attention: kiln's flash kernel on CUDA where it applies, the math form elsewhere.
  const Tensor y = scaled_dot_product_attention(q, k, part(2), {}, /*is_causal=*/true);
  return c_proj_(reshape(permute(y, {0, 2, 1, 3}), {b, t_len, dim}));
}

Tensor SelfAttention::forward(const Tensor& x) {
  const Tensor positions =
      rotary_ != nullptr && x.dim() == 3 ? arange(x.size(1), DType::kInt64, x.device()) : Tensor();
  return Attend(x, positions);
}

std::vector<Tensor> SelfAttention::forward_many(const std::vector<Tensor>& inputs) {
  KILN_CHECK(inputs.size() == 1 || inputs.size() == 2,
             "SelfAttention: takes {x} or {x, positions}, got ", inputs.size(), " inputs");
  if (inputs.size() == 1) return {forward(inputs[0])};
  KILN_CHECK(rotary_ != nullptr, "SelfAttention: positions are an input only with rotary ",
             "embeddings (config.rotary)");
  return {Attend(inputs[0], inputs[1])};
}

namespace {

std::unique_ptr<Module> MakeNorm(const DecoderBlockConfig& c, const ModuleOptions& o) {
  if (c.norm == NormKind::kLayerNorm) {
    return std::make_unique<LayerNorm>(c.dim, c.eps, /*elementwise_affine=*/true, c.bias, o);
  }
  return std::make_unique<RMSNorm>(c.dim, c.eps, o);
}

}  // namespace

DecoderBlock::DecoderBlock(const DecoderBlockConfig& c, Generator& gen, ModuleOptions o)
    : ln_1_(RegisterModule("ln_1", MakeNorm(c, o))),
      attn_(RegisterModule("attn", std::make_unique<SelfAttention>(c, gen, o))),
      ln_2_(RegisterModule("ln_2", MakeNorm(c, o))),
      mlp_(RegisterModule(
          "mlp", std::make_unique<FeedForward>(c.dim, c.hidden > 0 ? c.hidden : 4 * c.dim, c.mlp,
                                               c.bias, gen, o))) {}

std::vector<Tensor> DecoderBlock::forward_many(const std::vector<Tensor>& inputs) {
  KILN_CHECK(!inputs.empty() && inputs.size() <= 2,
             "DecoderBlock: takes {x} or {x, positions}, got ", inputs.size(), " inputs");
  std::vector<Tensor> attn_in = inputs;
  attn_in[0] = ln_1_(inputs[0]);
  const Tensor h = inputs[0] + attn_(attn_in)[0];
  return {h + mlp_(ln_2_(h))};
}

Tensor DecoderBlock::forward(const Tensor& x) { return forward_many({x})[0]; }

}  // namespace kiln
