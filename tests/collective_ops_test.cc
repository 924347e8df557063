// The collectives as registry ops (ops/distributed.h: kiln::all_reduce, all_gather,
// reduce_scatter, broadcast) over thread ranks, on the CPU: functional results equal to the
// group's own forms; bad input names the op, the shapes and the rule (a split that does not
// divide, a source outside the group, bool reductions, a group that no longer exists); compiled,
// each is an opaque node that fusion stops at (IR CHECK lines, the explain line), printed with its
// group and parsed back (the verifier refuses a group this process lacks), never folded at compile
// time even over frozen constants, never dropped when unused nor merged with another call; a plan
// that outlives its group says so; Export refuses a plan with a collective.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "codegen/compile.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "models/export.h"
#include "ops/dispatch.h"
#include "ops/distributed.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "ops/tensor_parallel.h"
#include "tests/filecheck.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

// Rank r's [4, 3] tensor: r * 100 + i.
Tensor RankMatrix(int r) {
  return add(reshape(arange(0, 12, 1, DType::kFloat32), {4, 3}), r * 100.0);
}

TEST(CollectiveOps, AreFunctionalAndGiveTheGroupsResults) {
  std::mutex mu;
  RunThreadRanks(2, [&](ProcessGroup& pg) {
    const Tensor x = RankMatrix(pg.rank());
    const std::vector<double> before = to_vector(x);
    const Tensor sum = all_reduce(x, pg), max = all_reduce(x, pg, ReduceOp::kMax);
    const Tensor gathered = all_gather(x, pg), scattered = reduce_scatter(x, pg);
    const Tensor from1 = broadcast(x, pg, 1);
    Tensor want_sum = clone(x), want_max = clone(x), want_b = clone(x);
    pg.all_reduce(want_sum);
    pg.all_reduce(want_max, ReduceOp::kMax);
    const Tensor want_g = pg.all_gather(x), want_s = pg.reduce_scatter(x);
    pg.broadcast(want_b, 1);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(to_vector(x), before) << "the input is left alone";
    EXPECT_EQ(to_vector(sum), to_vector(want_sum));
    EXPECT_EQ(to_vector(max), to_vector(want_max));
    EXPECT_EQ(gathered.shape(), (Shape{8, 3}));
    EXPECT_EQ(to_vector(gathered), to_vector(want_g));
    EXPECT_EQ(scattered.shape(), (Shape{2, 3}));
    EXPECT_EQ(to_vector(scattered), to_vector(want_s));
    EXPECT_EQ(to_vector(from1), to_vector(want_b));
    EXPECT_EQ(to_vector(from1), to_vector(RankMatrix(1)));
  });
}

TEST(CollectiveOps, BadInputNamesTheOpAndTheRule) {
  RunThreadRanks(2, [&](ProcessGroup& pg) {
    // Refused by inference on every rank alike, before any rank reaches the exchange.
    ExpectThrowsWith(
        [&] {
          reduce_scatter(zeros({5, 2}), pg);
        },
        "must be a multiple of the world size 2");
    ExpectThrowsWith([&] { reduce_scatter(zeros({5, 2}), pg); }, "reduce_scatter");
    ExpectThrowsWith([&] { broadcast(zeros({2}), pg, 2); }, "source rank 2 is not in 0..1");
    ExpectThrowsWith([&] { all_reduce(zeros({2}, DType::kBool), pg); }, "bool");
    ExpectThrowsWith([&] { all_gather(zeros(Shape{}), pg); }, "rank >= 1");
    ExpectThrowsWith([&] { all_reduce(Tensor(), pg); }, "all_reduce");
    ExpectThrowsWith([&] { GatherVocab(Tensor(), 10, pg); }, "an undefined tensor");
    ExpectThrowsWith([&] { GatherVocab(zeros({2, 5}), 0, pg); }, "a vocabulary of 0");
  });
  int64_t gone = 0;
  RunThreadRanks(1, [&](ProcessGroup& pg) { gone = pg.id(); });
  OpAttrs a;
  a.group = gone;
  ExpectThrowsWith([&] { Dispatch(OpId::kAllReduce, {zeros({2})}, a); },
                   absl::StrCat("process group ", gone, " does not exist"));
  EXPECT_EQ(FindProcessGroup(gone), nullptr);
}

// Empty, 0-d, integer, bool and strided tensors: each op's definition, no crash.
TEST(CollectiveOps, EdgeShapesAndDtypes) {
  std::mutex mu;
  RunThreadRanks(3, [&](ProcessGroup& pg) {
    const Tensor empty_rows = zeros({0, 4});
    const Tensor scalar = full({}, pg.rank() + 1.0);
    const Tensor ints = full({2, 3}, pg.rank() + 1.0, DType::kInt64);
    const Tensor flags = full({3, 2}, pg.rank() == 1 ? 1.0 : 0.0, DType::kBool);
    const Tensor strided = transpose(reshape(arange(0, 6, 1, DType::kFloat32), {2, 3}), 0, 1);
    const Tensor sum0 = all_reduce(empty_rows, pg), gathered0 = all_gather(empty_rows, pg),
                 scattered0 = reduce_scatter(empty_rows, pg);
    const Tensor scalar_max = all_reduce(scalar, pg, ReduceOp::kMax);
    const Tensor int_sum = all_reduce(ints, pg);
    const Tensor flags_from1 = broadcast(flags, pg, 1), flags_all = all_gather(flags, pg);
    const Tensor strided_sum = all_reduce(strided, pg);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(sum0.shape(), (Shape{0, 4}));
    EXPECT_EQ(gathered0.shape(), (Shape{0, 4}));
    EXPECT_EQ(scattered0.shape(), (Shape{0, 4}));
    EXPECT_EQ(scalar_max.shape(), Shape{});
    EXPECT_EQ(to_vector(scalar_max), std::vector<double>{3.0});
    EXPECT_EQ(int_sum.dtype(), DType::kInt64);
    EXPECT_EQ(to_vector(int_sum), std::vector<double>(6, 6.0));
    EXPECT_EQ(to_vector(flags_from1), std::vector<double>(6, 1.0));
    EXPECT_EQ(flags_all.shape(), (Shape{9, 2}));
    EXPECT_EQ(to_vector(strided_sum), (std::vector<double>{0, 9, 3, 12, 6, 15}));
  });
}

// Every rank's compiled plan issues the same collectives in the same order (what NCCL, and a CUDA
// graph capturing it, need): one trace of one program on each rank.
TEST(CollectiveOps, EveryRanksPlanHasTheSameCollectiveSequence) {
  std::vector<std::vector<std::string>> per_rank(3);
  RunThreadRanks(3, [&](ProcessGroup& pg) {
    auto fn = [&pg](const std::vector<Tensor>& in) {
      const Tensor a = all_reduce(relu(in[0]), pg);
      const Tensor b = all_gather(a * 2.0, pg);
      return std::vector<Tensor>{reduce_scatter(b, pg, ReduceOp::kMax), broadcast(a, pg, 2)};
    };
    const Tensor x = full({3, 2}, pg.rank() - 1.0);
    const CompiledFn f = compile(fn, {x}, {.mode = CompileOptions::Mode::kCompiled});
    f({x});
    std::vector<std::string> sequence;
    for (const std::string& line :
         std::vector<std::string>(absl::StrSplit(f.report({x}).final_graph, '\n'))) {
      for (const char* op : {"all_reduce(", "all_gather(", "reduce_scatter(", "broadcast("}) {
        if (line.find(op) != std::string::npos) {
          // The op and its type, without the group's id (each rank's group has its own).
          sequence.push_back(std::string(line.substr(0, line.find("group="))));
        }
      }
    }
    per_rank[pg.rank()] = sequence;
  });
  ASSERT_EQ(per_rank[0].size(), 4u) << absl::StrJoin(per_rank[0], "\n");
  EXPECT_EQ(per_rank[1], per_rank[0]);
  EXPECT_EQ(per_rank[2], per_rank[0]);
}

// x -> x·1.5 + 0.5 -> all_reduce -> gelu + 1: two fused groups around the collective.
std::vector<Tensor> AroundAllReduce(ProcessGroup& pg, const std::vector<Tensor>& in) {
  return {add(gelu(all_reduce(mul(in[0], 1.5) + 0.5, pg)), 1.0)};
}

TEST(CollectiveOps, CompiledTheyAreOpaqueNodesFusionStopsAt) {
  std::mutex mu;
  RunThreadRanks(
      2, [&](ProcessGroup& pg) {
        const Tensor x = RankMatrix(pg.rank()) * 0.01;
        auto fn = [&pg](const std::vector<Tensor>& in) { return AroundAllReduce(pg, in); };
        const CompiledFn f = compile(fn, {x}, {.mode = CompileOptions::Mode::kCompiled});
        const std::vector<double> compiled = to_vector(f({x})[0]), eager = to_vector(fn({x})[0]);
        const CompileReport& r = f.report({x});
        absl::StatusOr<ir::Graph> parsed = ir::ParseGraph(r.traced_graph);
        std::lock_guard<std::mutex> lock(mu);
        ExpectClose(compiled, eager, {1e-5, 1e-5}, "compiled");
        EXPECT_TRUE(FileCheck(r.final_graph, absl::StrCat(R"(
      CHECK:     fusion
      CHECK:     %[[AR:[0-9]+]] = all_reduce(%
      CHECK-SAME: {group=)",
                                                          pg.id(), R"(, reduce=sum}
      CHECK:     fusion
      CHECK-SAME: (%[[AR]])
      CHECK-NOT: all_reduce
    )"))) << r.final_graph;
        bool explained = false;
        for (const std::string& line : r.explain) {
          explained |= line.find("(all_reduce) into the group of") != std::string::npos &&
                       line.find("opaque boundary") != std::string::npos;
        }
        EXPECT_TRUE(explained) << absl::StrJoin(r.explain, "\n");
        ASSERT_TRUE(parsed.ok()) << parsed.status();
        EXPECT_EQ(ir::PrintGraph(*parsed), r.traced_graph);
      });
  // Text naming a group this process does not have parses, and the verifier refuses it.
  const absl::StatusOr<ir::Graph> no_group = ir::ParseGraph(
      "graph(%0: f32[4]) {\n  %1 = all_reduce(%0) {group=999999, reduce=sum} : f32[4]\n"
      "  return %1\n}\n");
  ASSERT_TRUE(no_group.ok()) << no_group.status();
  const absl::Status verified = ir::Verify(*no_group);
  EXPECT_NE(verified.message().find("process group 999999 does not exist"), std::string::npos)
      << verified;
  RunThreadRanks(1, [](ProcessGroup& pg) {
    const absl::StatusOr<ir::Graph> bad_op =
        ir::ParseGraph(absl::StrCat("graph(%0: f32[4]) {\n  %1 = all_reduce(%0) {group=", pg.id(),
                                    ", reduce=mean} : f32[4]\n  return %1\n}\n"));
    ASSERT_FALSE(bad_op.ok());
    EXPECT_NE(bad_op.status().message().find("expected one of sum, max for"), std::string::npos)
        << bad_op.status();
  });
}

// The group's torch.distributed-style forms run the ops, so a compiled function may call them
// too: the in-place all_reduce is traced as the op and a copy_ into the tensor.
TEST(CollectiveOps, TheGroupsInPlaceFormsAreTracedToo) {
  std::mutex mu;
  RunThreadRanks(2, [&](ProcessGroup& pg) {
    auto fn = [&pg](const std::vector<Tensor>& in) {
      Tensor y = mul(in[0], 2.0);
      pg.all_reduce(y);
      pg.broadcast(y, 1);
      return std::vector<Tensor>{add(y, 1.0), pg.all_gather(in[0])};
    };
    const Tensor x = full({4}, pg.rank() + 1.0);
    const CompiledFn f = compile(fn, {x}, {.mode = CompileOptions::Mode::kCompiled});
    const std::vector<Tensor> got = f({x});
    const std::string graph = f.report({x}).traced_graph;
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(to_vector(got[0]), std::vector<double>(4, 7.0));  // (2·1 + 2·2) + 1
    EXPECT_EQ(to_vector(got[1]), (std::vector<double>{1, 1, 1, 1, 2, 2, 2, 2}));
    EXPECT_TRUE(FileCheck(graph, R"(
      CHECK: all_reduce(%
      CHECK: broadcast(%
      CHECK: all_gather(%
    )")) << graph;
  });
}

// A collective whose result one rank does not use still runs there, as in eager (the other ranks
// wait for it): dead-code elimination keeps collectives.
TEST(CollectiveOps, AnUnusedResultStillRunsItsCollective) {
  std::mutex mu;
  RunThreadRanks(
      2,
      [&](ProcessGroup& pg) {
        auto fn = [&pg](const std::vector<Tensor>& in) {
          const Tensor y = all_reduce(in[0], pg);
          return std::vector<Tensor>{pg.rank() == 0 ? add(y, 1.0) : add(in[0], 1.0)};
        };
        const Tensor x = full({3}, pg.rank() + 1.0);
        const CompiledFn f = compile(fn, {x}, {.mode = CompileOptions::Mode::kCompiled});
        const std::vector<double> got = to_vector(f({x})[0]);
        const std::string graph = f.report({x}).final_graph;
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_EQ(got, std::vector<double>(3, pg.rank() == 0 ? 4.0 : 3.0));
        EXPECT_TRUE(FileCheck(graph, "CHECK: all_reduce(%")) << graph;
      },
      std::chrono::seconds(5));
}

// Two calls on one rank's same tensor are two exchanges (another rank passes different ones):
// never merged into one.
TEST(CollectiveOps, TwoCallsAreNeverMerged) {
  std::mutex mu;
  RunThreadRanks(
      2,
      [&](ProcessGroup& pg) {
        auto fn = [&pg](const std::vector<Tensor>& in) {
          const Tensor second = pg.rank() == 0 ? in[0] : mul(in[0], 10.0);
          return std::vector<Tensor>{add(all_reduce(in[0], pg), all_reduce(second, pg))};
        };
        const Tensor x = full({2}, pg.rank() + 1.0);
        const CompiledFn f = compile(fn, {x}, {.mode = CompileOptions::Mode::kCompiled});
        const std::vector<double> got = to_vector(f({x})[0]);
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_EQ(got, std::vector<double>(2, 3.0 + 21.0));  // (1 + 2) + (1 + 20)
      },
      std::chrono::seconds(5));
}

TEST(CollectiveOps, ConstantFoldingLeavesThemToTheRun) {
  std::mutex mu;
  RunThreadRanks(3, [&](ProcessGroup& pg) {
    const Tensor w = full({4}, pg.rank() + 1.0);  // a captured weight, frozen below
    auto fn = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{add(in[0], all_reduce(w, pg))};
    };
    const Tensor x = arange(0, 4, 1, DType::kFloat32);
    CompileOptions o;
    o.mode = CompileOptions::Mode::kCompiled;
    o.freeze_weights = true;
    const CompiledFn f = compile(fn, {x}, o);
    const std::vector<double> first = to_vector(f({x})[0]), second = to_vector(f({x})[0]);
    const std::string graph = f.report({x}).final_graph;
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(first, (std::vector<double>{6, 7, 8, 9}));  // 1 + 2 + 3 added
    EXPECT_EQ(second, first);
    EXPECT_TRUE(FileCheck(graph, "CHECK: all_reduce(%")) << graph;
  });
}

TEST(CollectiveOps, APlanThatOutlivesItsGroupSaysSo) {
  std::optional<CompiledFn> f;
  const Tensor x = ones({3});
  RunThreadRanks(1, [&](ProcessGroup& pg) {
    f.emplace(compile(
        [&pg](const std::vector<Tensor>& in) { return std::vector<Tensor>{all_reduce(in[0], pg)}; },
        {x}, {.mode = CompileOptions::Mode::kCompiled}));
    EXPECT_EQ(to_vector((*f)({x})[0]), to_vector(x));  // a world of one: the tensor itself
  });
  ExpectThrowsWith([&] { (*f)({x}); }, "all_reduce");
  ExpectThrowsWith([&] { (*f)({x}); }, "does not exist");
}

TEST(CollectiveOps, ExportRefusesAPlanWithACollective) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("kiln_collective_export_", getpid());
  RunThreadRanks(1, [&](ProcessGroup& pg) {
    const Tensor x = ones({3});
    const CompiledFn f = compile(
        [&pg](const std::vector<Tensor>& in) { return std::vector<Tensor>{all_reduce(in[0], pg)}; },
        {x}, {.mode = CompileOptions::Mode::kCompiled});
    ExpectThrowsWith([&] { Export(f, {x}, dir.string()); },
                     "whose process group lives in this process only");
  });
  EXPECT_FALSE(std::filesystem::exists(dir / "manifest.json"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
