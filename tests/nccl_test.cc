// The NCCL process group (ops/nccl.h). Without a GPU (CI): not available, saying why, and
// RunNcclRanks refuses. On a GPU: a world over every visible GPU (one on the H200 machine) gives
// each collective's definition in several dtypes, in place on non-contiguous tensors too;
// tensors on the wrong device and bool reductions are refused naming the rank and device; the
// collective ops write fresh results through NCCL's out-of-place forms; a Llama-style model
// sharded over the NCCL group gives the whole model's logits and greedy ids, eager, compiled and
// replayed as a CUDA graph (NCCL's kernels captured); a thread group's collectives on CUDA
// tensors are not captured, saying why.
#include "ops/nccl.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "codegen/compile.h"
#include "models/generate.h"
#include "models/llama.h"
#include "ops/distributed.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/cuda.h"
#include "runtime/random.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

std::vector<int> AllDevices() {
  std::vector<int> d;
  for (int i = 0; i < cuda::DeviceCount(); ++i) d.push_back(i);
  return d;
}

TEST(Nccl, WithoutAGpuItIsUnavailableSayingWhy) {
  if (cuda::IsAvailable()) GTEST_SKIP() << "a GPU is here: the GPU tests cover NCCL";
  std::string why;
  EXPECT_FALSE(NcclAvailable(&why));
  EXPECT_FALSE(why.empty());
  ExpectThrowsWith([] { RunNcclRanks({0}, [](ProcessGroup&) {}); }, "RunNcclRanks", why);
  const std::string port = std::to_string(FreeTcpPort());
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("MASTER_PORT", port.c_str(), 1);
  ExpectThrowsWith([] { InitProcessGroup({.backend = "nccl"}); }, "NCCL is not available", why);
}

// One process per GPU from torchrun's environment (a world of one here): NCCL's id through the
// store, the rank's device from LOCAL_RANK, a sharded model over it.
TEST(NcclOnGpu, OneProcessPerRankFromTheEnvironment) {
  KILN_SKIP_WITHOUT_GPU();
  const std::string port = std::to_string(FreeTcpPort());
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port.c_str(), 1);
  std::unique_ptr<ProcessGroup> pg = InitProcessGroup({.backend = "nccl"});
  Tensor t = full({5}, 3.0, DType::kBFloat16, CUDA(0));
  pg->all_reduce(t);
  EXPECT_EQ(to_vector(t), std::vector<double>(5, 3.0));
  ExpectThrowsWith(
      [&] {
        Tensor cpu = full({2}, 1.0);
        pg->all_reduce(cpu);
      },
      "rank 0 works on cuda:0");
  LlamaConfig c;
  c.vocab = 64, c.dim = 32, c.hidden = 64, c.layers = 1, c.heads = 4, c.kv_heads = 2;
  c.rope.max_positions = 32;
  Generator gen(5);
  LlamaForCausalLM model(c, {.device = CUDA(0), .generator = &gen});
  const Tensor tokens = from_vector({1, 2, 3, 4}, {1, 4}, DType::kInt64, CUDA(0));
  const std::vector<double> want = to_vector(model(tokens));
  model.ShardTensorParallel(*pg);
  ExpectClose(to_vector(model(tokens)), want, {2e-5, 2e-5}, "sharded over the NCCL group");
}

TEST(NcclOnGpu, CollectivesGiveTheirDefinitions) {
  KILN_SKIP_WITHOUT_GPU();
  std::string why;
  ASSERT_TRUE(NcclAvailable(&why)) << why;
  EXPECT_GT(NcclVersion(), 0);
  const std::vector<int> devices = AllDevices();
  const int n = static_cast<int>(devices.size());
  std::mutex mu;
  RunNcclRanks(devices, [&](ProcessGroup& pg) {
    const int r = pg.rank();
    const Device dev = CUDA(devices[r]);
    ASSERT_EQ(pg.world_size(), n);
    for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
      Tensor sum = full({6}, r + 1.0, t, dev);
      pg.all_reduce(sum);
      Tensor max = full({6}, r + 1.0, t, dev);
      pg.all_reduce(max, ReduceOp::kMax);
      const Tensor gathered = pg.all_gather(full({2, 3}, r, t, dev));
      const Tensor scattered = pg.reduce_scatter(full({2 * n}, 1.0, t, dev));
      Tensor b = full({3}, r + 10.0, t, dev);
      pg.broadcast(b, n - 1);
      // In place through a non-contiguous view: the rows of a transposed [3, 4].
      Tensor wide = full({4, 3}, 2.0, t, dev);
      Tensor view = transpose(wide, 0, 1);
      pg.all_reduce(view);
      std::lock_guard<std::mutex> lock(mu);
      const std::string at = std::string(DTypeName(t)) + " rank " + std::to_string(r);
      EXPECT_EQ(to_vector(sum), std::vector<double>(6, n * (n + 1) / 2.0)) << at;
      EXPECT_EQ(to_vector(max), std::vector<double>(6, n)) << at;
      std::vector<double> g;
      for (int k = 0; k < n; ++k) g.insert(g.end(), 6, k);
      EXPECT_EQ(gathered.shape(), (Shape{2 * n, 3})) << at;
      EXPECT_EQ(to_vector(gathered), g) << at;
      EXPECT_EQ(to_vector(scattered), std::vector<double>(2, n)) << at;
      EXPECT_EQ(to_vector(b), std::vector<double>(3, n - 1 + 10.0)) << at;
      EXPECT_EQ(to_vector(wide), std::vector<double>(12, 2.0 * n)) << at;
    }
  });
}

TEST(NcclOnGpu, BadTensorsAreRefused) {
  KILN_SKIP_WITHOUT_GPU();
  ExpectThrowsWith(
      [] {
        RunNcclRanks({0}, [](ProcessGroup& pg) {
          Tensor t = full({4}, 1.0);  // on the CPU
          pg.all_reduce(t);
        });
      },
      "all_reduce", "rank 0 works on cuda:0", "on cpu");
  ExpectThrowsWith(
      [] {
        RunNcclRanks({0}, [](ProcessGroup& pg) {
          Tensor t = full({4}, 1.0, DType::kBool, CUDA(0));
          pg.all_reduce(t);
        });
      },
      "all_reduce", "does not take bool tensors");
  ExpectThrowsWith([] { RunNcclRanks({0, 0}, [](ProcessGroup&) {}); }, "distinct devices");
  ExpectThrowsWith([] { RunNcclRanks({cuda::DeviceCount()}, [](ProcessGroup&) {}); },
                   "does not exist");
}

// A small Llama-style model that splits over 1, 2, 4 or 8 GPUs, and its results on cuda:0 alone.
struct SplittableLlamaOnGpu {
  explicit SplittableLlamaOnGpu(bool biases) {
    c.vocab = 96, c.dim = 64, c.hidden = 96, c.layers = 2, c.heads = 8, c.kv_heads = 8;
    c.qkv_bias = c.out_bias = c.mlp_bias = biases;
    c.rope.max_positions = 64;
    auto whole = Make(CUDA(0));
    want = to_vector((*whole)(to(tokens, CUDA(0))));
    want_ids = generate(*whole, prompts, {.max_new_tokens = 6});
  }
  std::unique_ptr<LlamaForCausalLM> Make(Device d) const {
    Generator gen(21);
    return std::make_unique<LlamaForCausalLM>(c, ModuleOptions{.device = d, .generator = &gen});
  }
  // The same model on `pg`'s rank's GPU, split over `pg`.
  std::unique_ptr<LlamaForCausalLM> Split(ProcessGroup& pg, Device d) const {
    auto model = Make(d);
    model->ShardTensorParallel(pg);
    return model;
  }
  LlamaConfig c;
  const std::vector<std::vector<int64_t>> prompts = {{5, 17, 2, 40, 33}, {9, 81, 4}};
  const Tensor tokens = from_vector({5, 17, 2, 40, 33, 9, 81, 4, 60, 1}, {2, 5}, DType::kInt64);
  std::vector<double> want;  // the whole model's logits of `tokens`
  GenerateResult want_ids;   // and its greedy ids for `prompts`
};

TEST(NcclOnGpu, AShardedLlamaGivesTheWholeModelsResults) {
  KILN_SKIP_WITHOUT_GPU();
  const SplittableLlamaOnGpu m(/*biases=*/true);
  const std::vector<int> devices = AllDevices();
  std::mutex mu;
  RunNcclRanks(devices, [&](ProcessGroup& pg) {
    const Device dev = CUDA(devices[pg.rank()]);
    auto model = m.Split(pg, dev);
    const std::vector<double> got = to_vector((*model)(to(m.tokens, dev)));
    const GenerateResult ids = generate(*model, m.prompts, {.max_new_tokens = 6});
    std::lock_guard<std::mutex> lock(mu);
    ExpectClose(got, m.want, {2e-5, 2e-5}, "rank " + std::to_string(pg.rank()));
    EXPECT_EQ(ids.tokens, m.want_ids.tokens);
  });
}

TEST(NcclOnGpu, CollectiveOpsWriteFreshResults) {
  KILN_SKIP_WITHOUT_GPU();
  const std::vector<int> devices = AllDevices();
  const int n = static_cast<int>(devices.size());
  std::mutex mu;
  RunNcclRanks(devices, [&](ProcessGroup& pg) {
    const int r = pg.rank();
    const Device dev = CUDA(devices[r]);
    const Tensor x = transpose(full({3, 2 * n}, r + 1.0, DType::kBFloat16, dev), 0, 1);  // strided
    const Tensor sum = all_reduce(x, pg), max = all_reduce(x, pg, ReduceOp::kMax);
    const Tensor gathered = all_gather(x, pg), scattered = reduce_scatter(x, pg);
    const Tensor from0 = broadcast(x, pg, 0);
    std::lock_guard<std::mutex> lock(mu);
    const std::string at = "rank " + std::to_string(r);
    EXPECT_EQ(to_vector(x), std::vector<double>(6 * n, r + 1.0)) << at << ": input left alone";
    EXPECT_EQ(to_vector(sum), std::vector<double>(6 * n, n * (n + 1) / 2.0)) << at;
    EXPECT_EQ(to_vector(max), std::vector<double>(6 * n, n)) << at;
    EXPECT_EQ(gathered.shape(), (Shape{2 * n * n, 3})) << at;
    EXPECT_EQ(scattered.shape(), (Shape{2, 3})) << at;
    EXPECT_EQ(to_vector(scattered), std::vector<double>(6, n * (n + 1) / 2.0)) << at;
    EXPECT_EQ(to_vector(from0), std::vector<double>(6 * n, 1.0)) << at;
  });
}

TEST(NcclOnGpu, ACompiledShardedLlamaReplaysAsACudaGraph) {
  KILN_SKIP_WITHOUT_GPU();
  const SplittableLlamaOnGpu m(/*biases=*/false);
  const std::vector<int> devices = AllDevices();
  std::mutex mu;
  RunNcclRanks(devices, [&](ProcessGroup& pg) {
    const Device dev = CUDA(devices[pg.rank()]);
    auto model = m.Split(pg, dev);
    const Tensor x = to(m.tokens, dev);
    CompileOptions o;
    o.mode = CompileOptions::Mode::kCompiled;
    o.cuda_graphs = true;
    const CompiledFn f = compile(*model, x, o);
    std::vector<std::vector<double>> calls;
    for (int i = 0; i < 3; ++i) calls.push_back(to_vector(f({x})[0]));  // plan, capture, replay
    const std::string graph = f.report({x}).cuda_graph;
    GenerateOptions g;
    g.max_new_tokens = 6;
    g.mode = GenerateOptions::Mode::kCudaGraph;
    const GenerateResult ids = generate(*model, m.prompts, g);
    std::lock_guard<std::mutex> lock(mu);
    const std::string at = "rank " + std::to_string(pg.rank());
    for (const std::vector<double>& got : calls) ExpectClose(got, m.want, {1e-4, 1e-4}, at);
    EXPECT_EQ(graph.rfind("on:", 0), 0u) << at << ": " << graph;
    EXPECT_EQ(ids.tokens, m.want_ids.tokens) << at;
  });
}

TEST(NcclOnGpu, AThreadGroupOnCudaTensorsIsNotCapturedSayingWhy) {
  KILN_SKIP_WITHOUT_GPU();
  RunThreadRanks(1, [](ProcessGroup& pg) {
    const Tensor x = full({8}, 2.0, DType::kFloat32, CUDA(0));
    CompileOptions o;
    o.mode = CompileOptions::Mode::kCompiled;
    o.cuda_graphs = true;
    auto fn = [&pg](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{add(all_reduce(in[0], pg), 1.0)};
    };
    const CompiledFn f = compile(fn, {x}, o);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(to_vector(f({x})[0]), std::vector<double>(8, 3.0)) << "call " << i;
    }
    const std::string graph = f.report({x}).cuda_graph;
    EXPECT_NE(graph.find("which a CUDA graph cannot capture"), std::string::npos) << graph;
  });
}

}  // namespace
}  // namespace kiln
