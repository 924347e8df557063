// The GPT-2-class decoder of gpt.h: its blocks, the prefill and decode steps over a fixed-capacity
// KV cache, and GPT-2's initialisation.
#include "examples/gpt.h"

#include <algorithm>
#include <array>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "ops/tensor_parallel.h"
#include "runtime/status.h"

namespace examples {

using kiln::Tensor;

// c_attn (q, k, v in one [dim, 3 dim] projection, GPT-2's layout) and c_proj.
class GptAttention : public kiln::Module {
 public:
  GptAttention(int64_t dim, int64_t heads, kiln::Generator& gen, kiln::ModuleOptions o)
      : heads_(heads),
        head_dim_(dim / heads),
        c_attn_(
            RegisterModule("c_attn", std::make_unique<kiln::Linear>(dim, 3 * dim, true, gen, o))),
        c_proj_(RegisterModule("c_proj", std::make_unique<kiln::Linear>(dim, dim, true, gen, o))) {}
  const char* type_name() const override { return "GptAttention"; }

  // q, k, v [B, H, T, Dh] of x [B, T, dim]: views of the projection, read in place by SDPA.
  std::array<Tensor, 3> Qkv(const Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), hd = head_dim_;
    const Tensor qkv =
        kiln::permute(kiln::reshape(c_attn_(x), {b, t, 3, heads_, hd}), {2, 0, 3, 1, 4});
    auto part = [&](int64_t i) { return kiln::squeeze(kiln::slice(qkv, 0, i, i + 1), 0); };
    return {part(0), part(1), part(2)};
  }
  // c_proj of the heads y [B, H, T, Dh] joined back to [B, T, dim].
  Tensor Out(const Tensor& y) {
    const int64_t b = y.size(0), t = y.size(2);
    const Tensor heads =
        kiln::reshape(kiln::permute(y, {0, 2, 1, 3}), {b, t, y.size(1) * y.size(3)});
    return kiln::RowParallelOrWhole(c_proj_, heads, group_);
  }
  // This rank's heads: its part of each of c_attn's q, k and v blocks, c_proj's columns; c_proj
  // is all-reduced over `group`.
  void ShardTensorParallel(kiln::ProcessGroup& group) {
    KILN_CHECK(!group_.defined(), "GptAttention::ShardTensorParallel: already sharded");
    c_attn_.KeepShard(0, group.rank(), group.world_size(), /*sections=*/3, "GptAttention");
    c_proj_.KeepShard(1, group.rank(), group.world_size(), 1, "GptAttention");
    heads_ /= group.world_size();
    group_ = kiln::GroupRef(group);
  }

 private:
  int64_t heads_, head_dim_;
  kiln::GroupRef group_;
  kiln::Linear& c_attn_;
  kiln::Linear& c_proj_;
};

// GPT-2's pre-norm block: h = x + attn(ln_1(x)); y = h + mlp(ln_2(h)).
class GptBlock : public kiln::Module {
 public:
  GptBlock(const GptConfig& c, kiln::Generator& gen, kiln::ModuleOptions o)
      : ln_1_(
            RegisterModule("ln_1", std::make_unique<kiln::LayerNorm>(c.dim, c.eps, true, true, o))),
        attn_(RegisterModule("attn", std::make_unique<GptAttention>(c.dim, c.heads, gen, o))),
        ln_2_(
            RegisterModule("ln_2", std::make_unique<kiln::LayerNorm>(c.dim, c.eps, true, true, o))),
        mlp_(RegisterModule("mlp", std::make_unique<kiln::FeedForward>(
                                       c.dim, 4 * c.dim, kiln::MlpKind::kPlain,
                                       kiln::Activation::kGeluTanh, true, gen, o))) {}
  const char* type_name() const override { return "GptBlock"; }
  void ShardTensorParallel(kiln::ProcessGroup& group) {
    attn_.ShardTensorParallel(group);
    mlp_.ShardTensorParallel(group);
  }

  // Causal attention over x [B, T, dim] at positions 0 .. T-1; the keys and values go to rows
  // 0 .. T-1 of the caches when they are given.
  Tensor Prefill(const Tensor& x, const Tensor& k_cache, const Tensor& v_cache) {
    const auto [q, k, v] = attn_.Qkv(ln_1_(x));
    if (k_cache.defined()) {
      const int64_t t = x.size(1);
      kiln::copy_(kiln::slice(k_cache, 2, 0, t), k);
      kiln::copy_(kiln::slice(v_cache, 2, 0, t), v);
    }
    const Tensor h = x + attn_.Out(kiln::scaled_dot_product_attention(q, k, v, {}, true));
    return h + mlp_(ln_2_(h));
  }

  // One token x [B, 1, dim] at position `pos` (int64 [1]): its key and value written into row
  // pos of the caches, attention over the slots `visible` [1, 1, 1, ctx] (bool, true = attend).
  Tensor Decode(const Tensor& x, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                const Tensor& visible) {
    const auto [q, k, v] = attn_.Qkv(ln_1_(x));
    kiln::index_copy_(k_cache, 2, pos, k);
    kiln::index_copy_(v_cache, 2, pos, v);
    const Tensor h =
        x + attn_.Out(kiln::scaled_dot_product_attention(q, k_cache, v_cache, visible));
    return h + mlp_(ln_2_(h));
  }

 private:
  kiln::LayerNorm& ln_1_;
  GptAttention& attn_;
  kiln::LayerNorm& ln_2_;
  kiln::FeedForward& mlp_;
};

namespace {

void CheckConfig(const GptConfig& c) {
  KILN_CHECK(c.layers > 0 && c.dim > 0 && c.heads > 0 && c.vocab > 0 && c.ctx > 0,
             "Gpt: sizes must be positive, got layers=", c.layers, " dim=", c.dim,
             " heads=", c.heads, " vocab=", c.vocab, " ctx=", c.ctx);
  KILN_CHECK(c.dim % c.heads == 0, "Gpt: dim ", c.dim, " must be a multiple of heads ", c.heads);
}

}  // namespace

Gpt::Gpt(const GptConfig& c, kiln::Generator& gen, kiln::ModuleOptions o)
    : config_((CheckConfig(c), c)),
      wte_(RegisterModule("wte", std::make_unique<kiln::Embedding>(c.vocab, c.dim, gen, o))),
      wpe_(RegisterModule("wpe", std::make_unique<kiln::Embedding>(c.ctx, c.dim, gen, o))),
      ln_f_([&]() -> kiln::LayerNorm& {
        auto& h = RegisterModule("h", std::make_unique<kiln::ModuleList>());
        for (int64_t i = 0; i < c.layers; ++i) {
          blocks_.push_back(&h.push_back(std::make_unique<GptBlock>(c, gen, o)));
        }
        return RegisterModule("ln_f",
                              std::make_unique<kiln::LayerNorm>(c.dim, c.eps, true, true, o));
      }()),
      slots_(kiln::arange(c.ctx, kiln::DType::kInt64, o.device)),
      one_(kiln::ones({1}, kiln::DType::kInt64, o.device)) {}

Tensor Gpt::forward(const Tensor& tokens) {
  KILN_CHECK(tokens.dim() == 2 && tokens.size(1) <= config_.ctx,
             "Gpt: expected tokens [B, T] with T <= ctx ", config_.ctx, ", got ",
             tokens.shape_string());
  Tensor x = wte_(tokens) + wpe_(kiln::slice(slots_, 0, 0, tokens.size(1)));
  for (GptBlock* block : blocks_) x = block->Prefill(x, {}, {});
  return Head(ln_f_(x));
}

Tensor Gpt::Head(const Tensor& h) const {
  if (!tp_.defined()) return kiln::linear(h, wte_.weight());
  return kiln::VocabParallelLogits(h, wte_.weight(), tp_.get("Gpt"));
}

void Gpt::MaterialiseBuffers(kiln::Device device) {
  Module::MaterialiseBuffers(device);
  slots_ = kiln::arange(config_.ctx, kiln::DType::kInt64, device);
  one_ = kiln::ones({1}, kiln::DType::kInt64, device);
}

void Gpt::ShardTensorParallel(kiln::ProcessGroup& group) {
  const int64_t n = group.world_size();
  KILN_CHECK(!tp_.defined(), "Gpt::ShardTensorParallel: already sharded over ", tp_.world_size(),
             " ranks");
  // Checked before any block changes: a refused split leaves the model whole.
  KILN_CHECK(config_.heads % n == 0 && 4 * config_.dim % n == 0,
             "Gpt::ShardTensorParallel: ", config_.heads, " heads and ", 4 * config_.dim,
             " MLP features must split over ", n, " ranks");
  for (GptBlock* block : blocks_) block->ShardTensorParallel(group);
  tp_ = kiln::GroupRef(group);
}

KvCache Gpt::NewCache(int64_t batch) const {
  const Tensor& w = wte_.weight();
  KvCache cache;
  for (int64_t i = 0; i < config_.layers; ++i) {
    for (auto* list : {&cache.k, &cache.v}) {
      list->push_back(kiln::zeros(
          {batch, config_.heads / tp_.world_size(), config_.ctx, config_.dim / config_.heads},
          w.dtype(), w.device()));
    }
  }
  return cache;
}

DecodeState Gpt::NewState(int64_t batch) const {
  const kiln::Device d = wte_.weight().device();
  return {kiln::zeros({batch, 1}, kiln::DType::kInt64, d), kiln::zeros({1}, kiln::DType::kInt64, d),
          kiln::zeros({batch, config_.ctx}, kiln::DType::kInt64, d)};
}

std::vector<Tensor> Gpt::PrefillInputs(const Tensor& prompt, const KvCache& cache,
                                       const DecodeState& state) {
  std::vector<Tensor> in = {prompt};
  for (const Tensor& t : DecodeInputs(cache, state)) in.push_back(t);
  return in;
}

std::vector<Tensor> Gpt::DecodeInputs(const KvCache& cache, const DecodeState& state) {
  std::vector<Tensor> in = {state.tokens, state.pos, state.ids};
  for (size_t i = 0; i < cache.k.size(); ++i) {
    in.push_back(cache.k[i]);
    in.push_back(cache.v[i]);
  }
  return in;
}

Tensor Gpt::Finish(const Tensor& x, const Tensor& tokens, const Tensor& pos, const Tensor& ids,
                   const Tensor& next_pos) {
  const int64_t b = x.size(0);
  const Tensor logits = kiln::reshape(Head(ln_f_(x)), {b, config_.vocab});
  const Tensor next = kiln::reshape(kiln::argmax(logits, -1), {b, 1});
  kiln::index_copy_(ids, 1, next_pos, next);
  kiln::copy_(tokens, next);
  kiln::copy_(pos, next_pos);
  return logits;
}

std::vector<Tensor> Gpt::Prefill(const std::vector<Tensor>& in) {
  const size_t n = 4 + 2 * blocks_.size();
  KILN_CHECK(in.size() == n, "Gpt::Prefill: expected ", n,
             " inputs {prompt, tokens, pos, ids, k_0, v_0, ...}, got ", in.size());
  const Tensor& prompt = in[0];
  KILN_CHECK(prompt.dim() == 2 && prompt.size(1) < config_.ctx && prompt.size(0) == in[1].size(0),
             "Gpt::Prefill: expected a prompt [B, T] with T < ctx ", config_.ctx,
             " and B the tokens' ", in[1].shape_string(), ", got ", prompt.shape_string());
  const int64_t t = prompt.size(1);
  kiln::copy_(kiln::slice(in[3], 1, 0, t), prompt);
  Tensor x = wte_(prompt) + wpe_(kiln::slice(slots_, 0, 0, t));
  for (size_t i = 0; i < blocks_.size(); ++i) {
    x = blocks_[i]->Prefill(x, in[4 + 2 * i], in[5 + 2 * i]);
  }
  // The next position, t, is a view of the slots: no tensor is made while tracing (that would be
  // one more constant per trace).
  const Tensor next_pos = kiln::slice(slots_, 0, t, t + 1);
  return {Finish(kiln::slice(x, 1, t - 1, t), in[1], in[2], in[3], next_pos)};
}

std::vector<Tensor> Gpt::Decode(const std::vector<Tensor>& in) {
  const size_t n = 3 + 2 * blocks_.size();
  KILN_CHECK(in.size() == n, "Gpt::Decode: expected ", n,
             " inputs {tokens, pos, ids, k_0, v_0, ...}, got ", in.size());
  const Tensor &tokens = in[0], &pos = in[1];
  const int64_t ctx = config_.ctx;
  const Tensor visible = kiln::reshape(kiln::le(slots_, pos), {1, 1, 1, ctx});
  // [B, 1, dim] + [1, dim]
  Tensor x = wte_(tokens) + wpe_(pos);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    x = blocks_[i]->Decode(x, in[3 + 2 * i], in[4 + 2 * i], pos, visible);
  }
  return {Finish(x, tokens, pos, in[2], pos + one_)};
}

void InitGpt2Weights(Gpt& model, uint64_t seed) {
  kiln::Generator gen(seed);
  for (const auto& [name, p] : model.named_parameters()) {
    const bool norm = absl::StrContains(name, "ln_");
    Tensor value;
    if (norm) {
      value = kiln::full(p.shape(), absl::EndsWith(name, ".weight") ? 1 : 0, p.dtype(), p.device());
    } else {
      const double std = name == "wpe.weight" ? 0.01 : 0.02;
      value = kiln::randn(p.shape(), gen, kiln::DType::kFloat32, p.device()) * std;
    }
    kiln::copy_(p, value);
  }
}

}  // namespace examples
