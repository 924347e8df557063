// Modules for writing models, like torch.nn: named parameters, submodules, seeded init.
//
//   Generator gen(0);
//   GeGLUMLP mlp(768, 3072, gen, {DType::kBFloat16, CUDA()});
//   Tensor y = mlp(x);                      // down(gelu_tanh(gate(x)) * up(x))
//   for (auto& [name, p] : mlp.named_parameters()) ...   // "gate.weight", ...
//
//   // A GPT-2 block (names like torch's state-dict keys: "ln_1.weight", "attn.c_attn.weight")
//   DecoderBlock block({.dim = 768, .heads = 12, .norm = NormKind::kLayerNorm,
//                       .mlp = MlpKind::kGelu, .bias = true, .rotary = false}, gen);
//   Tensor h = block(x);                               // x [B, T, 768]
//   Tensor r = block({x, positions})[0];  // several inputs (forward_many): rotary positions
//
// A module overrides forward(x) (one input, one output) or forward_many(inputs) (any number),
// or both; each one's default calls the other. Not thread-safe while called: modules may cache
// (the causal mask of the last sequence length).
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "runtime/random.h"
#include "runtime/tensor.h"

namespace kiln {

// Where and in which dtype a module creates its parameters.
struct ModuleOptions {
  DType dtype = DType::kFloat32;
  Device device = kCPU;
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
  Tensor operator()(const Tensor& x) { return forward(x); }
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs) { return forward_many(inputs); }

  // Expires when the module is destroyed (compiled functions refer to their module through it).
  std::weak_ptr<const bool> alive_token() const { return alive_; }

  // Parameters of this module and its submodules, named "child.param" recursively (torch's
  // state-dict keys: "h.0.attn.c_attn.weight"), in registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  // Buffers (tensors that are state but not parameters, like rotary tables), named likewise.
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  // Moves/converts every parameter (in place of the old handles); to(Device) moves buffers too,
  // to(DType) leaves them in their dtype (rotary tables stay float32).
  void to(Device device);
  void to(DType dtype);
  // The module's name in error messages ("Linear", "DecoderBlock").
  virtual const char* type_name() const { return "Module"; }

 private:
  std::shared_ptr<const bool> alive_ = std::make_shared<const bool>(true);

 protected:
  // The returned reference stays valid for the module's lifetime.
  Tensor& RegisterParameter(std::string name, Tensor value);
  Tensor& RegisterBuffer(std::string name, Tensor value);
  template <typename M>
  M& RegisterModule(std::string name, std::unique_ptr<M> child) {
    M& ref = *child;
    children_.emplace_back(std::move(name), std::move(child));
    return ref;
  }

 private:
  void CollectNamed(bool buffers, const std::string& prefix,
                    std::vector<std::pair<std::string, Tensor>>* out) const;

  std::deque<std::pair<std::string, Tensor>> params_, buffers_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  bool in_default_forward_ = false;  // breaks the recursion of the two default forwards
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
  Module& operator[](size_t i) const { return *modules_.at(i); }
  // Runs the modules in order, each on the previous one's output.
  Tensor forward(const Tensor& x) override;
  const char* type_name() const override { return "ModuleList"; }

 private:
  std::vector<Module*> modules_;
};

// y = x @ weightᵀ + bias, weight [out, in]; init U(-1/sqrt(in), 1/sqrt(in)) like torch.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, Generator& gen,
         ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias

 private:
  Tensor& weight_;
  Tensor& bias_;
};

// The seed workload: down(gelu_tanh(gate(x)) * up(x)), no biases.
class GeGLUMLP : public Module {
 public:
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

// Naive causal attention on q, k, v [..., T, D]: softmax(mask(q kᵀ / sqrt(D))) v. `causal_mask`
// is a bool [T, T] tensor, true above the diagonal (made with triu(ones, 1)) — pass it to reuse
// one; undefined builds it. `inplace` masks the scores with masked_fill_ (one copy fewer).
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

// rms_norm over the last dim with weight (ones).
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6, ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  const char* type_name() const override { return "RMSNorm"; }

 private:
  double eps_;
  Tensor& weight_;
};

// Rotary position embeddings (RoFormer; the "rotate half" layout of GPT-NeoX and LLaMA): the
// two halves (x1, x2) of the last dim become (x1 cos - x2 sin, x2 cos + x1 sin) with angles
// position * base^(-2i / head_dim). cos/sin tables [max_positions, head_dim / 2] are float32
// buffers computed in double; they are gathered by position (an embedding lookup, so compiled
// functions take positions as an input) and cast to x's dtype.
//   forward(x)                      x [..., T, head_dim] at positions 0 .. T-1
//   forward_many({x, positions})    positions int64/int32 [T] (a decode step: {offset})
class RotaryEmbedding : public Module {
 public:
  RotaryEmbedding(int64_t head_dim, int64_t max_positions, double base = 10000,
                  ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::vector<Tensor> forward_many(const std::vector<Tensor>& inputs) override;
  Tensor Rotate(const Tensor& x, const Tensor& positions) const;
  const char* type_name() const override { return "RotaryEmbedding"; }

 private:
  int64_t head_dim_;
  Tensor& cos_;
  Tensor& sin_;
};

enum class NormKind : uint8_t { kLayerNorm, kRmsNorm };
// kGelu: c_proj(gelu_tanh(c_fc(x))) (GPT-2). kGeGLU / kSwiGLU: down(act(gate(x)) * up(x)).
enum class MlpKind : uint8_t { kGelu, kGeGLU, kSwiGLU };

// The MLPs of DecoderBlock, by MlpKind, with or without biases.
class FeedForward : public Module {
 public:
  FeedForward(int64_t dim, int64_t hidden, MlpKind kind, bool bias, Generator& gen,
              ModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  const char* type_name() const override { return "FeedForward"; }

 private:
  MlpKind kind_;
  std::vector<Linear*> layers_;  // c_fc, c_proj | gate, up, down
};

struct DecoderBlockConfig {
  int64_t dim = 0;
  int64_t heads = 0;
  int64_t hidden = 0;  // the MLP's inner size; 0: 4 * dim
  NormKind norm = NormKind::kRmsNorm;
  MlpKind mlp = MlpKind::kSwiGLU;
  bool bias = false;             // biases of the linears (GPT-2: true)
  bool rotary = true;            // rotary embeddings on q and k (GPT-2: false, positions learned)
  int64_t max_positions = 2048;  // rotary tables
  double rope_base = 10000;
  double eps = 1e-5;  // the norms'
};

// Causal multi-head self-attention: c_attn (fused q, k, v projection) and c_proj, optional
// rotary embeddings. x [B, T, dim] -> [B, T, dim]; forward_many({x, positions}) for rotary
// positions other than 0 .. T-1.
class SelfAttention : public Module {
 public:
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

}  // namespace kiln
