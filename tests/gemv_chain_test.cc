// One-row GEMVs chained into one launch (ops/cuda/gemv_kernels.h GemvChain) and deferred into
// chains inside a compiled plan's region (ops/cuda/gemv_chain.h): the chain computes what each
// GEMV alone computes, bit for bit, over a decode layer's shapes where every op reads the one
// before it (and q, k, v that share their x, with no barrier between them); where the barriers go
// (host code, also without a GPU); what it refuses; a
// region flushes before any other launch, so an op between two linears reads their results; a
// compiled decode layer launches one chain kernel and counts it so. GPU cases skip without a GPU.
#include "ops/cuda/gemv_chain.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/compile.h"
#include "ops/cuda/gemv_kernels.h"
#include "ops/cuda/matmul_cuda.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/cuda_api.h"
#include "tests/gemv_test_util.h"
#include "tests/kernel_test_util.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

using cuda_kernels::GemvAct;
using cuda_kernels::GemvArgs;
using cuda_kernels::GemvNorm;

// A one-row GEMV out = act(x · wᵀ + bias) (+ residual), optionally normalising x first.
GemvArgs Op(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
            const Tensor& residual, GemvAct act, GemvNorm norm = GemvNorm::kNone,
            const Tensor& gamma = Tensor(), const Tensor& beta = Tensor()) {
  GemvArgs a{};
  a.x = x.data_ptr();
  a.ldx = x.size(-1);
  a.w = w.data_ptr();
  a.ldw = w.stride(0);
  a.bias = bias.defined() ? bias.data_ptr() : nullptr;
  a.bias_stride = 1;
  a.out = out.data_ptr();
  a.residual = residual.defined() ? residual.data_ptr() : nullptr;
  a.m = 1;
  a.n = w.size(0);
  a.k = w.size(1);
  a.type = *cuda_kernels::ElemTypeOf(out.dtype());
  a.act = act;
  a.sm_count = cuda::Props(0).sm_count;
  a.norm = norm;
  a.norm_weight = gamma.defined() ? gamma.data_ptr() : nullptr;
  a.norm_bias = beta.defined() ? beta.data_ptr() : nullptr;
  a.norm_eps = 1e-5f;
  return a;
}

// A 2-byte float tensor's values (exact in double), for exact comparisons.
std::vector<double> Values(const Tensor& t) { return to_vector(t); }

// A decode layer's GEMVs after its attention (o-proj + residual, norm + fc + gelu, proj +
// residual, the next norm + qkv), each reading the one before, chained and alone: same bits.
TEST(GemvChain, ADecodeLayerMatchesEachGemvBitForBit) {
  KILN_SKIP_WITHOUT_GPU();
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t d : {64, 768}) {
      Generator gen(d);
      auto rnd = [&](Shape s, double scale) { return randn(s, gen, t, CUDA(0)) * scale; };
      const double ws = 1.0 / std::sqrt(static_cast<double>(d));
      const Tensor attn = rnd({1, d}, 1.0), h0 = rnd({1, d}, 1.0);
      const Tensor wo = rnd({d, d}, ws), bo = rnd({d}, 0.1), wfc = rnd({4 * d, d}, ws),
                   bfc = rnd({4 * d}, 0.1), wp = rnd({d, 4 * d}, ws / 2), bp = rnd({d}, 0.1),
                   wqkv = rnd({3 * d, d}, ws), bqkv = rnd({3 * d}, 0.1);
      const Tensor g1 = rnd({d}, 0.3) + 1.0, b1 = rnd({d}, 0.2), g2 = rnd({d}, 0.3) + 1.0,
                   b2 = rnd({d}, 0.2);
      auto outputs = [&] {
        return std::vector<Tensor>{
            Tensor::Empty({1, d}, t, CUDA(0)), Tensor::Empty({1, 4 * d}, t, CUDA(0)),
            Tensor::Empty({1, d}, t, CUDA(0)), Tensor::Empty({1, 3 * d}, t, CUDA(0))};
      };
      auto layer = [&](const std::vector<Tensor>& o) {
        return std::vector<GemvArgs>{
            Op(attn, wo, bo, o[0], h0, GemvAct::kNone),
            Op(o[0], wfc, bfc, o[1], Tensor(), GemvAct::kGeluTanh, GemvNorm::kLayer, g1, b1),
            Op(o[1], wp, bp, o[2], o[0], GemvAct::kNone),
            Op(o[2], wqkv, bqkv, o[3], Tensor(), GemvAct::kNone, GemvNorm::kLayer, g2, b2)};
      };
      const std::vector<Tensor> alone = outputs(), chained = outputs();
      const std::vector<GemvArgs> ops_alone = layer(alone), ops_chained = layer(chained);
      for (const GemvArgs& a : ops_alone) {
        ASSERT_TRUE(cuda_kernels::GemvChainTakes(a));
        KILN_CUDA_CHECK(cuda_kernels::Gemv(a, cuda::CurrentStream()));
      }
      const std::vector<std::string> names = KernelNames([&] {
        KILN_CUDA_CHECK(cuda_kernels::GemvChain(ops_chained.data(), 4, cuda::CurrentStream()));
      });
      ASSERT_EQ(names.size(), 1u) << absl::StrJoin(names, "\n");
      EXPECT_NE(names[0].find("GemvChainKernel"), std::string::npos) << names[0];
      for (size_t i = 0; i < alone.size(); ++i) {
        const std::vector<double> want = Values(alone[i]), got = Values(chained[i]);
        ASSERT_EQ(got.size(), want.size());
        int differ = 0;
        for (size_t j = 0; j < got.size(); ++j) differ += !(got[j] == want[j]);
        EXPECT_EQ(differ, 0) << DTypeName(t) << " d=" << d << " op " << i;
      }
    }
  }
}

// q, k and v of one RMS norm (no barrier between them: they share only their x) and an odd,
// unaligned op (weights one element off 16 bytes: the element loop), chained and alone.
TEST(GemvChain, IndependentAndUnalignedOpsMatchBitForBit) {
  KILN_SKIP_WITHOUT_GPU();
  const DType t = DType::kBFloat16;
  Generator gen(3);
  auto rnd = [&](Shape s, double scale) { return randn(s, gen, t, CUDA(0)) * scale; };
  const Tensor x = rnd({1, 256}, 1.0), g = rnd({256}, 0.3) + 1.0;
  const Tensor wq = rnd({256, 256}, 0.06), wk = rnd({64, 256}, 0.06), wv = rnd({64, 256}, 0.06);
  const Tensor wodd_base = rnd({17 * 41 + 1}, 0.1);
  const Tensor wodd = wodd_base.as_strided({17, 41}, {41, 1}, 1);  // 2-byte offset
  auto run = [&](bool chained) {
    std::vector<Tensor> o = {Tensor::Empty({1, 256}, t, CUDA(0)),
                             Tensor::Empty({1, 64}, t, CUDA(0)), Tensor::Empty({1, 64}, t, CUDA(0)),
                             Tensor::Empty({1, 17}, t, CUDA(0))};
    const Tensor xodd = narrow(o[0], 1, 0, 41);
    std::vector<GemvArgs> ops = {
        Op(x, wq, Tensor(), o[0], Tensor(), GemvAct::kNone, GemvNorm::kRms, g),
        Op(x, wk, Tensor(), o[1], Tensor(), GemvAct::kNone, GemvNorm::kRms, g),
        Op(x, wv, Tensor(), o[2], Tensor(), GemvAct::kRelu, GemvNorm::kRms, g),
        Op(xodd, wodd, Tensor(), o[3], Tensor(), GemvAct::kNone)};
    ops[3].ldx = 256;
    if (chained) {
      KILN_CUDA_CHECK(cuda_kernels::GemvChain(ops.data(), 4, cuda::CurrentStream()));
    } else {
      for (const GemvArgs& a : ops) KILN_CUDA_CHECK(cuda_kernels::Gemv(a, cuda::CurrentStream()));
    }
    return o;
  };
  const std::vector<Tensor> want = run(false), got = run(true);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(Values(got[i]), Values(want[i])) << "op " << i;
  }
}

// Where the barriers go (host code: runs without a GPU). Buffers are byte addresses only.
GemvArgs At(uintptr_t x, uintptr_t w, uintptr_t out, int64_t n, int64_t k, uintptr_t residual = 0) {
  GemvArgs a{};
  a.x = reinterpret_cast<const void*>(x);
  a.w = reinterpret_cast<const void*>(w);
  a.out = reinterpret_cast<void*>(out);
  a.residual = reinterpret_cast<const void*>(residual);
  a.ldx = k;
  a.ldw = k;
  a.m = 1;
  a.n = n;
  a.k = k;
  a.type = cuda_kernels::ElemType::kBF16;
  return a;
}

std::vector<bool> Barriers(const std::vector<GemvArgs>& ops) {
  bool b[cuda_kernels::kGemvChainMaxOps] = {};
  cuda_kernels::GemvChainBarriers(ops.data(), static_cast<int>(ops.size()), b);
  return std::vector<bool>(b, b + ops.size());
}

TEST(GemvChainBarriers, OnlyWhereOneOpTouchesAnothersBytes) {
  constexpr uintptr_t kW = 0x100000, kAttn = 0x1000, kH0 = 0x2000, kH = 0x3000, kF = 0x4000,
                      kH2 = 0x8000, kQkv = 0x9000;
  // A decode layer: o-proj (+ residual h0) -> h; fc reads h; proj reads fc, adds h; qkv reads h2.
  EXPECT_EQ(Barriers({At(kAttn, kW, kH, 768, 768, kH0), At(kH, kW, kF, 3072, 768),
                      At(kF, kW, kH2, 768, 3072, kH), At(kH2, kW, kQkv, 2304, 768)}),
            (std::vector<bool>{false, true, true, true}));
  // q, k, v of one x: no barrier; a fourth op reading q waits.
  EXPECT_EQ(Barriers({At(kH, kW, kF, 64, 64), At(kH, kW, kF + 128, 16, 64),
                      At(kH, kW, kF + 160, 16, 64), At(kF + 2, kW, kQkv, 8, 8)}),
            (std::vector<bool>{false, false, false, true}));
  // Write after read: op 1 overwrites op 0's x; write after write: op 1 writes op 0's out.
  EXPECT_EQ(Barriers({At(kH, kW, kF, 64, 64), At(kAttn, kW, kH + 64, 8, 64)}),
            (std::vector<bool>{false, true}));
  EXPECT_EQ(Barriers({At(kH, kW, kF, 64, 64), At(kAttn, kW, kF + 126, 8, 64)}),
            (std::vector<bool>{false, true}));
  // Byte ranges end where they end: out [kF, kF + 128) and a read from kF + 128 do not meet.
  EXPECT_EQ(Barriers({At(kH, kW, kF, 64, 64), At(kF + 128, kW, kQkv, 8, 8)}),
            (std::vector<bool>{false, false}));
  // A barrier starts a new phase: op 2 waits for op 1 and so is ordered after op 0 as well; op 3
  // reads op 0's output without a barrier of its own.
  EXPECT_EQ(Barriers({At(kH, kW, kF, 64, 64), At(kAttn, kW, kH2, 64, 64), At(kH2, kW, kQkv, 64, 64),
                      At(kF, kW, kH0, 64, 64)}),
            (std::vector<bool>{false, false, true, false}));
}

TEST(GemvChain, RefusesWhatItDoesNotTake) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(4);
  const Tensor x = randn({2, 64}, gen, DType::kBFloat16, CUDA(0));
  const Tensor w = randn({32, 64}, gen, DType::kBFloat16, CUDA(0));
  const Tensor o = Tensor::Empty({2, 32}, DType::kBFloat16, CUDA(0));
  GemvArgs one = Op(x, w, Tensor(), o, Tensor(), GemvAct::kNone);
  EXPECT_TRUE(cuda_kernels::GemvChainTakes(one));
  GemvArgs two = one;
  two.m = 2;
  EXPECT_FALSE(cuda_kernels::GemvChainTakes(two));  // one row only
  GemvArgs f32 = one;
  f32.type = cuda_kernels::ElemType::kF32;
  EXPECT_FALSE(cuda_kernels::GemvChainTakes(f32));
  GemvArgs unfolded = Op(x, w, Tensor(), o, Tensor(), GemvAct::kNone, GemvNorm::kLayer);
  unfolded.fold_norm = false;  // the norm prologue needs its own shared memory
  EXPECT_FALSE(cuda_kernels::GemvChainTakes(unfolded));
  GemvArgs null_x = one;
  null_x.x = nullptr;
  EXPECT_FALSE(cuda_kernels::GemvChainTakes(null_x));
  const std::vector<GemvArgs> nine(9, one);
  EXPECT_EQ(cuda_kernels::GemvChain(nine.data(), 9, cuda::CurrentStream()), cudaErrorInvalidValue);
  EXPECT_EQ(cuda_kernels::GemvChain(nine.data(), 0, cuda::CurrentStream()), cudaErrorInvalidValue);
  GemvArgs half = one;
  half.type = cuda_kernels::ElemType::kF16;
  const std::vector<GemvArgs> mixed = {one, half};
  EXPECT_EQ(cuda_kernels::GemvChain(mixed.data(), 2, cuda::CurrentStream()), cudaErrorInvalidValue);
  const std::vector<GemvArgs> with_two = {one, two};
  EXPECT_EQ(cuda_kernels::GemvChain(with_two.data(), 2, cuda::CurrentStream()),
            cudaErrorInvalidValue);
  cudaGetLastError();
}

// Inside a region: two linears defer, an add between them flushes first (it reads the first
// linear's result), the third linear reads the add; the region's end launches the rest. Same
// values as without a region; kernels: chain-or-GEMV, add, chain.
TEST(GemvChainRegion, FlushesBeforeAnyOtherLaunch) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvChain chains_on(true);
  const ScopedGemvMode on(cuda_ops::GemvMode::kOn);
  Generator gen(5);
  auto rnd = [&](Shape s, double scale) {
    return randn(s, gen, DType::kBFloat16, CUDA(0)) * scale;
  };
  const Tensor x = rnd({1, 128}, 1.0), w1 = rnd({128, 128}, 0.1), w2 = rnd({128, 128}, 0.1),
               w3 = rnd({64, 128}, 0.1);
  auto body = [&] {
    const Tensor a = linear(x, w1);
    const Tensor b = linear(a, w2);
    const Tensor c = a + b;
    return linear(c, w3) + 0.0;  // the trailing add flushes the last linear
  };
  const std::vector<double> want = Values(body());  // no region: each linear launches
  std::vector<double> got;
  const std::vector<std::string> names = KernelNames([&] {
    const bool opened = cuda_ops::BeginGemvChain();
    got = Values(body());
    cuda_ops::EndGemvChain(opened);
  });
  EXPECT_EQ(got, want);
  std::vector<std::string> kinds;
  for (const std::string& n : names) {
    if (n.find("GemvChainKernel") != std::string::npos) kinds.push_back("chain");
  }
  EXPECT_EQ(kinds.size(), 1u) << absl::StrJoin(names, "\n");  // linear, linear as one
}

// The bf16 weights of a GPT-2-style decode layer's part after its attention (width d): the output
// projection with its residual, the MLP with its norm, and the next layer's norm + qkv.
struct DecodeLayerTail {
  Tensor wo, bo, wfc, bfc, wp, bp, wqkv, bqkv, g1, b1, g2, b2;
  DecodeLayerTail(Generator& gen, int64_t d) {
    auto bf16 = [&](Shape s, double scale) {
      return randn(s, gen, DType::kBFloat16, CUDA(0)) * scale;
    };
    wo = bf16({d, d}, 0.06), bo = bf16({d}, 0.1), wfc = bf16({4 * d, d}, 0.06);
    bfc = bf16({4 * d}, 0.1), wp = bf16({d, 4 * d}, 0.03), bp = bf16({d}, 0.1);
    wqkv = bf16({3 * d, d}, 0.06), bqkv = bf16({3 * d}, 0.1);
    g1 = bf16({d}, 0.3) + 1.0, b1 = bf16({d}, 0.2), g2 = bf16({d}, 0.3) + 1.0;
    b2 = bf16({d}, 0.2);
  }
  // h = residual + o-proj(attn), then h + mlp(ln(h)).
  Tensor Block(const Tensor& attn, const Tensor& residual) const {
    const Tensor h = residual + linear(attn, wo, bo);
    return h + linear(gelu(linear(layer_norm(h, g1, b1), wfc, bfc), "tanh"), wp, bp);
  }
  Tensor NextQkv(const Tensor& h) const { return linear(layer_norm(h, g2, b2), wqkv, bqkv); }
};

int ChainKernels(const std::vector<std::string>& names) {
  int chains = 0;
  for (const std::string& n : names) chains += n.find("GemvChainKernel") != std::string::npos;
  return chains;
}

std::vector<Tensor> DecodeRows(Generator& gen, int64_t d) {
  return {randn({1, 1, d}, gen, DType::kBFloat16, CUDA(0)),
          randn({1, 1, d}, gen, DType::kBFloat16, CUDA(0))};
}

// A compiled GPT-2-style decode layer after its attention (bf16, one row): the output
// projection, the MLP and the next layer's norm + qkv launch as one chain kernel; the report
// counts it so and the values are eager's within the numerics policy's tolerance.
TEST(GemvChainRegion, ACompiledDecodeLayerIsOneChainKernel) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvChain chains_on(true);
  const ScopedGemvMode on(cuda_ops::GemvMode::kOn);
  Generator gen(6);
  const DecodeLayerTail layer(gen, 256);
  auto fn = [&](const std::vector<Tensor>& t) {
    const Tensor h2 = layer.Block(t[0], t[1]);
    return std::vector<Tensor>{h2, layer.NextQkv(h2)};
  };
  const std::vector<Tensor> in = DecodeRows(gen, 256);
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  CompiledFn f = compile(fn, in, o);
  const std::vector<Tensor> want = fn(in);
  std::vector<Tensor> got = f(in);  // warm: choices made
  const std::vector<std::string> names = KernelNames([&] { got = f(in); });
  for (size_t i = 0; i < got.size(); ++i) {
    ExpectClose(to_vector(got[i]), to_vector(want[i]), ToleranceFor(DType::kBFloat16),
                absl::StrCat("output ", i));
  }
  const CompileReport& r = f.report(in);
  EXPECT_EQ(ChainKernels(names), 1) << absl::StrJoin(names, "\n") << "\n" << r.final_graph;
  EXPECT_EQ(r.kernels_per_step, static_cast<int>(names.size()))
      << absl::StrJoin(names, "\n") << "\n"
      << r.final_graph;
}

// The same layer compiled with CUDA graphs: the plan's region inside the capture launches its
// chain into the graph (the caller's region, open around the calls, defers nothing meanwhile), and
// every replay, on new values each time, gives eager's values with one chain kernel.
TEST(GemvChainRegion, ACapturedDecodeLayerReplaysItsChainKernel) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvChain chains_on(true);
  const ScopedGemvMode on(cuda_ops::GemvMode::kOn);
  Generator gen(7);
  const DecodeLayerTail layer(gen, 256);
  auto fn = [&](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{layer.Block(t[0], t[1])};
  };
  const std::vector<Tensor> in = DecodeRows(gen, 256);
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  o.cuda_graphs = true;
  CompiledFn f = compile(fn, in, o);
  const bool outer = cuda_ops::BeginGemvChain();  // a caller's region around the calls
  for (int call = 0; call < 4; ++call) {  // call 0 times the choices, call 1 captures, 2.. replay
    const std::vector<Tensor> x = DecodeRows(gen, 256);
    std::vector<Tensor> got;
    const std::vector<std::string> names = KernelNames([&] { got = f(x); });
    ExpectClose(to_vector(got[0]), to_vector(fn(x)[0]), ToleranceFor(DType::kBFloat16),
                absl::StrCat("call ", call));
    if (call >= 2) {
      EXPECT_EQ(ChainKernels(names), 1) << "call " << call << ":\n" << absl::StrJoin(names, "\n");
    }
  }
  cuda_ops::EndGemvChain(outer);
}

// A family that launches its own kernel after a linear it dispatches (the gated MLP's GeGLU
// family at one row): the region is paused across it, so its kernel reads the linear's output,
// not memory a deferred GEMV has yet to write. Every call, the first (choices timed) included,
// gives eager's values.
TEST(GemvChainRegion, AFamilyLaunchingItsOwnKernelsSeesItsLinearsOutputs) {
  KILN_SKIP_WITHOUT_GPU();
  const ScopedGemvChain chains_on(true);
  const ScopedGemvMode on(cuda_ops::GemvMode::kOn);
  Generator gen(7);
  GeGLUMLP mlp(256, 1024, {.dtype = DType::kBFloat16, .device = CUDA(0), .generator = &gen});
  const Tensor x = randn({1, 256}, gen, DType::kBFloat16, CUDA(0));
  const Tensor want = mlp(x);
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  CompiledFn f = compile(mlp, x, o);
  for (int call = 0; call < 3; ++call) {
    ExpectClose(to_vector(f({x})[0]), to_vector(want), ToleranceFor(DType::kBFloat16),
                absl::StrCat("call ", call));
  }
}

}  // namespace
}  // namespace kiln
