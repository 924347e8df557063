// Tests of the graph IR: building graphs (by hand and by tracing), the text form (printing,
// parsing, round trips, parse errors), the verifier, and the FileCheck matcher the pass tests
// use. Everything runs on Meta/CPU types: no GPU needed.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "codegen/fusion_template.h"
#include "ir/graph.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/tracer.h"
#include "ir/verifier.h"
#include "ops/factories.h"
#include "ops/kernel_ir.h"
#include "ops/ops.h"
#include "runtime/status.h"
#include "tests/filecheck.h"

namespace kiln::ir {
namespace {

TensorType T(Shape shape, DType dtype = DType::kFloat32, Device device = kMeta) {
  return TensorType{std::move(shape), dtype, device};
}

// Parses `text`, failing the test (and returning an empty graph) on a parse error.
Graph Parse(std::string_view text) {
  absl::StatusOr<Graph> g = ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << text;
  return g.ok() ? *std::move(g) : Graph();
}

// print -> parse -> print gives the same text, and the parsed graph verifies.
void ExpectRoundTrip(const Graph& g) {
  const std::string text = PrintGraph(g);
  absl::StatusOr<Graph> parsed = ParseGraph(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(PrintGraph(*parsed), text);
  const absl::Status verified = Verify(*parsed);
  EXPECT_TRUE(verified.ok()) << verified << "\n" << text;
}

// The verifier's error for `g`, which must be an InternalError.
std::string VerifyError(const Graph& g) {
  const absl::Status s = Verify(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s << "\n" << PrintGraph(g);
  return std::string(s.message());
}

// ---------------------------------------------------------------------------------------------
// FileCheck

constexpr char kFileCheckText[] =
    "alpha one\n"
    "beta two\n"
    "gamma three\n"
    "beta four\n";

TEST(FileCheckTest, MatchesInOrder) {
  EXPECT_TRUE(FileCheck(kFileCheckText, R"(
    CHECK: alpha
    CHECK-SAME: one
    CHECK-NEXT: beta
    CHECK-NOT: delta
    CHECK: three
    CHECK-NEXT: four
  )"));
  EXPECT_TRUE(FileCheck(kFileCheckText, "CHECK-COUNT-2: beta"));
}

TEST(FileCheckTest, CheckNextFailsWhenALineIsSkipped) {
  const ::testing::AssertionResult r = FileCheck(kFileCheckText, R"(
    CHECK: alpha
    CHECK-NEXT: gamma
  )");
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("CHECK-NEXT: gamma"), std::string::npos) << r.message();
  EXPECT_NE(std::string(r.message()).find("not the line after"), std::string::npos);
  EXPECT_NE(std::string(r.message()).find("gamma three"), std::string::npos);  // the output
}

TEST(FileCheckTest, CheckNotFailsBetweenMatchesAndAtTheEnd) {
  const ::testing::AssertionResult between = FileCheck(kFileCheckText, R"(
    CHECK: alpha
    CHECK-NOT: two
    CHECK: gamma
  )");
  ASSERT_FALSE(between);
  EXPECT_NE(std::string(between.message()).find("CHECK-NOT: two"), std::string::npos);
  EXPECT_NE(std::string(between.message()).find("output line 2"), std::string::npos);
  EXPECT_FALSE(FileCheck(kFileCheckText, "CHECK: gamma\nCHECK-NOT: four"));
  EXPECT_TRUE(FileCheck(kFileCheckText, "CHECK: gamma\nCHECK-NOT: two"));
}

TEST(FileCheckTest, CapturesBindAndMatchValueNames) {
  const std::string ir = "%4 = mul(%2, %3)\n%5 = neg(%4)\n%6 = add(%5, %2)\n";
  EXPECT_TRUE(FileCheck(ir, R"(
    CHECK: %[[MUL:[0-9]+]] = mul(%[[X:[0-9]+]],
    CHECK-NEXT: %[[NEG:[0-9]+]] = neg(%[[MUL]])
    CHECK-NEXT: add(%[[NEG]], %[[X]])
  )"));
  EXPECT_FALSE(FileCheck(ir, R"(
    CHECK: %[[MUL:[0-9]+]] = mul(
    CHECK: add(%[[MUL]],
  )"));  // add reads %5, not the mul
  EXPECT_FALSE(FileCheck(ir, "CHECK: add(%[[UNDEFINED]]"));
  // A CHECK-NOT after the last match covers the rest of the output, captures included.
  EXPECT_FALSE(FileCheck(ir, "CHECK: %[[M:[0-9]+]] = mul\nCHECK-NOT: neg(%[[M]])"));
  EXPECT_TRUE(FileCheck(ir, "CHECK: %[[M:[0-9]+]] = mul\nCHECK-NOT: neg(%2)"));
}

TEST(FileCheckTest, FailsOnMissingOrOutOfOrderMatches) {
  EXPECT_FALSE(FileCheck(kFileCheckText, "CHECK: gamma\nCHECK: alpha"));
  EXPECT_FALSE(FileCheck(kFileCheckText, "CHECK: epsilon"));
  EXPECT_FALSE(FileCheck(kFileCheckText, "CHECK-COUNT-3: beta"));
  EXPECT_FALSE(FileCheck(kFileCheckText, "CHECK: alpha\nCHECK-SAME: two"));
  EXPECT_FALSE(FileCheck(kFileCheckText, "no directives at all"));
}

// ---------------------------------------------------------------------------------------------
// Building graphs

TEST(GraphTest, BuildsPrintsAndRoundTripsAMetaGraph) {
  Graph g;
  const ValueId x = g.AddInput(T({4, 8}));
  const ValueId w = g.AddConstant(empty({16, 8}, DType::kFloat32, kMeta), "proj.weight");
  OpAttrs mm;
  mm.transpose_b = true;
  const ValueId y = g.AddOp(OpId::kMatmul, {x, w}, mm);
  OpAttrs tanh;
  tanh.approximate = GeluApprox::kTanh;
  const ValueId a = g.AddOp(OpId::kGelu, {y}, tanh);
  OpAttrs red;
  red.dims = {-1};
  red.keepdim = true;
  g.SetOutputs({a, g.AddOp(OpId::kSum, {a}, red)});

  EXPECT_TRUE(FileCheck(PrintGraph(g), R"(
    CHECK:      graph(%0: f32[4, 8]@meta) {
    CHECK-NEXT:   %1 = constant "proj.weight" : f32[16, 8]@meta
    CHECK-NEXT:   %2 = matmul(%0, %1) {transpose_b=true} : f32[4, 16]@meta
    CHECK-NEXT:   %3 = gelu(%2) {approximate=tanh} : f32[4, 16]@meta
    CHECK-NEXT:   %4 = sum(%3) {dims=[-1], keepdim=true} : f32[4, 1]@meta
    CHECK-NEXT:   return %3, %4
    CHECK-NEXT: }
  )"));
  EXPECT_TRUE(Verify(g).ok()) << Verify(g);
  ExpectRoundTrip(g);
}

TEST(GraphTest, Cuda0TypesPrintWithoutADevice) {
  Graph g;
  const ValueId x = g.AddInput(T({2, 3}, DType::kBFloat16, CUDA(0)));
  const ValueId b = g.AddInput(T({3}, DType::kBFloat16, CUDA(0)));
  g.SetOutputs({g.AddOp(OpId::kAdd, {x, b})});
  EXPECT_TRUE(FileCheck(PrintGraph(g), R"(
    CHECK:      graph(%0: bf16[2, 3], %1: bf16[3]) {
    CHECK-NEXT:   %2 = add(%0, %1) : bf16[2, 3]
    CHECK-NOT:  @
  )"));
  ExpectRoundTrip(g);
}

TEST(GraphTest, AddOpThrowsOnBadOperands) {
  Graph g;
  const ValueId a = g.AddInput(T({2, 3}));
  const ValueId b = g.AddInput(T({4, 3}));
  EXPECT_THROW(g.AddOp(OpId::kAdd, {a, b}), Error);
}

// ---------------------------------------------------------------------------------------------
// Tracing

std::vector<Tensor> AttentionLike(const std::vector<Tensor>& in) {
  const Tensor& x = in[0];     // [2, 4, 8]
  const Tensor& w = in[1];     // [16, 8]
  const Tensor& mask = in[2];  // bool [4, 4]
  Tensor h = matmul(x, transpose(w, 0, 1));
  h = gelu(add(h, h), "tanh");
  const Tensor scores = mul(matmul(h, transpose(h, -2, -1)), 0.25);
  const Tensor p = softmax(masked_fill(scores, mask, -INFINITY), -1);
  const Tensor r = sum(p, {1}, /*keepdim=*/true);
  const Tensor v = reshape(slice(h, 2, 0, 8), {8, 8});
  return {p, r, v};
}

TEST(TraceTest, RecordsOpsWithAttributes) {
  absl::StatusOr<Graph> g = Trace(
      AttentionLike, {empty({2, 4, 8}, DType::kFloat32, kMeta),
                      empty({16, 8}, DType::kFloat32, kMeta), empty({4, 4}, DType::kBool, kMeta)});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(FileCheck(PrintGraph(*g), R"(
    CHECK:      graph(%0: f32[2, 4, 8]@meta, %1: f32[16, 8]@meta, %2: bool[4, 4]@meta) {
    CHECK-NEXT:   %3 = transpose(%1) {dim=0, dim2=1} : f32[8, 16]@meta
    CHECK-NEXT:   %4 = matmul(%0, %3) : f32[2, 4, 16]@meta
    CHECK-NEXT:   %5 = add(%4, %4) : f32[2, 4, 16]@meta
    CHECK-NEXT:   %6 = gelu(%5) {approximate=tanh} : f32[2, 4, 16]@meta
    CHECK-NEXT:   %7 = transpose(%6) {dim=-2, dim2=-1} : f32[2, 16, 4]@meta
    CHECK-NEXT:   %8 = matmul(%6, %7) : f32[2, 4, 4]@meta
    CHECK-NEXT:   %9 = mul_scalar(%8) {scalar=0.25} : f32[2, 4, 4]@meta
    CHECK-NEXT:   %10 = masked_fill(%9, %2) {scalar=-inf} : f32[2, 4, 4]@meta
    CHECK-NEXT:   %11 = softmax(%10) {dim=-1} : f32[2, 4, 4]@meta
    CHECK-NEXT:   %12 = sum(%11) {dims=[1], keepdim=true} : f32[2, 1, 4]@meta
    CHECK-NEXT:   %13 = slice(%6) {dim=2, start=0, end=8, step=1} : f32[2, 4, 8]@meta
    CHECK-NEXT:   = reshape(
    CHECK-SAME:   {dims=[8, 8]} : f32[8, 8]@meta
    CHECK-NOT:    constant
    CHECK:        return %11, %12,
  )"));
  EXPECT_TRUE(Verify(*g).ok()) << Verify(*g);
  ExpectRoundTrip(*g);
}

TEST(TraceTest, CpuWeightBecomesAConstant) {
  const Tensor weight = ones({4, 8});
  auto fn = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    return {add(linear(in[0], weight), 1.0)};
  };
  absl::StatusOr<Graph> g = Trace(fn, {empty({2, 8})});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(FileCheck(PrintGraph(*g), R"(
    CHECK:      graph(%0: f32[2, 8]@cpu) {
    CHECK-NEXT:   %1 = constant "const0" : f32[4, 8]@cpu
    CHECK-NEXT:   %2 = linear(%0, %1) : f32[2, 4]@cpu
    CHECK-NEXT:   %3 = add_scalar(%2) {scalar=1.0} : f32[2, 4]@cpu
    CHECK-NEXT:   return %3
  )"));
  ASSERT_EQ(g->node(1).kind, NodeKind::kConstant);
  EXPECT_TRUE(g->node(1).constant.is_same(weight));
  EXPECT_TRUE(Verify(*g).ok()) << Verify(*g);
  ExpectRoundTrip(*g);
}

// ---------------------------------------------------------------------------------------------
// Parsing

TEST(ParserTest, RenumbersAHandWrittenFusionGraph) {
  const Graph g = Parse(R"(
    graph(%10: bf16[8, 3072], %11: bf16[8, 3072]) {
      // a fusion body numbers its own values
      %20 = fusion kiln_fused_gelu_mul_0(%10, %11) : bf16[8, 3072] {
        graph(%5: bf16[8, 3072], %6: bf16[8, 3072]) {
          %7 = gelu(%5) {approximate=tanh} : bf16[8, 3072]
          %8 = mul(%7, %6) : bf16[8, 3072]
          return %8
        }
      }
      %21 = sum(%20) {dims=[1], keepdim=false} : bf16[8]
      return %21
    })");
  EXPECT_EQ(PrintGraph(g),
            "graph(%0: bf16[8, 3072], %1: bf16[8, 3072]) {\n"
            "  %2 = fusion kiln_fused_gelu_mul_0(%0, %1) : bf16[8, 3072] {\n"
            "    graph(%0: bf16[8, 3072], %1: bf16[8, 3072]) {\n"
            "      %2 = gelu(%0) {approximate=tanh} : bf16[8, 3072]\n"
            "      %3 = mul(%2, %1) : bf16[8, 3072]\n"
            "      return %3\n"
            "    }\n"
            "  }\n"
            "  %3 = sum(%2) {dims=[1], keepdim=false} : bf16[8]\n"
            "  return %3\n"
            "}\n");
  ASSERT_EQ(g.num_values(), 4);
  EXPECT_EQ(g.node(2).kind, NodeKind::kFusion);
  EXPECT_EQ(g.node(2).name, "kiln_fused_gelu_mul_0");
  ASSERT_NE(g.node(2).body, nullptr);
  EXPECT_EQ(g.node(2).body->num_values(), 4);
  EXPECT_TRUE(Verify(g).ok()) << Verify(g);
  ExpectRoundTrip(g);
}

constexpr char kEveryAttribute[] = R"(
graph(%0: f32[2, 3, 4]@meta, %1: bool[3, 4]@meta, %2: f32[4]@meta, %3: f32[2, 3, 4]@cpu,
      %4: i32[5]@cuda:1, %5: f16[6]) {
  %6 = masked_fill(%0, %1) {scalar=-inf} : f32[2, 3, 4]@meta
  %7 = add_scalar(%6) {scalar=inf} : f32[2, 3, 4]@meta
  %8 = mul_scalar(%7) {scalar=nan} : f32[2, 3, 4]@meta
  %9 = layer_norm(%8, %2, %2) {eps=1e-05} : f32[2, 3, 4]@meta
  %10 = rms_norm(%9) {eps=1.5} : f32[2, 3, 4]@meta
  %11 = transpose(%10) {dim=0, dim2=-1} : f32[4, 3, 2]@meta
  %12 = permute(%11) {dims=[2, 0, 1]} : f32[2, 4, 3]@meta
  %13 = matmul(%12, %12) {transpose_b=true} : f32[2, 4, 4]@meta
  %14 = slice(%13) {dim=1, start=1, end=3, step=1} : f32[2, 2, 4]@meta
  %15 = unsqueeze(%14) {dim=0} : f32[1, 2, 2, 4]@meta
  %16 = squeeze(%15) {dim=0, all_dims=true} : f32[2, 2, 4]@meta
  %17 = expand(%16) {dims=[3, 2, 2, 4]} : f32[3, 2, 2, 4]@meta
  %18 = mean(%17) {dims=[0, -1], keepdim=true} : f32[1, 2, 2, 1]@meta
  %19 = gelu(%18) {approximate=none} : f32[1, 2, 2, 1]@meta
  %20 = cast(%19) {dtype=bf16} : bf16[1, 2, 2, 1]@meta
  %21 = triu(%3) {diagonal=-1} : f32[2, 3, 4]@cpu
  %22 = max(%4) {dims=[], keepdim=false} : i32[]@cuda:1
  %23 = sub_scalar(%5) {scalar=-2.5e+300} : f16[6]
  return %20, %21, %22, %23
})";

// A bool number prints as true / false and reads back as a bool (not the integer 1): its kind
// decides the result's dtype.
TEST(ParserTest, BoolScalarsRoundTripAsBools) {
  const Graph g = Parse(R"(
graph(%0: bool[3]@meta) {
  %1 = add_scalar(%0) {scalar=true} : bool[3]@meta
  %2 = mul_scalar(%1) {scalar=false} : bool[3]@meta
  return %2
})");
  ASSERT_EQ(g.num_values(), 3);
  EXPECT_EQ(g.node(1).attrs.scalar, Scalar(true));
  EXPECT_FALSE(g.node(1).attrs.scalar == Scalar(1));
  EXPECT_EQ(g.node(2).attrs.scalar, Scalar(false));
  EXPECT_TRUE(Verify(g).ok()) << Verify(g);
  ExpectRoundTrip(g);
}

TEST(ParserTest, ParsesEveryAttributeDeviceAndScalarForm) {
  const Graph g = Parse(kEveryAttribute);
  ASSERT_EQ(g.num_values(), 24);
  EXPECT_EQ(g.node(6).attrs.scalar, Scalar(-INFINITY));
  EXPECT_EQ(g.node(7).attrs.scalar, Scalar(INFINITY));
  EXPECT_TRUE(std::isnan(g.node(8).attrs.scalar.to_double()));
  EXPECT_EQ(g.node(9).attrs.eps, 1e-5);
  EXPECT_EQ(g.node(11).attrs.dim2, -1);
  EXPECT_EQ(g.node(12).attrs.dims, (Shape{2, 0, 1}));
  EXPECT_TRUE(g.node(13).attrs.transpose_b);
  EXPECT_FALSE(g.node(13).attrs.transpose_a);
  EXPECT_EQ(g.node(14).attrs.start, 1);
  EXPECT_EQ(g.node(14).attrs.end, 3);
  EXPECT_TRUE(g.node(16).attrs.all_dims);
  EXPECT_TRUE(g.node(18).attrs.keepdim);
  EXPECT_EQ(g.node(19).attrs.approximate, GeluApprox::kNone);
  EXPECT_EQ(g.node(20).attrs.dtype, DType::kBFloat16);
  EXPECT_EQ(g.node(21).attrs.diagonal, -1);
  EXPECT_EQ(g.type(4).device, CUDA(1));
  EXPECT_EQ(g.type(5).device, CUDA(0));
  EXPECT_EQ(g.node(23).attrs.scalar, -2.5e300);
  EXPECT_TRUE(Verify(g).ok()) << Verify(g);
  EXPECT_TRUE(FileCheck(PrintGraph(g), R"(
    CHECK: {scalar=-inf}
    CHECK: {scalar=inf}
    CHECK: {scalar=nan}
    CHECK: {eps=1.0000000000000001e-05}
    CHECK: %21 = triu(%3) {diagonal=-1} : f32[2, 3, 4]@cpu
    CHECK: %22 = max(%4) {dims=[], keepdim=false} : i32[]@cuda:1
    CHECK: %23 = sub_scalar(%5) {scalar=-2.5e+300} : f16[6]
  )"));
  ExpectRoundTrip(g);
}

TEST(ParserTest, LinearEpiloguePrintsOnlyWhenSetAndRoundTrips) {
  const Graph g = Parse(R"(
    graph(%0: bf16[8, 16], %1: bf16[16, 16], %2: bf16[16]) {
      %3 = linear(%0, %1, %2) {epilogue=gelu_tanh} : bf16[8, 16]
      %4 = linear(%3, %1) {epilogue=relu} : bf16[8, 16]
      %5 = linear(%4, %1, %2) {epilogue=none} : bf16[8, 16]
      return %5
    })");
  EXPECT_EQ(g.node(3).attrs.epilogue, Epilogue::kGeluTanh);
  EXPECT_EQ(g.node(4).attrs.epilogue, Epilogue::kRelu);
  EXPECT_EQ(g.node(5).attrs.epilogue, Epilogue::kNone);
  EXPECT_FALSE(g.node(3).attrs == g.node(5).attrs);
  EXPECT_TRUE(Verify(g).ok()) << Verify(g);
  EXPECT_TRUE(FileCheck(PrintGraph(g), R"(
    CHECK:      %3 = linear(%0, %1, %2) {epilogue=gelu_tanh} : bf16[8, 16]
    CHECK-NEXT: %4 = linear(%3, %1) {epilogue=relu} : bf16[8, 16]
    CHECK-NEXT: %5 = linear(%4, %1, %2) : bf16[8, 16]
  )"));
  ExpectRoundTrip(g);
}

TEST(ParserTest, EveryTruncationIsAnErrorNotACrash) {
  const std::string text = PrintGraph(Parse(kEveryAttribute));
  for (size_t n = 0; n + 1 < text.size(); ++n) {
    const absl::StatusOr<Graph> g = ParseGraph(std::string_view(text).substr(0, n));
    ASSERT_FALSE(g.ok()) << "prefix of " << n << " chars parsed";
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(ParseGraph(text).ok());
}

struct ParseErrorCase {
  const char* text;
  const char* error;  // a substring of the message
};

TEST(ParserTest, ErrorsNameLineColumnAndReason) {
  const ParseErrorCase cases[] = {
      {"graph(%0: f32[2]) {\n  %1 = neg(%0 : f32[2]\n  return %1\n}",
       "line 2, col 15: expected ')' after operands"},
      {"graph(%0: f32[2]) {\n  %1 = frobnicate(%0) : f32[2]\n  return %1\n}",
       "line 2, col 8: unknown op 'frobnicate'"},
      {"graph(%0: f32[2]) {\n  %1 = neg(%7) : f32[2]\n  return %1\n}",
       "line 2, col 12: undefined value %7"},
      {"graph(%0: f32[2]) {\n  %1 = neg(%0) : f32[2]\n  %1 = neg(%0) : f32[2]\n  return %1\n}",
       "line 3, col 3: redefinition of %1"},
      {"graph(%0: f32[2]) {\n  %1 = neg(%0) : f32[2]\n}",
       "line 3, col 1: missing 'return' at the end of the graph"},
      {"graph(%0: f32[2]) {\n  %1 = add(%0, %0) {dim=1} : f32[2]\n  return %1\n}",
       "line 2, col 21: op 'add' has no attribute 'dim'"},
      {"graph(%0: f32[2]) {\n  %1 = add(%0, %0) {foo=1} : f32[2]\n  return %1\n}",
       "line 2, col 21: unknown attribute 'foo'"},
      {"graph(%0: f32[2]) {\n  %1 = softmax(%0) {dim=0, dim=1} : f32[2]\n  return %1\n}",
       "line 2, col 28: duplicate attribute 'dim'"},
      {"graph(%0: f32[2]) {\n  %1 = mul_scalar(%0) {scalar=abc} : f32[2]\n  return %1\n}",
       "line 2, col 31: expected a number for 'scalar', got 'abc'"},
      {"graph(%0: f32[2]) {\n  %1 = neg(%0)\n  return %1\n}",
       "line 3, col 3: expected ':' before the result type"},
      {"graph(%0: f33[2]) {\n  return %0\n}", "line 1, col 11: unknown dtype 'f33'"},
      {"graph(%0: f32[2]@gpu) {\n  return %0\n}", "line 1, col 18: unknown device 'gpu'"},
      {"graph(%0: f32[2, -3]) {\n  return %0\n}", "line 1, col 14: negative dimension -3"},
      {"graph(%0: f32[2]) {\n  return %0\n", "line 3, col 1: expected '}' after the returned"},
      {"graph(%0: f32[2]) {\n  return %0\n}\nextra",
       "line 4, col 1: unexpected text after the end of the graph"},
      {"", "line 1, col 1: expected 'graph' at the start of a graph"},
      {"graph(%0: f32[2]) {\n  %1 = gelu(%0) {approximate=fast} : f32[2]\n  return %1\n}",
       "line 2, col 30: expected tanh or none for 'approximate'"},
      {"graph(%0: f32[2, 2]) {\n  %1 = linear(%0, %0) {epilogue=gelu} : f32[2, 2]\n"
       "  return %1\n}",
       "line 2, col 33: expected one of none, relu, gelu_tanh, add for 'epilogue'"},
      {"graph(%0: f32[2, 2]) {\n  %1 = matmul(%0, %0) {epilogue=relu} : f32[2, 2]\n"
       "  return %1\n}",
       "line 2, col 24: op 'matmul' has no attribute 'epilogue'"},
      {"graph(%0: f32[2]) {\n  %1 = constant \"w : f32[2]\n  return %1\n}",
       "unterminated constant name"},
      {"graph(%0: f32[2]) {\n  %1 = fusion k(%0) : f32[2] {\n    graph(%0: f32[2]) {\n"
       "      %1 = neg(%2) : f32[2]\n      return %1\n    }\n  }\n  return %1\n}",
       "line 4, col 16: undefined value %2"},
  };
  for (const ParseErrorCase& c : cases) {
    SCOPED_TRACE(c.text);
    const absl::StatusOr<Graph> g = ParseGraph(c.text);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(c.error), std::string::npos) << g.status();
  }
}

// ---------------------------------------------------------------------------------------------
// Verifier

TEST(VerifierTest, RejectsAWrongRecordedType) {
  const Graph g = Parse(R"(
    graph(%0: f32[4]@meta) {
      %1 = add(%0, %0) : f32[3]@meta
      return %1
    })");
  const std::string error = VerifyError(g);
  EXPECT_NE(error.find("%1 (add): recorded type f32[3]@meta differs from the inferred f32[4]@meta"),
            std::string::npos)
      << error;
}

TEST(VerifierTest, RejectsUseBeforeDefinitionAndDanglingValues) {
  const TensorType t = T({4});
  Graph use_before_def;
  use_before_def.AddInput(t);
  use_before_def.AddOpWithType(OpId::kNeg, {2}, {}, t);
  use_before_def.AddOpWithType(OpId::kNeg, {0}, {}, t);
  use_before_def.SetOutputs({1});
  EXPECT_NE(VerifyError(use_before_def).find("%1 (neg): operand %2 is used before its definition"),
            std::string::npos);

  Graph dangling;
  dangling.AddInput(t);
  dangling.AddOpWithType(OpId::kNeg, {9}, {}, t);
  EXPECT_NE(VerifyError(dangling).find("%1 (neg): operand %9 does not exist"), std::string::npos);

  Graph bad_output;
  bad_output.AddInput(t);
  bad_output.SetOutputs({5});
  EXPECT_NE(VerifyError(bad_output).find("graph output %5 does not exist"), std::string::npos);
}

TEST(VerifierTest, RejectsBadArityAndStrayInputNodes) {
  const TensorType t = T({4});
  Graph arity;
  arity.AddInput(t);
  arity.SetOutputs({arity.AddOpWithType(OpId::kAdd, {0}, {}, t)});
  EXPECT_NE(VerifyError(arity).find("%1 (add): takes 2 operands, has 1"), std::string::npos);

  Graph stray;
  stray.AddInput(t);
  Node n;
  n.kind = NodeKind::kInput;
  n.type = t;
  stray.AddNode(n);
  EXPECT_NE(VerifyError(stray).find("%1 is an input node but not a graph input"),
            std::string::npos);
}

// A fusion body: elementwise ops, optionally ending in a last-dim softmax and one cast of it.
Graph SoftmaxFusionGraph(const std::string& tail) {
  return Parse(absl::StrCat(R"(
    graph(%0: f32[4, 4]@meta, %1: bool[4]@meta) {
      %2 = fusion k(%0, %1) : f32[4, 4]@meta {
        graph(%0: f32[4, 4]@meta, %1: bool[4]@meta) {
          %2 = masked_fill(%0, %1) {scalar=-inf} : f32[4, 4]@meta
)",
                            tail, R"(
        }
      }
      return %2
    })"));
}

TEST(VerifierTest, AcceptsASoftmaxFusionBody) {
  const Graph g = SoftmaxFusionGraph(R"(
          %3 = softmax(%2) {dim=-1} : f32[4, 4]@meta
          return %3)");
  EXPECT_TRUE(Verify(g).ok()) << Verify(g);
  ExpectRoundTrip(g);
  const Graph cast = SoftmaxFusionGraph(R"(
          %3 = softmax(%2) {dim=1} : f32[4, 4]@meta
          %4 = cast(%3) {dtype=f32} : f32[4, 4]@meta
          return %4)");
  EXPECT_TRUE(Verify(cast).ok()) << Verify(cast);
}

// The kernel families' body rules (codegen/fusion_template.h), given to the verifier as it is
// given in the compile pipeline.
std::string FamilyError(const Graph& g) {
  const absl::Status s = Verify(g, codegen::CheckFusionBody);
  EXPECT_FALSE(s.ok());
  return std::string(s.message());
}

TEST(VerifierTest, RejectsBodiesNoKernelFamilyAccepts) {
  const std::string other_dim = FamilyError(SoftmaxFusionGraph(R"(
          %3 = softmax(%2) {dim=0} : f32[4, 4]@meta
          return %3)"));
  EXPECT_NE(other_dim.find("%2 (fusion k): no kernel family accepts this body"), std::string::npos)
      << other_dim;
  const std::string after = FamilyError(SoftmaxFusionGraph(R"(
          %3 = softmax(%2) {dim=-1} : f32[4, 4]@meta
          %4 = neg(%3) : f32[4, 4]@meta
          return %4)"));
  EXPECT_NE(after.find("softmax body value %4 (neg) follows the softmax %3; only one cast of "
                       "the softmax may"),
            std::string::npos)
      << after;
  const std::string not_last = FamilyError(SoftmaxFusionGraph(R"(
          %3 = softmax(%2) {dim=-1} : f32[4, 4]@meta
          %4 = cast(%3) {dtype=f32} : f32[4, 4]@meta
          return %3)"));
  EXPECT_NE(not_last.find("softmax body must return exactly its last value"), std::string::npos)
      << not_last;
  const std::string reduction = FamilyError(SoftmaxFusionGraph(R"(
          %3 = layer_norm(%2) {eps=1e-05} : f32[4, 4]@meta
          return %3)"));
  EXPECT_NE(reduction.find("no kernel family accepts this body"), std::string::npos) << reduction;
  // Without the families' rules the verifier checks only what every body must be.
  EXPECT_TRUE(Verify(SoftmaxFusionGraph(R"(
          %3 = layer_norm(%2) {eps=1e-05} : f32[4, 4]@meta
          return %3)"))
                  .ok());
}

// A fusion returning two values: the second reached through a result node.
TEST(VerifierTest, ResultNodesNameFurtherOutputsOfAFusion) {
  const std::string text = R"(
    graph(%0: f32[4]@meta) {
      %1 = fusion k(%0) : f32[4]@meta {
        graph(%0: f32[4]@meta) {
          %1 = tanh(%0) : f32[4]@meta
          %2 = neg(%1) : f32[4]@meta
          return %2, %1
        }
      }
      %2 = result %1 #1 : f32[4]@meta
      %3 = sum(%2) {dims=[], keepdim=false} : f32[]@meta
      return %1, %3
    })";
  const Graph g = Parse(text);
  EXPECT_TRUE(Verify(g, codegen::CheckFusionBody).ok()) << Verify(g, codegen::CheckFusionBody);
  ExpectRoundTrip(g);
  const Graph bad_index = Parse(absl::StrReplaceAll(text, {{"result %1 #1", "result %1 #2"}}));
  EXPECT_NE(VerifyError(bad_index).find("index 2 but the fusion %1 returns 2 values"),
            std::string::npos);
  const Graph bad_type = Parse(absl::StrReplaceAll(
      text, {{"%2 = result %1 #1 : f32[4]@meta", "%2 = result %1 #1 : f16[4]@meta"},
             {"%3 = sum(%2) {dims=[], keepdim=false} : f32[]@meta",
              "%3 = sum(%2) {dims=[], keepdim=false} : f16[]@meta"}}));
  EXPECT_NE(VerifyError(bad_type).find("type f16[4]@meta but output #1 of %1 is f32[4]@meta"),
            std::string::npos)
      << VerifyError(bad_type);
}

TEST(VerifierTest, RejectsAFusionWhoseBodyDoesNotMatchTheNode) {
  const Graph input_type = Parse(R"(
    graph(%0: f32[4]@meta) {
      %1 = fusion k(%0) : f32[4]@meta {
        graph(%0: f16[4]@meta) {
          %1 = neg(%0) : f16[4]@meta
          return %1
        }
      }
      return %1
    })");
  EXPECT_NE(VerifyError(input_type)
                .find("%1 (fusion k): body input 0 has type f16[4]@meta but operand %0 has "
                      "f32[4]@meta"),
            std::string::npos);

  const Graph output_type = Parse(R"(
    graph(%0: f32[4]@meta) {
      %1 = fusion k(%0) : f32[8]@meta {
        graph(%0: f32[4]@meta) {
          %1 = neg(%0) : f32[4]@meta
          return %1
        }
      }
      return %1
    })");
  EXPECT_NE(VerifyError(output_type).find("body returns f32[4]@meta but the node's type is"),
            std::string::npos);
}

TEST(VerifierTest, NamesTheFusionAroundAnErrorInItsBody) {
  const Graph g = Parse(R"(
    graph(%0: f32[4]@meta, %1: f32[4]@meta) {
      %2 = fusion k(%0, %1) : f32[4]@meta {
        graph(%0: f32[4]@meta, %1: f32[4]@meta) {
          %2 = mul(%0, %1) : i32[4]@meta
          return %2
        }
      }
      return %2
    })");
  const std::string error = VerifyError(g);
  EXPECT_NE(error.find("in the body of %2 (fusion k): %2 (mul): recorded type i32[4]@meta"),
            std::string::npos)
      << error;
}

// Every attribute field reaches the kernel key and the eager kernels' memo: a row whose source
// read a field the key missed would reuse a stale kernel.
TEST(KernelIrTest, EveryAttributeFieldChangesTheKeyAndTheMemoComparison) {
  const OpAttrs base;
  std::vector<std::function<void(OpAttrs&)>> changes = {
      [](OpAttrs& a) { a.eps = 1e-6; },
      [](OpAttrs& a) { a.eps = -0.0 * a.eps; },  // the sign bit alone
      [](OpAttrs& a) { a.dim = 1; },
      [](OpAttrs& a) { a.dim2 = 1; },
      [](OpAttrs& a) { a.start = 1; },
      [](OpAttrs& a) { a.end = 1; },
      [](OpAttrs& a) { a.step = 2; },
      [](OpAttrs& a) { a.diagonal = 1; },
      [](OpAttrs& a) { a.dims = {1}; },
      [](OpAttrs& a) { a.keepdim = true; },
      [](OpAttrs& a) { a.all_dims = true; },
      [](OpAttrs& a) { a.transpose_a = true; },
      [](OpAttrs& a) { a.transpose_b = true; },
      [](OpAttrs& a) { a.approximate = GeluApprox::kTanh; },
      [](OpAttrs& a) { a.dtype = DType::kBFloat16; },
      [](OpAttrs& a) { a.epilogue = Epilogue::kRelu; },
      [](OpAttrs& a) { a.strides = {1}; },
      [](OpAttrs& a) { a.offset = 1; },
      [](OpAttrs& a) { a.scale = 0.5; },
      [](OpAttrs& a) { a.is_causal = true; },
      [](OpAttrs& a) { a.enable_gqa = true; },
      [](OpAttrs& a) { a.k = 1; },
      [](OpAttrs& a) { a.largest = false; },
  };
  std::string base_key;
  kir::AppendAttrKey(base, &base_key);
  EXPECT_TRUE(kir::SameAttrsButScalar(base, base));
  for (size_t i = 0; i < changes.size(); ++i) {
    OpAttrs changed = base;
    changes[i](changed);
    std::string key;
    kir::AppendAttrKey(changed, &key);
    EXPECT_NE(key, base_key) << "change " << i;
    EXPECT_FALSE(kir::SameAttrsButScalar(base, changed)) << "change " << i;
  }
  OpAttrs scalar = base;
  scalar.scalar = 2.5;  // a kernel parameter: the memo ignores it, the instruction key does not
  std::string scalar_key;
  kir::AppendAttrKey(scalar, &scalar_key);
  EXPECT_NE(scalar_key, base_key);
  EXPECT_TRUE(kir::SameAttrsButScalar(base, scalar));
}

// A value of each attribute type other than OpAttrs{}'s.
double OtherValue(double v) { return v == 0.375 ? 0.5 : 0.375; }
Scalar OtherValue(const Scalar& v) { return v == Scalar(0.375) ? Scalar(0.5) : Scalar(0.375); }
int64_t OtherValue(int64_t v) { return v + 3; }
bool OtherValue(bool v) { return !v; }
Shape OtherValue(const Shape& v) { return v == Shape{2, 3} ? Shape{4} : Shape{2, 3}; }
GeluApprox OtherValue(GeluApprox v) {
  return v == GeluApprox::kTanh ? GeluApprox::kNone : GeluApprox::kTanh;
}
DType OtherValue(DType v) { return v == DType::kInt32 ? DType::kBFloat16 : DType::kInt32; }
Epilogue OtherValue(Epilogue v) { return v == Epilogue::kRelu ? Epilogue::kAdd : Epilogue::kRelu; }
ReduceOp OtherValue(ReduceOp v) { return v == ReduceOp::kMax ? ReduceOp::kSum : ReduceOp::kMax; }

// A scalar's kind survives the text: an integer prints as digits, a floating value never does.
TEST(AttributeTable, ScalarKindsPrintApartAndParseBack) {
  const OpDef& def = GetOpDef(OpId::kAddScalar);
  for (const auto& [scalar, text] : std::vector<std::pair<Scalar, std::string>>{
           {Scalar(2), "scalar=2"},
           {Scalar(2.0), "scalar=2.0"},
           {Scalar(-0.5), "scalar=-0.5"},
           {Scalar((int64_t{1} << 53) + 1), "scalar=9007199254740993"},
           {Scalar(1e30), "scalar=1e+30"},
           {Scalar(-INFINITY), "scalar=-inf"}}) {
    OpAttrs a;
    a.scalar = scalar;
    const std::string printed = PrintAttrs(def, a);
    EXPECT_NE(printed.find(text), std::string::npos) << printed;
    absl::StatusOr<OpAttrs> back = ParseAttrs(def, printed);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->scalar, scalar) << printed;
    EXPECT_EQ(back->scalar.is_integer(), scalar.is_integer()) << printed;
  }
  EXPECT_FALSE(ParseAttrs(def, "{scalar=99999999999999999999}").ok());
}

// Whether printed attributes `text` name `key` (not merely a key it begins: dim, dims, dim2).
bool Names(const std::string& text, const char* key) {
  return text.find(absl::StrCat("{", key, "=")) != std::string::npos ||
         text.find(absl::StrCat(" ", key, "=")) != std::string::npos;
}

// The attribute table is the only list of attributes: every row (a new one too) prints, parses
// back, changes the kernel key and (but the scalar) the memo comparison, with no code of its own.
TEST(AttributeTable, EveryRowPrintsParsesBackAndKeys) {
  OpDef every = GetOpDef(OpId::kAdd);
  every.attr_fields = ~0u;  // an op reading every attribute
  const OpAttrs base;
  std::string base_key;
  kir::AppendAttrKey(base, &base_key);
  int rows = 0;
  ForEachAttrRow([&](const auto& row) {
    ++rows;
    OpAttrs changed = base;
    changed.*row.member = OtherValue(base.*row.member);
    const std::string text = PrintAttrs(every, changed);
    EXPECT_TRUE(Names(text, row.key)) << text;
    absl::StatusOr<OpAttrs> back = ParseAttrs(every, text);
    ASSERT_TRUE(back.ok()) << row.key << ": " << back.status() << "\n" << text;
    EXPECT_TRUE(*back == changed) << row.key << ": " << text;
    std::string key;
    kir::AppendAttrKey(changed, &key);
    EXPECT_NE(key, base_key) << row.key;
    EXPECT_EQ(kir::SameAttrsButScalar(base, changed), std::string(row.key) == "scalar") << row.key;
    // An op that does not declare the row neither prints nor parses it.
    OpDef none = every;
    none.attr_fields = ~row.field;
    EXPECT_FALSE(Names(PrintAttrs(none, changed), row.key)) << row.key;
    EXPECT_FALSE(ParseAttrs(none, text).ok()) << row.key;
  });
  EXPECT_EQ(rows, kNumAttrRows);
  EXPECT_EQ(ParseAttrs(every, PrintAttrs(every, base)).value(), base);
}

}  // namespace
}  // namespace kiln::ir
