// The plan's own kernel count (Executable::kernels_per_step) against what a run launches, on the
// CPU: a reshape that cannot be a view copies, so it counts as a kernel; one that can does not.
// (On CUDA the cuBLASLt calls, attention and argmax are measured by capture as well:
// codegen/launch_count.h; a GPU test checks the report against a capture of a whole call.)
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/compile.h"
#include "codegen/executable.h"
#include "codegen/fusion_template.h"
#include "ir/graph.h"
#include "ops/cuda/gemv_chain.h"
#include "ops/cuda/matmul_cuda.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/cuda_api.h"
#include "runtime/status.h"
#include "tests/kernel_test_util.h"
#include "tests/numerics_policy.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

// x [4, 6] -> transpose -> reshape [24]: the transposed strides cannot be flattened.
ir::Graph TransposeThenReshape() {
  ir::Graph g;
  const ir::ValueId x = g.AddInput(TensorType{{4, 6}, DType::kFloat32, kCPU}, "x");
  OpAttrs t;
  t.dim = 0;
  t.dim2 = 1;
  const ir::ValueId xt = g.AddOp(OpId::kTranspose, {x}, t);
  OpAttrs r;
  r.dims = {24};
  g.SetOutputs({g.AddOp(OpId::kReshape, {xt}, r)});
  return g;
}

TEST(PlanCount, ReshapeThatCopiesIsAKernel) {
  auto exe = ValueOrThrow(codegen::Executable::Build(TransposeThenReshape()));
  EXPECT_EQ(exe->kernels_per_step(), 1);
  EXPECT_EQ(exe->memsets_per_step(), 0);
  const Tensor x = reshape(arange(24, DType::kFloat32), {4, 6});
  const Tensor y = exe->Run({x})[0];
  EXPECT_FALSE(y.shares_storage(x));  // it did copy
  const Tensor want = contiguous(transpose(x, 0, 1));
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(y.data<float>()[i], want.data<float>()[i]) << i;
}

TEST(PlanCount, ReshapeThatViewsIsNoKernel) {
  ir::Graph g;
  const ir::ValueId x = g.AddInput(TensorType{{4, 6}, DType::kFloat32, kCPU}, "x");
  OpAttrs r;
  r.dims = {2, 12};
  g.SetOutputs({g.AddOp(OpId::kReshape, {x}, r)});
  auto exe = ValueOrThrow(codegen::Executable::Build(std::move(g)));
  EXPECT_EQ(exe->kernels_per_step(), 0);
  const Tensor in = reshape(arange(24, DType::kFloat32), {4, 6});
  EXPECT_TRUE(exe->Run({in})[0].shares_storage(in));  // a view, as counted
}

// Through kiln::compile: a permute-back-then-reshape (attention's head merge) plus an add.
TEST(PlanCount, CompileReportCountsTheHeadMergeCopy) {
  const Tensor x = reshape(arange(2 * 3 * 4 * 5, DType::kFloat32), {2, 3, 4, 5});
  auto fn = [](const std::vector<Tensor>& in) {
    const Tensor merged = reshape(permute(in[0], {0, 2, 1, 3}), {2, 4, 15});
    return std::vector<Tensor>{merged + 1.0};
  };
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  CompiledFn f = compile(fn, {x}, o);
  const CompileReport& r = f.report({x});
  // The reshape of the permuted tensor copies (its strides cannot be flattened) and add_scalar
  // runs: two kernels (the plan used to count the reshape as a free view: 1).
  ASSERT_NE(r.final_graph.find("reshape("), std::string::npos) << r.final_graph;
  EXPECT_EQ(r.kernels_per_step, 2) << r.final_graph;
  const Tensor got = f({x})[0], want = fn({x})[0];
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t i = 0; i < want.numel(); ++i) {
    EXPECT_EQ(got.data<float>()[i], want.data<float>()[i]) << i;
  }
}

std::pair<int, int> CapturedLaunches(CompiledFn& f, const std::vector<Tensor>& in);

// Attention's head merge, reshape(permute(sdpa(q, k, v), {0, 2, 1, 3}), [B, L, H·E]): the result
// is allocated heads-last (OpDef::heads_last_output, as torch's flash attention returns it), so
// the merge is a view: one kernel a step, not two, and the same values as the math form.
void ExpectHeadMergeIsAView(Device device) {
  Generator gen(5);
  const DType t = device.is_cuda() ? DType::kBFloat16 : DType::kFloat32;
  const std::vector<Tensor> in = {to(cast(randn({2, 3, 40, 64}, gen), t), device),
                                  to(cast(randn({2, 3, 40, 64}, gen), t), device),
                                  to(cast(randn({2, 3, 40, 64}, gen), t), device)};
  auto fn = [](const std::vector<Tensor>& x) {
    const Tensor y = scaled_dot_product_attention(x[0], x[1], x[2], {}, /*is_causal=*/true);
    return std::vector<Tensor>{reshape(permute(y, {0, 2, 1, 3}), {2, 40, 192})};
  };
  const Tensor y = scaled_dot_product_attention(in[0], in[1], in[2], {}, true);
  EXPECT_FALSE(y.is_contiguous());
  EXPECT_TRUE(permute(y, {0, 2, 1, 3}).is_contiguous()) << ShapeString(y.strides());
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  CompiledFn f = compile(fn, in, o);
  const std::vector<Tensor> got = f(in);
  const CompileReport& r = f.report(in);
  EXPECT_EQ(r.kernels_per_step, 1) << r.final_graph;
  std::vector<Tensor> want;
  {
    SdpaBackendGuard math(SdpaBackend::kMath);
    want = fn(in);
  }
  Tolerance tol = ToleranceFor(t);
  tol.atol *= 4;  // the flash kernel rounds P once, the math form after each matmul
  tol.rtol *= 4;
  ExpectClose(to_vector(got[0]), to_vector(want[0]), tol, "head merge");
  if (!device.is_cuda()) return;
  const auto [kernels, memsets] = CapturedLaunches(f, in);
  EXPECT_EQ(r.kernels_per_step, kernels) << r.final_graph;
}

TEST(PlanCount, HeadMergeAfterAttentionIsAViewOnCpu) { ExpectHeadMergeIsAView(kCPU); }

// Kernels and memsets in a stream capture of one call of `f` (the plan, no CUDA graph).
std::pair<int, int> CapturedLaunches(CompiledFn& f, const std::vector<Tensor>& in) {
  cuda::Stream stream;
  cuda::StreamGuard guard(stream.get());
  cudaGraph_t graph = nullptr;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  { const std::vector<Tensor> out = f(in); }
  KILN_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
  size_t n = 0;
  KILN_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  KILN_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  int kernels = 0, memsets = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    KILN_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    kernels += type == cudaGraphNodeTypeKernel;
    memsets += type == cudaGraphNodeTypeMemset;
  }
  cudaGraphDestroy(graph);
  return {kernels, memsets};
}

// Ops whose launches depend on shapes and device: decode attention (one split-key kernel whose
// splits merge in a cluster on sm_90, split + combine kernels before it) and argmax over one long
// row (one kernel of a cluster on sm_90; memset + split + unpack before it). The report must count
// what a call launches.
TEST(PlanCount, DecodeAttentionAndLongArgmaxCountWhatRuns) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(3);
  auto bf16 = [&](Shape s) { return to(cast(randn(s, gen), DType::kBFloat16), CUDA(0)); };
  const std::vector<Tensor> in = {bf16({2, 12, 1, 64}), bf16({2, 12, 1024, 64}),
                                  bf16({2, 12, 1024, 64}), bf16({1, 50257})};
  auto fn = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{scaled_dot_product_attention(t[0], t[1], t[2]), argmax(t[3], 1)};
  };
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  CompiledFn f = compile(fn, in, o);
  (void)f(in);  // warm: kernels compiled outside the capture
  const auto [kernels, memsets] = CapturedLaunches(f, in);
  const CompileReport& r = f.report(in);
  EXPECT_EQ(r.kernels_per_step, kernels) << r.final_graph;
  EXPECT_EQ(r.memsets_per_step, memsets) << r.final_graph;
  if (cuda::Props(0).major >= 9) {  // one kernel each, no memset
    EXPECT_EQ(kernels, 2);
    EXPECT_EQ(memsets, 0);
  } else {  // split + combine, split + unpack
    EXPECT_EQ(kernels, 4);
    EXPECT_EQ(memsets, 1);
  }
}

TEST(PlanCount, HeadMergeAfterAttentionIsAViewOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  ExpectHeadMergeIsAView(CUDA(0));
}

// A decode step's KV-cache append fused with its attention (attention_fusion.h), then the head
// merge: in place on the caches, the fused node is the step's only kernel (the merge views its
// heads-last result) on the CPU; on CUDA the report counts what a call launches, two kernels fewer
// than with the attention family off (the two index_copy kernels).
void ExpectKvAppendCounts(Device device) {
  Generator gen(8);
  const DType t = device.is_cuda() ? DType::kBFloat16 : DType::kFloat32;
  auto rnd = [&](Shape s) { return to(cast(randn(s, gen), t), device); };
  const std::vector<Tensor> in = {
      rnd({2, 4, 2, 64}),  rnd({2, 4, 64, 64}),
      rnd({2, 4, 64, 64}), to(from_vector({7, 8}, {2}, DType::kInt64), device),
      rnd({2, 4, 2, 64}),  rnd({2, 4, 2, 64})};
  auto fn = [](const std::vector<Tensor>& x) {
    index_copy_(x[1], 2, x[3], x[4]);
    index_copy_(x[2], 2, x[3], x[5]);
    const Tensor y = scaled_dot_product_attention(x[0], x[1], x[2]);
    return std::vector<Tensor>{reshape(permute(y, {0, 2, 1, 3}), {2, 2, 256})};
  };
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  CompiledFn f = compile(fn, in, o);
  (void)f(in);  // warm: kernels compiled outside the capture
  const CompileReport& r = f.report(in);
  ASSERT_NE(r.final_graph.find("kiln_fused_index_copy_scaled_dot_product_attention"),
            std::string::npos)
      << r.final_graph;
  if (!device.is_cuda()) {
    EXPECT_EQ(r.kernels_per_step, 1) << r.final_graph;
    return;
  }
  const auto [kernels, memsets] = CapturedLaunches(f, in);
  EXPECT_EQ(r.kernels_per_step, kernels) << r.final_graph;
  o.disabled_families = {"attention"};
  CompiledFn apart = compile(fn, in, o);
  (void)apart(in);
  EXPECT_EQ(apart.report(in).kernels_per_step, kernels + 2) << apart.report(in).final_graph;
}

TEST(PlanCount, KvAppendAttentionIsOneNodeOnCpu) { ExpectKvAppendCounts(kCPU); }
TEST(PlanCount, KvAppendAttentionCountsWhatRunsOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  ExpectKvAppendCounts(CUDA(0));
}

// The step rotating its query and new keys (RoPE, as RotaryEmbedding traces it) before the
// append: with CompileOptions::kv_rope the decode kernel's rope variant rotates them, one kernel
// fewer than the rotations' pointwise kernel before it; the report counts what a call launches.
TEST(PlanCount, RotaryKvAppendIsOneKernelFewerOnCuda) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(9);
  auto rnd = [&](Shape s) { return to(cast(randn(s, gen), DType::kBFloat16), CUDA(0)); };
  const std::vector<Tensor> in = {
      rnd({2, 8, 1, 64}),  rnd({2, 2, 64, 64}),
      rnd({2, 2, 64, 64}), to(from_vector({7}, {1}, DType::kInt64), CUDA(0)),
      rnd({2, 2, 1, 64}),  rnd({2, 2, 1, 64}),
      rnd({2, 1, 1, 32}),  rnd({2, 1, 1, 32})};
  auto fn = [](const std::vector<Tensor>& x) {
    auto rotate = [&](const Tensor& t) { return apply_rotary(t, x[6], x[7]); };
    index_copy_(x[1], 2, x[3], rotate(x[4]));
    index_copy_(x[2], 2, x[3], x[5]);
    const Tensor y =
        scaled_dot_product_attention(rotate(x[0]), x[1], x[2], Tensor(), false, std::nullopt, true);
    return std::vector<Tensor>{reshape(permute(y, {0, 2, 1, 3}), {2, 1, 512})};
  };
  CompileOptions on;
  on.mode = CompileOptions::Mode::kCompiled;
  on.kv_rope = true;
  CompileOptions off = on;
  off.kv_rope = false;
  CompiledFn f = compile(fn, in, on), apart = compile(fn, in, off);
  (void)f(in);  // warm: kernels compiled outside the capture
  (void)apart(in);
  const CompileReport& r = f.report(in);
  const auto [kernels, memsets] = CapturedLaunches(f, in);
  EXPECT_EQ(r.kernels_per_step, kernels) << r.final_graph;
  EXPECT_EQ(apart.report(in).kernels_per_step, kernels + 1) << apart.report(in).final_graph;
  const std::vector<std::string> names = KernelNames([&] { (void)f(in); });
  const auto rope = std::find_if(names.begin(), names.end(), [](const std::string& n) {
    return n.find("kiln_flash_decode") == 0 && n.find("_append1_rope") != std::string::npos;
  });
  EXPECT_NE(rope, names.end()) << absl::StrJoin(names, ", ");
}

// A residual add in the GEMM (linear {epilogue=add}), fused or split by the epilogue timing, and
// a decode-sized one (the GEMV or cuBLASLt): the report counts what a call launches.
TEST(PlanCount, ResidualEpilogueCountsWhatRuns) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(4);
  auto bf16 = [&](Shape s) { return to(cast(randn(s, gen), DType::kBFloat16), CUDA(0)); };
  const Tensor w = bf16({768, 768}), b = bf16({768});
  auto fn = [&](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{t[0] + linear(t[0], w, b)};
  };
  for (int64_t rows : {512, 2}) {
    const std::vector<Tensor> in = {bf16({rows, 768})};
    CompileOptions o;
    o.mode = CompileOptions::Mode::kCompiled;
    CompiledFn f = compile(fn, in, o);
    (void)f(in);  // warm: kernels compiled and GEMMs planned outside the capture
    const auto [kernels, memsets] = CapturedLaunches(f, in);
    const CompileReport& r = f.report(in);
    ASSERT_NE(r.final_graph.find("{epilogue=add}"), std::string::npos) << r.final_graph;
    EXPECT_EQ(r.kernels_per_step, kernels) << rows << " rows\n" << r.final_graph;
    EXPECT_EQ(r.memsets_per_step, memsets) << rows << " rows";
  }
}

// A decode step's layer norm and the linear reading it (its GELU epilogue kept) are one launch on
// CUDA, the norm-linear family's GEMV; an RMS norm read by three linears (Llama's q, k, v) is
// three; with 512 rows they stay apart (the explain log says why). Every plan counts what it
// launches and matches eager. KILN_GEMV=on: the fused GEMV, not a per-shape timing's choice.
TEST(PlanCount, NormAndLinearsAreOneLaunchPerLinearForFewRows) {
  KILN_SKIP_WITHOUT_GPU();
  const cuda_ops::GemvMode previous = cuda_ops::CurrentGemvMode();
  cuda_ops::SetGemvMode(cuda_ops::GemvMode::kOn);
  Generator gen(5);
  auto bf16 = [&](Shape s) { return to(cast(randn(s, gen), DType::kBFloat16), CUDA(0)); };
  const Tensor g = bf16({768}), beta = bf16({768}), w = bf16({2304, 768}) * 0.03, b = bf16({2304});
  const Tensor wq = bf16({768, 768}) * 0.03, wk = bf16({256, 768}) * 0.03,
               wv = bf16({256, 768}) * 0.03;
  auto gpt = [&](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{gelu(linear(layer_norm(t[0], g, beta), w, b), "tanh")};
  };
  auto llama = [&](const std::vector<Tensor>& t) {
    const Tensor h = rms_norm(t[0], g, 1e-6);
    return std::vector<Tensor>{linear(h, wq), linear(h, wk), linear(h, wv) + t[1]};
  };
  struct Case {
    const char* name;
    std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn;
    int linears;
  };
  for (const Case& c : {Case{"gpt", gpt, 1}, Case{"llama", llama, 3}}) {
    for (int64_t rows : {1, 512}) {
      const std::vector<Tensor> in = {bf16({rows, 768}), bf16({rows, 256})};
      CompileOptions o;
      o.mode = CompileOptions::Mode::kCompiled;
      CompiledFn f = compile(c.fn, in, o);
      const std::vector<Tensor> got = f(in), want = c.fn(in);
      for (size_t i = 0; i < got.size(); ++i) {
        ExpectClose(to_vector(got[i]), to_vector(want[i]), ToleranceFor(DType::kBFloat16),
                    absl::StrCat(c.name, " ", rows, " rows, output ", i));
      }
      const auto [kernels, memsets] = CapturedLaunches(f, in);
      const CompileReport& r = f.report(in);
      const bool fused = r.final_graph.find("_norm_linear_") != std::string::npos;
      EXPECT_EQ(fused, rows == 1) << c.name << "\n" << r.final_graph;
      EXPECT_EQ(r.kernels_per_step, kernels) << c.name << " " << rows << " rows\n" << r.final_graph;
      EXPECT_EQ(r.memsets_per_step, memsets) << c.name << " " << rows << " rows";
      // One row: a GEMV per linear, or the linears of one norm as one chain kernel
      // (ops/cuda/gemv_chain.h).
      const int one_row = cuda_ops::GemvChainEnabled() ? 1 : c.linears;
      if (rows == 1) EXPECT_EQ(kernels, one_row) << c.name << "\n" << r.final_graph;
      const std::string log = absl::StrJoin(r.explain, "\n");
      EXPECT_NE(
          log.find(rows == 1 ? "normalise the rows themselves" : "512 rows: the GEMV takes 1 to 8"),
          std::string::npos)
          << log;
    }
  }
  cuda_ops::SetGemvMode(previous);
}

// A gated MLP at decode (Llama's SwiGLU after an RMS norm, a GeGLU after a layer norm): the norm,
// the gate and up projections (merged by GEMM merge) and act(gate) * up are one launch of the
// gated GEMV, the down projection with its residual another; with 512 rows they stay apart.
// Every plan counts what it launches and matches eager. KILN_GEMV=on: the GEMVs, not a per-shape
// timing's choice.
TEST(PlanCount, AGatedMlpIsTwoLaunchesForFewRows) {
  KILN_SKIP_WITHOUT_GPU();
  const cuda_ops::GemvMode previous = cuda_ops::CurrentGemvMode();
  cuda_ops::SetGemvMode(cuda_ops::GemvMode::kOn);
  Generator gen(6);
  auto bf16 = [&](Shape s) { return to(cast(randn(s, gen), DType::kBFloat16), CUDA(0)); };
  // g, beta, the gate, up and down weights; the MLPs are built over them, so that the numerics
  // policy's float32 reference runs the same program on their float32 copies.
  const std::vector<Tensor> w = {bf16({256}) * 0.2 + 1.0, bf16({256}), bf16({688, 256}) * 0.06,
                                 bf16({688, 256}) * 0.06, bf16({256, 688}) * 0.04};
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  auto swiglu = [](const std::vector<Tensor>& w) -> Fn {
    return [w](const std::vector<Tensor>& t) {
      const Tensor h = rms_norm(t[0], w[0], 1e-6);
      return std::vector<Tensor>{t[0] + linear(silu(linear(h, w[2])) * linear(h, w[3]), w[4])};
    };
  };
  auto geglu = [](const std::vector<Tensor>& w) -> Fn {
    return [w](const std::vector<Tensor>& t) {
      const Tensor h = layer_norm(t[0], w[0], w[1]);
      return std::vector<Tensor>{t[0] +
                                 linear(gelu(linear(h, w[2]), "tanh") * linear(h, w[3]), w[4])};
    };
  };
  auto in_float32 = [](const std::vector<Tensor>& ts) {
    std::vector<Tensor> out;
    for (const Tensor& t : ts) out.push_back(cast(t, DType::kFloat32));
    return out;
  };
  struct Case {
    const char* name;
    std::function<Fn(const std::vector<Tensor>&)> make;
  };
  for (const Case& c : {Case{"swiglu", swiglu}, Case{"geglu", geglu}}) {
    for (int64_t rows : {1, 8, 512}) {
      const std::vector<Tensor> in = {bf16({rows, 256})};
      CompileOptions o;
      o.mode = CompileOptions::Mode::kCompiled;
      o.gated_gemv = true;  // whatever KILN_GEMV_GLU says
      CompiledFn f = compile(c.make(w), in, o);
      // The gated GEMV rounds where eager does not (the product of unrounded sums; at 2..8 rows of
      // bf16 after an RMS norm γ·x, not the normalised value): the numerics policy against the
      // float32 program and eager's own error.
      ExpectWithinPolicy(f(in), c.make(w)(in), c.make(in_float32(w))(in_float32(in)),
                         absl::StrCat(c.name, " ", rows, " rows"));
      const auto [kernels, memsets] = CapturedLaunches(f, in);
      const CompileReport& r = f.report(in);
      EXPECT_EQ(r.kernels_per_step, kernels) << c.name << " " << rows << " rows\n" << r.final_graph;
      EXPECT_EQ(r.memsets_per_step, memsets) << c.name << " " << rows << " rows";
      const std::string log = absl::StrJoin(r.explain, "\n");
      if (rows <= 8) {
        EXPECT_EQ(kernels, 2) << c.name << " " << rows << " rows\n" << r.final_graph;
        EXPECT_NE(log.find("with its gated product"), std::string::npos) << log;
      } else {
        EXPECT_EQ(r.final_graph.find("_norm_linear_"), std::string::npos) << r.final_graph;
      }
    }
  }
  cuda_ops::SetGemvMode(previous);
}

// SDPA on the math path on CUDA (its matmuls, scale and softmax as separate kernels): the family
// counts the node once, by capture, and nothing adds the op's own count on top. (No mask and not
// causal: the math form's masks come from factories, which stage on the host, not capturable.)
TEST(PlanCount, MathPathAttentionCountsWhatRuns) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(5);
  auto bf16 = [&](Shape s) { return to(cast(randn(s, gen), DType::kBFloat16), CUDA(0)); };
  const std::vector<Tensor> in = {bf16({2, 4, 64, 64}), bf16({2, 4, 64, 64}), bf16({2, 4, 64, 64})};
  auto fn = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{scaled_dot_product_attention(t[0], t[1], t[2])};
  };
  SdpaBackendGuard math(SdpaBackend::kMath);
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  CompiledFn f = compile(fn, in, o);
  (void)f(in);
  const auto [kernels, memsets] = CapturedLaunches(f, in);
  const CompileReport& r = f.report(in);
  EXPECT_EQ(r.kernels_per_step, kernels) << r.final_graph;
  EXPECT_EQ(r.memsets_per_step, memsets) << r.final_graph;
  EXPECT_GE(kernels, 3);  // not the one flash kernel
}

// A generated kernel's footprint (registers, shared and local memory) is readable from the plan,
// and the elementwise skeleton uses no local memory. (The softmax skeleton's row arrays do:
// 128-136 B a thread on the H200 for rows of 256; the footprint shows it.)
TEST(PlanCount, FusedKernelsReportTheirFootprint) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(6);
  const std::vector<Tensor> in = {to(randn({64, 256}, gen), CUDA(0)),
                                  to(randn({64, 256}, gen), CUDA(0))};
  auto fn = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{gelu(t[0] * 1.5 + 0.5, "tanh") * t[1], softmax(t[0] * 0.5, -1)};
  };
  CompiledFn f = compile(fn, in);
  const codegen::Executable& exe = f.executable(in);
  int kernels = 0;
  for (ir::ValueId v = 0; v < exe.graph().num_values(); ++v) {
    const codegen::FusedKernel* k = exe.kernel_of(v);
    if (k == nullptr || exe.graph().node(v).kind != ir::NodeKind::kFusion) continue;
    const bool pointwise =
        codegen::TemplateFor(exe.graph().node(v))->name() == std::string("pointwise");
    for (const cuda::KernelFootprint& fp : k->Footprints()) {
      ++kernels;
      EXPECT_GT(fp.registers, 0) << fp.ToString();
      EXPECT_LE(fp.registers, 255) << fp.ToString();
      EXPECT_GE(fp.max_threads, 128) << fp.ToString();
      if (pointwise) {
        EXPECT_EQ(fp.local_bytes, 0) << fp.ToString();
      }
    }
  }
  EXPECT_GE(kernels, 3) << exe.graph().num_values();  // _contig, _rows; _vec/_strided
}

}  // namespace
}  // namespace kiln
