// The Llama-style model of llama.h: its config from Hugging Face's config.json, its layers, the
// full forward and the cached step generate() drives.
#include "models/llama.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "io/json_text.h"
#include "ops/distributed.h"
#include "ops/factories.h"
#include "ops/module_init.h"
#include "ops/ops.h"
#include "ops/tensor_parallel.h"
#include "runtime/status.h"

namespace kiln {
namespace {

using Json = nlohmann::json;

// The field `name` of `j` as T, or `fallback` when it is absent or null. An integer field must
// hold a JSON integer that fits T (16.5 or 1e30 would otherwise be truncated or overflow).
template <typename T>
T Field(const Json& j, const char* name, T fallback) {
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) return fallback;
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    const bool fits = it->is_number_integer() &&
                      (!it->is_number_unsigned() ||
                       it->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max()));
    KILN_CHECK(fits, "LlamaConfig::FromJson: field '", name,
               "' has the wrong type: it must be an integer that fits int64, got ",
               JsonForMessage(*it));
  }
  try {
    return it->get<T>();
  } catch (const Json::exception&) {
    KILN_FAIL("LlamaConfig::FromJson: field '", name,
              "' has the wrong type: ", JsonForMessage(*it));
  }
}

// The rope rule of a config: transformers 4.x writes rope_theta and rope_scaling at the top
// level, 5.x one rope_parameters object (rope_theta, rope_type and the scaling fields inside).
RopeOptions RopeFromJson(const Json& j, RopeOptions r) {
  r.max_positions = Field<int64_t>(j, "max_position_embeddings", r.max_positions);
  const auto params = j.find("rope_parameters");
  const bool v5 = params != j.end() && !params->is_null();
  KILN_CHECK(!v5 || params->is_object(), "LlamaConfig::FromJson: rope_parameters must be an ",
             "object, got ", v5 ? JsonForMessage(*params) : "");
  // transformers 5 keeps a top-level rope_theta where rope_parameters lacks one.
  r.base = Field<double>(v5 ? *params : j, "rope_theta", Field<double>(j, "rope_theta", r.base));
  const Json* s = nullptr;
  if (v5) {
    s = &*params;
  } else if (const auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    KILN_CHECK(it->is_object(), "LlamaConfig::FromJson: rope_scaling must be an object, got ",
               JsonForMessage(*it));
    s = &*it;
  }
  if (s == nullptr) return r;
  // transformers 4 finds no rope function for a rope_scaling without its type (KeyError); 5's
  // rope_parameters default to "default".
  KILN_CHECK(v5 || s->contains("rope_type") || s->contains("type"),
             "LlamaConfig::FromJson: rope_scaling needs its 'rope_type' (or 'type'), got ",
             JsonForMessage(*s));
  const std::string type =
      Field<std::string>(*s, "rope_type", Field<std::string>(*s, "type", "default"));
  // A scaling's parameters are required, as transformers requires them.
  const auto required = [&]<typename T>(const char* name, T) {
    KILN_CHECK(s->contains(name) && !(*s)[name].is_null(), "LlamaConfig::FromJson: rope type '",
               type, "' needs the field '", name, "'");
    return Field<T>(*s, name, T{});
  };
  if (type == "linear") {
    r.scaling = RopeOptions::Scaling::kLinear;
    r.factor = required("factor", 0.0);
  } else if (type == "llama3") {
    r.scaling = RopeOptions::Scaling::kLlama3;
    r.factor = required("factor", 0.0);
    r.low_freq_factor = required("low_freq_factor", 0.0);
    r.high_freq_factor = required("high_freq_factor", 0.0);
    r.original_max_positions = required("original_max_position_embeddings", int64_t{0});
  } else if (type == "yarn") {
    r.scaling = RopeOptions::Scaling::kYarn;
    // transformers 5: original_max_position_embeddings defaults to max_position_embeddings, and
    // a missing factor is their ratio.
    r.original_max_positions =
        Field<int64_t>(*s, "original_max_position_embeddings", r.max_positions);
    r.factor = Field<double>(
        *s, "factor",
        static_cast<double>(r.max_positions) / static_cast<double>(r.original_max_positions));
    r.attention_factor = Field<double>(*s, "attention_factor", 0.0);
    r.beta_fast = Field<double>(*s, "beta_fast", 0.0);  // 0 or null: the default, as there
    r.beta_slow = Field<double>(*s, "beta_slow", 0.0);
    if (r.beta_fast == 0) r.beta_fast = 32;
    if (r.beta_slow == 0) r.beta_slow = 1;
    r.mscale = Field<double>(*s, "mscale", 0.0);
    r.mscale_all_dim = Field<double>(*s, "mscale_all_dim", 0.0);
    r.truncate = Field<bool>(*s, "truncate", true);
  } else if (type == "dynamic") {
    r.scaling = RopeOptions::Scaling::kDynamic;
    r.factor = required("factor", 0.0);
  } else if (type != "default") {
    KILN_FAIL("LlamaConfig::FromJson: rope type '", type,
              "' is not supported (supported: default, linear, llama3, yarn, dynamic)");
  }
  return r;
}

// Qwen2/Qwen3's window: sliding_window (default 4096) with use_sliding_window, where some layer
// is a sliding one (layer_types says, or else the layers from max_window_layers, default 28, on);
// 0 where none is.
int64_t QwenSlidingWindow(const Json& j, int64_t layers) {
  if (!Field<bool>(j, "use_sliding_window", false)) return 0;
  const auto given = j.find("sliding_window");  // null: no window, as in transformers
  const int64_t window = given == j.end() ? 4096 : Field<int64_t>(j, "sliding_window", 0);
  const auto types = j.find("layer_types");
  if (types != j.end() && !types->is_null()) {
    KILN_CHECK(types->is_array() && static_cast<int64_t>(types->size()) == layers,
               "LlamaConfig::FromJson: layer_types must be a list of num_hidden_layers = ", layers,
               " entries, got ", JsonForMessage(*types));
    bool sliding = false;
    for (const Json& t : *types) {
      KILN_CHECK(t == "sliding_attention" || t == "full_attention",
                 "LlamaConfig::FromJson: layer_types entries must be \"full_attention\" or ",
                 "\"sliding_attention\", got ", JsonForMessage(t));
      sliding = sliding || t == "sliding_attention";
    }
    return sliding ? window : 0;
  }
  return layers > Field<int64_t>(j, "max_window_layers", 28) ? window : 0;
}

AttentionConfig AttentionOf(const LlamaConfig& c) {
  return {.dim = c.dim,
          .heads = c.heads,
          .kv_heads = c.kv_heads,
          .head_dim = c.head_dim,
          .qkv_bias = c.qkv_bias,
          .out_bias = c.out_bias,
          .rotary = true,
          .rope = c.rope,
          .qk_norm = c.qk_norm,
          .qk_norm_eps = c.eps,
          .sliding_window = c.sliding_window};
}

int64_t HeadDim(const LlamaConfig& c) {
  KILN_CHECK(c.heads > 0 && (c.head_dim > 0 || c.dim % c.heads == 0), "LlamaForCausalLM: dim ",
             c.dim, " must be a multiple of heads ", c.heads, " unless head_dim is given");
  return c.head_dim > 0 ? c.head_dim : c.dim / c.heads;
}

const LlamaConfig& Checked(const LlamaConfig& c) {
  KILN_CHECK(c.vocab > 0 && c.dim > 0 && c.hidden > 0 && c.layers > 0 && c.heads > 0 &&
                 c.kv_heads >= 0 && c.head_dim >= 0 && c.eps >= 0,
             "LlamaForCausalLM: sizes must be positive (kv_heads, head_dim: 0 for the default) ",
             "and eps >= 0, got vocab=", c.vocab, " dim=", c.dim, " hidden=", c.hidden,
             " layers=", c.layers, " heads=", c.heads, " kv_heads=", c.kv_heads,
             " head_dim=", c.head_dim, " eps=", c.eps);
  HeadDim(c);
  return c;
}

}  // namespace

LlamaConfig LlamaConfig::FromJson(const std::string& text) {
  const Json j = ValueOrThrow(ParseJsonStrictly(text, "LlamaConfig::FromJson: the config"));
  KILN_CHECK(j.is_object(), "LlamaConfig::FromJson: expected a JSON object");
  const std::string model_type = Field<std::string>(j, "model_type", "llama");
  KILN_CHECK(model_type == "llama" || model_type == "mistral" || model_type == "qwen2" ||
                 model_type == "qwen3" || model_type == "gemma" || model_type == "phi3",
             "LlamaConfig::FromJson: model_type '", model_type,
             "' is not supported (supported: llama, mistral, qwen2, qwen3, gemma, phi3)");
  LlamaConfig c;
  c.gemma = model_type == "gemma";
  c.fused_projections = model_type == "phi3";
  if (c.fused_projections) {  // Phi3Config's defaults (Phi-3-mini)
    c.vocab = 32064, c.dim = 3072, c.hidden = 8192, c.rope.max_positions = 4096;
    KILN_CHECK(Field<double>(j, "partial_rotary_factor", 1.0) == 1.0,
               "LlamaConfig::FromJson: phi3's partial_rotary_factor must be 1 (rotary embeddings "
               "over part of each head are not supported), got ",
               JsonForMessage(j.at("partial_rotary_factor")));
  }
  if (c.gemma) {  // GemmaConfig's defaults (gemma-7b) for the fields a config leaves out
    c.vocab = 256000, c.dim = 3072, c.hidden = 24576, c.layers = 28, c.heads = 16;
    c.kv_heads = 16, c.head_dim = 256, c.rope.max_positions = 8192;
  }
  if (model_type == "mistral") {  // MistralConfig's defaults (Mistral-7B)
    c.hidden = 14336, c.kv_heads = 8, c.rope.max_positions = 4096 * 32;
  }
  if (model_type == "qwen2" || model_type == "qwen3") {  // Qwen2Config's and Qwen3Config's
    c.vocab = 151936, c.hidden = 22016, c.kv_heads = 32, c.rope.max_positions = 32768;
  }
  c.vocab = Field<int64_t>(j, "vocab_size", c.vocab);
  c.dim = Field<int64_t>(j, "hidden_size", c.dim);
  c.hidden = Field<int64_t>(j, "intermediate_size", c.hidden);
  c.layers = Field<int64_t>(j, "num_hidden_layers", c.layers);
  c.heads = Field<int64_t>(j, "num_attention_heads", c.heads);
  c.kv_heads = Field<int64_t>(j, "num_key_value_heads", c.kv_heads);
  c.head_dim = Field<int64_t>(j, "head_dim", c.head_dim);
  // transformers' default (Phi3Config's: 1e-5), not the struct's
  c.eps = Field<double>(j, "rms_norm_eps", c.fused_projections ? 1e-5 : 1e-6);
  c.rope = RopeFromJson(j, c.rope);
  const bool mistral = model_type == "mistral", qwen3 = model_type == "qwen3";
  // Gemma: hidden_activation where given (transformers' GemmaMLP reads it), else hidden_act,
  // whose default there is the tanh GELU.
  const std::string act =
      c.gemma ? Field<std::string>(j, "hidden_activation",
                                   Field<std::string>(j, "hidden_act", "gelu_pytorch_tanh"))
              : Field<std::string>(j, "hidden_act", "silu");
  c.activation = ActivationFromName(act);
  const bool qwen = model_type == "qwen2" || qwen3;
  // The fields each transformers config class reads (one it does not define is ignored, as
  // there): Mistral's sliding_window defaults to 4096 when absent (null: none); Qwen's applies
  // only with use_sliding_window and to some layers (QwenSlidingWindow); Llama has none. Mistral
  // has no biases; Qwen2 has q/k/v biases and no others; Qwen3 reads attention_bias for all four
  // projections, has q/k norms and a head_dim of 128 unless given; Llama reads attention_bias and
  // mlp_bias.
  if (c.fused_projections) {
    c.sliding_window = Field<int64_t>(j, "sliding_window", 0);  // null (the default): none
  } else if (mistral) {
    const auto it = j.find("sliding_window");
    c.sliding_window = it == j.end() ? 4096 : Field<int64_t>(j, "sliding_window", 0);
  } else if (qwen) {
    c.sliding_window = QwenSlidingWindow(j, c.layers);
  }
  if (qwen3) c.head_dim = Field<int64_t>(j, "head_dim", 128);
  const bool own_bias =
      (qwen3 || c.gemma || model_type == "llama") && Field<bool>(j, "attention_bias", false);
  c.qkv_bias = model_type == "qwen2" || own_bias;
  c.out_bias = own_bias;
  c.mlp_bias = model_type == "llama" && Field<bool>(j, "mlp_bias", false);
  c.qk_norm = qwen3;
  // Gemma ties its head unless told otherwise (GemmaConfig's default); the others do not.
  c.tie_word_embeddings = Field<bool>(j, "tie_word_embeddings", c.gemma);
  return c;
}

GemmaRMSNorm::GemmaRMSNorm(int64_t dim, double eps, ModuleOptions o)
    : eps_(eps),
      weight_(RegisterParameter(
          "weight", module_init::Full({dim}, 0, module_init::FloatingChecked("GemmaRMSNorm", o)))) {
  KILN_CHECK(dim > 0, "GemmaRMSNorm: dim must be positive, got ", dim);
}

Tensor GemmaRMSNorm::forward(const Tensor& x) {
  CheckInitialised();
  // A float32 weight makes rms_norm compute in float32 and round once, as transformers does.
  return rms_norm(x, add(cast(weight_, DType::kFloat32), 1.0), eps_);
}

namespace {

// The model's RMSNorm: Gemma's where the config says so.
std::unique_ptr<Module> NormOf(const LlamaConfig& c, ModuleOptions o) {
  if (c.gemma) return std::make_unique<GemmaRMSNorm>(c.dim, c.eps, o);
  return std::make_unique<RMSNorm>(c.dim, c.eps, o);
}

}  // namespace

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& c, const RotaryEmbedding& rotary,
                                     ModuleOptions o)
    : input_layernorm_(RegisterModule("input_layernorm", NormOf(c, o))),
      self_attn_(
          RegisterModule("self_attn", std::make_unique<Attention>(AttentionOf(c), o, &rotary))),
      post_attention_layernorm_(RegisterModule("post_attention_layernorm", NormOf(c, o))),
      mlp_(RegisterModule("mlp", std::make_unique<FeedForward>(c.dim, c.hidden, MlpKind::kGated,
                                                               c.activation, c.mlp_bias, o))) {}

void LlamaDecoderLayer::ShardTensorParallel(ProcessGroup& group) {
  self_attn_.ShardTensorParallel(group);
  mlp_.ShardTensorParallel(group);
}

Tensor LlamaDecoderLayer::Forward(const Tensor& x, const Tensor& positions, const Tensor& mask) {
  const Tensor h = x + self_attn_.forward_many({input_layernorm_(x), positions, mask})[0];
  return h + mlp_(post_attention_layernorm_(h));
}

Tensor LlamaDecoderLayer::Cached(const Tensor& x, const Tensor& positions,
                                 const Attention::Cache& cache, const Tensor& slots,
                                 const Tensor& mask) {
  CheckInitialised();
  self_attn_.CheckInitialised();
  const Tensor h = x + self_attn_.Cached(input_layernorm_(x), positions, cache, slots, mask);
  return h + mlp_(post_attention_layernorm_(h));
}

Tensor LlamaDecoderLayer::forward(const Tensor& x) {
  return Forward(x, arange(x.size(1), DType::kInt64, x.device()));
}

LlamaForCausalLM::LlamaForCausalLM(const LlamaConfig& config, ModuleOptions o)
    : config_(Checked(config)),
      options_(o),
      embed_tokens_(
          RegisterModule("embed_tokens", std::make_unique<Embedding>(config.vocab, config.dim, o))),
      rotary_(RegisterModule("rotary_emb",
                             std::make_unique<RotaryEmbedding>(HeadDim(config), config.rope, o))),
      norm_([&]() -> Module& {
        auto& list = RegisterModule("layers", std::make_unique<ModuleList>());
        for (int64_t i = 0; i < config.layers; ++i) {
          layers_.push_back(
              &list.push_back(std::make_unique<LlamaDecoderLayer>(config, rotary_, o)));
        }
        return RegisterModule("norm", NormOf(config, o));
      }()) {
  if (config.tie_word_embeddings) {
    MarkTied("lm_head.weight", "embed_tokens.weight");  // what transformers may save too
  } else {
    lm_head_ =
        &RegisterModule("lm_head", std::make_unique<Linear>(config.dim, config.vocab, false, o));
  }
}

Tensor LlamaForCausalLM::Embed(const Tensor& tokens) {
  const Tensor x = embed_tokens_(tokens);
  if (!config_.gemma) return x;
  // transformers multiplies by sqrt(hidden_size) as a tensor of the model's dtype.
  return mul(x, RoundToDType(x.dtype(), std::sqrt(static_cast<double>(config_.dim))));
}

Tensor LlamaForCausalLM::Logits(const Tensor& x) {
  const Tensor h = norm_(x);
  if (tp_.defined()) {  // this rank's rows of the vocabulary, gathered
    ProcessGroup& group = tp_.get("LlamaForCausalLM");
    if (lm_head_ == nullptr) return VocabParallelLogits(h, embed_tokens_.weight(), group);
    return GatherVocab((*lm_head_)(h), config_.vocab, group);
  }
  if (lm_head_ != nullptr) return (*lm_head_)(h);
  embed_tokens_.CheckInitialised();
  return linear(h, embed_tokens_.weight());
}

namespace {

// The attention pattern of a padded batch: query i of row b sees key j <= i where
// attention_mask[b, j] is nonzero (HF's [B, T] mask, 1 = token, 0 = padding), and always
// itself, so a padding query's row is not empty (its output is never read).
Tensor PaddedCausalMask(const Tensor& attention_mask, const Tensor& tokens) {
  const int64_t b = tokens.size(0), t = tokens.size(1);
  KILN_CHECK(
      attention_mask.dim() == 2 && attention_mask.size(0) == b && attention_mask.size(1) == t,
      "LlamaForCausalLM: attention_mask must be [B, T] = ", tokens.shape_string(),
      " like the tokens, got ", attention_mask.shape_string());
  const Device d = tokens.device();
  const Tensor i = reshape(arange(t, DType::kInt64, d), {t, 1});
  const Tensor j = reshape(arange(t, DType::kInt64, d), {1, t});
  const Tensor keys = reshape(ne(attention_mask, 0), {b, 1, 1, t});
  return le(j, i) & (keys | eq(i, j));  // [B, 1, T, T]
}

}  // namespace

std::vector<Tensor> LlamaForCausalLM::forward_many(const std::vector<Tensor>& inputs) {
  KILN_CHECK(inputs.size() >= 1 && inputs.size() <= 3,
             "LlamaForCausalLM: takes {tokens}, {tokens, positions} or {tokens, positions, "
             "attention_mask}, got ",
             inputs.size(), " inputs");
  const Tensor& tokens = inputs[0];
  KILN_CHECK(tokens.dim() == 2, "LlamaForCausalLM: expected tokens [B, T], got ",
             tokens.shape_string());
  const Tensor positions = inputs.size() >= 2 && inputs[1].defined()
                               ? inputs[1]
                               : arange(tokens.size(1), DType::kInt64, tokens.device());
  const Tensor mask =
      inputs.size() == 3 && inputs[2].defined() ? PaddedCausalMask(inputs[2], tokens) : Tensor();
  Tensor x = Embed(tokens);
  for (LlamaDecoderLayer* layer : layers_) x = layer->Forward(x, positions, mask);
  return {Logits(x)};
}

Tensor LlamaForCausalLM::forward(const Tensor& tokens) { return forward_many({tokens})[0]; }

void LlamaForCausalLM::ShardTensorParallel(ProcessGroup& group) {
  KILN_CHECK(!tp_.defined(), "LlamaForCausalLM::ShardTensorParallel: already sharded over ",
             tp_.world_size(), " ranks");
  const int64_t n = group.world_size(), heads = config_.heads,
                kv_heads = config_.kv_heads > 0 ? config_.kv_heads : heads;
  // Checked before any layer changes: a refused split leaves the model whole.
  KILN_CHECK(heads % n == 0 && kv_heads % n == 0 && config_.hidden % n == 0,
             "LlamaForCausalLM::ShardTensorParallel: ", heads, " heads, ", kv_heads,
             " key/value heads and ", config_.hidden, " MLP features must all split over ", n,
             " ranks");
  for (LlamaDecoderLayer* layer : layers_) layer->ShardTensorParallel(group);
  // The LM head keeps its rows of the vocabulary; a tied one reads its rows of the embedding.
  if (lm_head_ != nullptr) lm_head_->KeepPaddedRows(group.rank(), group.world_size());
  tp_ = GroupRef(group);
}

CausalLM::CacheSpec LlamaForCausalLM::cache_spec() const {
  const Tensor& w = embed_tokens_.weight();
  return {config_.layers,
          (config_.kv_heads > 0 ? config_.kv_heads : config_.heads) / tp_.world_size(),
          HeadDim(config_),
          w.dtype(),
          w.device(),
          config_.vocab,
          rotary_.max_positions()};
}

Tensor LlamaForCausalLM::Step(const StepInputs& in) {
  KILN_CHECK(in.tokens.dim() == 2 && in.tokens.size(1) > 0 && in.cache.k.size() == layers_.size() &&
                 in.cache.v.size() == layers_.size(),
             "LlamaForCausalLM::Step: expected tokens [B, T] with T >= 1 and a cache of ",
             layers_.size(), " layers, got tokens ", in.tokens.shape_string(), " and ",
             in.cache.k.size(), " layers");
  const int64_t t = in.tokens.size(1);
  Tensor x = Embed(in.tokens);
  for (size_t i = 0; i < layers_.size(); ++i) {
    x = layers_[i]->Cached(x, in.positions, {in.cache.k[i], in.cache.v[i]}, in.slots, in.mask);
  }
  const Tensor last = slice(x, 1, t - 1, t);  // [B, 1, dim]
  return reshape(Logits(last), {in.tokens.size(0), config_.vocab});
}

}  // namespace kiln

namespace kiln {
namespace {

// The rows of Phi-3's fused tensors: {kiln's module, first row, rows} of self_attn.qkv_proj
// (q, k, v) or mlp.gate_up_proj (gate, up), in checkpoint order. The last part takes every row
// left (rows 0: "the rest"), so a fused tensor with rows to spare is a size error on load, not
// a silent partial read.
struct FusedPart {
  const char* module;
  int64_t start, rows;
};
std::vector<FusedPart> FusedParts(const LlamaConfig& c, bool attention) {
  if (!attention) return {{"gate_proj", 0, c.hidden}, {"up_proj", c.hidden, 0}};
  const int64_t hd = HeadDim(c), q = c.heads * hd,
                kv = (c.kv_heads > 0 ? c.kv_heads : c.heads) * hd;
  return {{"q_proj", 0, q}, {"k_proj", q, kv}, {"v_proj", q + kv, 0}};
}

// "layers.3.self_attn." + "qkv_proj" + ".weight" split at `fused`, or nullopt.
struct FusedName {
  std::string prefix, param;
  bool attention;
};
std::optional<FusedName> SplitFusedName(const std::string& name) {
  for (const auto& [fused, attention] :
       {std::pair<const char*, bool>{"self_attn.qkv_proj.", true},
        std::pair<const char*, bool>{"mlp.gate_up_proj.", false}}) {
    const size_t at = name.find(fused);
    if (at != std::string::npos) {
      return FusedName{name.substr(0, at), name.substr(at + std::strlen(fused)), attention};
    }
  }
  return std::nullopt;
}

}  // namespace

KeyMapper llama_load_mapping(const LlamaConfig& c) {
  const KeyMapper plain = llama_load_mapping();
  if (!c.fused_projections) return plain;
  return [plain, c](const std::string& key) -> KeyMappings {
    const KeyMappings base = plain(key);
    if (base.dropped()) return base;
    const std::string& name = base.list()[0].name;
    const std::optional<FusedName> f = SplitFusedName(name);
    if (!f) return base;
    std::vector<KeyMapping> parts;
    const std::string block = f->attention ? "self_attn." : "mlp.";
    for (const FusedPart& p : FusedParts(c, f->attention)) {
      parts.push_back(
          {absl::StrCat(f->prefix, block, p.module, ".", f->param), false, {p.start, p.rows}});
    }
    return parts;
  };
}

KeyMapper llama_save_mapping(const LlamaConfig& c) {
  const KeyMapper plain = llama_save_mapping();
  if (!c.fused_projections) return plain;
  return [plain, c](const std::string& name) -> KeyMappings {
    KeyMappings base = plain(name);
    if (base.dropped()) return base;
    for (const bool attention : {true, false}) {
      const std::string block = attention ? "self_attn." : "mlp.";
      for (const FusedPart& p : FusedParts(c, attention)) {
        const std::string module = absl::StrCat(block, p.module, ".");
        const size_t at = base.list()[0].name.find(module);
        if (at == std::string::npos) continue;
        const std::string& key = base.list()[0].name;
        const std::string fused = attention ? "self_attn.qkv_proj." : "mlp.gate_up_proj.";
        return KeyMapping{absl::StrCat(key.substr(0, at), fused, key.substr(at + module.size())),
                          false,
                          {},
                          {p.start, 0}};
      }
    }
    return base;
  };
}

}  // namespace kiln
