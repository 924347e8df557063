// CUDA graph replay of compiled plans (CompileOptions::cuda_graphs): results equal eager on
// fresh inputs every call, graphs bound by address see new values written in place, inputs
// that keep moving switch to the copy-in graph, outputs the caller still holds are never
// overwritten, strided inputs work, plans that cannot be captured say why and still run, and
// the option is harmless on the CPU.
#include "codegen/cuda_graph.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "codegen/compile.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

void ExpectSameValues(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  Tolerance tol = ToleranceFor(want.dtype());
  tol.atol *= 4;
  tol.rtol *= 4;
  ExpectClose(to_vector(got), to_vector(want), tol, what);
}

CompileOptions WithGraphs() {
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  o.cuda_graphs = true;
  return o;
}

TEST(CudaGraph, MlpReplaysMatchEagerOnFreshInputs) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(1);
  GeGLUMLP mlp(64, 128, gen);
  mlp.to(CUDA(0));
  mlp.to(DType::kBFloat16);
  auto input = [&] { return randn({32, 64}, gen, DType::kBFloat16, CUDA(0)); };
  CompiledFn f = compile(mlp, input(), WithGraphs());
  EXPECT_EQ(f.report({input()}).cuda_graph, "pending (captured after the first call)");
  for (int call = 0; call < 5; ++call) {  // call 0 captures, the rest replay
    const Tensor x = input();
    const Tensor want = mlp(x);
    ExpectSameValues(f({x})[0], want, absl::StrCat("call ", call));
  }
  EXPECT_EQ(f.report({input()}).cuda_graph.rfind("on: ", 0), 0u) << f.report({input()}).cuda_graph;
}

TEST(CudaGraph, HeldOutputsAreNotOverwritten) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(2);
  ir::TensorFn fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{gelu(in[0] * 1.5 + 0.5) * in[1]};
  };
  auto input = [&] { return randn({64, 256}, gen, DType::kFloat32, CUDA(0)); };
  std::vector<Tensor> a = {input(), input()}, b = {input(), input()}, c = {input(), input()};
  CompiledFn f = compile(fn, a, WithGraphs());
  f(a);                       // captures
  const Tensor ya = f(a)[0];  // a replay; held
  const Tensor yb = f(b)[0];  // must not reuse ya's memory
  const Tensor yc = f(c)[0];
  ExpectSameValues(ya, fn(a)[0], "first held output");
  ExpectSameValues(yb, fn(b)[0], "second held output");
  ExpectSameValues(yc, fn(c)[0], "third output");
}

TEST(CudaGraph, SameAddressNewValuesReplay) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(6);
  ir::TensorFn fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{sigmoid(in[0]) * in[1] - 0.25};
  };
  const std::vector<Tensor> in = {randn({32, 512}, gen, DType::kFloat32, CUDA(0)),
                                  randn({32, 512}, gen, DType::kFloat32, CUDA(0))};
  CompiledFn f = compile(fn, in, WithGraphs());
  for (int call = 0; call < 4; ++call) {  // the graph reads the same buffers, new values
    mul_(in[0], -1.5);
    add_(in[1], 0.75);
    ExpectSameValues(f(in)[0], fn(in)[0], absl::StrCat("in-place updated call ", call));
  }
  EXPECT_NE(f.report(in).cuda_graph.find("bound by address"), std::string::npos)
      << f.report(in).cuda_graph;
}

TEST(CudaGraph, InputsThatKeepMovingSwitchToCopyIn) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(7);
  ir::TensorFn fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{exp(in[0] * -0.5) + in[0]};
  };
  std::vector<Tensor> kept;  // every input stays alive, so each call has a new address
  kept.push_back(randn({16, 256}, gen, DType::kFloat32, CUDA(0)));
  CompiledFn f = compile(fn, {kept[0]}, WithGraphs());
  for (int call = 0; call < codegen::CudaGraphCache::kMaxCaptures + 4; ++call) {
    kept.push_back(randn({16, 256}, gen, DType::kFloat32, CUDA(0)));
    ExpectSameValues(f({kept.back()})[0], fn({kept.back()})[0], absl::StrCat("call ", call));
  }
  EXPECT_NE(f.report({kept[0]}).cuda_graph.find("copied in"), std::string::npos)
      << f.report({kept[0]}).cuda_graph;
  for (size_t i = 0; i < kept.size(); i += 5) {  // any address works in copy-in mode
    ExpectSameValues(f({kept[i]})[0], fn({kept[i]})[0], absl::StrCat("old input ", i));
  }
}

TEST(CudaGraph, StridedInputsWork) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(3);
  ir::TensorFn fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{relu(in[0]) + in[1]};
  };
  auto input = [&] { return randn({48, 40}, gen, DType::kFloat32, CUDA(0)); };
  std::vector<Tensor> first = {input(), input()};
  CompiledFn f = compile(fn, first, WithGraphs());
  f(first);
  for (int call = 0; call < 3; ++call) {
    const Tensor t = transpose(randn({40, 48}, gen, DType::kFloat32, CUDA(0)), 0, 1);
    ASSERT_FALSE(t.is_contiguous());
    const std::vector<Tensor> in = {t, input()};
    ExpectSameValues(f(in)[0], fn(in)[0], absl::StrCat("strided call ", call));
  }
}

TEST(CudaGraph, OutputAliasingAnInputRunsWithoutGraph) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(4);
  ir::TensorFn fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{reshape(in[0], {-1}), in[0] * 2.0};
  };
  const Tensor x = randn({8, 8}, gen, DType::kFloat32, CUDA(0));
  CompiledFn f = compile(fn, {x}, WithGraphs());
  for (int call = 0; call < 3; ++call) {
    const Tensor y = randn({8, 8}, gen, DType::kFloat32, CUDA(0));
    const std::vector<Tensor> got = f({y});
    ExpectSameValues(got[0], reshape(y, {-1}), "aliasing output");
    ExpectSameValues(got[1], y * 2.0, "computed output");
  }
  EXPECT_EQ(f.report({x}).cuda_graph.rfind("off: ", 0), 0u) << f.report({x}).cuda_graph;
}

// A chain of separate kernels (a GEMM between pointwise groups, a softmax): its intermediates
// and output come from the plan's arena, so no memory node stands between two kernels.
ir::TensorFn KernelChain() {
  return [](const std::vector<Tensor>& in) {
    const Tensor h = relu(matmul(in[0] * 2.0, in[1])) + 0.5;
    return std::vector<Tensor>{softmax(matmul(h, in[1]), -1) * 3.0};
  };
}

// Compiles KernelChain with CUDA graphs for `rows` rows, checks three calls (the first captures)
// against eager, and returns the report's CUDA graph line.
std::string ChainGraphReport(int64_t rows, uint64_t seed) {
  Generator gen(seed);
  const std::vector<Tensor> in = {randn({rows, 64}, gen, DType::kFloat32, CUDA(0)),
                                  randn({64, 64}, gen, DType::kFloat32, CUDA(0))};
  CompiledFn f = compile(KernelChain(), in, WithGraphs());
  for (int call = 0; call < 3; ++call) {
    ExpectSameValues(f(in)[0], KernelChain()(in)[0], absl::StrCat("call ", call));
  }
  return f.report(in).cuda_graph;
}

TEST(CudaGraph, CapturedAllocationsComeFromTheArena) {
  KILN_SKIP_WITHOUT_GPU();
  const std::string graph = ChainGraphReport(16, 8);
  EXPECT_NE(graph.find("KiB arena"), std::string::npos) << graph;
  EXPECT_EQ(graph.find("memory nodes"), std::string::npos) << graph;
}

TEST(CudaGraph, ArenaLimitZeroKeepsGraphMemoryNodes) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedEnv no_arena("KILN_CAPTURE_ARENA_MB", "0");
  const std::string graph = ChainGraphReport(16, 9);
  EXPECT_NE(graph.find("memory nodes"), std::string::npos) << graph;
  EXPECT_EQ(graph.find("arena"), std::string::npos) << graph;
}

// A plan whose arena would be over the limit keeps graph memory nodes, and its report says so.
TEST(CudaGraph, AnArenaOverTheLimitIsNamed) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedEnv small_arenas("KILN_CAPTURE_ARENA_MB", "1");
  const std::string graph = ChainGraphReport(1024, 12);  // 256 KiB a value
  EXPECT_NE(graph.find("memory nodes (an arena would take "), std::string::npos) << graph;
  EXPECT_NE(graph.find(" MiB, over KILN_CAPTURE_ARENA_MB)"), std::string::npos) << graph;
}

// An output handed out by a replay lives in the plan's arena: it stays valid after the compiled
// function (and its graphs) are gone.
TEST(CudaGraph, ArenaOutputsOutliveTheirFunction) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(10);
  const std::vector<Tensor> in = {randn({16, 64}, gen, DType::kFloat32, CUDA(0)),
                                  randn({64, 64}, gen, DType::kFloat32, CUDA(0))};
  Tensor kept;
  {
    CompiledFn f = compile(KernelChain(), in, WithGraphs());
    f(in);            // runs the plan, then captures
    kept = f(in)[0];  // a replay's output
    ASSERT_NE(f.report(in).cuda_graph.find("KiB arena"), std::string::npos);
  }
  const Tensor scratch = randn({1024, 1024}, gen, DType::kFloat32, CUDA(0));  // reuses freed memory
  ExpectSameValues(kept, KernelChain()(in)[0], "output after its function was destroyed");
  EXPECT_EQ(scratch.numel(), 1024 * 1024);  // alive across the check
}

// A decode-like chain of one-row GEMVs, norms and pointwise kernels, each reading what the one
// before wrote into arena ranges that liveness hands from one step to the next. With programmatic
// edges (KILN_PDL_GRAPHS) a kernel starts during its predecessor's tail: one that touched its
// operands before its dependency wait would read a range still being written, and a replay
// would differ from eager. Twenty replays, each on new values, must equal the eager chain.
TEST(CudaGraph, ReusedArenaRangesAreNeverReadEarly) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(11);
  constexpr int kLayers = 6, kDim = 512;
  std::vector<Tensor> weights;
  for (int i = 0; i < kLayers; ++i) {
    weights.push_back(randn({kDim, kDim}, gen, DType::kBFloat16, CUDA(0)) * 0.05);
  }
  ir::TensorFn fn = [&](const std::vector<Tensor>& in) {
    Tensor h = in[0];
    for (const Tensor& w : weights) h = h + gelu(linear(layer_norm(h), w));
    return std::vector<Tensor>{h};
  };
  const Tensor x = randn({1, kDim}, gen, DType::kBFloat16, CUDA(0));
  CompiledFn f = compile(fn, {x}, WithGraphs());
  for (int call = 0; call < 20; ++call) {
    copy_(x, randn({1, kDim}, gen, DType::kBFloat16, CUDA(0)));
    const Tensor want = fn({x})[0];
    ExpectSameValues(f({x})[0], want, absl::StrCat("replay ", call));
  }
  const std::string graph = f.report({x}).cuda_graph;
  EXPECT_NE(graph.find("KiB arena"), std::string::npos) << graph;
}

// The arena's books on the device: ranges within its size come from it, a range beyond it is
// booked past the end (the size a second capture needs), freed ranges are reused.
TEST(CudaGraph, ArenaBooksWhatDoesNotFit) {
  KILN_SKIP_WITHOUT_GPU();
  cuda::CaptureArena arena(1024, CUDA(0));
  void* a = arena.Allocate(300);  // 512 bytes booked
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(arena.Contains(a));
  EXPECT_EQ(arena.Allocate(1024), nullptr);  // would end at 1536
  int elsewhere = 0;
  arena.Booked(&elsewhere, 1024);
  EXPECT_TRUE(arena.overflowed());
  EXPECT_EQ(arena.needed_bytes(), 1536u);
  arena.Free(&elsewhere);
  arena.Free(a);
  void* b = arena.Allocate(1000);  // everything was given back: the whole arena fits
  EXPECT_EQ(b, a);
}

TEST(CudaGraph, OptionIsHarmlessOnCpu) {
  Generator gen(5);
  ir::TensorFn fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{tanh(in[0]) * in[0]};
  };
  const Tensor x = randn({4, 4}, gen);
  CompiledFn f = compile(fn, {x}, WithGraphs());
  ExpectSameValues(f({x})[0], fn({x})[0], "cpu");
  ExpectSameValues(f({x})[0], fn({x})[0], "cpu again");
  EXPECT_EQ(f.report({x}).cuda_graph, "off");
}

}  // namespace
}  // namespace kiln
