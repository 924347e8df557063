// kiln::compile end to end on the CPU (and on CUDA where present): fusion decisions checked on
// the printed graph, kernel counts per step, compiled-vs-eager numerics on the seed workloads,
// a seeded random-graph differential test, the signature rules and the eager/compiled switch.
#include "codegen/compile.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "ir/printer.h"
#include "ir/tracer.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/status.h"
#include "tests/filecheck.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

using Fn = ir::TensorFn;

// `precision`: the dtype the values were computed in when coarser than the outputs' (a bf16
// softmax cast to f32: eager rounds its result to bf16 first, the fused kernel does not).
void ExpectSame(const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                const std::string& what, std::optional<DType> precision = std::nullopt) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].shape(), want[i].shape()) << what;
    ASSERT_EQ(got[i].dtype(), want[i].dtype()) << what;
    Tolerance tol = ToleranceFor(precision.value_or(want[i].dtype()));
    tol.atol *= 4;  // fused math skips the eager intermediate roundings
    tol.rtol *= 4;
    ExpectClose(to_vector(got[i]), to_vector(want[i]), tol, what);
  }
}

TEST(Compile, GeGLUMlpFusesToThreeKernels) {
  Generator gen(0);
  GeGLUMLP mlp(32, 64, gen);
  const Tensor x = randn({16, 32}, gen);
  CompiledFn f = compile(mlp, x);
  const CompileReport& r = f.report({x});
  EXPECT_EQ(r.kernels_per_step, 3) << r.final_graph;  // merged gate/up GEMM, gelu*mul, down
  EXPECT_EQ(r.fused_kernels, 1);
  // Intermediates: merged [16, 128] f32 (8 KiB) and the fused [16, 64] (4 KiB); the merged
  // output dies after the fused kernel, so at most both are alive at once.
  EXPECT_EQ(r.total_intermediate_bytes, 16 * 128 * 4 + 16 * 64 * 4);
  EXPECT_EQ(r.planned_peak_bytes, 16 * 128 * 4 + 16 * 64 * 4);
  EXPECT_TRUE(FileCheck(r.final_graph, R"(
    CHECK: constant "merged(
    CHECK: linear(
    CHECK: slice(
    CHECK: slice(
    CHECK: fusion kiln_fused_gelu_mul_0(
    CHECK-NEXT: graph(
    CHECK: gelu(%0) {approximate=tanh}
    CHECK: mul(
    CHECK: linear(
    CHECK-NOT: gelu(
  )"));
  ExpectSame(f({x}), {mlp(x)}, "GeGLU MLP");
}

TEST(Compile, MlpFusesBiasGeluIntoTheGemmEpilogues) {
  Generator gen(7);
  MLP mlp({32, 64, 64, 16}, gen);  // Linear+bias, GELU(tanh), Linear+bias, GELU(tanh), Linear+bias
  const Tensor x = randn({8, 32}, gen);
  CompiledFn f = compile(mlp, x);
  const CompileReport& r = f.report({x});
  EXPECT_EQ(r.kernels_per_step, 3) << r.final_graph;  // one GEMM per layer, activations inside
  EXPECT_EQ(r.fused_kernels, 0);
  EXPECT_TRUE(FileCheck(r.final_graph, R"(
    CHECK: linear(%0,
    CHECK-SAME: {epilogue=gelu_tanh} : f32[8, 64]
    CHECK: linear(
    CHECK-SAME: {epilogue=gelu_tanh} : f32[8, 64]
    CHECK: linear(
    CHECK-NOT: epilogue
    CHECK: return
  )"));
  EXPECT_EQ(r.final_graph.find("gelu("), std::string::npos) << r.final_graph;
  ExpectSame(f({x}), {mlp(x)}, "3-layer MLP");

  CompileOptions off;
  off.fuse_gemm_epilogues = false;
  CompiledFn g = compile(mlp, x, off);
  EXPECT_EQ(g.report({x}).kernels_per_step, 5) << g.report({x}).final_graph;
}

TEST(Compile, ElementwiseChainIsOneKernel) {
  Fn fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{gelu(in[0] * 1.5 + 0.5, "tanh") * in[1]};
  };
  Generator gen(1);
  const Tensor x = randn({64, 48}, gen), u = randn({64, 48}, gen);
  CompiledFn f = compile(fn, {x, u});
  EXPECT_EQ(f.report({x, u}).kernels_per_step, 1);
  EXPECT_TRUE(FileCheck(f.report({x, u}).final_graph,
                        "CHECK: fusion kiln_fused_mul_scalar_add_scalar_gelu_mul_0(%0, %1)"));
  ExpectSame(f({x, u}), fn({x, u}), "chain");
}

TEST(Compile, FanOutProducerMaterialises) {
  Fn fn = [](const std::vector<Tensor>& in) {
    Tensor h = tanh(in[0] + 1.0);
    return std::vector<Tensor>{exp(h) * 2.0, sum(h, {1})};
  };
  Generator gen(2);
  const Tensor x = randn({8, 8}, gen);
  CompiledFn f = compile(fn, {x});
  const CompileReport& r = f.report({x});
  bool logged = false;
  for (const std::string& line : r.explain) logged |= line.find("fan-out") != std::string::npos;
  EXPECT_TRUE(logged) << r.final_graph;
  EXPECT_LE(r.planned_peak_bytes, r.total_intermediate_bytes);
  ExpectSame(f({x}), fn({x}), "fan-out");
}

Fn Attention() {
  return [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{causal_attention(in[0], in[1], in[2])};
  };
}

// The scale and the folded causal mask run inside the softmax kernel: q·kᵀ GEMM, one fused
// softmax, ·v GEMM. (matmul has no alpha, so the scale stays in the softmax's prologue.)
TEST(Compile, AttentionIsThreeKernelsAndMatchesEager) {
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    Generator gen(3);
    const Tensor q = randn({2, 2, 8, 4}, gen, t), k = randn({2, 2, 8, 4}, gen, t),
                 v = randn({2, 2, 8, 4}, gen, t);
    CompiledFn f = compile(Attention(), {q, k, v});
    const CompileReport& r = f.report({q, k, v});
    EXPECT_EQ(r.kernels_per_step, 3) << r.final_graph;
    EXPECT_EQ(r.fused_kernels, 1);
    EXPECT_TRUE(FileCheck(r.final_graph, R"(
      CHECK: constant "folded_triu
      CHECK: matmul(
      CHECK: fusion kiln_fused_mul_scalar_masked_fill_softmax_0(
      CHECK: mul_scalar(%0) {scalar=0.5}
      CHECK-NEXT: masked_fill(%2, %1) {scalar=-inf}
      CHECK-NEXT: softmax(%3) {dim=-1}
      CHECK: matmul(
      CHECK-NOT: softmax(
    )"));
    ExpectSame(f({q, k, v}), Attention()({q, k, v}), absl::StrCat("attention ", DTypeName(t)));
  }
}

TEST(Compile, SoftmaxFusionSwitchKeepsTheSoftmaxApart) {
  Generator gen(3);
  const Tensor q = randn({2, 2, 8, 4}, gen), k = randn({2, 2, 8, 4}, gen),
               v = randn({2, 2, 8, 4}, gen);
  CompileOptions o;
  o.fuse_softmax = false;
  CompiledFn f = compile(Attention(), {q, k, v}, o);
  const CompileReport& r = f.report({q, k, v});
  EXPECT_EQ(r.kernels_per_step, 4) << r.final_graph;
  EXPECT_TRUE(FileCheck(r.final_graph, R"(
    CHECK: fusion kiln_fused_mul_scalar_masked_fill_0(
    CHECK: softmax(
  )"));
  ExpectSame(f({q, k, v}), Attention()({q, k, v}), "attention, softmax fusion off");
}

// Compiled (one fused softmax kernel) against eager over row lengths that take every kernel
// layout: part of a warp (1, 7, 48), a warp (33, 1024), a block (4096, 4099), the loop kernel
// (20000), with 16-byte loads where the length allows (48, 1024, 4096: contiguous input and
// mask); f32 and bf16; a mask that fully masks one row (NaN, like eager); a transposed input
// (the strided kernel), a per-row bias (broadcast along the row) and a trailing cast.
void RunSoftmaxFusionDifferential(Device device) {
  for (int64_t n : {1, 7, 33, 48, 1024, 4096, 4099, 20000}) {
    for (DType t : {DType::kFloat32, DType::kBFloat16}) {
      Generator gen(n);
      const int64_t rows = 5;
      std::vector<double> bits(rows * n);
      for (int64_t i = 0; i < rows * n; ++i) bits[i] = i / n == 1 || gen.Uniform() < 0.3;
      const Tensor mask = to(from_vector(bits, {rows, n}, DType::kBool), device);
      const Tensor x = to(randn({2, rows, n}, gen, t), device);
      const Tensor xt = transpose(to(randn({2, n, rows}, gen, t), device), 1, 2);
      const Tensor bias = to(randn({rows, 1}, gen, t), device);
      const Fn masked = [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{softmax(masked_fill(in[0] * 0.5, in[1], -INFINITY), -1)};
      };
      const Fn cast_after = [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{cast(softmax(in[0] / 3.0 + in[1], -1), DType::kFloat32)};
      };
      const struct {
        const char* what;
        Fn fn;
        std::vector<Tensor> in;
      } cases[] = {{"masked", masked, {x, mask}},
                   {"masked, transposed input", masked, {xt, mask}},
                   {"row bias, cast", cast_after, {x, bias}}};
      for (const auto& c : cases) {
        const std::string what = absl::StrCat(c.what, ", rows of ", n, ", ", DTypeName(t));
        CompiledFn f = compile(c.fn, c.in);
        EXPECT_EQ(f.report(c.in).kernels_per_step, 1) << what << "\n" << f.report(c.in).final_graph;
        ExpectSame(f(c.in), c.fn(c.in), what, t);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(CompileSoftmaxFusion, RowLengthsMasksAndLayoutsOnCpu) { RunSoftmaxFusionDifferential(kCPU); }

TEST(CompileSoftmaxFusion, RowLengthsMasksAndLayoutsOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  RunSoftmaxFusionDifferential(CUDA(0));
}

// The attention workload of the benchmarks: bf16 [8, 16, 1024, 64], compiled against eager, both
// on the GPU (the fused kernel takes its 8-wide, warp-per-row path).
TEST(CompileSoftmaxFusion, AttentionWorkloadOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(7);
  std::vector<Tensor> in;
  for (int i = 0; i < 3; ++i)
    in.push_back(randn({8, 16, 1024, 64}, gen, DType::kBFloat16, CUDA(0)));
  CompiledFn f = compile(Attention(), in);
  EXPECT_EQ(f.report(in).kernels_per_step, 3) << f.report(in).final_graph;
  ExpectSame(f(in), Attention()(in), "attention bf16 [8, 16, 1024, 64]");
}

// A traced value cannot change device inside a compiled function (the graph runs on one device),
// while a real tensor built inside it (a mask from a factory) is copied and becomes a constant.
TEST(Compile, DeviceMovesWhileTracing) {
  Generator gen(8);
  const Tensor x = randn({4, 4}, gen);
  try {
    compile([](const std::vector<Tensor>& in) { return std::vector<Tensor>{to(in[0], kMeta)}; },
            {x});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("inside a compiled function"), std::string::npos)
        << e.what();
  }
  const Fn masked = [](const std::vector<Tensor>& in) {
    const Tensor m = to(triu(ones({4, 4}, DType::kBool), 1), in[0].device());
    return std::vector<Tensor>{masked_fill(in[0], m, 0.0)};
  };
  CompiledFn f = compile(masked, {x});
  ExpectSame(f({x}), masked({x}), "mask built and moved inside the traced function");
}

// On CUDA each linear with an activation epilogue is timed fused and split once; the plan runs
// the faster, the report says which with both timings, and the answer matches eager either way.
TEST(Compile, EpilogueChoiceIsMeasuredOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(12);
  MLP mlp({768, 3072, 3072, 768}, gen, ModuleOptions{DType::kBFloat16, CUDA(0)});
  const Tensor x = randn({2048, 768}, gen, DType::kBFloat16, CUDA(0));
  CompiledFn f = compile(mlp, x);
  const CompileReport& r = f.report({x});
  int choices = 0, split = 0;
  for (const std::string& line : r.explain) {
    if (line.rfind("epilogue choice: ", 0) != 0) continue;
    ++choices;
    split += line.find("-> split") != std::string::npos;
  }
  EXPECT_EQ(choices, 2) << r.final_graph;  // two distinct shapes, each measured once
  EXPECT_EQ(r.kernels_per_step, 3 + split);
  ExpectSame(f({x}), {mlp(x)}, "3-layer MLP with measured epilogues");
}

TEST(Compile, SignatureRules) {
  Fn fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{relu(in[0]) + 1.0}; };
  Generator gen(4);
  const Tensor a = randn({4, 4}, gen), b = randn({2, 8}, gen);
  CompiledFn f = compile(fn, {a});
  ExpectSame(f({b}), fn({b}), "recompiled for a new shape");
  ExpectSame(f({transpose(b, 0, 1)}), fn({transpose(b, 0, 1)}), "non-contiguous input");
  CompileOptions strict;
  strict.recompile = false;
  CompiledFn g = compile(fn, {a}, strict);
  try {
    g({b});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 0 is float32[2, 8]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(
      compile([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] + in[1]}; },
              {a, b}),
      Error);  // bad shapes surface at compile time, from the trace
}

TEST(Compile, ModeSwitchRunsEagerly) {
  Fn fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{sigmoid(in[0])}; };
  Generator gen(5);
  const Tensor a = randn({3, 3}, gen);
  CompileOptions eager;
  eager.mode = CompileOptions::Mode::kEager;
  CompiledFn f = compile(fn, {a}, eager);
  EXPECT_FALSE(f.compiled());
  ExpectSame(f({a}), fn({a}), "eager mode");
}

TEST(Compile, DumpsGraphsKernelsAndIndex) {
  const std::string dir = (std::filesystem::temp_directory_path() / "kiln_dump_test").string();
  std::filesystem::remove_all(dir);
  CompileOptions o;
  o.dump_dir = dir;
  Fn fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{silu(in[0]) * in[0]}; };
  Generator gen(6);
  compile(fn, {randn({4, 4}, gen)}, o);
  EXPECT_TRUE(std::filesystem::exists(dir + "/index.md"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/00_traced.txt"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/00_traced.dot"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/explain.txt"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/kernels/kiln_fused_silu_mul_0.cu"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/kernels/kiln_fused_silu_mul_0.ptx"));
}

TEST(Compile, DumpsTheFusedSoftmaxKernel) {
  const std::string dir = (std::filesystem::temp_directory_path() / "kiln_dump_softmax").string();
  std::filesystem::remove_all(dir);
  CompileOptions o;
  o.dump_dir = dir;
  Generator gen(8);
  const Tensor q = randn({1, 2, 16, 8}, gen, DType::kBFloat16);
  compile(Attention(), {q, q, q}, o);
  const std::string base = dir + "/kernels/kiln_fused_mul_scalar_masked_fill_softmax_0";
  ASSERT_TRUE(std::filesystem::exists(base + ".cu"));
  EXPECT_TRUE(std::filesystem::exists(base + ".ptx"));
  std::ifstream in(base + ".cu");
  const std::string src((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(FileCheck(src, R"(
    CHECK: // kiln_fused_mul_scalar_masked_fill_softmax_0: fused from mul_scalar, masked_fill, softmax
    CHECK-NEXT: // launch: rows of 16; strided: 1-element loads, 16 threads per row
    CHECK-SAME: vec: 8-element loads, 2 threads per row
    CHECK: kiln_fused_mul_scalar_masked_fill_softmax_0_strided(
    CHECK: kiln_fused_mul_scalar_masked_fill_softmax_0_vec(
  )"));
}

// ---- Differential testing on seeded random graphs --------------------------------------------

// A random program: a list of steps over a growing pool of values, replayable on any inputs.
class RandomProgram {
 public:
  RandomProgram(uint64_t seed, DType dtype, Device device)
      : gen_(seed), dtype_(dtype), device_(device) {
    const int64_t b = 2 + Pick(4), n = 3 + Pick(6);
    shape_ = {b, n};
    weight_ = to(cast(randn({n, n}, gen_), dtype_), device_);  // a constant of the graph
    mask_ = to(from_vector(RandomBits(n), {n}, DType::kBool), device_);
    steps_ = 3 + Pick(8);
    for (int i = 0; i < steps_; ++i) ops_.push_back({Pick(17), Pick(1000), Pick(1000)});
  }

  std::vector<Tensor> Inputs() {
    std::vector<Tensor> in = {cast(randn(shape_, gen_), dtype_),
                              cast(randn({shape_[1]}, gen_), dtype_),
                              cast(randn({shape_[0], 1}, gen_), dtype_)};
    for (Tensor& x : in) x = to(x, device_);
    return in;
  }

  std::vector<Tensor> operator()(const std::vector<Tensor>& in) const {
    std::vector<Tensor> pool(in.begin(), in.end());
    for (const Op& op : ops_) pool.push_back(Apply(op, pool));
    return {pool.back(), pool[pool.size() / 2 + 1]};  // two outputs, one often an intermediate
  }

 private:
  struct Op {
    int kind, a, b;
  };
  int Pick(int n) { return static_cast<int>(gen_.NextU64() % n); }
  std::vector<double> RandomBits(int64_t n) {
    std::vector<double> v(n);
    for (double& x : v) x = gen_.Uniform() < 0.3;
    return v;
  }
  // Picks an operand; full-shape values for most ops so results keep the base shape.
  const Tensor& Full(const std::vector<Tensor>& pool, int r) const {
    for (int i = 0; i < static_cast<int>(pool.size()); ++i) {
      const Tensor& t = pool[(r + i) % pool.size()];
      if (t.shape() == Shape(shape_.begin(), shape_.end())) return t;
    }
    return pool[0];
  }
  Tensor Apply(const Op& op, const std::vector<Tensor>& pool) const {
    const Tensor& x = Full(pool, op.a);
    const Tensor& y = pool[op.b % pool.size()];  // may broadcast ([n] or [b, 1])
    switch (op.kind) {
      case 0:
        return x + y;
      case 1:
        return x * y;
      case 2:
        return x - y * 0.5;
      case 3:
        return gelu(x, op.b % 2 ? "tanh" : "none");
      case 4:
        return tanh(x) * 2.0 + 0.25;
      case 5:
        return sigmoid(x) / (1.0 + relu(y));
      case 6:
        return masked_fill(x, mask_, -1.5);
      case 7:
        return where(mask_, x, y);
      case 8:
        return softmax(x, -1);
      case 9:
        return matmul(x, weight_) * 0.25;
      case 10:
        return cast(cast(x, DType::kBFloat16), dtype_) + 1.0;
      case 11:
        return x - mean(x, {1}, true);
      case 12:
        return silu(x) * y;
      case 13:
        return exp(neg(relu(x)));
      case 15:  // the attention chain: scale, mask, softmax (one fused kernel)
        return softmax(masked_fill(x * 0.5, mask_, -INFINITY) + y, -1);
      case 16:  // casts around a softmax (both fused into it)
        return cast(softmax(cast(x, DType::kFloat32) / 2.0, -1), dtype_);
      default:
        return rsqrt(x * x + 1.0);
    }
  }

  mutable Generator gen_;
  DType dtype_;
  Device device_;
  std::vector<int64_t> shape_;
  Tensor weight_, mask_;
  int steps_;
  std::vector<Op> ops_;
};

void RunDifferential(int count, Device device) {
  int fused_graphs = 0, softmax_graphs = 0;
  for (int seed = 0; seed < count; ++seed) {
    for (DType t : {DType::kFloat32, DType::kBFloat16}) {
      RandomProgram prog(1000 + seed, t, device);
      std::vector<Tensor> in = prog.Inputs();
      Fn fn = [&prog](const std::vector<Tensor>& i) { return prog(i); };
      const std::string what = absl::StrCat("random graph seed ", seed, " ", DTypeName(t));
      std::string stage = "eager";
      try {  // an error names the graph and the stage it came from
        const std::vector<Tensor> want = fn(in);
        stage = "compile";
        CompiledFn f = compile(fn, in);
        fused_graphs += f.report(in).fused_kernels > 0;
        softmax_graphs += f.report(in).final_graph.find("_softmax_") != std::string::npos;
        stage = "compiled run";
        ExpectSame(f(in), want, absl::StrCat(what, "\n", f.report(in).final_graph));
      } catch (const Error& e) {
        ADD_FAILURE() << what << ": " << stage << " threw: " << e.what() << "\ntraced:\n"
                      << ir::PrintGraph(ValueOrThrow(ir::Trace(fn, in)));
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
  EXPECT_GT(fused_graphs, count / 2);  // the generator does exercise fusion
  EXPECT_GT(softmax_graphs, count / 4) << "softmax fusions";
}

TEST(CompileDifferential, RandomGraphsOnCpu) { RunDifferential(300, kCPU); }

TEST(CompileDifferential, RandomGraphsOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  RunDifferential(600, CUDA(0));
}

}  // namespace
}  // namespace kiln
