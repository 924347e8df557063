// Modules for writing models, like torch.nn: named parameters, submodules, seeded init.
//
//   Generator gen(0);
//   GeGLUMLP mlp(768, 3072, gen, {DType::kBFloat16, CUDA()});
//   Tensor y = mlp(x);                      // down(gelu_tanh(gate(x)) * up(x))
//   for (auto& [name, p] : mlp.named_parameters()) ...   // "gate.weight", ...
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

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

  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Parameters of this module and its submodules, named "child.param" recursively.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  // Moves/converts every parameter (in place of the old handles).
  void to(Device device);
  void to(DType dtype);

 protected:
  // The returned reference stays valid for the module's lifetime.
  Tensor& RegisterParameter(std::string name, Tensor value);
  template <typename M>
  M& RegisterModule(std::string name, std::unique_ptr<M> child) {
    M& ref = *child;
    children_.emplace_back(std::move(name), std::move(child));
    return ref;
  }

 private:
  std::deque<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
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
  // The causal mask for x's sequence length and device: a real tensor (built eagerly even while
  // a trace is recording, so it becomes a constant and never a placeholder), cached.
  Tensor CausalMask(const Tensor& x);

  int64_t heads_;
  bool inplace_;
  Linear& qkv_;
  Linear& proj_;
  std::mutex mask_mu_;  // forward may run in several threads at once
  Tensor mask_;         // cached causal mask for the last sequence length; guarded by mask_mu_
};

}  // namespace kiln
