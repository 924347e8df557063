// Modules for writing models, like torch.nn: named parameters, submodules, seeded init.
//
//   GeGLUMLP mlp(768, 3072, {DType::kBFloat16, CUDA()});   // random init, default generator
//   Tensor y = mlp(x);                      // down(gelu_tanh(gate(x)) * up(x))
//   for (auto& [name, p] : mlp.named_parameters()) ...   // "gate.weight", ...
//
//   // A GPT-2 block (names like torch's state-dict keys: "ln_1.weight", "attn.c_attn.weight")
//   DecoderBlock block({.dim = 768, .heads = 12, .norm = NormKind::kLayerNorm,
//                       .mlp = MlpKind::kPlain, .activation = Activation::kGeluTanh,
//                       .bias = true, .rotary = false});
//   Tensor h = block(x);                               // x [B, T, 768]
//   Tensor r = block({x, positions})[0];  // several inputs (forward_many): rotary positions
//
//   // Llama-style attention (q/k/v/o projections, grouped-query heads, rotary), its weights
//   // left uninitialised because a checkpoint will fill them:
//   Attention attn({.dim = 2048, .heads = 32, .kv_heads = 8}, {.init = Init::kNone});
//
// Initial values come from ModuleOptions::generator, or from the default generator
// (kiln::manual_seed) when it names none; older constructors take a Generator& first. With
// Init::kNone a module's parameters are allocated but hold no values until something writes them
// (load_state_dict, copy_): calling the module before that is an error naming the parameter.
//
// A module overrides forward(x) (one input, one output) or forward_many(inputs) (any number),
// or both; each one's default calls the other. Not thread-safe while called: modules may cache
// (the causal mask of the last sequence length).
#pragma once

#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "ops/distributed.h"
#include "runtime/random.h"
#include "runtime/tensor.h"

namespace kiln {

// How a module's parameters get their first values.
enum class Init : uint8_t {
  kRandom,  // drawn like torch's defaults (each module says how)
  kNone,    // allocated only: they must be written (loaded) before the module is called
};

// Where, in which dtype and how a module creates its parameters.
struct ModuleOptions {
  DType dtype = DType::kFloat32;
  Device device = kCPU;
  Init init = Init::kRandom;
  Generator* generator = nullptr;  // random init's; nullptr: the default generator (manual_seed)
};

class Module {
 public:
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  // One input, one output. The default runs forward_many({x}) and expects one output.
  virtual Tensor forward(const Tensor& x);
  // Any number of inputs and outputs. The default runs forward(inputs[0]) for one input.
  virtual std::vector<Tensor> forward_many(const std::vector<Tensor>& inputs);
  // The calls: they check that this module's own parameters hold values (Init::kNone), then
  // forward. Modules call their children through these.
  Tensor operator()(const Tensor& x) {
    CheckInitialised();
    return forward(x);
  }
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs) {
    CheckInitialised();
    return forward_many(inputs);
  }
  // Throws naming the first of this module's own parameters (not its children's) made with
  // Init::kNone and never written since.
  void CheckInitialised() const;

  // Expires when the module is destroyed (compiled functions refer to their module through it).
  std::weak_ptr<const bool> alive_token() const { return alive_; }

  // Parameters of this module and its submodules, named "child.param" recursively (torch's
  // state-dict keys: "h.0.attn.c_attn.weight"), in registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  // Buffers (tensors that are state but not parameters, like rotary tables), named likewise.
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  // Both: the parameters, then the buffers (what compiled functions name captured tensors by).
  std::vector<std::pair<std::string, Tensor>> named_tensors() const;
  // Moves/converts every parameter (in place of the old handles); to(Device) moves buffers too,
  // to(DType) leaves them in their dtype (rotary tables stay float32) and converts only floating
  // parameters (torch's Module.to). A tensor registered in several places stays one tensor.
  void to(Device device);
  void to(DType dtype);
  // The module's name in error messages ("Linear", "DecoderBlock").
  virtual const char* type_name() const { return "Module"; }

  // Memory for a module built on the meta device (ModuleOptions::device = kMeta: shapes only),
  // torch's to_empty: every meta parameter and buffer becomes uninitialised memory on `device`
  // (the module refuses to run until it is written: load_state_dict), the others move there;
  // buffers a module computes itself (rotary tables) get their values. Build on meta, split
  // (ShardTensorParallel), to_empty, then load: no rank ever holds the whole model.
  void to_empty(Device device);

  // A parameter this module holds only a part of (tensor parallelism, ops/tensor_parallel.h):
  // load_state_dict (io/state_dict.h) takes that part of the checkpoint's whole tensor.
  struct ParamShard {
    Shape whole;                            // the whole parameter's shape
    int dim = 0;                            // split along: 0 (rows) or 1 (columns)
    int rank = 0, world = 1, sections = 1;  // ShardOf's split
    bool padded = false;                    // PaddedRowShard's instead (rows; zero-padded)
  };
  // The split parameters of this module and its submodules, named as named_parameters() names them.
  std::vector<std::pair<std::string, ParamShard>> named_shards() const;
  // Checkpoint names of parameters held under another name (Hugging Face's tied weights: a tied
  // LM head is the embedding), {alias, parameter}, named as named_parameters() names them.
  // load_state_dict takes the alias where the parameter's own key is absent and otherwise
  // requires the two to hold the same values.
  std::vector<std::pair<std::string, std::string>> named_ties() const;

 private:
  std::shared_ptr<const bool> alive_ = std::make_shared<const bool>(true);

 protected:
  // The returned reference stays valid for the module's lifetime.
  Tensor& RegisterParameter(std::string name, Tensor value);
  Tensor& RegisterBuffer(std::string name, Tensor value);
  template <typename M>
  M& RegisterModule(std::string name, std::unique_ptr<M> child) {
    CheckNewName(name, "module");
    M& ref = *child;
    children_.emplace_back(std::move(name), std::move(child));
    SetPath(children_.back().second.get(), Child(children_.back().first));
    return ref;
  }
  // Records that parameter `name` of this module holds only `shard` of the whole.
  void MarkShard(const std::string& name, ParamShard shard);
  // Records that a checkpoint may name parameter `name` (of this module or a child, dotted) as
  // `alias` too.
  void MarkTied(std::string alias, std::string name);
  // to_empty's step for this module's own buffers; the default gives meta ones uninitialised
  // memory and moves the others. A module that computes its buffers overrides it.
  virtual void MaterialiseBuffers(Device device);
  // Puts `value` in parameter or buffer slot `slot` (the old storage retired, as `to` does).
  static void ReplaceSlot(Tensor& slot, Tensor value);
  // to_empty's step for one slot: a meta tensor becomes uninitialised memory on `device`
  // (checked at call), another moves there.
  void MaterialiseSlot(Tensor& t, Device device);

 private:
  void CollectNamed(bool buffers, const std::string& prefix,
                    std::vector<std::pair<std::string, Tensor>>* out) const;
  // Refuses (kiln::Error naming the module) an empty name or one this module already holds as a
  // parameter, buffer or submodule (torch's register_* rules; a dotted name, which torch refuses,
  // is kiln's shortcut for a state-dict key of a flat module).
  void CheckNewName(const std::string& name, const char* what) const;
  // Puts convert(t) in every parameter slot (and buffer slot, `buffers`) of this module and its
  // submodules, once per tensor: slots holding the same view of one storage (a weight registered
  // in two modules) get the same converted tensor, so they stay one (as a shared torch Parameter).
  void ConvertSlots(bool buffers, const std::function<Tensor(const Tensor&)>& convert,
                    std::vector<std::pair<Tensor, Tensor>>* done);
  static bool Uninitialised(const Tensor& t);
  // The dotted path of child `name` ("layers.0.mlp"), and the paths of a module registered under
  // a parent and of its submodules; error messages name a module by it.
  std::string Child(const std::string& name) const;
  static void SetPath(Module* m, const std::string& path);
  // "Linear (lm_head)" for a registered module, "Linear" for a root.
  std::string Where() const;

  std::string path_;  // "" for a module no parent holds
  std::deque<std::pair<std::string, Tensor>> params_, buffers_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  std::vector<std::pair<std::string, ParamShard>> shards_;  // MarkShard's, by parameter name
  std::vector<std::pair<std::string, std::string>> ties_;   // MarkTied's {alias, name}
  bool in_default_forward_ = false;  // breaks the recursion of the two default forwards
  // Set when a parameter was registered without values; cleared once a check found all written.
  mutable std::atomic<bool> maybe_uninitialised_{false};
};

// An indexed list of submodules named "0", "1", ... (torch.nn.ModuleList): GPT-2's "h.0...".
class ModuleList : public Module {
 public:
  template <typename M>
  M& push_back(std::unique_ptr<M> module) {
    M& ref = RegisterModule(std::to_string(modules_.size()), std::move(module));
    modules_.push_back(&ref);
    return ref;
  }
  size_t size() const { return modules_.size(); }
  // The i-th module; negative i counts from the end (torch's); out of range is an error.
  Module& operator[](int64_t i) const;
  // Runs the modules in order, each on the previous one's output.
  Tensor forward(const Tensor& x) override;
  const char* type_name() const override { return "ModuleList"; }

 private:
  std::vector<Module*> modules_;
};

// y = x @ weightᵀ + bias, weight [out, in]; init U(-1/sqrt(in), 1/sqrt(in)) like torch.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, ModuleOptions options = {});
  Linear(int64_t in_features, int64_t out_features, bool bias, Generator& gen,
         ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias
  const char* type_name() const override { return "Linear"; }
  // Tensor parallelism (ops/tensor_parallel.h): keeps rank `rank`'s part of `world` along the
  // weight's `dim` (0: output features, and the bias's; 1: input features, the bias whole) and
  // drops the rest. `sections` > 1: the dim holds that many equal blocks (a fused q/k/v) and the
  // rank keeps its part of each. The sizes must divide; `who` names the layer in the error.
  void KeepShard(int dim, int rank, int world, int sections = 1, const char* who = "Linear");
  // Keeps rank `rank`'s output features split like a vocabulary that need not divide
  // (PaddedRowShard: ceil(out / world) rows, the last ranks' missing ones zeros; the bias alike).
  void KeepPaddedRows(int rank, int world);

 private:
  Tensor& weight_;
  Tensor& bias_;
};

// The seed workload: down(gelu_tanh(gate(x)) * up(x)), no biases.
class GeGLUMLP : public Module {
 public:
  GeGLUMLP(int64_t dim, int64_t hidden, ModuleOptions options = {});
  GeGLUMLP(int64_t dim, int64_t hidden, Generator& gen, ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  Linear& gate() { return gate_; }
  Linear& up() { return up_; }
  Linear& down() { return down_; }

 private:
  Linear& gate_;
  Linear& up_;
  Linear& down_;
};

// A stack of Linear(+bias) layers with GELU (tanh) between them: dims = {in, h1, ..., out}.
class MLP : public Module {
 public:
  MLP(const std::vector<int64_t>& dims, Generator& gen, ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;

 private:
  std::vector<Linear*> layers_;
};

// Naive causal attention on q [..., T, D], k [..., S, D], v [..., S, Dv]: softmax(mask(q kᵀ /
// sqrt(D))) v. `causal_mask` is a bool [T, S] tensor, true above the diagonal (made with
// triu(ones, 1): query i sees keys 0..i, SDPA's is_causal) — pass it to reuse one; undefined
// builds it. `inplace` masks the scores with masked_fill_ (one copy fewer).
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& causal_mask = {}, bool inplace = false);

// Multi-head self-attention with a causal mask in the naive form: x [B, T, dim] -> [B, T, dim].
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t dim, int64_t heads, Generator& gen, ModuleOptions options = {},
                      bool inplace = false);
  Tensor forward(const Tensor& x) override;

 private:
  // The cached causal mask for x's sequence length and device (eager calls only).
  Tensor CausalMask(const Tensor& x);

  int64_t heads_;
  bool inplace_;
  Linear& qkv_;
  Linear& proj_;
  std::mutex mask_mu_;                     // forward may run in several threads at once
  Tensor mask_ ABSL_GUARDED_BY(mask_mu_);  // cached causal mask for the last sequence length
};

// A lookup table: weight [num_embeddings, dim], init N(0, 1) like torch; forward(indices).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, ModuleOptions options = {});
  Embedding(int64_t num_embeddings, int64_t dim, Generator& gen, ModuleOptions options = {});
  Tensor forward(const Tensor& indices) override;
  const Tensor& weight() const { return weight_; }
  const char* type_name() const override { return "Embedding"; }

 private:
  Tensor& weight_;
};

// layer_norm over the last dim with weight (ones) and bias (zeros); either may be left out.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true, ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  const char* type_name() const override { return "LayerNorm"; }

 private:
  double eps_;
  Tensor& weight_;
  Tensor& bias_;
};

// rms_norm over the last dim with weight (ones). Give eps: Llama uses 1e-5 (the default, 1e-6,
// is kiln's first one, kept for code written against it; torch's default is the dtype's epsilon).
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6, ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  const char* type_name() const override { return "RMSNorm"; }

 private:
  double eps_;
  Tensor& weight_;
};

// How rotary angles are made: Hugging Face's rope_theta and rope_scaling.
struct RopeOptions {
  enum class Scaling : uint8_t {
    kNone,
    kLinear,  // positions divided by factor (HF "linear")
    kLlama3,  // Llama 3.1's frequency-dependent rule (HF "llama3")
    // YaRN (HF "yarn"): each frequency blends its interpolated (/ factor) and original values by
    // a ramp over the dims between beta_fast and beta_slow rotations in original_max_positions,
    // and the tables are scaled by attention_factor.
    kYarn,
    // Dynamic NTK (HF "dynamic"): the default frequencies up to max_positions, which is where
    // kiln's tables end (HF changes them only for longer sequences).
    kDynamic,
  };
  double base = 10000;  // rope_theta
  int64_t max_positions = 2048;
  Scaling scaling = Scaling::kNone;
  double factor = 1;                      // kLinear, kLlama3, kYarn
  double low_freq_factor = 1;             // kLlama3
  double high_freq_factor = 4;            // kLlama3
  int64_t original_max_positions = 8192;  // kLlama3, kYarn
  // kYarn: the tables' scale (0: from factor, as 0.1 ln(factor) + 1, or the ratio of the two
  // such terms with mscale and mscale_all_dim when both are given), the ramp's ends in
  // rotations, and whether they are rounded outwards to whole dims.
  double attention_factor = 0;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 0, mscale_all_dim = 0;
  bool truncate = true;
};

// The scale of the rotary tables (YaRN's attention factor; 1 for the other rules).
double rope_attention_scaling(const RopeOptions& rope);

// Rotary position embeddings (RoFormer; the "rotate half" layout of GPT-NeoX and LLaMA): the
// two halves (x1, x2) of the last dim become (x1 cos - x2 sin, x2 cos + x1 sin) with angles
// position * inv_freq[i]. The tables cos/sin [max_positions, head_dim / 2] are float32 buffers
// computed as Hugging Face does, in float32 (inv_freq = 1 / base^(2i / head_dim), scaled by the
// rule; angle = position * inv_freq, each rounded to float32), or given. They are gathered by
// position (an embedding lookup, so compiled functions take positions as an input) and cast to
// x's dtype.
//   forward(x)                      x [..., T, head_dim] at positions 0 .. T-1
//   forward_many({x, positions})    positions int64/int32 [T], or [B, T] per row for x [B, H, T,
//                                   head_dim] (left-padded batches); a decode step: {offset}
class RotaryEmbedding : public Module {
 public:
  RotaryEmbedding(int64_t head_dim, RopeOptions rope = {}, ModuleOptions options = {});
  RotaryEmbedding(int64_t head_dim, int64_t max_positions, double base = 10000,
                  ModuleOptions options = {});
  // Given tables cos, sin [max_positions, head_dim / 2] (float32; copied to options.device).
  RotaryEmbedding(const Tensor& cos, const Tensor& sin, ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::vector<Tensor> forward_many(const std::vector<Tensor>& inputs) override;
  Tensor Rotate(const Tensor& x, const Tensor& positions) const;
  int64_t max_positions() const { return cos_.size(0); }
  int64_t head_dim() const { return head_dim_; }
  const char* type_name() const override { return "RotaryEmbedding"; }

 protected:
  void MaterialiseBuffers(Device device) override;  // the tables' values, computed on the CPU

 private:
  int64_t head_dim_;
  Tensor& cos_;
  Tensor& sin_;
  std::pair<Tensor, Tensor> meta_values_;  // built on meta: cos and sin on the CPU, for to_empty
};

// The inverse frequencies [head_dim / 2] of a rope rule, float32 on the CPU, as HF computes them.
Tensor rope_inverse_frequencies(int64_t head_dim, const RopeOptions& rope);

// The rotate-half rotation RotaryEmbedding applies: x's last dim split in halves (x1, x2) becomes
// (x1·cos - x2·sin, x2·cos + x1·sin), with cos and sin [.., head_dim / 2] broadcasting to the
// halves. The compiler finds this form in traced graphs (a decode step's rotations run inside its
// attention kernel: codegen/families/attention/rotary_pattern.h).
Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin);

enum class NormKind : uint8_t { kLayerNorm, kRmsNorm };
// kPlain: c_proj(act(c_fc(x))) (GPT-2). kGated: down_proj(act(gate_proj(x)) * up_proj(x))
// (Llama's names). The first kinds kiln had name their activation too and keep their children's
// names (c_fc/c_proj, gate/up/down): kGelu is kPlain with gelu_tanh, kGeGLU gated gelu_tanh,
// kSwiGLU gated silu.
enum class MlpKind : uint8_t { kPlain, kGated, kGelu, kGeGLU, kSwiGLU };
// The activations, by name: kGelu is the exact (erf) form, kGeluTanh the tanh approximation
// (GPT-2's "gelu_new", HF's "gelu_pytorch_tanh"), kSilu is SiLU/swish (Llama's SwiGLU).
enum class Activation : uint8_t { kGelu, kGeluTanh, kSilu, kRelu };
const char* ActivationName(Activation a);  // "gelu", "gelu_tanh", "silu", "relu"
// The activation of a Hugging Face hidden_act string ("silu", "gelu", "gelu_new",
// "gelu_pytorch_tanh", "relu", ...); an unknown name is an error listing the known ones.
Activation ActivationFromName(const std::string& hf_name);
Tensor activate(const Tensor& x, Activation a);

// The MLPs of DecoderBlock and Llama-style models, with or without biases. Children: c_fc, c_proj
// (kPlain) or gate_proj, up_proj, down_proj (kGated; Hugging Face Llama's names).
class FeedForward : public Module {
 public:
  FeedForward(int64_t dim, int64_t hidden, MlpKind kind, Activation activation, bool bias,
              ModuleOptions options = {});
  FeedForward(int64_t dim, int64_t hidden, MlpKind kind, Activation activation, bool bias,
              Generator& gen, ModuleOptions options = {});
  // kGelu, kGeGLU or kSwiGLU: the activation their name says (kPlain and kGated need one given).
  FeedForward(int64_t dim, int64_t hidden, MlpKind kind, bool bias, Generator& gen,
              ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  const char* type_name() const override { return "FeedForward"; }
  // Tensor parallelism, Megatron-style: keeps this rank's share of the hidden features (the
  // first linears' rows, the last one's columns) and all-reduces over `group` after the last
  // linear, whose bias is added once after the sum (the all_reduce op: compile() traces it).
  void ShardTensorParallel(ProcessGroup& group);

 private:
  MlpKind kind_;
  Activation activation_;
  std::vector<Linear*> layers_;  // c_fc, c_proj | gate_proj, up_proj, down_proj
  GroupRef group_;               // set by ShardTensorParallel
};

struct DecoderBlockConfig {
  int64_t dim = 0;
  int64_t heads = 0;
  int64_t hidden = 0;  // the MLP's inner size; 0: 4 * dim
  NormKind norm = NormKind::kRmsNorm;
  MlpKind mlp = MlpKind::kSwiGLU;
  // The MLP's activation: required with kPlain and kGated; kGelu, kGeGLU and kSwiGLU imply theirs
  // (one given must agree).
  std::optional<Activation> activation;
  bool bias = false;          // biases of the linears (GPT-2: true)
  bool rotary = true;         // rotary embeddings on q and k (GPT-2: false, positions learned)
  int64_t max_positions = 0;  // nonzero: rope.max_positions (kept for earlier configs)
  double rope_base = 0;       // nonzero: rope.base (kept for earlier configs)
  RopeOptions rope;           // the rotary tables' rule and size
  double eps = 1e-5;          // the norms'
};

// Causal multi-head self-attention: c_attn (fused q, k, v projection) and c_proj, optional
// rotary embeddings. x [B, T, dim] -> [B, T, dim]; forward_many({x, positions}) for rotary
// positions other than 0 .. T-1.
class SelfAttention : public Module {
 public:
  explicit SelfAttention(const DecoderBlockConfig& config, ModuleOptions options = {});
  SelfAttention(const DecoderBlockConfig& config, Generator& gen, ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::vector<Tensor> forward_many(const std::vector<Tensor>& inputs) override;
  const char* type_name() const override { return "SelfAttention"; }

 private:
  Tensor Attend(const Tensor& x, const Tensor& positions);

  int64_t heads_;
  Linear& c_attn_;
  Linear& c_proj_;
  RotaryEmbedding* rotary_ = nullptr;
};

// A pre-norm transformer decoder block: h = x + attn(ln_1(x)); y = h + mlp(ln_2(h)). Children
// ln_1, attn (c_attn, c_proj), ln_2, mlp (c_fc, c_proj or gate, up, down): with LayerNorm, a
// GELU MLP, biases and no rotary it is GPT-2's block, parameter names included.
class DecoderBlock : public Module {
 public:
  explicit DecoderBlock(const DecoderBlockConfig& config, ModuleOptions options = {});
  DecoderBlock(const DecoderBlockConfig& config, Generator& gen, ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  // {x} or {x, positions} (rotary positions).
  std::vector<Tensor> forward_many(const std::vector<Tensor>& inputs) override;
  const char* type_name() const override { return "DecoderBlock"; }

 private:
  Module& ln_1_;
  SelfAttention& attn_;
  Module& ln_2_;
  FeedForward& mlp_;
};

struct AttentionConfig {
  int64_t dim = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;   // 0: heads; fewer (dividing heads): grouped-query attention
  int64_t head_dim = 0;   // 0: dim / heads
  bool qkv_bias = false;  // q_proj, k_proj, v_proj biases (Qwen2: true)
  bool out_bias = false;  // o_proj's
  bool rotary = true;
  RopeOptions rope;
  // q_norm and k_norm (Qwen3): RMSNorm over each query and key head's head_dim, weight [head_dim]
  // and epsilon qk_norm_eps, after the projections and before the rotary embedding.
  bool qk_norm = false;
  double qk_norm_eps = 1e-6;
  // Nonzero: the model was trained with sliding-window attention (HF Mistral's sliding_window:
  // a query sees only the last `sliding_window` keys). kiln does not mask by window; it runs
  // sequences and caches of at most this many positions, where the window changes nothing, and
  // refuses longer ones.
  int64_t sliding_window = 0;
};

// Causal self-attention with separate projections (Hugging Face Llama's names: q_proj, k_proj,
// v_proj, o_proj), grouped-query heads and optional rotary embeddings: its own ("rotary", buffers
// only), or one a model shares among its layers (`shared_rotary`, which must outlive it).
//   forward(x)                          x [B, T, dim] at positions 0 .. T-1, causal
//   forward_many({x, positions})        rotary positions [T] or [B, T] (undefined: 0 .. T-1)
//   forward_many({x, positions, mask})  the attention pattern given instead of causal: bool,
//                                       broadcasting to [B, 1, T, T], true = attend (padding)
//   Cached(x, positions, cache, slots, mask)
//       with a KV cache: k and v of x are written (index_copy_) into rows `slots` (int64 [T]) of
//       cache.k / cache.v [B, kv_heads, S, head_dim]; the queries attend to the cache's S rows
//       where `mask` (bool, broadcasting to [B, 1, T, S]; true = attend; required) allows. Shapes
//       do not depend on the position, so a decode step compiles once and replays as a CUDA graph.
class Attention : public Module {
 public:
  explicit Attention(const AttentionConfig& config, ModuleOptions options = {},
                     const RotaryEmbedding* shared_rotary = nullptr);
  Tensor forward(const Tensor& x) override;
  std::vector<Tensor> forward_many(const std::vector<Tensor>& inputs) override;
  struct Cache {
    Tensor k, v;  // [B, kv_heads, S, head_dim]
  };
  Tensor Cached(const Tensor& x, const Tensor& positions, const Cache& cache, const Tensor& slots,
                const Tensor& mask);
  const AttentionConfig& config() const { return config_; }
  const char* type_name() const override { return "Attention"; }
  // Tensor parallelism: keeps this rank's heads and key/value heads (contiguous ranges; both
  // counts must divide by the world size, so grouped-query heads stay with their key/value head),
  // their q/k/v rows and o_proj's columns; the output projection is all-reduced over `group`, its
  // bias added once. config() then counts this rank's heads (a KV cache holds kv_heads of them).
  void ShardTensorParallel(ProcessGroup& group);

 private:
  // q [B, H, T, hd], k and v [B, kv_heads, T, hd] of x, rotated at `positions` (if rotary).
  std::array<Tensor, 3> Project(const Tensor& x, const Tensor& positions);
  Tensor Out(const Tensor& y);  // o_proj of the heads y [B, H, T, hd]

  AttentionConfig config_;
  Linear& q_proj_;
  Linear& k_proj_;
  Linear& v_proj_;
  Linear& o_proj_;
  RMSNorm* q_norm_ = nullptr;  // AttentionConfig::qk_norm
  RMSNorm* k_norm_ = nullptr;
  const RotaryEmbedding* rotary_ = nullptr;
  GroupRef group_;  // set by ShardTensorParallel
};

}  // namespace kiln
