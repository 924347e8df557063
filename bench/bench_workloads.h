// kiln_bench's workloads (bench/kiln_bench.cc): how one input set is built, the step as a function
// of activations and weights, and which modes a workload has. Keys, shapes, input order and the
// meaning of each input are shared with bench/torch_baseline.py and bench/libtorch_baseline.cc;
// torch_baseline.py reads kiln's input set and outputs (bench/bench_common.py) to check kiln.
//
//   for (const Workload& w : MakeWorkloads()) {
//     InputSet set = w.build();
//     Outputs y = w.fn(Tensors(set.acts), Tensors(set.weights));
//   }
//
// Workloads (bf16 on CUDA unless said otherwise):
//   empty_launch          an empty NVRTC kernel (host cost of one launch; kiln only)
//   tiny_add              a + b, float32 [16]
//   elementwise           gelu(x * 1.5 + 0.5, tanh) * u, [8192, 12288]
//   softmax               softmax(x, -1), [131072, 1024]
//   linear                x [8192, 768] @ wᵀ [3072, 768] + b
//   mlp, mlp_1tok         GeGLU down(gelu_tanh(x @ gateᵀ) * (x @ upᵀ)), 768 -> 3072, 8192 / 1
//   tokens attention             causal softmax(q kᵀ / 8, masked) v, q/k/v [8, 16, 1024, 64]
//   block_BxT_dD          pre-norm transformer block: x + attn(LayerNorm(x)) with q/k/v/o
//                         projections and a causal mask (heads of 64), then h + GeGLU(RMSNorm(h))
//                         with hidden 4D; B·T = 2·256 and 8·1024, D = 512 and 1024
//   decode_dD             one decode step of that block for 1 token: q/k/v of the token, attention
//                         of q over a K/V cache of 1024 positions (inputs, no mask), o projection,
//                         MLP; outputs y and the token's k and v (what a decoder appends)
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_harness.h"

namespace kiln::bench {

using Named = std::vector<std::pair<std::string, Tensor>>;

struct InputSet {
  Named acts;     // activations, masks, caches: inputs of every compiled mode
  Named weights;  // folded as constants by "compiled", inputs of "compiled_winputs"
};

using StepFn =
    std::function<Outputs(const std::vector<Tensor>& acts, const std::vector<Tensor>& weights)>;

struct Workload {
  std::string key;
  std::function<InputSet()> build;
  StepFn fn;
  std::string metric;                                       // "tbps", "tflops" or "" (none)
  double amount = 0.0;                                      // bytes for tbps, flops for tflops
  bool compiled = true;                                     // has compiled modes
  std::vector<std::pair<std::string, StepFn>> extra_eager;  // e.g. "eager_inplace"
  std::vector<int> frozen_acts;     // activations frozen as constants in the frozen compiled rows
  bool kiln_only = false;           // no baseline: no correctness files written
  bool materialize_fanout = false;  // compiled with CompileOptions::multi_output_fusion off
};

std::vector<Workload> MakeWorkloads();
std::vector<Tensor> Tensors(const Named& named);

}  // namespace kiln::bench
