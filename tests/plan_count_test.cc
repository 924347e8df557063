// The plan's own kernel count (Executable::kernels_per_step) against what a run launches, on the
// CPU: a reshape that cannot be a view copies, so it counts as a kernel; one that can does not.
// (On CUDA the cuBLASLt calls are measured by capture as well: codegen/launch_count.h.)
#include <gtest/gtest.h>

#include "codegen/compile.h"
#include "codegen/executable.h"
#include "ir/graph.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/status.h"

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

}  // namespace
}  // namespace kiln
