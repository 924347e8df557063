// Collectives over thread ranks (ops/distributed.h) and the tensor-parallel modules
// (ops/tensor_parallel.h), on the CPU: every collective for 1..4 ranks against values computed
// here, results bit-identical on every rank, the failures (ranks calling different collectives or
// shapes, a rank that never comes, a rank that throws) reported on every rank; column- and
// row-parallel linears and the GeGLU MLP split over 1, 2 and 4 ranks against the whole module.
#include "ops/distributed.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "ops/tensor_parallel.h"
#include "runtime/status.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

// Rank r's tensor: [6] of r * 10 + i (i = 0..5), float32.
Tensor RankTensor(int r) {
  std::vector<double> v;
  for (int i = 0; i < 6; ++i) v.push_back(r * 10 + i);
  return from_vector(v, {6}, DType::kFloat32);
}

TEST(ThreadRanks, EveryCollectiveGivesTheValuesOfItsDefinition) {
  for (int n : {1, 2, 3, 4}) {
    std::mutex mu;
    RunThreadRanks(n, [&](ProcessGroup& pg) {
      const int r = pg.rank();
      ASSERT_EQ(pg.world_size(), n);
      Tensor sum = RankTensor(r);
      pg.all_reduce(sum);
      Tensor max = RankTensor(r);
      pg.all_reduce(max, ReduceOp::kMax);
      const Tensor gathered = pg.all_gather(RankTensor(r));
      const Tensor big = full({2 * n}, r + 1.0);
      const Tensor scattered = pg.reduce_scatter(big);
      Tensor b = RankTensor(r);
      pg.broadcast(b, n - 1);
      std::lock_guard<std::mutex> lock(mu);  // gtest's assertions from one thread at a time
      const std::vector<double> s = to_vector(sum), m = to_vector(max), g = to_vector(gathered),
                                sc = to_vector(scattered), bc = to_vector(b);
      for (int i = 0; i < 6; ++i) {
        EXPECT_EQ(s[i], 10.0 * n * (n - 1) / 2 + n * i) << "n " << n << " rank " << r;
        EXPECT_EQ(m[i], 10.0 * (n - 1) + i);
        EXPECT_EQ(bc[i], 10.0 * (n - 1) + i);
      }
      ASSERT_EQ(g.size(), 6u * n);
      for (int k = 0; k < 6 * n; ++k) EXPECT_EQ(g[k], 10.0 * (k / 6) + k % 6);
      ASSERT_EQ(sc.size(), 2u);
      for (double v : sc) EXPECT_EQ(v, n * (n + 1) / 2.0);  // sum of r + 1 over the ranks
    });
  }
}

// Sums of floats whose order matters give the same bits on every rank.
TEST(ThreadRanks, ReductionsAreBitIdenticalOnEveryRank) {
  const int n = 4;
  std::vector<std::vector<float>> got(n);
  RunThreadRanks(n, [&](ProcessGroup& pg) {
    Generator gen(100 + pg.rank());
    Tensor t = mul(randn({257}, gen, DType::kFloat32), std::pow(10.0, pg.rank()));
    pg.all_reduce(t);
    const std::vector<double> v = to_vector(t);
    got[pg.rank()].assign(v.begin(), v.end());
  });
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(std::memcmp(got[r].data(), got[0].data(), got[0].size() * sizeof(float)), 0) << r;
  }
}

TEST(ThreadRanks, RanksThatCallDifferentThingsFailOnEveryRank) {
  ExpectThrowsWith(
      [] {
        RunThreadRanks(2, [](ProcessGroup& pg) {
          Tensor t = RankTensor(pg.rank());
          if (pg.rank() == 0) {
            pg.all_reduce(t);
          } else {
            pg.broadcast(t, 0);
          }
        });
      },
      "all_reduce #0: the ranks' calls differ (rank 0: all_reduce of float32 [6]; rank 1: "
      "broadcast from 0 of float32 [6])");
  ExpectThrowsWith(
      [] {
        RunThreadRanks(3, [](ProcessGroup& pg) {
          Tensor t = full({pg.rank() == 2 ? 5 : 6}, 1.0);
          pg.all_reduce(t);
        });
      },
      "rank 2: all_reduce of float32 [5]");
}

// A timeout must be positive (0 ms would fail every collective at once).
TEST(ThreadRanks, ATimeoutMustBePositive) {
  EXPECT_THROW(RunThreadRanks(
                   1, [](ProcessGroup&) {}, std::chrono::milliseconds(0)),
               Error);
}

TEST(ThreadRanks, ARankThatNeverComesTimesOutNamingIt) {
  ExpectThrowsWith(
      [] {
        RunThreadRanks(
            3,
            [](ProcessGroup& pg) {
              Tensor t = RankTensor(pg.rank());
              if (pg.rank() != 1) pg.all_reduce(t);
            },
            std::chrono::milliseconds(200));
      },
      "rank(s) 1 of 3 did not come within 200 ms");
}

TEST(ThreadRanks, ARankThatThrowsFailsTheOthersAndItsErrorComesBack) {
  ExpectThrowsWith(
      [] {
        RunThreadRanks(2, [](ProcessGroup& pg) {
          if (pg.rank() == 1) KILN_FAIL("rank 1's own mistake");
          Tensor t = RankTensor(0);
          pg.all_reduce(t);  // wakes with "rank 1 failed" instead of waiting for the timeout
        });
      },
      "rank 1's own mistake");
}

TEST(ThreadRanks, BadArgumentsAreRefused) {
  ExpectThrowsWith([] { RunThreadRanks(0, [](ProcessGroup&) {}); }, "world size 0");
  ExpectThrowsWith(
      [] { RunThreadRanks(2, [](ProcessGroup& pg) { pg.reduce_scatter(full({3}, 1.0)); }); },
      "dim 0 of [3] must be a multiple of the world size 2");
  ExpectThrowsWith(
      [] {
        RunThreadRanks(2, [](ProcessGroup& pg) {
          Tensor t = full({2}, 1.0);
          pg.broadcast(t, 2);
        });
      },
      "source rank 2 is not in 0..1");
}

// The split modules against the whole one, for 1, 2 and 4 ranks (float32; the row-parallel sum
// is reordered, so close rather than equal).
TEST(TensorParallel, SplitLayersGiveTheWholeModulesResult) {
  Generator gen(7);
  Linear col(16, 24, /*bias=*/true, gen), row(24, 16, /*bias=*/true, gen);
  GeGLUMLP mlp(16, 32, gen);
  const Tensor x = randn({3, 5, 16}, gen, DType::kFloat32);
  const std::vector<double> want_col = to_vector(col(x)), want_row = to_vector(row(col(x))),
                            want_mlp = to_vector(mlp(x));
  for (int n : {1, 2, 4}) {
    std::mutex mu;
    RunThreadRanks(n, [&](ProcessGroup& pg) {
      ColumnParallelLinear c(col, pg);
      RowParallelLinear r(row, pg);
      TensorParallelGeGLUMLP m(mlp, pg);
      const Tensor shard = c(x);  // this rank's 24 / n output features
      const Tensor whole = pg.all_gather(contiguous(transpose(shard, 0, 2)));
      const std::vector<double> got_col = to_vector(contiguous(transpose(whole, 0, 2)));
      const std::vector<double> got_row = to_vector(r(shard)), got_mlp = to_vector(m(x));
      std::lock_guard<std::mutex> lock(mu);
      const std::string at = "n " + std::to_string(n) + " rank " + std::to_string(pg.rank());
      ExpectClose(got_col, want_col, {1e-6, 1e-6}, at + " column");
      ExpectClose(got_row, want_row, {1e-5, 1e-5}, at + " row");
      ExpectClose(got_mlp, want_mlp, {1e-5, 1e-5}, at + " mlp");
    });
  }
}

// An LM head split by the vocabulary (10 rows over 1..4 ranks: 4 ranks get 3, 3, 3 and 1 real
// rows, the last padded with zeros): the gathered logits are the whole head's, on every rank.
TEST(TensorParallel, AVocabularySplitThatDoesNotDivideGathersTheWholeLogits) {
  Generator gen(9);
  Linear head(8, 10, /*bias=*/true, gen);
  const Tensor h = randn({2, 3, 8}, gen, DType::kFloat32);
  const std::vector<double> want = to_vector(head(h));
  for (int n : {1, 2, 3, 4}) {
    std::mutex mu;
    RunThreadRanks(n, [&](ProcessGroup& pg) {
      const Tensor rows = PaddedRowShard(head.weight(), pg.rank(), n);
      const Tensor bias = PaddedRowShard(head.bias(), pg.rank(), n);
      const Tensor logits = GatherVocab(linear(h, rows, bias), 10, pg);
      std::lock_guard<std::mutex> lock(mu);
      const std::string at = "n " + std::to_string(n) + " rank " + std::to_string(pg.rank());
      EXPECT_EQ(rows.shape(), (Shape{(10 + n - 1) / n, 8})) << at;
      if (n == 4 && pg.rank() == 3) {  // row 9 only, then two zero rows
        EXPECT_EQ(to_vector(slice(rows, 0, 1, 3)), std::vector<double>(16, 0.0));
      }
      EXPECT_EQ(logits.shape(), (Shape{2, 3, 10})) << at;
      ExpectClose(to_vector(logits), want, {1e-6, 1e-6}, at);
    });
  }
  ExpectThrowsWith(
      [&] { RunThreadRanks(2, [&](ProcessGroup& pg) {
              GatherVocab(zeros({2, 4}), 10, pg);
            }); },
      "GatherVocab: 2 parts of [2, 4] are not a vocabulary of 10 split by PaddedRowShard (the "
      "last dim must be ceil(vocab / world) = 5)");
  // Parts wider than PaddedRowShard's covered the vocabulary but put rank 1's logits past the
  // cut: every rank got rank 0's values only.
  ExpectThrowsWith(
      [&] { RunThreadRanks(2, [&](ProcessGroup& pg) {
              GatherVocab(zeros({2, 4}), 3, pg);
            }); },
      "the last dim must be ceil(vocab / world) = 2");
}

TEST(TensorParallel, SizesThatDoNotSplitAreRefused) {
  Generator gen(8);
  Linear odd(16, 18, false, gen);
  ExpectThrowsWith(
      [&] { RunThreadRanks(4, [&](ProcessGroup& pg) { ColumnParallelLinear c(odd, pg); }); },
      "ColumnParallelLinear: 18 output features do not split over 4 ranks");
  Linear odd_in(18, 16, false, gen);
  ExpectThrowsWith(
      [&] { RunThreadRanks(4, [&](ProcessGroup& pg) { RowParallelLinear r(odd_in, pg); }); },
      "RowParallelLinear: 18 input features do not split over 4 ranks");
  ExpectThrowsWith(
      [&] {
        RunThreadRanks(2, [&](ProcessGroup& pg) {
          RowParallelLinear r(odd_in, pg);
          r(full({2, 18}, 1.0));  // the whole input, not this rank's 9 features
        });
      },
      "takes its 9 input features, got a last dim of 18");
}

}  // namespace
}  // namespace kiln
