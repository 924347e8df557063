// Pass tests written as IR text in -> pass -> CHECK lines out (MLIR/XLA FileCheck style).
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "codegen/families/attention/attention_fusion.h"
#include "codegen/families/gemm/gemm_fusion.h"
#include "codegen/families/gemm_epilogue/epilogue_fusion.h"
#include "codegen/families/norm_linear/norm_linear_fusion.h"
#include "codegen/families/pointwise/elementwise_fusion.h"
#include "codegen/families/softmax/softmax_fusion.h"
#include "codegen/fusion_template.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/canonicalize.h"
#include "passes/cat_sinking.h"
#include "passes/fusion_groups.h"
#include "passes/simplify.h"
#include "tests/filecheck.h"

namespace kiln::passes {
namespace {

// Parses `ir`, runs `pass` (then DCE), verifies, and returns the printed result.
// `ctx_out`, when given, also holds the options the pass runs with.
std::string RunPass(Pass& pass, const std::string& ir, PassContext* ctx_out = nullptr) {
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(ir);
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << ir;
  if (!g.ok()) return "";
  PassContext ctx = ctx_out != nullptr ? *ctx_out : PassContext{};
  EXPECT_TRUE(pass.Run(*g, ctx).ok());
  DeadCodeElimination dce;
  EXPECT_TRUE(dce.Run(*g, ctx).ok());
  EXPECT_TRUE(ir::Verify(*g).ok()) << ir::Verify(*g).message();
  if (ctx_out != nullptr) *ctx_out = ctx;
  return ir::PrintGraph(*g);
}

TEST(Canonicalize, MatmulTransposeBiasBecomesLinear) {
  Canonicalize pass;
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[8, 16], %11: f32[32, 16], %12: f32[32]) {
      %13 = transpose(%11) {dim=0, dim2=1} : f32[16, 32]
      %14 = matmul(%10, %13) : f32[8, 32]
      %15 = add(%14, %12) : f32[8, 32]
      return %15
    })");
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: graph(%0: f32[8, 16], %1: f32[32, 16], %2: f32[32])
    CHECK-NEXT: %3 = linear(%0, %1, %2) : f32[8, 32]
    CHECK-NEXT: return %3
    CHECK-NOT: matmul
    CHECK-NOT: transpose
  )"));
}

TEST(Canonicalize, TransposesBecomeGemmFlags) {
  Canonicalize pass;
  const std::string out = RunPass(pass, R"(
    graph(%10: bf16[2, 4, 64, 16], %11: bf16[2, 4, 64, 16]) {
      %12 = transpose(%11) {dim=-2, dim2=-1} : bf16[2, 4, 16, 64]
      %13 = matmul(%10, %12) : bf16[2, 4, 64, 64]
      return %13
    })");
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %2 = matmul(%0, %1) {transpose_b=true} : bf16[2, 4, 64, 64]
    CHECK-NOT: transpose(
  )"));
}

TEST(Canonicalize, LeavesSharedMatmulAndWrongBiasAlone) {
  Canonicalize pass;
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[8, 16], %11: f32[16, 32], %12: f32[8, 32]) {
      %13 = matmul(%10, %11) : f32[8, 32]
      %14 = add(%13, %12) : f32[8, 32]
      %15 = mul(%14, %13) : f32[8, 32]
      return %15
    })");
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: matmul(%0, %1) : f32[8, 32]
    CHECK-NEXT: add(
    CHECK-NOT: linear
  )"));
}

// A traced write through a view, copy_(slice(cache, 1, 0, 2), k): the scatter reads k itself;
// a copy that converts (f32 into a bf16 cache) or broadcasts stays.
TEST(Canonicalize, ScatterReadsTheCopySource) {
  Canonicalize pass;
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[4, 8], %11: f32[2, 8], %12: bf16[4, 8], %13: f32[1, 8]) {
      %14 = slice(%10) {dim=0, start=0, end=2, step=1} : f32[2, 8]
      %15 = copy(%14, %11) : f32[2, 8]
      %16 = as_strided_scatter(%10, %15) {dims=[2, 8], strides=[8, 1], offset=0} : f32[4, 8]
      %17 = slice(%12) {dim=0, start=0, end=2, step=1} : bf16[2, 8]
      %18 = copy(%17, %11) : bf16[2, 8]
      %19 = as_strided_scatter(%12, %18) {dims=[2, 8], strides=[8, 1], offset=0} : bf16[4, 8]
      %20 = copy(%14, %13) : f32[2, 8]
      %21 = as_strided_scatter(%10, %20) {dims=[2, 8], strides=[8, 1], offset=16} : f32[4, 8]
      return %16, %19, %21
    })");
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: graph(%[[CACHE:[0-9]+]]: f32[4, 8], %[[K:[0-9]+]]: f32[2, 8], %[[HALF:[0-9]+]]: bf16[4, 8], %[[ROW:[0-9]+]]: f32[1, 8])
    CHECK-NOT: copy(
    CHECK: as_strided_scatter(%[[CACHE]], %[[K]])
    CHECK: %[[CONVERTED:[0-9]+]] = copy(%[[HALF_ROWS:[0-9]+]], %[[K]]) : bf16[2, 8]
    CHECK-NEXT: as_strided_scatter(%[[HALF]], %[[CONVERTED]])
    CHECK: %[[BROADCAST:[0-9]+]] = copy(%[[ROWS:[0-9]+]], %[[ROW]]) : f32[2, 8]
    CHECK-NEXT: as_strided_scatter(%[[CACHE]], %[[BROADCAST]])
  )"));
}

TEST(ElementwiseFusion, ChainAndFanOut) {
  ElementwiseFusion pass(codegen::PointwiseTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[4, 8], %11: f32[8]) {
      %12 = mul_scalar(%10) {scalar=1.5} : f32[4, 8]
      %13 = add_scalar(%12) {scalar=0.5} : f32[4, 8]
      %14 = gelu(%13) {approximate=tanh} : f32[4, 8]
      %15 = mul(%14, %11) : f32[4, 8]
      %16 = sum(%13) {dims=[1], keepdim=false} : f32[4]
      return %15, %16
    })",
                                  &ctx);
  // %13 has a user outside the chain (the sum): the one fused kernel stores it too, and a
  // result node hands it to the sum.
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %[[F:[0-9]+]] = fusion kiln_fused_mul_scalar_add_scalar_gelu_mul_0(%0, %1) : f32[4, 8]
    CHECK: %[[ADD:[0-9]+]] = add_scalar(
    CHECK: return %[[ROOT:[0-9]+]], %[[ADD]]
    CHECK: %[[R:[0-9]+]] = result %[[F]] #1 : f32[4, 8]
    CHECK-NEXT: sum(%[[R]])
    CHECK-NOT: fusion
  )"));
  bool logged = false;
  for (const auto& line : ctx.explain) logged |= line.find("multi-output: %3") != std::string::npos;
  EXPECT_TRUE(logged) << absl::StrJoin(ctx.explain, "\n");
}

// A producer whose outside user leads back into the group stays out of it (the kernel could not
// run before that user, nor after it).
TEST(ElementwiseFusion, AFanOutThatLeadsBackIntoTheGroupMaterialises) {
  ElementwiseFusion pass(codegen::PointwiseTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[4, 4], %11: f32[4, 4]) {
      %12 = tanh(%10) : f32[4, 4]
      %13 = matmul(%12, %11) : f32[4, 4]
      %14 = add(%12, %13) : f32[4, 4]
      %15 = neg(%14) : f32[4, 4]
      return %15
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %[[T:[0-9]+]] = tanh(%0)
    CHECK-NEXT: %[[M:[0-9]+]] = matmul(%[[T]], %1)
    CHECK-NEXT: fusion kiln_fused_add_neg_0(%[[T]], %[[M]])
    CHECK-NOT: result
  )"));
  bool logged = false;
  for (const auto& line : ctx.explain)
    logged |= line.find("leads back into the group") != std::string::npos;
  EXPECT_TRUE(logged) << absl::StrJoin(ctx.explain, "\n");
}

// Two groups that would each read a further output of the other through a node between them
// (%11 -> group of %13; %12 -> contiguous -> group of %16): every value path is acyclic, the
// groups are not. The fan-out of %12 is refused, the rewrite ends (fuzz program 90033 hung it).
constexpr char kCrossedGroups[] = R"(
    graph(%10: f32[2, 1, 2]) {
      %11 = tanh(%10) : f32[2, 1, 2]
      %12 = add(%10, %10) : f32[2, 1, 2]
      %13 = sub(%12, %11) : f32[2, 1, 2]
      %14 = contiguous(%12) : f32[2, 1, 2]
      %15 = mul(%14, %11) : f32[2, 1, 2]
      %16 = mul(%15, %15) : f32[2, 1, 2]
      return %16, %13
    })";

TEST(ElementwiseFusion, GroupsThatWouldReadEachOthersOutputsStayApart) {
  ElementwiseFusion pass(codegen::PointwiseTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, kCrossedGroups, &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %[[A:[0-9]+]] = add(%0, %0)
    CHECK: fusion kiln_fused_tanh_mul_0(%0, %[[C:[0-9]+]])
    CHECK: sub(%[[A]],
  )")) << out;
  bool logged = false;
  for (const auto& line : ctx.explain)
    logged |= line.find(
                  "not fused: %2 (add) into the group of %3: also used by %4, which leads "
                  "back into the group") != std::string::npos;
  EXPECT_TRUE(logged) << absl::StrJoin(ctx.explain, "\n");
}

// Should grouping ever hand the rewrite a cycle of groups, the rewrite emits a waiting group as
// separate nodes instead of waiting forever.
TEST(ElementwiseFusion, RewriteOfACycleOfGroupsEnds) {
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(kCrossedGroups);
  ASSERT_TRUE(g.ok()) << g.status().message();
  FusionGroups grp(*g, {});
  grp.groups = {{1, 5, 6}, {2, 3}};  // the crossed grouping LeadsInto refuses
  for (ir::ValueId v : {1, 5, 6}) grp.group_of[v] = 0;
  for (ir::ValueId v : {2, 3}) grp.group_of[v] = 1;
  ASSERT_TRUE(RewriteFusionGroups(*g, grp));
  EXPECT_TRUE(ir::Verify(*g).ok()) << ir::Verify(*g).message();
  const std::string out = ir::PrintGraph(*g);
  // The first waiting group (of %13) became its nodes; the other one is still one kernel.
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %[[A:[0-9]+]] = add(%0, %0)
    CHECK-NEXT: %[[C:[0-9]+]] = contiguous(%[[A]])
    CHECK-NEXT: %[[F:[0-9]+]] = fusion kiln_fused_tanh_mul_0(%0, %[[C]])
    CHECK: %[[T:[0-9]+]] = result %[[F]] #1
    CHECK-NEXT: sub(%[[A]], %[[T]])
    CHECK-NOT: fusion kiln_fused_add
  )")) << out;
}

TEST(ElementwiseFusion, StopsAtReductionsAndShapeChanges) {
  ElementwiseFusion pass(codegen::PointwiseTemplate());
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[4, 8], %11: f32[4, 1]) {
      %12 = exp(%11) : f32[4, 1]
      %13 = mul(%10, %12) : f32[4, 8]
      %14 = softmax(%13) {dim=-1} : f32[4, 8]
      %15 = neg(%14) : f32[4, 8]
      return %15
    })");
  // exp has a smaller shape than the group: it stays a plain op; softmax is a boundary.
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: exp(%1) : f32[4, 1]
    CHECK-NEXT: mul(
    CHECK-NEXT: softmax(
    CHECK-NEXT: neg(
    CHECK-NOT: fusion
  )"));
}

// True when some explain line contains every one of `parts`.
bool Logged(const PassContext& ctx, std::initializer_list<const char*> parts) {
  for (const std::string& line : ctx.explain) {
    bool all = true;
    for (const char* p : parts) all &= line.find(p) != std::string::npos;
    if (all) return true;
  }
  return false;
}

bool Logged(const PassContext& ctx, const std::string& text) { return Logged(ctx, {text.c_str()}); }

// RoPE's rotated halves: the two elementwise parts and the cat are one fusion whose kernel
// iterates over a part's shape (loads of x1, x2, cos and sin shared) and stores each part into
// its slice of the cat.
TEST(ElementwiseFusion, ACatOfElementwisePartsIsStoredByThem) {
  ElementwiseFusion pass(codegen::PointwiseTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%10: bf16[1, 4, 1, 16], %11: bf16[1, 1, 1, 8], %12: bf16[1, 1, 1, 8]) {
      %13 = slice(%10) {dim=-1, start=0, end=8, step=1} : bf16[1, 4, 1, 8]
      %14 = slice(%10) {dim=-1, start=8, end=16, step=1} : bf16[1, 4, 1, 8]
      %15 = mul(%13, %11) : bf16[1, 4, 1, 8]
      %16 = mul(%14, %12) : bf16[1, 4, 1, 8]
      %17 = sub(%15, %16) : bf16[1, 4, 1, 8]
      %18 = mul(%14, %11) : bf16[1, 4, 1, 8]
      %19 = mul(%13, %12) : bf16[1, 4, 1, 8]
      %20 = add(%18, %19) : bf16[1, 4, 1, 8]
      %21 = cat(%17, %20) {dim=-1} : bf16[1, 4, 1, 16]
      return %21
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %[[F:[0-9]+]] = fusion kiln_fused_mul_sub_mul_add_cat_0(
    CHECK-SAME: : bf16[1, 4, 1, 16]
    CHECK-NEXT: graph(%0: bf16[1, 4, 1, 8], %1: bf16[1, 1, 1, 8], %2: bf16[1, 4, 1, 8], %3: bf16[1, 1, 1, 8])
    CHECK: %[[CAT:[0-9]+]] = cat(%[[V1:[0-9]+]], %[[V2:[0-9]+]]) {dim=-1} : bf16[1, 4, 1, 16]
    CHECK-NEXT: return %[[CAT]]
    CHECK: return %[[F]]
  )")) << out;
}

// Horizontal fusion: RoPE of q and of k (GQA: 4 and 2 heads) and the tanh·exp chain, independent
// and small, become one node of three segments at the last one's place; the first one's value is
// output 0, the others' results. The sum reads the joined node before the sigmoid: the sigmoid
// (a plain op here, no fusion) would not join anyway, and nothing moves past the sum.
TEST(ElementwiseFusion, SmallIndependentKernelsJoinOneNode) {
  ElementwiseFusion pass(codegen::PointwiseTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[1, 4, 1, 8], %11: f32[1, 2, 1, 8], %12: f32[1, 1, 1, 4], %13: f32[4, 4]) {
      %14 = slice(%10) {dim=-1, start=0, end=4, step=1} : f32[1, 4, 1, 4]
      %15 = slice(%10) {dim=-1, start=4, end=8, step=1} : f32[1, 4, 1, 4]
      %16 = mul(%14, %12) : f32[1, 4, 1, 4]
      %17 = mul(%15, %12) : f32[1, 4, 1, 4]
      %18 = cat(%16, %17) {dim=-1} : f32[1, 4, 1, 8]
      %19 = slice(%11) {dim=-1, start=0, end=4, step=1} : f32[1, 2, 1, 4]
      %20 = slice(%11) {dim=-1, start=4, end=8, step=1} : f32[1, 2, 1, 4]
      %21 = mul(%19, %12) : f32[1, 2, 1, 4]
      %22 = mul(%20, %12) : f32[1, 2, 1, 4]
      %23 = cat(%21, %22) {dim=-1} : f32[1, 2, 1, 8]
      %24 = matmul(%13, %13) : f32[4, 4]
      %25 = tanh(%24) : f32[4, 4]
      %26 = exp(%25) : f32[4, 4]
      %27 = sum(%26) {dims=[1], keepdim=false} : f32[4]
      %28 = sigmoid(%24) : f32[4, 4]
      return %18, %23, %27, %28
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %[[J:[0-9]+]] = fusion kiln_fused_mul_cat_0_and_mul_cat_1_and_tanh_exp_2(
    CHECK-SAME: : f32[1, 4, 1, 8]
    CHECK: cat(%[[P:[0-9]+]], %[[Q:[0-9]+]]) {dim=-1} : f32[1, 4, 1, 8]
    CHECK: cat(%[[R:[0-9]+]], %[[S:[0-9]+]]) {dim=-1} : f32[1, 2, 1, 8]
    CHECK: exp(
    CHECK: return %[[A:[0-9]+]], %[[B:[0-9]+]], %[[C:[0-9]+]]
    CHECK: %[[K:[0-9]+]] = result %[[J]] #1 : f32[1, 2, 1, 8]
    CHECK-NEXT: %[[E:[0-9]+]] = result %[[J]] #2 : f32[4, 4]
    CHECK-NEXT: sum(%[[E]])
    CHECK-NEXT: sigmoid(
    CHECK: return %[[J]], %[[K]],
  )")) << out;
  EXPECT_TRUE(Logged(ctx, {"horizontal fusion: kiln_fused_mul_cat_0 %6 and kiln_fused_mul_cat_1 %9",
                           "48 elements in all"}))
      << absl::StrJoin(ctx.explain, "\n");
}

// A cat stays a kernel of its own (its producers fuse apart) where its parts differ in shape or
// dtype; the explain log says why.
TEST(ElementwiseFusion, CatsOfPartsOfDifferentTypesStayApart) {
  ElementwiseFusion pass(codegen::PointwiseTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[2, 3], %11: f32[2, 5], %12: bf16[2, 3]) {
      %13 = tanh(%10) : f32[2, 3]
      %14 = neg(%11) : f32[2, 5]
      %15 = cat(%13, %14) {dim=1} : f32[2, 8]
      %16 = exp(%12) : bf16[2, 3]
      %17 = cat(%13, %16) {dim=0} : f32[4, 3]
      return %15, %17
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: cat(
    CHECK: cat(
    CHECK-NOT: fusion
  )")) << out;
  EXPECT_TRUE(Logged(ctx, {"cat %5 stays a kernel of its own", "operands of different shapes"}))
      << absl::StrJoin(ctx.explain, "\n");
  EXPECT_TRUE(
      Logged(ctx, {"cat %7 stays a kernel of its own", "dtype bfloat16 promoted to float32"}))
      << absl::StrJoin(ctx.explain, "\n");
}

// The GeGLU MLP after GEMM merge: one linear, its two halves, gelu_tanh(gate) * up.
constexpr char kGeglu[] = R"(
    graph(%10: bf16[4, 8, 64]@cuda:0, %11: bf16[192, 64]@cuda:0, %12: bf16[192]@cuda:0) {
      %13 = linear(%10, %11, %12) : bf16[4, 8, 192]@cuda:0
      %14 = slice(%13) {dim=-1, start=0, end=96, step=1} : bf16[4, 8, 96]@cuda:0
      %15 = slice(%13) {dim=2, start=96, end=192, step=1} : bf16[4, 8, 96]@cuda:0
      %16 = gelu(%15) {approximate=tanh} : bf16[4, 8, 96]@cuda:0
      %17 = mul(%16, %14) : bf16[4, 8, 96]@cuda:0
      return %17
    })";

TEST(GegluGemmFusion, MergedLinearGeluMulBecomesOneGemmNode) {
  GegluGemmFusion pass(codegen::GemmTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, kGeglu, &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %3 = fusion kiln_fused_linear_slice_gelu_mul_0(%0, %1, %2) : bf16[4, 8, 96]
    CHECK-NEXT: graph(%0: bf16[4, 8, 64], %1: bf16[192, 64], %2: bf16[192])
    CHECK-NEXT: %3 = linear(%0, %1, %2)
    CHECK-NEXT: %4 = slice(%3) {dim=-1, start=0, end=96, step=1}
    CHECK-NEXT: %5 = slice(%3) {dim=2, start=96, end=192, step=1}
    CHECK-NEXT: %6 = gelu(%5) {approximate=tanh}
    CHECK-NEXT: %7 = mul(%6, %4)
    CHECK-NEXT: return %7
    CHECK: return %3
  )")) << out;
  EXPECT_TRUE(Logged(ctx, {"gemm fusion: GeGLU: linear %3", "as one GEMM at %7"}));
}

TEST(GegluGemmFusion, RefusalsAreExplained) {
  struct Case {
    std::vector<std::pair<std::string, std::string>> edits;
    std::string why;
  };
  const Case cases[] = {
      {{{"@cuda:0", "@cpu"}}, "runs on CUDA only"},
      {{{"approximate=tanh", "approximate=none"}}, "erf's"},
      {{{"dim=2, start=96, end=192", "dim=2, start=0, end=96"}}, "not the two halves"},
      {{{"return %17", "return %17, %13"}}, "has other users or is a graph output"},
      {{{"bf16[192, 64]", "bf16[192, 60]"}, {"[4, 8, 64]", "[4, 8, 60]"}},
       "k a positive multiple of 8"},
      {{{"gelu(%15) {approximate=tanh}", "silu(%15)"}}, "the activation is not a GELU"},
      {{{"[4, 8, ", "[1, 1, "}}, "at most 8 rows: the GEMV's gated product serves them"},
  };
  for (const Case& c : cases) {
    const std::string ir = absl::StrReplaceAll(kGeglu, c.edits);
    GegluGemmFusion pass(codegen::GemmTemplate());
    PassContext ctx;
    const std::string out = RunPass(pass, ir, &ctx);
    EXPECT_EQ(out.find("fusion"), std::string::npos) << c.why << "\n" << out;
    EXPECT_TRUE(Logged(ctx, {"gemm fusion: mul %", c.why.c_str()}))
        << c.why << "\n"
        << absl::StrJoin(ctx.explain, "\n");
  }
  // Without the gated GEMV (CompileOptions::gated_gemv off) a decode-sized GeGLU is the family's.
  PassContext off;
  off.gated_gemv = false;
  GegluGemmFusion pass(codegen::GemmTemplate());
  EXPECT_NE(RunPass(pass, absl::StrReplaceAll(kGeglu, {{"[4, 8, ", "[1, 1, "}}), &off)
                .find("fusion kiln_fused_linear_slice_gelu_mul_0"),
            std::string::npos);
}

TEST(GemmEpilogueFusion, LinearBiasGeluTanhBecomesOneLinear) {
  GemmEpilogueFusion pass(codegen::GemmEpilogueTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%10: bf16[8, 16], %11: bf16[32, 16], %12: bf16[32]) {
      %13 = linear(%10, %11, %12) : bf16[8, 32]
      %14 = gelu(%13) {approximate=tanh} : bf16[8, 32]
      %15 = mul_scalar(%14) {scalar=2} : bf16[8, 32]
      return %15
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %3 = linear(%0, %1, %2) {epilogue=gelu_tanh} : bf16[8, 32]
    CHECK-NEXT: %4 = mul_scalar(%3) {scalar=2} : bf16[8, 32]
    CHECK-NOT: gelu(
  )"));
  EXPECT_TRUE(Logged(ctx, {"GEMM epilogue: linear %3 -> gelu %4", "epilogue=gelu_tanh"}));
}

TEST(GemmEpilogueFusion, ReluWithoutBiasAndAsGraphOutput) {
  GemmEpilogueFusion pass(codegen::GemmEpilogueTemplate());
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[2, 4, 16], %11: f32[32, 16]) {
      %12 = linear(%10, %11) : f32[2, 4, 32]
      %13 = relu(%12) : f32[2, 4, 32]
      return %13
    })");
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %2 = linear(%0, %1) {epilogue=relu} : f32[2, 4, 32]
    CHECK-NEXT: return %2
    CHECK-NOT: relu(
  )"));
}

// The gate of a GeGLU of two linears at decode (at most 8 rows) stays out of the gate linear's
// epilogue while the gated GEMV is on (it computes the whole product); off, or at 9 rows, it joins.
TEST(GemmEpilogueFusion, AGatedGemvsGateStaysOutOfTheEpilogue) {
  GemmEpilogueFusion pass(codegen::GemmEpilogueTemplate());
  auto ir = [](int rows) {
    return absl::StrReplaceAll(R"(
    graph(%0: bf16[R, 16]@cuda:0, %1: bf16[32, 16]@cuda:0, %2: bf16[32, 16]@cuda:0) {
      %3 = linear(%0, %1) : bf16[R, 32]@cuda:0
      %4 = linear(%0, %2) : bf16[R, 32]@cuda:0
      %5 = gelu(%3) {approximate=tanh} : bf16[R, 32]@cuda:0
      %6 = mul(%5, %4) : bf16[R, 32]@cuda:0
      return %6
    })",
                               {{"R", std::to_string(rows)}});
  };
  PassContext on;
  on.gated_gemv = true;
  EXPECT_TRUE(FileCheck(RunPass(pass, ir(8), &on), R"(
    CHECK: %3 = linear(%0, %1) : bf16[8, 32]
    CHECK: = gelu(%3) {approximate=tanh}
  )"));
  EXPECT_TRUE(Logged(on, {"not fused: linear %3 -> gelu %5",
                          "the gate of a gated product of at "
                          "most 8 rows"}))
      << absl::StrJoin(on.explain, "\n");
  PassContext off;
  off.gated_gemv = false;
  EXPECT_NE(RunPass(pass, ir(8), &off).find("{epilogue=gelu_tanh}"), std::string::npos);
  PassContext nine;
  nine.gated_gemv = true;
  EXPECT_NE(RunPass(pass, ir(9), &nine).find("{epilogue=gelu_tanh}"), std::string::npos);
}

TEST(GemmEpilogueFusion, ErfGeluIsNotFused) {
  GemmEpilogueFusion pass(codegen::GemmEpilogueTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[8, 16], %11: f32[32, 16], %12: f32[32]) {
      %13 = linear(%10, %11, %12) : f32[8, 32]
      %14 = gelu(%13) {approximate=none} : f32[8, 32]
      return %14
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %3 = linear(%0, %1, %2) : f32[8, 32]
    CHECK-NEXT: %4 = gelu(%3) {approximate=none} : f32[8, 32]
    CHECK-NOT: epilogue
  )"));
  EXPECT_TRUE(Logged(ctx, {"not fused: linear %3 -> gelu %4",
                           "GELU epilogue is the tanh approximation; erf GELU stays"}));
}

TEST(GemmEpilogueFusion, FanOutAndGraphOutputAreNotFused) {
  GemmEpilogueFusion pass(codegen::GemmEpilogueTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[8, 16], %11: f32[16, 16]) {
      %12 = linear(%10, %11) : f32[8, 16]
      %13 = relu(%12) : f32[8, 16]
      %14 = add(%13, %12) : f32[8, 16]
      %15 = linear(%14, %11) : f32[8, 16]
      %16 = gelu(%15) {approximate=tanh} : f32[8, 16]
      return %16, %15
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %2 = linear(%0, %1) : f32[8, 16]
    CHECK-NEXT: %3 = relu(%2)
    CHECK-NEXT: %4 = add(%3, %2)
    CHECK-NEXT: %5 = linear(%4, %1) : f32[8, 16]
    CHECK-NEXT: %6 = gelu(%5) {approximate=tanh}
    CHECK-NOT: epilogue
  )"));
  EXPECT_TRUE(Logged(ctx, {"not fused: linear %2 -> relu %3", "fan-out: %2 is also used by %4"}));
  EXPECT_TRUE(Logged(ctx, {"not fused: linear %5 -> gelu %6", "graph output"}));
}

TEST(GemmEpilogueFusion, ResidualAddBecomesTheGemmsC) {
  GemmEpilogueFusion pass(codegen::GemmEpilogueTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%10: bf16[8, 16], %11: bf16[32, 16], %12: bf16[32], %13: bf16[8, 32]) {
      %14 = linear(%10, %11, %12) : bf16[8, 32]
      %15 = add(%13, %14) : bf16[8, 32]
      %16 = mul_scalar(%15) {scalar=2} : bf16[8, 32]
      return %16
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %[[LIN:[0-9]+]] = linear(%0, %1, %2, %3) {epilogue=add} : bf16[8, 32]
    CHECK-NEXT: mul_scalar(%[[LIN]]) {scalar=2}
    CHECK-NOT: add(
  )"));
  EXPECT_TRUE(Logged(ctx, {"GEMM epilogue: linear %4 -> add %5", "epilogue=add", "residual %3"}));
}

TEST(GemmEpilogueFusion, ResidualAddsThatCannotBeTheGemmsC) {
  GemmEpilogueFusion pass(codegen::GemmEpilogueTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[8, 16], %11: f32[16, 16], %12: f32[16]) {
      %14 = linear(%10, %11) : f32[8, 16]
      %15 = add(%14, %12) : f32[8, 16]
      %16 = linear(%15, %11) : f32[8, 16]
      %17 = relu(%15) : f32[8, 16]
      %18 = add(%16, %17) : f32[8, 16]
      %19 = linear(%18, %11) : f32[8, 16]
      %20 = add(%19, %19) : f32[8, 16]
      %21 = linear(%20, %11) {epilogue=relu} : f32[8, 16]
      %22 = add(%21, %20) : f32[8, 16]
      return %22
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: = add(%[[L1:[0-9]+]], %2) : f32[8, 16]
    CHECK: = add(%[[L2:[0-9]+]], %[[R:[0-9]+]]) : f32[8, 16]
    CHECK: %[[L3:[0-9]+]] = linear(
    CHECK-NEXT: = add(%[[L3]], %[[L3]]) : f32[8, 16]
    CHECK: {epilogue=relu}
    CHECK-NEXT: = add(
    CHECK-NOT: epilogue=add
  )"));
  EXPECT_TRUE(Logged(ctx, {"not fused: linear %3 -> add %4", "no broadcasting"}));
  EXPECT_TRUE(Logged(ctx, {"not fused: linear %5 -> add %7", "computed after the linear"}));
  EXPECT_TRUE(Logged(ctx, {"not fused: linear %8 -> add %9", "reads the linear twice"}));
  EXPECT_TRUE(Logged(ctx, {"not fused: linear %10 -> add %11", "already has epilogue=relu"}));
}

TEST(GemmEpilogueFusion, OffSwitchAndCseKeepEpiloguesApart) {
  GemmEpilogueFusion pass(codegen::GemmEpilogueTemplate());
  PassContext off;
  off.disabled_families = {"gemm_epilogue"};
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(R"(
    graph(%0: f32[4, 8], %1: f32[8, 8]) {
      %2 = linear(%0, %1) : f32[4, 8]
      %3 = relu(%2) : f32[4, 8]
      return %3
    })");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE(*pass.Run(*g, off));
  CommonSubexpressionElimination cse;
  const std::string out = RunPass(cse, R"(
    graph(%10: f32[4, 8], %11: f32[8, 8]) {
      %12 = linear(%10, %11) {epilogue=relu} : f32[4, 8]
      %13 = linear(%10, %11) : f32[4, 8]
      %14 = add(%12, %13) : f32[4, 8]
      return %14
    })");
  EXPECT_TRUE(FileCheck(out, "CHECK: add(%2, %3)"));
}

// Equal values that outputs hold (directly, or through a view) stay two: eager returns two
// tensors, and a write into one must not show in the other. Equal values inside still merge.
TEST(CommonSubexpressionElimination, OutputsKeepTheirOwnValues) {
  CommonSubexpressionElimination cse;
  const std::string out = RunPass(cse, R"(
    graph(%0: f32[4, 2]) {
      %1 = relu(%0) : f32[4, 2]
      %2 = relu(%0) : f32[4, 2]
      %3 = relu(%0) : f32[4, 2]
      %4 = transpose(%3) {dim=0, dim2=1} : f32[2, 4]
      %5 = exp(%0) : f32[4, 2]
      %6 = exp(%0) : f32[4, 2]
      %7 = add(%5, %6) : f32[4, 2]
      return %1, %2, %4, %7
    })");
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %1 = relu(%0)
    CHECK: %2 = relu(%0)
    CHECK: %3 = relu(%0)
    CHECK: %4 = transpose(%3)
    CHECK: %5 = exp(%0)
    CHECK-NOT: exp(
    CHECK: add(%5, %5)
    CHECK: return %1, %2, %4, %6)"))
      << out;
}

// transformers' rotary embedding, q * cos + rotate_half(q) * sin: the mul by sin and then the add
// compute on the cat's two halves (cos and sin sliced, q * cos rebuilt on the slices), and the
// cat comes last, where the pointwise family stores it from one kernel.
TEST(CatSinking, RotateHalfRopeComputesOnTheHalves) {
  CatSinking pass;
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%0: f32[1, 4, 1, 16], %1: f32[1, 1, 1, 16], %2: f32[1, 1, 1, 16]) {
      %3 = slice(%0) {dim=-1, start=0, end=8, step=1} : f32[1, 4, 1, 8]
      %4 = slice(%0) {dim=-1, start=8, end=16, step=1} : f32[1, 4, 1, 8]
      %5 = neg(%4) : f32[1, 4, 1, 8]
      %6 = cat(%5, %3) {dim=-1} : f32[1, 4, 1, 16]
      %7 = mul(%0, %1) : f32[1, 4, 1, 16]
      %8 = mul(%6, %2) : f32[1, 4, 1, 16]
      %9 = add(%7, %8) : f32[1, 4, 1, 16]
      return %9
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %[[X2:[0-9]+]] = slice(%0) {dim=-1, start=8, end=16, step=1}
    CHECK: %[[NEG:[0-9]+]] = neg(%[[X2]])
    CHECK-NOT: = cat(
    CHECK: mul(%[[NEG]],
    CHECK: = add(
    CHECK: = add(
    CHECK: %[[OUT:[0-9]+]] = cat(%[[A:[0-9]+]], %[[B:[0-9]+]]) {dim=3} : f32[1, 4, 1, 16]
    CHECK: return %[[OUT]]
  )")) << out;
  EXPECT_TRUE(Logged(ctx, {"cat sinking: mul %8 computes on the 2 parts of cat %6"}))
      << absl::StrJoin(ctx.explain, "\n");
  EXPECT_TRUE(Logged(ctx, {"cat sinking: add %"})) << absl::StrJoin(ctx.explain, "\n");
  PassContext off;  // CompileOptions::cuda_cat_sinking off: CUDA values keep their cat
  off.cuda_cat_sinking = false;
  const std::string cuda = R"(
    graph(%0: f32[2, 4]@cuda:0, %1: f32[2, 4]@cuda:0, %2: f32[2, 8]@cuda:0) {
      %3 = cat(%0, %1) {dim=1} : f32[2, 8]@cuda:0
      %4 = mul(%3, %2) : f32[2, 8]@cuda:0
      return %4
    })";
  EXPECT_NE(RunPass(pass, cuda, &off).find("= cat(%0, %1)"), std::string::npos);
  EXPECT_TRUE(off.explain.empty()) << absl::StrJoin(off.explain, "\n");
  PassContext on;
  (void)RunPass(pass, cuda, &on);
  EXPECT_TRUE(Logged(on, {"cat sinking: mul %4"})) << absl::StrJoin(on.explain, "\n");
}

// What stays: a cat with another user (it is needed whole), a graph-output cat, an op that
// broadcasts the cat along its dim (a cat of one row and an empty part), a cat that promotes a
// part (the op would compute on it in bfloat16).
TEST(CatSinking, CatsNeededWholeStay) {
  const char* cases[] = {
      R"(graph(%0: f32[2, 4], %1: f32[2, 4]) {
        %2 = cat(%0, %1) {dim=1} : f32[2, 8]
        %3 = relu(%2) : f32[2, 8]
        %4 = add(%3, %2) : f32[2, 8]
        return %4 })",
      R"(graph(%0: f32[2, 4], %1: f32[2, 4]) {
        %2 = cat(%0, %1) {dim=1} : f32[2, 8]
        %3 = relu(%2) : f32[2, 8]
        return %3, %2 })",
      R"(graph(%0: f32[1, 4], %1: f32[0, 4], %2: f32[3, 4]) {
        %3 = cat(%0, %1) {dim=0} : f32[1, 4]
        %4 = add(%3, %2) : f32[3, 4]
        return %4 })",
      R"(graph(%0: f32[2, 4], %1: bf16[2, 4], %2: bf16[2, 8]) {
        %3 = cat(%0, %1) {dim=1} : f32[2, 8]
        %4 = mul(%3, %2) : f32[2, 8]
        return %4 })",
  };
  for (const char* ir : cases) {
    CatSinking pass;
    PassContext ctx;
    const std::string out = RunPass(pass, ir, &ctx);
    EXPECT_TRUE(ctx.explain.empty()) << out << absl::StrJoin(ctx.explain, "\n");
  }
}

// A decode step's norm and the linear after it (with its GEMM epilogue) become one fusion whose
// body is the norm, then the linear; the fusion has the linear's type.
TEST(NormLinearFusion, LayerNormThenLinearBecomesOneFusionOnCuda) {
  NormLinearFusion pass(codegen::NormLinearTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%10: bf16[2, 64]@cuda:0, %11: bf16[64]@cuda:0, %12: bf16[64]@cuda:0, %13: bf16[96, 64]@cuda:0, %14: bf16[96]@cuda:0, %19: bf16[64, 96]@cuda:0) {
      %15 = layer_norm(%10, %11, %12) {eps=1e-05} : bf16[2, 64]@cuda:0
      %16 = linear(%15, %13, %14) {epilogue=gelu_tanh} : bf16[2, 96]@cuda:0
      %17 = rms_norm(%16) {eps=1e-06} : bf16[2, 96]@cuda:0
      %18 = linear(%17, %19) : bf16[2, 64]@cuda:0
      return %18
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %6 = fusion kiln_fused_layer_norm_linear_0(%0, %1, %2, %3, %4) : bf16[2, 96]
    CHECK-NEXT: graph(%0: bf16[2, 64], %1: bf16[64], %2: bf16[64], %3: bf16[96, 64], %4: bf16[96])
    CHECK-NEXT: %5 = layer_norm(%0, %1, %2) {eps=
    CHECK-NEXT: %6 = linear(%5, %3, %4) {epilogue=gelu_tanh} : bf16[2, 96]
    CHECK-NEXT: return %6
    CHECK: %7 = fusion kiln_fused_rms_norm_linear_1(%6, %5) : bf16[2, 64]
    CHECK: %2 = rms_norm(%0) {eps=
    CHECK-NEXT: %3 = linear(%2, %1) : bf16[2, 64]
    CHECK-NOT: = layer_norm(
  )")) << out;
  EXPECT_TRUE(Logged(ctx, {"norm-linear fusion: %6 (layer_norm) -> linear %7", "one GEMV"}));
}

// A norm read by several linears (Llama's q, k and v projections) becomes one node with an
// output per linear; the other users of those outputs follow it.
TEST(NormLinearFusion, ANormFeedingSeveralLinearsIsOneNode) {
  NormLinearFusion pass(codegen::NormLinearTemplate());
  PassContext ctx;
  // %8, computed after the first linear but not from it, may be the residual of another.
  const std::string out = RunPass(pass, R"(
    graph(%0: bf16[1, 64]@cuda:0, %1: bf16[64]@cuda:0, %2: bf16[64, 64]@cuda:0, %3: bf16[32, 64]@cuda:0, %4: bf16[1, 32]@cuda:0) {
      %5 = rms_norm(%0, %1) {eps=1e-06} : bf16[1, 64]@cuda:0
      %6 = linear(%5, %2) : bf16[1, 64]@cuda:0
      %7 = relu(%6) : bf16[1, 64]@cuda:0
      %8 = neg(%4) : bf16[1, 32]@cuda:0
      %9 = linear(%5, %3, %8) {epilogue=add} : bf16[1, 32]@cuda:0
      %10 = linear(%5, %3) : bf16[1, 32]@cuda:0
      %11 = add(%9, %10) : bf16[1, 32]@cuda:0
      return %7, %11
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %5 = neg(%4)
    CHECK: %6 = fusion kiln_fused_rms_norm_linear_0(%0, %1, %2, %3, %5) : bf16[1, 32]
    CHECK: %5 = rms_norm(%0, %1) {eps=
    CHECK-NEXT: %6 = linear(%5, %2) : bf16[1, 64]
    CHECK-NEXT: %7 = linear(%5, %3, %4) {epilogue=add} : bf16[1, 32]
    CHECK-NEXT: %8 = linear(%5, %3) : bf16[1, 32]
    CHECK-NEXT: return %8, %6, %7
    CHECK: = result %6 #1 : bf16[1, 64]
    CHECK: = result %6 #2 : bf16[1, 32]
    CHECK: relu(
    CHECK: add(
    CHECK-NOT: = rms_norm(
  )")) << out;
  EXPECT_TRUE(Logged(ctx, {"norm-linear fusion: %5 (rms_norm) -> linear %6 %9 %10", "GEMVs"}))
      << absl::StrJoin(ctx.explain, "\n");
}

// What stays apart, and why: a CPU graph, more rows than the GEMV takes, a norm with a user
// that is not a linear, a linear whose residual depends on its sibling, a norm that is a graph
// output, the norm read as the linear's residual too.
TEST(NormLinearFusion, RefusalsAreExplained) {
  struct Case {
    const char* ir;
    const char* why;
  };
  const Case cases[] = {
      {R"(graph(%0: f32[1, 8]@cpu, %1: f32[4, 8]@cpu) {
            %2 = layer_norm(%0) {eps=1e-05} : f32[1, 8]@cpu
            %3 = linear(%2, %1) : f32[1, 4]@cpu
            return %3 })",
       "on the CPU the norm and the linear run as two ops anyway"},
      {R"(graph(%0: f32[16, 8]@cuda:0, %1: f32[4, 8]@cuda:0) {
            %2 = layer_norm(%0) {eps=1e-05} : f32[16, 8]@cuda:0
            %3 = linear(%2, %1) : f32[16, 4]@cuda:0
            return %3 })",
       "16 rows: the GEMV takes 1 to 8"},
      {R"(graph(%0: f32[1, 4]@cuda:0, %1: f32[4, 4]@cuda:0) {
            %2 = layer_norm(%0) {eps=1e-05} : f32[1, 4]@cuda:0
            %3 = linear(%2, %1) : f32[1, 4]@cuda:0
            %4 = add(%2, %3) : f32[1, 4]@cuda:0
            return %4 })",
       "fan-out: %2 is also used by %4, not a linear's x"},
      {R"(graph(%0: f32[1, 4]@cuda:0, %1: f32[4, 4]@cuda:0) {
            %2 = layer_norm(%0) {eps=1e-05} : f32[1, 4]@cuda:0
            %3 = linear(%2, %1) : f32[1, 4]@cuda:0
            %4 = relu(%3) : f32[1, 4]@cuda:0
            %5 = linear(%2, %1, %4) {epilogue=add} : f32[1, 4]@cuda:0
            return %5 })",
       "linear %5 reads %4, which depends on linear %3"},
      {R"(graph(%0: f32[1, 8]@cuda:0, %1: f32[4, 8]@cuda:0) {
            %2 = layer_norm(%0) {eps=1e-05} : f32[1, 8]@cuda:0
            %3 = linear(%2, %1) : f32[1, 4]@cuda:0
            return %3, %2 })",
       "%2 is a graph output"},
      {R"(graph(%0: f32[1, 8]@cuda:0, %1: f32[8, 8]@cuda:0) {
            %2 = layer_norm(%0) {eps=1e-05} : f32[1, 8]@cuda:0
            %3 = linear(%2, %1, %2) {epilogue=add} : f32[1, 8]@cuda:0
            return %3 })",
       "linear %3 also reads the norm as an operand"},
  };
  for (const Case& c : cases) {
    NormLinearFusion pass(codegen::NormLinearTemplate());
    PassContext ctx;
    const std::string out = RunPass(pass, c.ir, &ctx);
    EXPECT_EQ(out.find("fusion"), std::string::npos) << c.why << "\n" << out;
    EXPECT_TRUE(Logged(ctx, {"norm-linear fusion: not fused", c.why}))
        << absl::StrJoin(ctx.explain, "\n");
  }
}

// A Llama MLP at decode: the RMS norm, the merged gate/up linear (gate second) and
// silu(gate) * up become one node whose output is the product; q's linear of the same norm joins
// as a plain output. The down projection stays outside.
TEST(NormLinearFusion, AGatedProductJoinsItsLinear) {
  NormLinearFusion pass(codegen::NormLinearTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%0: bf16[1, 64]@cuda:0, %1: bf16[64]@cuda:0, %2: bf16[256, 64]@cuda:0, %3: bf16[64, 128]@cuda:0, %4: bf16[32, 64]@cuda:0) {
      %5 = rms_norm(%0, %1) {eps=1e-06} : bf16[1, 64]@cuda:0
      %6 = linear(%5, %2) : bf16[1, 256]@cuda:0
      %7 = slice(%6) {dim=-1, start=0, end=128, step=1} : bf16[1, 128]@cuda:0
      %8 = slice(%6) {dim=-1, start=128, end=256, step=1} : bf16[1, 128]@cuda:0
      %9 = silu(%8) : bf16[1, 128]@cuda:0
      %10 = mul(%9, %7) : bf16[1, 128]@cuda:0
      %11 = linear(%10, %3, %0) {epilogue=add} : bf16[1, 64]@cuda:0
      %12 = linear(%5, %4) : bf16[1, 32]@cuda:0
      return %11, %12
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %5 = fusion kiln_fused_rms_norm_linear_slice_silu_mul_linear_0(%0, %1, %2, %4) : bf16[1, 32]
    CHECK-NEXT: graph(
    CHECK-NEXT: %4 = rms_norm(%0, %1) {eps=
    CHECK-NEXT: %5 = linear(%4, %2) : bf16[1, 256]
    CHECK-NEXT: %6 = slice(%5) {dim=-1, start=0, end=128, step=1}
    CHECK-NEXT: %7 = slice(%5) {dim=-1, start=128, end=256, step=1}
    CHECK-NEXT: %8 = silu(%7)
    CHECK-NEXT: %9 = mul(%8, %6) : bf16[1, 128]
    CHECK-NEXT: %10 = linear(%4, %3) : bf16[1, 32]
    CHECK-NEXT: return %10, %9
    CHECK: %6 = result %5 #1 : bf16[1, 128]
    CHECK: = linear(%6, %3, %0) {epilogue=add} : bf16[1, 64]
    CHECK-NOT: = silu(
  )")) << out;
  EXPECT_TRUE(Logged(ctx, {"norm-linear fusion: %5 (rms_norm) -> linear %6 %12", "GEMVs",
                           "linear %6 with its gated product silu(%8) * %7 at %10"}))
      << absl::StrJoin(ctx.explain, "\n");
}

// transformers' MLP unmerged (gate_proj and up_proj, biases too): the two linears of the norm and
// their product are one node whose output is the product. Linears unlike each other (a bias on one)
// are no product: they join as two GEMVs.
TEST(NormLinearFusion, AGatedProductOfTwoLinearsJoinsThem) {
  NormLinearFusion pass(codegen::NormLinearTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%0: bf16[2, 64]@cuda:0, %1: bf16[64]@cuda:0, %2: bf16[128, 64]@cuda:0, %3: bf16[128]@cuda:0, %4: bf16[128, 64]@cuda:0, %5: bf16[128]@cuda:0, %6: bf16[64, 128]@cuda:0) {
      %7 = rms_norm(%0, %1) {eps=1e-06} : bf16[2, 64]@cuda:0
      %8 = linear(%7, %2, %3) : bf16[2, 128]@cuda:0
      %9 = linear(%7, %4, %5) : bf16[2, 128]@cuda:0
      %10 = silu(%8) : bf16[2, 128]@cuda:0
      %11 = mul(%10, %9) : bf16[2, 128]@cuda:0
      %12 = linear(%11, %6, %0) {epilogue=add} : bf16[2, 64]@cuda:0
      return %12
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %[[NODE:[0-9]+]] = fusion kiln_fused_rms_norm_linear_silu_mul_0(%0, %1, %2, %3, %4, %5) : bf16[2, 128]
    CHECK-NEXT: graph(
    CHECK-NEXT: %[[N:[0-9]+]] = rms_norm(%0, %1) {eps=
    CHECK-NEXT: %[[G:[0-9]+]] = linear(%[[N]], %2, %3) : bf16[2, 128]
    CHECK-NEXT: %[[U:[0-9]+]] = linear(%[[N]], %4, %5) : bf16[2, 128]
    CHECK-NEXT: %[[A:[0-9]+]] = silu(%[[G]])
    CHECK-NEXT: %[[P:[0-9]+]] = mul(%[[A]], %[[U]]) : bf16[2, 128]
    CHECK-NEXT: return %[[P]]
    CHECK: = linear(%[[NODE]], %6, %0) {epilogue=add} : bf16[2, 64]
    CHECK-NOT: = silu(
  )")) << out;
  EXPECT_TRUE(Logged(ctx, {"norm-linear fusion: %7 (rms_norm) -> linear %8 %9", "GEMVs",
                           "linear %8 with its gated product silu(%8) * %9 at %11"}))
      << absl::StrJoin(ctx.explain, "\n");

  PassContext other;
  const std::string apart = RunPass(pass, R"(
    graph(%0: bf16[2, 64]@cuda:0, %1: bf16[128, 64]@cuda:0, %2: bf16[128, 64]@cuda:0, %3: bf16[128]@cuda:0) {
      %4 = layer_norm(%0) {eps=1e-05} : bf16[2, 64]@cuda:0
      %5 = linear(%4, %1) : bf16[2, 128]@cuda:0
      %6 = linear(%4, %2, %3) : bf16[2, 128]@cuda:0
      %7 = gelu(%5) : bf16[2, 128]@cuda:0
      %8 = mul(%7, %6) : bf16[2, 128]@cuda:0
      return %8
    })",
                                    &other);
  EXPECT_TRUE(FileCheck(apart, R"(
    CHECK: fusion kiln_fused_layer_norm_linear_0(
    CHECK: = gelu(
    CHECK: = mul(
  )")) << apart;
}

// A gated product whose gate is also read elsewhere stays outside: the linear joins alone, and
// the log says why. Erf's GELU and relu are gates too (the kernel has both).
TEST(NormLinearFusion, AGatedProductWithOtherUsersStaysApart) {
  NormLinearFusion pass(codegen::NormLinearTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%0: f32[2, 16]@cuda:0, %1: f32[64, 16]@cuda:0) {
      %2 = layer_norm(%0) {eps=1e-05} : f32[2, 16]@cuda:0
      %3 = linear(%2, %1) : f32[2, 64]@cuda:0
      %4 = slice(%3) {dim=-1, start=0, end=32, step=1} : f32[2, 32]@cuda:0
      %5 = slice(%3) {dim=-1, start=32, end=64, step=1} : f32[2, 32]@cuda:0
      %6 = gelu(%4) : f32[2, 32]@cuda:0
      %7 = mul(%6, %5) : f32[2, 32]@cuda:0
      return %7, %6
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %2 = fusion kiln_fused_layer_norm_linear_0(%0, %1) : f32[2, 64]
    CHECK: = gelu(
    CHECK: = mul(
  )")) << out;
  EXPECT_TRUE(Logged(ctx, {"linear %3 joins without its gated product", "%6 has other users"}))
      << absl::StrJoin(ctx.explain, "\n");
  const char* relu_ir = R"(
    graph(%0: f16[8, 16]@cuda:0, %1: f16[64, 16]@cuda:0) {
      %2 = layer_norm(%0) {eps=1e-05} : f16[8, 16]@cuda:0
      %3 = linear(%2, %1) : f16[8, 64]@cuda:0
      %4 = slice(%3) {dim=-1, start=0, end=32, step=1} : f16[8, 32]@cuda:0
      %5 = slice(%3) {dim=-1, start=32, end=64, step=1} : f16[8, 32]@cuda:0
      %6 = relu(%4) : f16[8, 32]@cuda:0
      %7 = mul(%5, %6) : f16[8, 32]@cuda:0
      return %7
    })";
  PassContext relu;
  EXPECT_NE(
      RunPass(pass, relu_ir, &relu).find("fusion kiln_fused_layer_norm_linear_slice_relu_mul_0"),
      std::string::npos)
      << absl::StrJoin(relu.explain, "\n");
  PassContext off;  // CompileOptions::gated_gemv off: the linear alone
  off.gated_gemv = false;
  const std::string alone = RunPass(pass, relu_ir, &off);
  EXPECT_TRUE(FileCheck(alone, R"(
    CHECK: fusion kiln_fused_layer_norm_linear_0(
    CHECK: = relu(
  )")) << alone;
}

TEST(NormLinearFusion, MixedDtypesAndTheSwitch) {
  const char* ir = R"(graph(%0: bf16[1, 8]@cuda:0, %1: f32[8]@cuda:0, %2: bf16[4, 8]@cuda:0) {
      %3 = layer_norm(%0, %1) {eps=1e-05} : bf16[1, 8]@cuda:0
      %4 = linear(%3, %2) : bf16[1, 4]@cuda:0
      return %4 })";
  NormLinearFusion pass(codegen::NormLinearTemplate());
  PassContext ctx;
  EXPECT_EQ(RunPass(pass, ir, &ctx).find("fusion"), std::string::npos);
  EXPECT_TRUE(Logged(ctx, {"not fused: %3 (layer_norm) -> linear %4", "several dtypes"}));
  const char* same = R"(graph(%0: bf16[1, 8]@cuda:0, %1: bf16[4, 8]@cuda:0) {
      %2 = layer_norm(%0) {eps=1e-05} : bf16[1, 8]@cuda:0
      %3 = linear(%2, %1) : bf16[1, 4]@cuda:0
      return %3 })";
  PassContext on;
  EXPECT_NE(RunPass(pass, same, &on).find("fusion kiln_fused_layer_norm_linear_0"),
            std::string::npos);
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(same);
  ASSERT_TRUE(g.ok());
  PassContext off;
  off.disabled_families = {"norm_linear"};
  EXPECT_FALSE(*pass.Run(*g, off));
}

TEST(SoftmaxFusion, AttentionScaleMaskSoftmaxAndCastBecomeOneFusion) {
  SoftmaxFusion pass(codegen::SoftmaxTemplate());
  const std::string out = RunPass(pass, R"(
    graph(%10: bf16[2, 4, 16, 16], %11: bf16[2, 4, 16, 16], %12: bool[16, 16]) {
      %13 = matmul(%10, %11) {transpose_b=true} : bf16[2, 4, 16, 16]
      %14 = mul_scalar(%13) {scalar=0.125} : bf16[2, 4, 16, 16]
      %15 = masked_fill(%14, %12) {scalar=-inf} : bf16[2, 4, 16, 16]
      %16 = softmax(%15) {dim=-1} : bf16[2, 4, 16, 16]
      %17 = cast(%16) {dtype=f32} : f32[2, 4, 16, 16]
      %18 = matmul(%17, %17) : f32[2, 4, 16, 16]
      return %18
    })");
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %3 = matmul(%0, %1) {transpose_b=true}
    CHECK-NEXT: %4 = fusion kiln_fused_mul_scalar_masked_fill_softmax_cast_0(%3, %2) : f32[2, 4, 16, 16]
    CHECK-NEXT: graph(%0: bf16[2, 4, 16, 16], %1: bool[16, 16])
    CHECK-NEXT: %2 = mul_scalar(%0) {scalar=0.125}
    CHECK-NEXT: %3 = masked_fill(%2, %1) {scalar=-inf}
    CHECK-NEXT: %4 = softmax(%3) {dim=-1} : bf16[2, 4, 16, 16]
    CHECK-NEXT: %5 = cast(%4) {dtype=f32} : f32[2, 4, 16, 16]
    CHECK-NEXT: return %5
    CHECK: %5 = matmul(%4, %4)
    CHECK-NOT: softmax(
  )"));
}

TEST(SoftmaxFusion, FanOutAndOtherDimsAreNotAbsorbed) {
  SoftmaxFusion pass(codegen::SoftmaxTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[4, 8], %11: f32[8]) {
      %12 = mul_scalar(%10) {scalar=0.5} : f32[4, 8]
      %13 = add(%12, %11) : f32[4, 8]
      %14 = softmax(%13) {dim=-1} : f32[4, 8]
      %15 = exp(%10) : f32[4, 8]
      %16 = softmax(%15) {dim=0} : f32[4, 8]
      %17 = add(%14, %16) : f32[4, 8]
      %18 = add(%17, %12) : f32[4, 8]
      return %18
    })",
                                  &ctx);
  // %12 also feeds the final add: it materialises; the add of the broadcast [8] joins the
  // softmax. The dim-0 softmax is left alone with its exp.
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %2 = mul_scalar(%0) {scalar=0.5}
    CHECK-NEXT: fusion kiln_fused_add_softmax_0(%2, %1) : f32[4, 8]
    CHECK-NEXT: graph(%0: f32[4, 8], %1: f32[8])
    CHECK-NEXT: add(%0, %1)
    CHECK-NEXT: softmax(%2) {dim=-1}
    CHECK-NOT: mul_scalar(
    CHECK: exp(%0)
    CHECK-NEXT: softmax(
    CHECK-NOT: fusion
  )"));
  EXPECT_TRUE(Logged(ctx,
                     "softmax fusion: not fused: %2 (mul_scalar) into the group of %4: "
                     "fan-out: also used by %8"))
      << absl::StrJoin(ctx.explain, "\n");
  EXPECT_TRUE(Logged(ctx,
                     "softmax fusion: %6 (softmax) stays alone: over dim 0 of [4, 8], not "
                     "the last dim"))
      << absl::StrJoin(ctx.explain, "\n");
  // Its elementwise consumer is not a cast.
  EXPECT_TRUE(Logged(ctx, "not fused: %7 (add) after the softmax %4: only a cast is fused"))
      << absl::StrJoin(ctx.explain, "\n");
}

// A chain over 40 inputs: the group stops at the kernel's operand budget (32), the producers
// beyond it stay plain ops.
std::string AddChainIr(int inputs, const std::string& tail) {
  std::string ir = "graph(";
  for (int i = 0; i < inputs; ++i) absl::StrAppend(&ir, i ? ", " : "", "%", i, ": f32[4, 8]");
  absl::StrAppend(&ir, ") {\n  %", inputs, " = add(%0, %1) : f32[4, 8]\n");
  for (int i = 2; i < inputs; ++i) {
    absl::StrAppend(&ir, "  %", inputs + i - 1, " = add(%", inputs + i - 2, ", %", i,
                    ") : f32[4, 8]\n");
  }
  return absl::StrCat(ir, tail);
}

TEST(SoftmaxFusion, OperandBudgetAndSwitch) {
  const std::string ir =
      AddChainIr(40, "  %79 = softmax(%78) {dim=1} : f32[4, 8]\n  return %79\n}");
  SoftmaxFusion pass(codegen::SoftmaxTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, ir, &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %[[LAST:[0-9]+]] = add(%[[P:[0-9]+]], %9)
    CHECK-NEXT: fusion kiln_fused_add_softmax_0(%[[LAST]], %10, %11,
    CHECK-SAME: %39)
    CHECK: softmax(
    CHECK-NEXT: return
    CHECK-NOT: add(
  )"));
  EXPECT_TRUE(Logged(ctx, "the kernel would have more than 32 inputs and outputs"))
      << absl::StrJoin(ctx.explain, "\n");
  absl::StatusOr<ir::Graph> fused = ir::ParseGraph(out);
  ASSERT_TRUE(fused.ok());
  for (const ir::Node& n : fused->nodes()) {
    if (n.kind == ir::NodeKind::kFusion) EXPECT_EQ(n.inputs.size(), 31u);  // + the output: 32
  }
  // Off: nothing changes.
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(ir);
  ASSERT_TRUE(g.ok());
  PassContext off;
  off.disabled_families = {"softmax"};
  EXPECT_FALSE(*pass.Run(*g, off));
}

// ---- Attention fusion ------------------------------------------------------------------------

TEST(AttentionFusion, NaiveAttentionWithAnAdditiveMaskAndTheScaleOnQ) {
  AttentionFusion pass(codegen::AttentionTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[2, 4, 16, 8]@cpu, %11: f32[2, 4, 16, 8]@cpu, %12: f32[2, 4, 16, 8]@cpu,
          %13: f32[16, 16]@cpu) {
      %14 = mul_scalar(%10) {scalar=0.5} : f32[2, 4, 16, 8]@cpu
      %15 = matmul(%14, %11) {transpose_b=true} : f32[2, 4, 16, 16]@cpu
      %16 = div_scalar(%15) {scalar=2} : f32[2, 4, 16, 16]@cpu
      %17 = add(%16, %13) : f32[2, 4, 16, 16]@cpu
      %18 = softmax(%17) {dim=-1} : f32[2, 4, 16, 16]@cpu
      %19 = matmul(%18, %12) : f32[2, 4, 16, 8]@cpu
      return %19
    })",
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: graph(%[[Q:[0-9]+]]: f32[2, 4, 16, 8]@cpu, %[[K:[0-9]+]]: f32[2, 4, 16, 8]@cpu, %[[V:[0-9]+]]: f32[2, 4, 16, 8]@cpu, %[[M:[0-9]+]]: f32[16, 16]@cpu)
    CHECK-NEXT: %[[A:[0-9]+]] = scaled_dot_product_attention(%[[Q]], %[[K]], %[[V]], %[[M]]) {scale=0.25}
    CHECK-NEXT: return %[[A]]
    CHECK-NOT: softmax
  )"));
  EXPECT_TRUE(Logged(ctx, "became one scaled_dot_product_attention (scale 0.25, with a mask)"))
      << absl::StrJoin(ctx.explain, "\n");
}

// A bool mask known only at run time (an input) becomes an additive mask computed each call.
TEST(AttentionFusion, AMaskInputBecomesAnAdditiveMask) {
  AttentionFusion pass(codegen::AttentionTemplate());
  const std::string out = RunPass(pass, R"(
    graph(%10: bf16[2, 16, 64]@cpu, %11: bf16[2, 16, 64]@cpu, %12: bf16[2, 16, 64]@cpu,
          %13: bool[16, 16]@cpu) {
      %14 = matmul(%10, %11) {transpose_b=true} : bf16[2, 16, 16]@cpu
      %15 = masked_fill(%14, %13) {scalar=-inf} : bf16[2, 16, 16]@cpu
      %16 = mul_scalar(%15) {scalar=0.125} : bf16[2, 16, 16]@cpu
      %17 = softmax(%16) {dim=-1} : bf16[2, 16, 16]@cpu
      %18 = matmul(%17, %12) : bf16[2, 16, 64]@cpu
      return %18
    })");
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %[[Z:[0-9]+]] = constant "zeros_
    CHECK-NEXT: %[[A:[0-9]+]] = masked_fill(%[[Z]], %3) {scalar=-inf} : bf16[16, 16]@cpu
    CHECK-NEXT: scaled_dot_product_attention(%0, %1, %2, %[[A]]) {scale=0.125}
    CHECK-NOT: softmax
  )"));
}

TEST(AttentionFusion, NearMissesAreExplained) {
  struct Case {
    const char* tail;
    const char* why;
  };
  const Case cases[] = {
      {R"(%14 = softmax(%13) {dim=-1} : f32[2, 16, 16]@cpu
          %15 = matmul(%14, %12) : f32[2, 16, 8]@cpu
          return %15, %13)",
       "the scores are used elsewhere"},
      {R"(%14 = softmax(%13) {dim=-1} : f32[2, 16, 16]@cpu
          %15 = matmul(%14, %12) : f32[2, 16, 8]@cpu
          return %15, %14)",
       "the probabilities are used elsewhere"},
      {R"(%14 = softmax(%13) {dim=1} : f32[2, 16, 16]@cpu
          %15 = matmul(%14, %12) : f32[2, 16, 8]@cpu
          return %15)",
       "the softmax is not over the last dim"},
      {R"(%20 = masked_fill(%13, %16) {scalar=-100} : f32[2, 16, 16]@cpu
          %14 = softmax(%20) {dim=-1} : f32[2, 16, 16]@cpu
          %15 = matmul(%14, %12) : f32[2, 16, 8]@cpu
          return %15)",
       "the masked_fill value is not -inf"},
  };
  for (const Case& c : cases) {
    AttentionFusion pass(codegen::AttentionTemplate());
    PassContext ctx;
    const std::string out = RunPass(pass,
                                    absl::StrCat(R"(
      graph(%10: f32[2, 16, 8]@cpu, %11: f32[2, 16, 8]@cpu, %12: f32[2, 16, 8]@cpu,
            %16: bool[16, 16]@cpu) {
        %13 = matmul(%10, %11) {transpose_b=true} : f32[2, 16, 16]@cpu
        )",
                                                 c.tail, "\n}"),
                                    &ctx);
    EXPECT_TRUE(FileCheck(out, "CHECK: softmax(\nCHECK-NOT: scaled_dot_product_attention"))
        << c.why;
    EXPECT_TRUE(Logged(ctx, c.why)) << c.why << "\n" << absl::StrJoin(ctx.explain, "\n");
  }
}

// A decode step's KV-cache writes and the attention reading the caches: one fusion node whose
// body is the three ops, the updated caches its further outputs.
constexpr char kKvAppendInputs[] = R"(
    graph(%0: bf16[2, 4, 1, 64]@cpu, %1: bf16[2, 2, 16, 64]@cpu, %2: bf16[2, 2, 16, 64]@cpu,
          %3: i64[1]@cpu, %4: bf16[2, 2, 1, 64]@cpu, %5: bf16[2, 2, 1, 64]@cpu,
          %6: bool[1, 1, 1, 16]@cpu, %7: i64[1]@cpu) {
)";

TEST(AttentionFusion, AKvCacheAppendJoinsTheAttentionReadingTheCaches) {
  AttentionFusion pass(codegen::AttentionTemplate());
  PassContext ctx;
  const std::string out = RunPass(pass, absl::StrCat(kKvAppendInputs, R"(
      %8 = index_copy(%1, %3, %4) {dim=2} : bf16[2, 2, 16, 64]@cpu
      %9 = index_copy(%2, %3, %5) {dim=-2} : bf16[2, 2, 16, 64]@cpu
      %10 = scaled_dot_product_attention(%0, %8, %9, %6) {scale=0.125, enable_gqa=true} : bf16[2, 4, 1, 64]@cpu
      return %10, %8, %9
    })"),
                                  &ctx);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %[[F:[0-9]+]] = fusion kiln_fused_index_copy_scaled_dot_product_attention_0(%1, %3, %4, %2, %5, %0, %6) : bf16[2, 4, 1, 64]@cpu
    CHECK: index_copy(
    CHECK: index_copy(
    CHECK: scaled_dot_product_attention(
    CHECK: %[[K:[0-9]+]] = result %[[F]] #1 : bf16[2, 2, 16, 64]@cpu
    CHECK-NEXT: %[[V:[0-9]+]] = result %[[F]] #2 : bf16[2, 2, 16, 64]@cpu
    CHECK-NEXT: return %[[F]], %[[K]], %[[V]]
  )")) << out;
  EXPECT_TRUE(Logged(ctx, "one kernel writes the new rows and attends over them"))
      << absl::StrJoin(ctx.explain, "\n");
  absl::StatusOr<ir::Graph> fused = ir::ParseGraph(out);
  ASSERT_TRUE(fused.ok()) << fused.status().message();
  int nodes = 0;
  for (const ir::Node& n : fused->nodes()) {
    if (n.kind != ir::NodeKind::kFusion) continue;
    ++nodes;
    passes::KvAppendBody roles;
    ASSERT_TRUE(passes::ParseKvAppendBody(*n.body, &roles));
    EXPECT_EQ(roles.q, 5);
    EXPECT_EQ(roles.k_cache, 0);
    EXPECT_EQ(roles.v_cache, 3);
    EXPECT_EQ(roles.slots, 1);
    EXPECT_EQ(roles.mask, 6);
    EXPECT_EQ(roles.k_out, 1);
    EXPECT_EQ(roles.v_out, 2);
    EXPECT_EQ(roles.dim, 2);
    EXPECT_TRUE(roles.attention.enable_gqa);
  }
  EXPECT_EQ(nodes, 1);
}

TEST(AttentionFusion, KvAppendNearMissesAreExplained) {
  struct Case {
    const char* body;
    const char* why;
  };
  const Case cases[] = {
      {R"(%8 = index_copy(%1, %3, %4) {dim=2} : bf16[2, 2, 16, 64]@cpu
          %9 = index_copy(%2, %7, %5) {dim=2} : bf16[2, 2, 16, 64]@cpu)",
       "the key and value rows go to different index tensors"},
      {R"(%8 = index_copy(%1, %3, %4) {dim=2} : bf16[2, 2, 16, 64]@cpu
          %9 = index_copy(%1, %3, %5) {dim=2} : bf16[2, 2, 16, 64]@cpu)",
       "the key and value caches are one tensor"},
      {R"(%11 = slice(%1) {dim=0, start=1, end=2, step=1} : bf16[1, 2, 16, 64]@cpu
          %8 = index_copy(%1, %3, %11) {dim=0} : bf16[2, 2, 16, 64]@cpu
          %9 = index_copy(%2, %3, %5) {dim=2} : bf16[2, 2, 16, 64]@cpu)",
       "the rows are not written along the key-row dim (-2)"},
  };
  for (const Case& c : cases) {
    AttentionFusion pass(codegen::AttentionTemplate());
    PassContext ctx;
    const std::string out = RunPass(pass, absl::StrCat(kKvAppendInputs, c.body, R"(
        %10 = scaled_dot_product_attention(%0, %8, %9, %6) {scale=0.125, enable_gqa=true} : bf16[2, 4, 1, 64]@cpu
        return %10, %8, %9
      })"),
                                    &ctx);
    EXPECT_TRUE(FileCheck(out, "CHECK-NOT: fusion")) << c.why << "\n" << out;
    EXPECT_TRUE(Logged(ctx, c.why)) << c.why << "\n" << absl::StrJoin(ctx.explain, "\n");
  }
}

// Eight query rows (a prefill, not a decode step) keep the writes apart; so does a query that
// depends on the write (the node would read its own output).
TEST(AttentionFusion, KvAppendNeedsADecodeStepThatDoesNotReadItsOwnWrite) {
  AttentionFusion pass(codegen::AttentionTemplate());
  PassContext ctx;
  std::string out = RunPass(pass, R"(
    graph(%0: bf16[2, 2, 8, 64]@cpu, %1: bf16[2, 2, 16, 64]@cpu, %2: bf16[2, 2, 16, 64]@cpu,
          %3: i64[1]@cpu, %4: bf16[2, 2, 1, 64]@cpu, %5: bf16[2, 2, 1, 64]@cpu) {
      %8 = index_copy(%1, %3, %4) {dim=2} : bf16[2, 2, 16, 64]@cpu
      %9 = index_copy(%2, %3, %5) {dim=2} : bf16[2, 2, 16, 64]@cpu
      %10 = scaled_dot_product_attention(%0, %8, %9) {scale=0.125} : bf16[2, 2, 8, 64]@cpu
      return %10, %8, %9
    })",
                            &ctx);
  EXPECT_TRUE(FileCheck(out, "CHECK-NOT: fusion")) << out;
  EXPECT_TRUE(Logged(ctx, "up to 4 query rows")) << absl::StrJoin(ctx.explain, "\n");
  PassContext ctx2;
  out = RunPass(pass, R"(
    graph(%1: bf16[2, 2, 16, 64]@cpu, %2: bf16[2, 2, 16, 64]@cpu,
          %3: i64[1]@cpu, %4: bf16[2, 2, 1, 64]@cpu, %5: bf16[2, 2, 1, 64]@cpu) {
      %8 = index_copy(%1, %3, %4) {dim=2} : bf16[2, 2, 16, 64]@cpu
      %9 = index_copy(%2, %3, %5) {dim=2} : bf16[2, 2, 16, 64]@cpu
      %11 = slice(%8) {dim=2, start=0, end=1, step=1} : bf16[2, 2, 1, 64]@cpu
      %10 = scaled_dot_product_attention(%11, %8, %9) {scale=0.125} : bf16[2, 2, 1, 64]@cpu
      return %10, %8, %9
    })",
                &ctx2);
  EXPECT_TRUE(FileCheck(out, "CHECK-NOT: fusion")) << out;
  EXPECT_TRUE(Logged(ctx2, "depends on the writes")) << absl::StrJoin(ctx2.explain, "\n");
}

// The rotary embedding of a decode step's query and new keys (kiln's RotaryEmbedding traced: the
// halves, four products, a difference, a sum and a cat) joins the KV-append attention node when
// PassContext::kv_rope is on: one fusion whose body holds the rotations, the tables its inputs.
// `q_rot` / `k_rot` replace the lines that rotate q (%0) and the new keys (%4).
std::string RotaryDecodeStep(const std::string& q_rot, const std::string& k_rot,
                             const std::string& tail = "return %10, %8, %9") {
  return absl::StrCat(R"(
    graph(%0: bf16[2, 4, 1, 64]@cpu, %1: bf16[2, 2, 16, 64]@cpu, %2: bf16[2, 2, 16, 64]@cpu,
          %3: i64[1]@cpu, %4: bf16[2, 2, 1, 64]@cpu, %5: bf16[2, 2, 1, 64]@cpu,
          %6: bool[1, 1, 1, 16]@cpu, %20: bf16[2, 1, 1, 32]@cpu, %21: bf16[2, 1, 1, 32]@cpu,
          %22: bf16[2, 1, 1, 32]@cpu) {
)",
                      q_rot, k_rot, R"(
      %8 = index_copy(%1, %3, %48) {dim=2} : bf16[2, 2, 16, 64]@cpu
      %9 = index_copy(%2, %3, %5) {dim=2} : bf16[2, 2, 16, 64]@cpu
      %10 = scaled_dot_product_attention(%38, %8, %9, %6) {scale=0.125, enable_gqa=true} : bf16[2, 4, 1, 64]@cpu
      )",
                      tail, "\n}");
}

// x [B, H, 1, 64] rotated by the tables %cos, %sin into %out (values %first.. %first+7 for the
// steps): the products in the operand orders RotaryEmbedding traces, or swapped.
std::string Rotation(int x, int heads, int out, int first, int cos, int sin, bool swapped) {
  const std::string h = absl::StrCat("bf16[2, ", heads, ", 1, 32]@cpu");
  auto v = [&](int i) { return absl::StrCat("%", first + i); };
  return absl::StrCat(v(0), " = slice(%", x, ") {dim=-1, start=0, end=32, step=1} : ", h, "\n",
                      v(1), " = slice(%", x, ") {dim=3, start=32, end=64, step=1} : ", h, "\n",
                      v(2), " = mul(", v(0), ", %", cos, ") : ", h, "\n", v(3), " = mul(", v(1),
                      ", %", sin, ") : ", h, "\n", v(4), " = sub(", v(2), ", ", v(3), ") : ", h,
                      "\n", v(5),
                      swapped ? absl::StrCat(" = mul(%", cos, ", ", v(1), ") : ")
                              : absl::StrCat(" = mul(", v(1), ", %", cos, ") : "),
                      h, "\n", v(6), " = mul(", v(0), ", %", sin, ") : ", h, "\n", v(7),
                      swapped ? absl::StrCat(" = add(", v(6), ", ", v(5), ") : ")
                              : absl::StrCat(" = add(", v(5), ", ", v(6), ") : "),
                      h, "\n", "%", out, " = cat(", v(4), ", ", v(7), ") {dim=-1} : bf16[2, ",
                      heads, ", 1, 64]@cpu\n");
}

TEST(AttentionFusion, TheRotaryEmbeddingOfADecodeStepJoinsItsKvAppend) {
  for (bool swapped : {false, true}) {
    AttentionFusion pass(codegen::AttentionTemplate());
    PassContext ctx;
    const std::string out = RunPass(pass,
                                    RotaryDecodeStep(Rotation(0, 4, 38, 30, 20, 21, swapped),
                                                     Rotation(4, 2, 48, 40, 20, 21, !swapped)),
                                    &ctx);
    EXPECT_TRUE(FileCheck(out, R"(
      CHECK: %[[F:[0-9]+]] = fusion kiln_fused_slice_mul_sub_mul_add_scaled_dot_product_attention_0(%0, %7, %8, %4, %1, %3, %2, %5, %6) : bf16[2, 4, 1, 64]@cpu
      CHECK-COUNT-2: cat(
      CHECK: index_copy(
      CHECK: scaled_dot_product_attention(
      CHECK: result %[[F]] #1
      CHECK-NOT: cat(
    )")) << out;
    EXPECT_TRUE(Logged(ctx, "rotating the query and the new keys"))
        << absl::StrJoin(ctx.explain, "\n");
    const ir::Graph fused = ValueOrThrow(ir::ParseGraph(out));
    int nodes = 0;
    for (const ir::Node& n : fused.nodes()) {
      if (n.kind != ir::NodeKind::kFusion) continue;
      ++nodes;
      passes::KvAppendBody roles;
      ASSERT_TRUE(passes::ParseKvAppendBody(*n.body, &roles)) << out;
      EXPECT_EQ(roles.q, 0);  // the rows before their rotation
      EXPECT_EQ(roles.cos, 1);
      EXPECT_EQ(roles.sin, 2);
      EXPECT_EQ(roles.k_new, 3);
      EXPECT_EQ(roles.k_cache, 4);
      EXPECT_EQ(roles.slots, 5);
    }
    EXPECT_EQ(nodes, 1);
  }
  // Off (CompileOptions::kv_rope, KILN_KV_ROPE): the append joins, the rotations stay outside.
  AttentionFusion pass(codegen::AttentionTemplate());
  PassContext off;
  off.kv_rope = false;
  const std::string out = RunPass(pass,
                                  RotaryDecodeStep(Rotation(0, 4, 38, 30, 20, 21, false),
                                                   Rotation(4, 2, 48, 40, 20, 21, false)),
                                  &off);
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %[[Q:[0-9]+]] = cat(
    CHECK: %[[K:[0-9]+]] = cat(
    CHECK: fusion kiln_fused_index_copy_scaled_dot_product_attention_0(%1, %3, %[[K]], %2, %5, %[[Q]], %6)
  )")) << out;
}

TEST(AttentionFusion, RotaryNearMissesStayOutsideTheKvAppend) {
  struct Case {
    std::string graph;
    const char* why;
  };
  const std::string q = Rotation(0, 4, 38, 30, 20, 21, false);
  const std::string k = Rotation(4, 2, 48, 40, 20, 21, false);
  const Case cases[] = {
      {RotaryDecodeStep(q, "%48 = neg(%4) : bf16[2, 2, 1, 64]@cpu\n"),
       "only the query is a rotation"},
      {RotaryDecodeStep(q, Rotation(4, 2, 48, 40, 22, 21, false)),
       "the query and the new key rotate by different tables"},
      {RotaryDecodeStep(q, k, "return %10, %8, %9, %38"),
       "a rotated query or key is used elsewhere"},
  };
  for (const Case& c : cases) {
    AttentionFusion pass(codegen::AttentionTemplate());
    PassContext ctx;
    const std::string out = RunPass(pass, c.graph, &ctx);
    EXPECT_TRUE(FileCheck(
        out, "CHECK: cat(\nCHECK: fusion kiln_fused_index_copy_scaled_dot_product_attention_0("))
        << c.why << "\n"
        << out;
    EXPECT_TRUE(Logged(ctx, c.why)) << c.why << "\n" << absl::StrJoin(ctx.explain, "\n");
  }
}

TEST(SoftmaxFusion, ALoneSoftmaxStaysAnOpAndElementwiseFusionSkipsTheFusion) {
  Pipeline p;
  p.Add(std::make_unique<SoftmaxFusion>(codegen::SoftmaxTemplate()));
  p.Add(std::make_unique<ElementwiseFusion>(codegen::PointwiseTemplate()));
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(R"(
    graph(%10: f32[4, 8], %11: f32[4, 8]) {
      %12 = softmax(%10) {dim=-1} : f32[4, 8]
      %13 = tanh(%11) : f32[4, 8]
      %14 = softmax(%13) {dim=-1} : f32[4, 8]
      %15 = mul(%14, %12) : f32[4, 8]
      %16 = neg(%15) : f32[4, 8]
      return %16
    })");
  ASSERT_TRUE(g.ok());
  PassContext ctx;
  ASSERT_TRUE(p.Run(*g, ctx).ok());
  EXPECT_TRUE(FileCheck(ir::PrintGraph(*g), R"(
    CHECK: %2 = softmax(%0) {dim=-1}
    CHECK-NEXT: %3 = fusion kiln_fused_tanh_softmax_0(%1)
    CHECK: fusion kiln_fused_mul_neg_0(%3, %2)
  )"));
}

TEST(CommonSubexpressionElimination, MergesEqualOps) {
  CommonSubexpressionElimination pass;
  const std::string out = RunPass(pass, R"(
    graph(%10: f32[4]) {
      %11 = tanh(%10) : f32[4]
      %12 = tanh(%10) : f32[4]
      %13 = add(%11, %12) : f32[4]
      return %13
    })");
  EXPECT_TRUE(FileCheck(out, R"(
    CHECK: %1 = tanh(%0)
    CHECK-NEXT: %2 = add(%1, %1)
  )"));
}

}  // namespace
}  // namespace kiln::passes
