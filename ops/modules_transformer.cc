// The transformer modules of modules.h: Embedding, LayerNorm, RMSNorm, RotaryEmbedding,
// activations, FeedForward, SelfAttention, the pre-norm DecoderBlock and the Llama-style
// Attention, all written with kiln ops (so they run eagerly on any device and trace into
// compiled functions).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "ops/module_init.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "ops/tensor_parallel.h"
#include "runtime/status.h"

namespace kiln {
using module_init::WithGenerator;

Embedding::Embedding(int64_t num, int64_t dim, Generator& gen, ModuleOptions o)
    : Embedding(num, dim, WithGenerator(o, gen)) {}

namespace {

// The module's sizes checked before its first parameter is made (a bad size is named by the
// module, not by the factory drawing its weight); each returns what its initializer needs.
ModuleOptions EmbeddingChecked(int64_t num, int64_t dim, ModuleOptions o) {
  KILN_CHECK(num > 0 && dim > 0, "Embedding: sizes must be positive, got num_embeddings=", num,
             " dim=", dim);
  module_init::SizeChecked("Embedding", {num, dim});
  return module_init::FloatingChecked("Embedding", o);
}

// The rotary positions of x [B, T, dim] when none are given: 0 .. T-1 (undefined without rotary
// embeddings, or for another rank: the module's shape check names it).
Tensor DefaultPositions(const Tensor& x, bool rotary) {
  return rotary && x.dim() == 3 ? arange(x.size(1), DType::kInt64, x.device()) : Tensor();
}

double NormChecked(const char* module, int64_t dim, double eps) {
  KILN_CHECK(dim > 0, module, ": dim must be positive, got ", dim);
  return eps;
}

}  // namespace

Embedding::Embedding(int64_t num, int64_t dim, ModuleOptions o)
    : weight_(RegisterParameter("weight",
                                module_init::Normal({num, dim}, EmbeddingChecked(num, dim, o)))) {}

Tensor Embedding::forward(const Tensor& indices) { return embedding(indices, weight_); }

LayerNorm::LayerNorm(int64_t dim, double eps, bool affine, bool bias, ModuleOptions o)
    : eps_(NormChecked("LayerNorm", dim, eps)),
      weight_(RegisterParameter(
          "weight", affine
                        ? module_init::Full({dim}, 1, module_init::FloatingChecked("LayerNorm", o))
                        : Tensor())),
      bias_(RegisterParameter("bias", affine && bias ? module_init::Full({dim}, 0, o) : Tensor())) {
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, weight_, bias_, eps_); }

RMSNorm::RMSNorm(int64_t dim, double eps, ModuleOptions o)
    : eps_(NormChecked("RMSNorm", dim, eps)),
      weight_(RegisterParameter(
          "weight", module_init::Full({dim}, 1, module_init::FloatingChecked("RMSNorm", o)))) {}

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, weight_, eps_); }

namespace {

// YaRN's frequencies, every step in float32 where transformers' _compute_yarn_parameters computes
// in float32 (the correction range in double, as there).
Tensor YarnInverseFrequencies(int64_t head_dim, const RopeOptions& r) {
  const double dim = static_cast<double>(head_dim);
  const auto correction_dim = [&](double rotations) {
    return dim * std::log(static_cast<double>(r.original_max_positions) / (rotations * 2 * M_PI)) /
           (2 * std::log(r.base));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // as transformers: no zero-width ramp
  const int64_t half = head_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float pos = std::pow(static_cast<float>(r.base), exponent);
    const float extrapolated = 1.0f / pos;
    const float interpolated = 1.0f / (static_cast<float>(r.factor) * pos);
    const float ramp = std::clamp(
        (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
        1.0f);
    const float keep = 1.0f - ramp;  // the share of the original frequency
    inv[static_cast<size_t>(i)] = interpolated * (1.0f - keep) + extrapolated * keep;
  }
  return from_vector(inv, {half}, DType::kFloat32);
}

}  // namespace

double rope_attention_scaling(const RopeOptions& r) {
  if (r.scaling != RopeOptions::Scaling::kYarn) return 1;
  if (r.attention_factor > 0) return r.attention_factor;
  const auto mscale = [&](double m) {
    return r.factor <= 1 ? 1.0 : 0.1 * m * std::log(r.factor) + 1;
  };
  if (r.mscale != 0 && r.mscale_all_dim != 0) return mscale(r.mscale) / mscale(r.mscale_all_dim);
  return mscale(1);
}

Tensor rope_inverse_frequencies(int64_t head_dim, const RopeOptions& r) {
  using Scaling = RopeOptions::Scaling;
  KILN_CHECK(head_dim > 0 && head_dim % 2 == 0, "RotaryEmbedding: head_dim must be positive and ",
             "even, got ", head_dim);
  KILN_CHECK(r.base > 0 && r.factor > 0, "RotaryEmbedding: base and factor must be positive, got ",
             "base=", r.base, " factor=", r.factor);
  KILN_CHECK(
      r.scaling != Scaling::kLlama3 || (r.high_freq_factor > r.low_freq_factor &&
                                        r.low_freq_factor > 0 && r.original_max_positions > 0),
      "RotaryEmbedding: llama3 scaling needs high_freq_factor > low_freq_factor > 0 and ",
      "original_max_positions > 0, got ", r.high_freq_factor, ", ", r.low_freq_factor, ", ",
      r.original_max_positions);
  KILN_CHECK(
      r.scaling != Scaling::kYarn || (r.original_max_positions > 0 && r.beta_fast > 0 &&
                                      r.beta_slow > 0 && r.attention_factor >= 0 && r.base > 1),
      "RotaryEmbedding: yarn scaling needs original_max_positions, beta_fast and beta_slow "
      "positive, attention_factor >= 0 and base > 1, got ",
      r.original_max_positions, ", ", r.beta_fast, ", ", r.beta_slow, ", ", r.attention_factor,
      ", ", r.base);
  if (r.scaling == Scaling::kYarn) return YarnInverseFrequencies(head_dim, r);
  // Every step in float32, in the order of transformers' rope init functions.
  const int64_t half = head_dim / 2;
  const float factor = static_cast<float>(r.factor);
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    float f = 1.0f / std::pow(static_cast<float>(r.base), exponent);
    if (r.scaling == Scaling::kLinear) f = f / factor;
    if (r.scaling == Scaling::kLlama3) {
      const double old_len = static_cast<double>(r.original_max_positions);
      const float low_wavelen = static_cast<float>(old_len / r.low_freq_factor);
      const float high_wavelen = static_cast<float>(old_len / r.high_freq_factor);
      const float wavelen = (1.0f / f) * static_cast<float>(2 * M_PI);
      const float scaled = wavelen > low_wavelen ? f / factor : f;
      const float smooth =
          ((1.0f / wavelen) * static_cast<float>(old_len) - static_cast<float>(r.low_freq_factor)) /
          static_cast<float>(r.high_freq_factor - r.low_freq_factor);
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      f = medium ? smoothed : scaled;
    }
    inv[static_cast<size_t>(i)] = f;
  }
  return from_vector(inv, {half}, DType::kFloat32);
}

namespace {

// The rule's cos (or sin) table on the CPU: of position * inv_freq for [max_positions,
// head_dim / 2], times the rule's attention scaling, float32 throughout.
Tensor RotaryTable(int64_t head_dim, const RopeOptions& r, bool sine) {
  KILN_CHECK(r.max_positions > 0, "RotaryEmbedding: max_positions must be positive, got ",
             r.max_positions);
  constexpr int64_t kMaxTableEntries = int64_t{1} << 28;  // 1 GiB per float32 table
  KILN_CHECK(head_dim / 2 <= kMaxTableEntries / r.max_positions, "RotaryEmbedding: tables of ",
             "max_positions x head_dim / 2 = ", r.max_positions, " x ", head_dim / 2,
             " entries are too large (at most 2^28 entries each)");
  const std::vector<double> inv = to_vector(rope_inverse_frequencies(head_dim, r));
  const int64_t half = static_cast<int64_t>(inv.size());
  const float scale = static_cast<float>(rope_attention_scaling(r));
  std::vector<double> v(static_cast<size_t>(r.max_positions * half));
  for (int64_t p = 0; p < r.max_positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * static_cast<float>(inv[i]);
      v[p * half + i] = static_cast<float>(sine ? std::sin(angle) : std::cos(angle)) * scale;
    }
  }
  return from_vector(v, {r.max_positions, half}, DType::kFloat32);
}

Tensor GivenTable(const Tensor& t, const Tensor& other, const char* name, Device device) {
  KILN_CHECK(t.defined() && other.defined() && t.dim() == 2 && t.shape() == other.shape() &&
                 t.size(0) > 0 && t.size(1) > 0 && t.dtype() == DType::kFloat32,
             "RotaryEmbedding: given tables must be float32 [max_positions, head_dim / 2] of one ",
             "shape, got ", name, " ", t.defined() ? Describe(t.type()) : "undefined");
  return to(contiguous(t), device);
}

}  // namespace

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, int64_t max_positions, double base,
                                 ModuleOptions o)
    : RotaryEmbedding(head_dim, RopeOptions{.base = base, .max_positions = max_positions}, o) {}

// The rule's tables, as given tables (which keeps the meta device's values for to_empty).
RotaryEmbedding::RotaryEmbedding(int64_t head_dim, RopeOptions r, ModuleOptions o)
    : RotaryEmbedding(RotaryTable(head_dim, r, false), RotaryTable(head_dim, r, true), o) {}

RotaryEmbedding::RotaryEmbedding(const Tensor& cos, const Tensor& sin, ModuleOptions o)
    : head_dim_(cos.defined() && cos.dim() == 2 ? 2 * cos.size(1) : 0),
      cos_(RegisterBuffer("cos", GivenTable(cos, sin, "cos", o.device))),
      sin_(RegisterBuffer("sin", GivenTable(sin, cos, "sin", o.device))) {
  if (o.device.is_meta())
    meta_values_ = {GivenTable(cos, sin, "cos", kCPU), GivenTable(sin, cos, "sin", kCPU)};
}

void RotaryEmbedding::MaterialiseBuffers(Device device) {
  if (!meta_values_.first.defined()) return Module::MaterialiseBuffers(device);
  ReplaceSlot(cos_, kiln::to(meta_values_.first, device));
  ReplaceSlot(sin_, kiln::to(meta_values_.second, device));
  meta_values_ = {};
}

Tensor RotaryEmbedding::Rotate(const Tensor& x, const Tensor& positions) const {
  KILN_CHECK(x.dim() >= 2 && x.size(-1) == head_dim_, "RotaryEmbedding: expected x [..., T, ",
             head_dim_, "], got ", x.shape_string());
  KILN_CHECK(positions.defined() &&
                 (positions.dtype() == DType::kInt64 || positions.dtype() == DType::kInt32),
             "RotaryEmbedding: positions must be an int64 or int32 tensor, got ",
             positions.defined() ? std::string(DTypeName(positions.dtype())) : "undefined");
  const bool per_row = positions.dim() == 2;
  KILN_CHECK(
      (positions.dim() == 1 && positions.size(0) == x.size(-2)) ||
          (per_row && x.dim() == 4 && (positions.size(0) == x.size(0) || positions.size(0) == 1) &&
           positions.size(1) == x.size(-2)),
      "RotaryEmbedding: positions must be [T] (one per row of x) or [B, T] (or [1, T]) for ",
      "x [B, H, T, head_dim], got positions ", positions.shape_string(), " for x ",
      x.shape_string());
  const auto table = [&](const Tensor& t) {  // [T, half] or [B, T, half]
    return WithErrorContext(
        [&] {
          return absl::StrCat(
              "RotaryEmbedding: positions must lie in [0, max_positions = ", cos_.size(0), ")");
        },
        [&] { return cast(embedding(positions, t), x.dtype()); });
  };
  Tensor cos_t = table(cos_), sin_t = table(sin_);
  if (per_row) {
    cos_t = unsqueeze(cos_t, 1);
    sin_t = unsqueeze(sin_t, 1);
  }
  return apply_rotary(x, cos_t, sin_t);
}

Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  KILN_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "apply_rotary: x's last dim must be even, got ",
             x.shape_string());
  const int64_t d = x.size(-1), half = d / 2;
  const Tensor x1 = slice(x, -1, 0, half), x2 = slice(x, -1, half, d);
  // cos and sin cover one half (HF's tables repeat theirs across both: pass the first half) and
  // broadcast to it without growing it: the rotation of x has x's shape.
  for (const Tensor* t : {&cos, &sin}) {
    const char* name = t == &cos ? "cos" : "sin";
    KILN_CHECK(t->defined(), "apply_rotary: ", name, " is undefined");
    const absl::StatusOr<Shape> b = BroadcastShapes(x1.shape(), t->shape());
    KILN_CHECK(t->dim() >= 1 && t->size(-1) == half && b.ok() && *b == x1.shape(),
               "apply_rotary: ", name, " ", t->shape_string(), " must broadcast to x's half ",
               x1.shape_string(), " (x ", x.shape_string(),
               "; its last dim is head_dim / 2 = ", half, ")");
  }
  return cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
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

const char* ActivationName(Activation a) {
  switch (a) {
    case Activation::kGelu:
      return "gelu";
    case Activation::kGeluTanh:
      return "gelu_tanh";
    case Activation::kSilu:
      return "silu";
    case Activation::kRelu:
      return "relu";
  }
  return "?";
}

Activation ActivationFromName(const std::string& name) {
  static const std::vector<std::pair<std::string, Activation>> kNames = {
      {"silu", Activation::kSilu},
      {"swish", Activation::kSilu},
      {"gelu", Activation::kGelu},
      {"gelu_new", Activation::kGeluTanh},
      {"gelu_pytorch_tanh", Activation::kGeluTanh},
      {"gelu_fast", Activation::kGeluTanh},
      {"gelu_tanh", Activation::kGeluTanh},
      {"relu", Activation::kRelu}};
  std::vector<std::string> known;
  for (const auto& [n, a] : kNames) {
    if (n == name) return a;
    known.push_back(n);
  }
  KILN_FAIL("ActivationFromName: unknown activation '", name,
            "'; known: ", absl::StrJoin(known, ", "));
}

Tensor activate(const Tensor& x, Activation a) {
  switch (a) {
    case Activation::kGelu:
      return gelu(x);
    case Activation::kGeluTanh:
      return gelu(x, "tanh");
    case Activation::kSilu:
      return silu(x);
    case Activation::kRelu:
      return relu(x);
  }
  KILN_FAIL("activate: unknown activation ", static_cast<int>(a));
}

namespace {

// The activation a kind names (none for kPlain and kGated).
std::optional<Activation> ImpliedActivation(MlpKind kind) {
  switch (kind) {
    case MlpKind::kGelu:
    case MlpKind::kGeGLU:
      return Activation::kGeluTanh;
    case MlpKind::kSwiGLU:
      return Activation::kSilu;
    default:
      return std::nullopt;
  }
}

bool Gated(MlpKind kind) { return kind != MlpKind::kPlain && kind != MlpKind::kGelu; }

Activation ActivationOf(MlpKind kind, std::optional<Activation> given, const char* who) {
  const std::optional<Activation> implied = ImpliedActivation(kind);
  KILN_CHECK(given.has_value() || implied.has_value(), who,
             ": MlpKind::kPlain and kGated need an activation (gelu, gelu_tanh, silu or relu)");
  KILN_CHECK(!given || !implied || *given == *implied, who, ": the MLP kind implies ",
             ActivationName(*implied), " but the activation given is ", ActivationName(*given));
  return given ? *given : *implied;
}

}  // namespace

FeedForward::FeedForward(int64_t dim, int64_t hidden, MlpKind kind, bool bias, Generator& gen,
                         ModuleOptions o)
    : FeedForward(dim, hidden, kind, ActivationOf(kind, std::nullopt, "FeedForward"), bias,
                  WithGenerator(o, gen)) {}

FeedForward::FeedForward(int64_t dim, int64_t hidden, MlpKind kind, Activation act, bool bias,
                         Generator& gen, ModuleOptions o)
    : FeedForward(dim, hidden, kind, act, bias, WithGenerator(o, gen)) {}

FeedForward::FeedForward(int64_t dim, int64_t hidden, MlpKind kind, Activation act, bool bias,
                         ModuleOptions o)
    : kind_(kind), activation_(ActivationOf(kind, act, "FeedForward")) {
  auto add = [&](const char* name, int64_t in, int64_t out) {
    layers_.push_back(&RegisterModule(name, std::make_unique<Linear>(in, out, bias, o)));
  };
  const bool legacy = ImpliedActivation(kind).has_value();  // the first kinds' names
  if (!Gated(kind)) {
    add("c_fc", dim, hidden);
    add("c_proj", hidden, dim);
  } else {
    add(legacy ? "gate" : "gate_proj", dim, hidden);
    add(legacy ? "up" : "up_proj", dim, hidden);
    add(legacy ? "down" : "down_proj", hidden, dim);
  }
}

Tensor FeedForward::forward(const Tensor& x) {
  const Tensor h = Gated(kind_) ? activate((*layers_[0])(x), activation_) * (*layers_[1])(x)
                                : activate((*layers_[0])(x), activation_);
  return RowParallelOrWhole(*layers_.back(), h, group_);
}

void FeedForward::ShardTensorParallel(ProcessGroup& group) {
  KILN_CHECK(!group_.defined(), "FeedForward::ShardTensorParallel: already sharded");
  for (Linear* l : layers_) {
    l->KeepShard(l == layers_.back() ? 1 : 0, group.rank(), group.world_size(), 1, "FeedForward");
  }
  group_ = GroupRef(group);
}

namespace {

// The config's rope rule, with the earlier max_positions / rope_base fields where set.
RopeOptions RopeOf(const DecoderBlockConfig& c) {
  RopeOptions r = c.rope;
  if (c.max_positions != 0) r.max_positions = c.max_positions;
  if (c.rope_base != 0) r.base = c.rope_base;
  return r;
}

}  // namespace

namespace {

// The config's heads, checked before the projections are made.
int64_t SelfAttentionHeads(const DecoderBlockConfig& c) {
  KILN_CHECK(c.heads > 0 && c.dim > 0 && c.dim % c.heads == 0, "SelfAttention: dim ", c.dim,
             " must be a positive multiple of heads ", c.heads);
  return c.heads;
}

}  // namespace

SelfAttention::SelfAttention(const DecoderBlockConfig& c, Generator& gen, ModuleOptions o)
    : SelfAttention(c, WithGenerator(o, gen)) {}

SelfAttention::SelfAttention(const DecoderBlockConfig& c, ModuleOptions o)
    : heads_(SelfAttentionHeads(c)),
      c_attn_(RegisterModule("c_attn", std::make_unique<Linear>(c.dim, 3 * c.dim, c.bias, o))),
      c_proj_(RegisterModule("c_proj", std::make_unique<Linear>(c.dim, c.dim, c.bias, o))) {
  if (c.rotary) {
    rotary_ =
        &RegisterModule("rotary", std::make_unique<RotaryEmbedding>(c.dim / c.heads, RopeOf(c), o));
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
  return Attend(x, DefaultPositions(x, rotary_ != nullptr));
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

// The config, its sizes checked before the first child is made (0 hidden: 4 * dim).
const DecoderBlockConfig& BlockChecked(const DecoderBlockConfig& c) {
  KILN_CHECK(c.dim > 0 && c.heads > 0 && c.hidden >= 0, "DecoderBlock: dim and heads must be ",
             "positive and hidden positive or 0 (4 * dim), got dim=", c.dim, " heads=", c.heads,
             " hidden=", c.hidden);
  return c;
}

}  // namespace

DecoderBlock::DecoderBlock(const DecoderBlockConfig& c, Generator& gen, ModuleOptions o)
    : DecoderBlock(c, WithGenerator(o, gen)) {}

DecoderBlock::DecoderBlock(const DecoderBlockConfig& c, ModuleOptions o)
    : ln_1_(RegisterModule("ln_1", MakeNorm(BlockChecked(c), o))),
      attn_(RegisterModule("attn", std::make_unique<SelfAttention>(c, o))),
      ln_2_(RegisterModule("ln_2", MakeNorm(c, o))),
      mlp_(RegisterModule(
          "mlp", std::make_unique<FeedForward>(c.dim, c.hidden == 0 ? 4 * c.dim : c.hidden, c.mlp,
                                               ActivationOf(c.mlp, c.activation, "DecoderBlock"),
                                               c.bias, o))) {}

std::vector<Tensor> DecoderBlock::forward_many(const std::vector<Tensor>& inputs) {
  KILN_CHECK(!inputs.empty() && inputs.size() <= 2,
             "DecoderBlock: takes {x} or {x, positions}, got ", inputs.size(), " inputs");
  std::vector<Tensor> attn_in = inputs;
  attn_in[0] = ln_1_(inputs[0]);
  const Tensor h = inputs[0] + attn_(attn_in)[0];
  return {h + mlp_(ln_2_(h))};
}

Tensor DecoderBlock::forward(const Tensor& x) { return forward_many({x})[0]; }

namespace {

AttentionConfig Checked(AttentionConfig c) {
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  KILN_CHECK(c.dim > 0 && c.heads > 0 && c.kv_heads > 0 && c.heads % c.kv_heads == 0,
             "Attention: dim and heads must be positive and kv_heads divide heads, got dim=", c.dim,
             " heads=", c.heads, " kv_heads=", c.kv_heads);
  if (c.head_dim == 0) {
    KILN_CHECK(c.dim % c.heads == 0, "Attention: dim ", c.dim, " must be a multiple of heads ",
               c.heads, " unless head_dim is given");
    c.head_dim = c.dim / c.heads;
  }
  KILN_CHECK(c.head_dim > 0, "Attention: head_dim must be positive, got ", c.head_dim);
  int64_t width = 0;
  KILN_CHECK(!__builtin_mul_overflow(c.heads, c.head_dim, &width),
             "Attention: heads x head_dim = ", c.heads, " x ", c.head_dim, " passes int64's range");
  KILN_CHECK(c.sliding_window >= 0, "Attention: sliding_window must be >= 0 (0: none), got ",
             c.sliding_window);
  KILN_CHECK(!c.qk_norm || c.qk_norm_eps >= 0, "Attention: qk_norm_eps must be >= 0, got ",
             c.qk_norm_eps);
  return c;
}

// Sliding-window attention is not masked: a sequence (or cache) of `length` positions is exact
// only within the window.
void CheckWithinWindow(const AttentionConfig& c, int64_t length, const char* what) {
  KILN_CHECK(c.sliding_window == 0 || length <= c.sliding_window, "Attention: ", what, " of ",
             length, " positions exceeds the sliding window of ", c.sliding_window,
             "; sliding-window masking is not implemented, so sequences and caches must fit in "
             "the window");
}

}  // namespace

Attention::Attention(const AttentionConfig& config, ModuleOptions o,
                     const RotaryEmbedding* shared_rotary)
    : config_(Checked(config)),
      q_proj_(RegisterModule("q_proj",
                             std::make_unique<Linear>(config_.dim, config_.heads * config_.head_dim,
                                                      config_.qkv_bias, o))),
      k_proj_(RegisterModule(
          "k_proj", std::make_unique<Linear>(config_.dim, config_.kv_heads * config_.head_dim,
                                             config_.qkv_bias, o))),
      v_proj_(RegisterModule(
          "v_proj", std::make_unique<Linear>(config_.dim, config_.kv_heads * config_.head_dim,
                                             config_.qkv_bias, o))),
      o_proj_(
          RegisterModule("o_proj", std::make_unique<Linear>(config_.heads * config_.head_dim,
                                                            config_.dim, config_.out_bias, o))) {
  if (config_.qk_norm) {
    q_norm_ = &RegisterModule("q_norm",
                              std::make_unique<RMSNorm>(config_.head_dim, config_.qk_norm_eps, o));
    k_norm_ = &RegisterModule("k_norm",
                              std::make_unique<RMSNorm>(config_.head_dim, config_.qk_norm_eps, o));
  }
  if (config_.rotary && shared_rotary != nullptr) {
    KILN_CHECK(shared_rotary->head_dim() == config_.head_dim, "Attention: the shared rotary ",
               "embedding is for head_dim ", shared_rotary->head_dim(), ", the heads have ",
               config_.head_dim);
    rotary_ = shared_rotary;
  } else if (config_.rotary) {
    rotary_ = &RegisterModule("rotary",
                              std::make_unique<RotaryEmbedding>(config_.head_dim, config_.rope, o));
  }
}

std::array<Tensor, 3> Attention::Project(const Tensor& x, const Tensor& positions) {
  KILN_CHECK(x.dim() == 3 && x.size(2) == config_.dim, "Attention: expected x [B, T, ", config_.dim,
             "], got ", x.shape_string());
  const int64_t b = x.size(0), t = x.size(1), hd = config_.head_dim;
  auto heads = [&](Linear& proj, int64_t n, RMSNorm* norm = nullptr) {
    Tensor h = reshape(proj(x), {b, t, n, hd});
    if (norm != nullptr) h = (*norm)(h);
    return permute(h, {0, 2, 1, 3});  // [B, n, T, hd]
  };
  Tensor q = heads(q_proj_, config_.heads, q_norm_);
  Tensor k = heads(k_proj_, config_.kv_heads, k_norm_);
  if (rotary_ != nullptr) {
    q = rotary_->Rotate(q, positions);
    k = rotary_->Rotate(k, positions);
  }
  return {q, k, heads(v_proj_, config_.kv_heads)};
}

Tensor Attention::Out(const Tensor& y) {
  const int64_t b = y.size(0), t = y.size(2);
  const Tensor heads = reshape(permute(y, {0, 2, 1, 3}), {b, t, config_.heads * config_.head_dim});
  return RowParallelOrWhole(o_proj_, heads, group_);
}

void Attention::ShardTensorParallel(ProcessGroup& group) {
  const int n = group.world_size(), r = group.rank();
  KILN_CHECK(!group_.defined(), "Attention::ShardTensorParallel: already sharded");
  KILN_CHECK(config_.heads % n == 0 && config_.kv_heads % n == 0, "Attention: ", config_.heads,
             " heads and ", config_.kv_heads, " key/value heads do not split over ", n, " ranks");
  for (Linear* l : {&q_proj_, &k_proj_, &v_proj_}) l->KeepShard(0, r, n, 1, "Attention");
  o_proj_.KeepShard(1, r, n, 1, "Attention");
  config_.heads /= n;
  config_.kv_heads /= n;
  group_ = GroupRef(group);
}

Tensor Attention::forward(const Tensor& x) {
  return forward_many({x, DefaultPositions(x, rotary_ != nullptr)})[0];
}

std::vector<Tensor> Attention::forward_many(const std::vector<Tensor>& inputs) {
  KILN_CHECK(inputs.size() >= 1 && inputs.size() <= 3,
             "Attention: takes {x}, {x, positions} or {x, positions, mask}, got ", inputs.size(),
             " inputs");
  if (inputs.size() == 1) return {forward(inputs[0])};
  KILN_CHECK(rotary_ != nullptr || !inputs[1].defined(),
             "Attention: positions are an input only with rotary embeddings (config.rotary)");
  const Tensor mask = inputs.size() == 3 ? inputs[2] : Tensor();
  KILN_CHECK(!mask.defined() || mask.dtype() == DType::kBool,
             "Attention: the mask must be bool (true = attend), got ",
             mask.defined() ? DTypeName(mask.dtype()) : "");
  // Undefined positions are forward's (and LlamaForCausalLM's).
  const Tensor positions =
      inputs[1].defined() ? inputs[1] : DefaultPositions(inputs[0], rotary_ != nullptr);
  const auto [q, k, v] = Project(inputs[0], positions);
  CheckWithinWindow(config_, q.size(2), "a sequence");
  const bool gqa = config_.kv_heads != config_.heads;
  return {Out(scaled_dot_product_attention(q, k, v, mask, /*is_causal=*/!mask.defined(),
                                           std::nullopt, gqa))};
}

Tensor Attention::Cached(const Tensor& x, const Tensor& positions, const Cache& cache,
                         const Tensor& slots, const Tensor& mask) {
  const auto [q, k, v] = Project(x, positions);
  KILN_CHECK(cache.k.defined() && cache.v.defined() && cache.k.dim() == 4 &&
                 cache.k.shape() == cache.v.shape() && cache.k.size(0) == x.size(0) &&
                 cache.k.size(1) == config_.kv_heads && cache.k.size(3) == config_.head_dim,
             "Attention::Cached: the caches must be [B, kv_heads, S, head_dim] = [", x.size(0),
             ", ", config_.kv_heads, ", S, ", config_.head_dim, "], got k ",
             cache.k.defined() ? cache.k.shape_string() : "undefined", " v ",
             cache.v.defined() ? cache.v.shape_string() : "undefined");
  CheckWithinWindow(config_, cache.k.size(2), "a KV cache");
  KILN_CHECK(
      mask.defined() && mask.dtype() == DType::kBool,
      "Attention::Cached: mask must be a bool tensor broadcasting to [B, 1, T, S] (true = ",
      "attend), got ",
      mask.defined() ? absl::StrCat(DTypeName(mask.dtype()), mask.shape_string()) : "undefined");
  KILN_CHECK(slots.defined() && slots.dim() == 1 && slots.size(0) == x.size(1),
             "Attention::Cached: slots must be [T] = [", x.size(1), "] cache rows, got ",
             slots.defined() ? slots.shape_string() : "undefined");
  KILN_CHECK(cache.k.dtype() == k.dtype() && cache.v.dtype() == v.dtype(),
             "Attention::Cached: the caches must hold the keys' and values' dtype ",
             DTypeName(k.dtype()), ", got k ", DTypeName(cache.k.dtype()), " v ",
             DTypeName(cache.v.dtype()));
  WithErrorContext(
      [&] {
        return absl::StrCat("Attention::Cached: slots must be rows of the cache's S = ",
                            cache.k.size(2));
      },
      [&] {
        index_copy_(cache.k, 2, slots, k);
        index_copy_(cache.v, 2, slots, v);
      });
  const bool gqa = config_.kv_heads != config_.heads;
  return Out(scaled_dot_product_attention(q, cache.k, cache.v, mask, false, std::nullopt, gqa));
}

}  // namespace kiln
