// kiln_bench's workloads (see bench_workloads.h).
#include "bench/bench_workloads.h"

#include <cuda_runtime_api.h>

#include <cmath>

#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/cuda_api.h"
#include "runtime/nvrtc.h"
#include "runtime/random.h"
#include "runtime/status.h"

namespace kiln::bench {
namespace {

constexpr DType kBF16 = DType::kBFloat16;
constexpr int64_t kHeadDim = 64;
constexpr int64_t kKvLength = 1024;

Generator Seeded() { return Generator(1234); }

Tensor Randn(IntList shape, Generator& gen, DType dtype = kBF16) {
  return randn(shape, gen, dtype, CUDA());
}

// A weight [out, in] drawn as randn / sqrt(in), so activations stay O(1) through the block.
Tensor Weight(int64_t out, int64_t in, Generator& gen) {
  return Randn({out, in}, gen) * (1.0 / std::sqrt(static_cast<double>(in)));
}

Tensor CausalMask(int64_t t) { return triu(ones({t, t}, DType::kBool, CUDA()), 1); }

constexpr char kEmptySource[] = "extern \"C\" __global__ void kiln_empty() {}\n";

Outputs LaunchEmpty(const std::vector<Tensor>&, const std::vector<Tensor>&) {
  static const cudaKernel_t k = ValueOrThrow(cuda::GetKernel(kEmptySource, "kiln_empty"));
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(1), dim3(1), nullptr, 0,
                                   cuda::CurrentStream()));
  return {};
}

std::function<InputSet()> Acts(std::vector<std::pair<std::string, std::vector<int64_t>>> shapes,
                               DType dtype = kBF16) {
  return [shapes, dtype] {
    Generator gen = Seeded();
    InputSet set;
    for (const auto& [name, shape] : shapes) set.acts.emplace_back(name, Randn(shape, gen, dtype));
    return set;
  };
}

// ---- GeGLU MLP (raw randn weights, as the published MLP rows had) ----------------------------

constexpr int64_t kDModel = 768, kDFF = 3072;

Tensor GeGlu(const Tensor& x, const Tensor& gate, const Tensor& up, const Tensor& down) {
  return linear(gelu(linear(x, gate), "tanh") * linear(x, up), down);
}

std::function<InputSet()> BuildMlp(int64_t tokens) {
  return [tokens] {
    Generator gen = Seeded();
    InputSet set;
    set.acts.emplace_back("x", Randn({tokens, kDModel}, gen));
    set.weights.emplace_back("gate", Randn({kDFF, kDModel}, gen));
    set.weights.emplace_back("up", Randn({kDFF, kDModel}, gen));
    set.weights.emplace_back("down", Randn({kDModel, kDFF}, gen));
    return set;
  };
}

// ---- The pre-norm transformer block --------------------------------------------------------

// Weights in this order everywhere (torch_baseline.py BLOCK_WEIGHTS).
Named BlockWeights(int64_t d, Generator& gen) {
  Named w;
  w.emplace_back("ln1.weight", 1.0 + Randn({d}, gen) * 0.1);
  w.emplace_back("ln1.bias", Randn({d}, gen) * 0.1);
  for (const char* name : {"wq", "wk", "wv", "wo"}) w.emplace_back(name, Weight(d, d, gen));
  w.emplace_back("rms.weight", 1.0 + Randn({d}, gen) * 0.1);
  w.emplace_back("w_gate", Weight(4 * d, d, gen));
  w.emplace_back("w_up", Weight(4 * d, d, gen));
  w.emplace_back("w_down", Weight(d, 4 * d, gen));
  return w;
}

// [b, t, h * 64] -> [b, h, t, 64] (a view).
Tensor SplitHeads(const Tensor& y, int64_t b, int64_t t) {
  return permute(reshape(y, {b, t, y.size(-1) / kHeadDim, kHeadDim}), {0, 2, 1, 3});
}

// [b, h, t, 64] -> [b, t, h * 64] (a copy: the permuted strides cannot be flattened).
Tensor MergeHeads(const Tensor& o, int64_t b, int64_t t) {
  return reshape(permute(o, {0, 2, 1, 3}), {b, t, o.size(1) * kHeadDim});
}

// Causal attention of the block: kiln's scaled_dot_product_attention (the mask input is the same
// causal mask, applied by is_causal), as torch's block uses F.scaled_dot_product_attention.
Tensor Attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&) {
  return scaled_dot_product_attention(q, k, v, {}, /*is_causal=*/true);
}

// h + GeGLU(RMSNorm(h)): the second half of the block.
Tensor MlpHalf(const Tensor& h, const std::vector<Tensor>& w) {
  return h + GeGlu(rms_norm(h, w[6], 1e-6), w[7], w[8], w[9]);
}

// acts = {x [B, T, D], mask [T, T] bool}.
Outputs Block(const std::vector<Tensor>& acts, const std::vector<Tensor>& w) {
  const Tensor& x = acts[0];
  const int64_t b = x.size(0), t = x.size(1);
  const Tensor a = layer_norm(x, w[0], w[1], 1e-5);
  const Tensor o = Attend(SplitHeads(linear(a, w[2]), b, t), SplitHeads(linear(a, w[3]), b, t),
                          SplitHeads(linear(a, w[4]), b, t), acts[1]);
  return {MlpHalf(x + linear(MergeHeads(o, b, t), w[5]), w)};
}

// acts = {x [1, 1, D], k_cache [1, H, 1024, 64], v_cache [1, H, 1024, 64]}.
Outputs Decode(const std::vector<Tensor>& acts, const std::vector<Tensor>& w) {
  const Tensor& x = acts[0];
  const Tensor a = layer_norm(x, w[0], w[1], 1e-5);
  const Tensor q = SplitHeads(linear(a, w[2]), 1, 1);
  const Tensor k_new = linear(a, w[3]), v_new = linear(a, w[4]);
  const Tensor s = matmul(q, transpose(acts[1], -2, -1)) * (1.0 / std::sqrt(double(kHeadDim)));
  const Tensor o = matmul(softmax(s, -1), acts[2]);
  return {MlpHalf(x + linear(MergeHeads(o, 1, 1), w[5]), w), k_new, v_new};
}

double BlockFlops(int64_t b, int64_t t, int64_t d) {
  return 2.0 * b * t * 16.0 * d * d + 4.0 * b * t * t * d;  // GEMMs + full q·kᵀ and p·v
}

Workload MakeBlock(int64_t b, int64_t t, int64_t d) {
  Workload w;
  w.key = "block_" + std::to_string(b) + "x" + std::to_string(t) + "_d" + std::to_string(d);
  w.build = [b, t, d] {
    Generator gen = Seeded();
    InputSet set;
    set.acts.emplace_back("x", Randn({b, t, d}, gen));
    set.acts.emplace_back("mask", CausalMask(t));
    set.weights = BlockWeights(d, gen);
    return set;
  };
  w.fn = Block;
  w.metric = "tflops";
  w.amount = BlockFlops(b, t, d);
  return w;
}

Workload MakeDecode(int64_t d) {
  Workload w;
  w.key = "decode_d" + std::to_string(d);
  w.build = [d] {
    Generator gen = Seeded();
    InputSet set;
    const int64_t h = d / kHeadDim;
    set.acts.emplace_back("x", Randn({1, 1, d}, gen));
    set.acts.emplace_back("k_cache", Randn({1, h, kKvLength, kHeadDim}, gen));
    set.acts.emplace_back("v_cache", Randn({1, h, kKvLength, kHeadDim}, gen));
    set.weights = BlockWeights(d, gen);
    return set;
  };
  w.fn = Decode;
  w.metric = "tbps";  // bytes of weights and cache read once
  w.amount = 2.0 * (16.0 * d * d + 2.0 * kKvLength * d);
  return w;
}

}  // namespace

std::vector<Tensor> Tensors(const Named& named) {
  std::vector<Tensor> out;
  for (const auto& [name, t] : named) out.push_back(t);
  return out;
}

std::vector<Workload> MakeWorkloads() {
  std::vector<Workload> w;
  w.push_back({"empty_launch", [] { return InputSet{}; }, LaunchEmpty, "", 0.0, false});
  w.push_back({"tiny_add", Acts({{"a", {16}}, {"b", {16}}}, DType::kFloat32),
               [](const auto& a, const auto&) { return Outputs{a[0] + a[1]}; }});
  constexpr int64_t kEwRows = 8192, kEwCols = 12288, kSmRows = 131072, kSmCols = 1024;
  w.push_back(
      {"elementwise", Acts({{"x", {kEwRows, kEwCols}}, {"u", {kEwRows, kEwCols}}}),
       [](const auto& a, const auto&) { return Outputs{gelu(a[0] * 1.5 + 0.5, "tanh") * a[1]}; },
       "tbps", 3.0 * kEwRows * kEwCols * 2});
  w.push_back({"softmax", Acts({{"x", {kSmRows, kSmCols}}}),
               [](const auto& a, const auto&) { return Outputs{softmax(a[0], -1)}; }, "tbps",
               2.0 * kSmRows * kSmCols * 2});
  constexpr int64_t kLinM = 8192, kLinN = 3072, kLinK = 768;
  w.push_back({"linear",
               [] {
                 Generator gen = Seeded();
                 InputSet set;
                 set.acts.emplace_back("x", Randn({kLinM, kLinK}, gen));
                 set.weights.emplace_back("w", Randn({kLinN, kLinK}, gen));
                 set.weights.emplace_back("b", Randn({kLinN}, gen));
                 return set;
               },
               [](const auto& a, const auto& wt) { return Outputs{linear(a[0], wt[0], wt[1])}; },
               "tflops", 2.0 * kLinM * kLinN * kLinK});
  const StepFn mlp = [](const auto& a, const auto& wt) {
    return Outputs{GeGlu(a[0], wt[0], wt[1], wt[2])};
  };
  w.push_back({"mlp", BuildMlp(8192), mlp, "tflops", 2.0 * 8192 * kDModel * kDFF * 3});
  w.push_back({"mlp_1tok", BuildMlp(1), mlp, "tflops", 2.0 * kDModel * kDFF * 3});
  Workload att{
      "attention",
      [] {
        InputSet set =
            Acts({{"q", {8, 16, 1024, 64}}, {"k", {8, 16, 1024, 64}}, {"v", {8, 16, 1024, 64}}})();
        set.acts.emplace_back("mask", CausalMask(1024));
        return set;
      },
      [](const auto& a, const auto&) {
        return Outputs{causal_attention(a[0], a[1], a[2], a[3], false)};
      },
      "tflops", 4.0 * 8 * 16 * 1024.0 * 1024 * 64};
  att.extra_eager.emplace_back("eager_inplace", [](const auto& a, const auto&) {
    return Outputs{causal_attention(a[0], a[1], a[2], a[3], true)};
  });
  att.frozen_acts = {3};  // the causal mask: a buffer, frozen with the weights
  att.extra_eager.emplace_back("sdpa", [](const auto& a, const auto&) {  // kiln's flash kernel
    return Outputs{scaled_dot_product_attention(a[0], a[1], a[2], {}, /*is_causal=*/true)};
  });
  w.push_back(att);
  for (int64_t d : {512, 1024}) w.push_back(MakeBlock(2, 256, d));
  for (int64_t d : {512, 1024}) w.push_back(MakeBlock(8, 1024, d));
  for (int64_t d : {512, 1024}) w.push_back(MakeDecode(d));
  // kiln only: a value used inside a fused group and by a reduction outside it, stored by the
  // fused kernel (multi-output) or materialised by a kernel of its own (the rule measured).
  for (const bool materialize : {false, true}) {
    Workload f{materialize ? "fanout_materialized" : "fanout_multi_output",
               Acts({{"x", {4096, 8192}}}),
               [](const auto& a, const auto&) {
                 const Tensor h = tanh(a[0] * 1.5 + 0.5);
                 return Outputs{exp(h) * 2.0, sum(h, {1})};
               },
               "tbps", (1.0 + 1.0 + 1.0) * 4096 * 8192 * 2};  // x read, y and h written
    f.kiln_only = true;
    f.materialize_fanout = materialize;
    w.push_back(f);
  }
  return w;
}

}  // namespace kiln::bench
