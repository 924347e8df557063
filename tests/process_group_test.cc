// One process per rank (InitProcessGroup, ops/distributed.h) over the TCP store (ops/tcp_store.h),
// on the CPU: the test binary starts itself as the ranks, with torchrun's environment. Every
// collective across 3 processes; a Llama-style model split over 2 processes gives the whole
// model's logits, eager and compiled; a rank that never starts, a rank with another WORLD_SIZE and
// a rank that skips a collective make the others fail naming it; the store itself (set, get,
// waiting, timeout).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "codegen/compile.h"
#include "models/llama.h"
#include "ops/distributed.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "ops/tcp_store.h"
#include "runtime/random.h"
#include "runtime/status.h"
#include "tests/test_util.h"

extern char** environ;

namespace kiln {
namespace {

struct Ranks {
  std::vector<int> exit_codes;
  std::vector<std::string> said;  // what each rank wrote (its error, or "ok")
};

// Starts `launched` copies of this binary as ranks 0..launched-1 of the scenario, rank r with
// WORLD_SIZE world(r), and waits for them.
Ranks RunRanks(const std::string& scenario, int launched, const std::function<int(int)>& world,
               const std::vector<std::string>& extra_env = {}, int port = FreeTcpPort()) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("kiln_pg_" + std::to_string(getpid()) + "_" + scenario))
                              .string();
  std::filesystem::create_directories(dir);
  std::vector<pid_t> pids;
  for (int r = 0; r < launched; ++r) {
    std::vector<std::string> env = {
        "KILN_PG_CHILD=" + scenario, "KILN_PG_OUT=" + dir,
        "RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world(r)),
        "MASTER_ADDR=127.0.0.1",     "MASTER_PORT=" + std::to_string(port)};
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
    std::vector<char*> envp, argv;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string self = "/proc/self/exe", filter = "--gtest_filter=ProcessGroupChild.Body";
    argv = {self.data(), filter.data(), nullptr};
    pid_t pid = 0;
    EXPECT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()), 0);
    pids.push_back(pid);
  }
  Ranks out;
  for (int r = 0; r < launched; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    out.exit_codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    std::ifstream f(dir + "/" + std::to_string(r) + ".txt");
    std::stringstream text;
    text << f.rdbuf();
    out.said.push_back(text.str());
  }
  std::filesystem::remove_all(dir);
  return out;
}

// What a rank process does, by scenario; it writes "ok" or its error to KILN_PG_OUT/<rank>.txt.
void ChildBody(const std::string& scenario, int rank) {
  if (scenario == "collectives") {
    auto pg = InitProcessGroup({.timeout = std::chrono::seconds(30)});
    const int n = pg->world_size();
    Tensor sum = full({4}, rank + 1.0);
    pg->all_reduce(sum);
    Tensor max = full({4}, rank + 1.0);
    pg->all_reduce(max, ReduceOp::kMax);
    const Tensor gathered = pg->all_gather(full({1, 2}, rank, DType::kInt64));
    const Tensor scattered = pg->reduce_scatter(full({2 * n}, 1.0, DType::kBFloat16));
    Tensor b = full({3}, rank + 10.0);
    pg->broadcast(b, n - 1);
    std::vector<double> g;
    for (int k = 0; k < n; ++k) g.insert(g.end(), 2, k);
    KILN_CHECK(to_vector(sum) == std::vector<double>(4, n * (n + 1) / 2.0), "sum");
    KILN_CHECK(to_vector(max) == std::vector<double>(4, n), "max");
    KILN_CHECK(to_vector(gathered) == g, "gather");
    KILN_CHECK(to_vector(scattered) == std::vector<double>(2, n), "scatter");
    KILN_CHECK(to_vector(b) == std::vector<double>(3, n - 1 + 10.0), "broadcast");
    Tensor deep = ones(Shape(20, 1));  // more dims than the store used to carry (16)
    pg->all_reduce(deep);
    KILN_CHECK(to_vector(deep) == std::vector<double>(1, n), "20-dim all_reduce");
  } else if (scenario == "llama") {
    auto pg = InitProcessGroup({.timeout = std::chrono::seconds(30)});
    LlamaConfig c;
    c.vocab = 96, c.dim = 64, c.hidden = 96, c.layers = 2, c.heads = 8, c.kv_heads = 4;
    c.rope.max_positions = 64;
    Generator gen(3);
    LlamaForCausalLM model(c, {.generator = &gen});
    const Tensor tokens = from_vector({5, 17, 2, 40, 33, 9}, {1, 6}, DType::kInt64);
    const std::vector<double> want = to_vector(model(tokens));
    model.ShardTensorParallel(*pg);
    const std::vector<double> got = to_vector(model(tokens));
    // Compiled too: the all-reduces and the logits' gather are ops of the plan, sent through the
    // store like the eager calls.
    const std::vector<double> compiled =
        to_vector(compile(model, tokens, {.mode = CompileOptions::Mode::kCompiled})({tokens})[0]);
    for (size_t i = 0; i < want.size(); ++i) {
      KILN_CHECK(std::abs(got[i] - want[i]) <= 2e-5 * (1 + std::abs(want[i])), "logit ", i, ": ",
                 got[i], " vs ", want[i]);
      KILN_CHECK(std::abs(compiled[i] - want[i]) <= 1e-4 * (1 + std::abs(want[i])),
                 "compiled logit ", i, ": ", compiled[i], " vs ", want[i]);
    }
  } else if (scenario == "join") {  // a rank missing or with another WORLD_SIZE
    InitProcessGroup({.timeout = std::chrono::milliseconds(1500)});
  } else if (scenario == "skip") {  // rank 1 leaves before the first collective
    auto pg = InitProcessGroup({.timeout = std::chrono::milliseconds(1500)});
    if (rank == 1) return;
    Tensor t = full({2}, 1.0);
    pg->all_reduce(t);
  }
}

TEST(ProcessGroupChild, Body) {
  const char* scenario = std::getenv("KILN_PG_CHILD");
  if (scenario == nullptr) GTEST_SKIP() << "runs as a rank of the multi-process tests only";
  const int rank = std::atoi(std::getenv("RANK"));
  std::string said = "ok";
  try {
    ChildBody(scenario, rank);
  } catch (const std::exception& e) {
    said = e.what();
  }
  std::ofstream(std::string(std::getenv("KILN_PG_OUT")) + "/" + std::to_string(rank) + ".txt")
      << said;
}

TEST(ProcessGroup, EveryCollectiveAcrossThreeProcesses) {
  const Ranks r = RunRanks("collectives", 3, [](int) { return 3; });
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.exit_codes[i], 0);
    EXPECT_EQ(r.said[i], "ok") << "rank " << i;
  }
}

// Under torchrun's agent, MASTER_PORT is taken by torch's own store: kiln's goes one port up.
TEST(ProcessGroup, UnderTorchrunsAgentTheStoreTakesTheNextPort) {
  int port = 0, fd = -1;
  for (int attempt = 0; attempt < 20 && fd < 0; ++attempt) {
    port = FreeTcpPort();
    if (port >= 65535) continue;
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 4) != 0) {
      close(fd);
      fd = -1;
    }
  }
  ASSERT_GE(fd, 0) << "no port to stand in for torchrun's store";
  const Ranks r = RunRanks(
      "collectives", 2, [](int) { return 2; }, {"TORCHELASTIC_USE_AGENT_STORE=True"}, port);
  close(fd);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(r.said[i], "ok") << "rank " << i;
}

TEST(ProcessGroup, ALlamaSplitOverTwoProcessesGivesTheWholeModelsLogits) {
  const Ranks r = RunRanks("llama", 2, [](int) { return 2; });
  for (int i = 0; i < 2; ++i) EXPECT_EQ(r.said[i], "ok") << "rank " << i;
}

TEST(ProcessGroup, ARankThatNeverStartsIsNamed) {
  const Ranks r = RunRanks("join", 2, [](int) { return 3; });
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(r.said[i].find("rank(s) 2 of 3 did not join within 1500 ms"), std::string::npos)
        << "rank " << i << ": " << r.said[i];
  }
}

TEST(ProcessGroup, AnotherWorldSizeIsNamed) {
  const Ranks r = RunRanks("join", 2, [](int rank) { return rank == 1 ? 3 : 2; });
  // Rank 1 (WORLD_SIZE 3) waits for a rank 2 that never comes or sees rank 0's 2; rank 0 sees 3.
  EXPECT_NE(r.said[0].find("rank 1 has WORLD_SIZE 3, rank 0 has 2"), std::string::npos)
      << r.said[0];
  EXPECT_NE(r.said[1], "ok");
}

TEST(ProcessGroup, ARankThatSkipsACollectiveIsNamed) {
  const Ranks r = RunRanks("skip", 2, [](int) { return 2; });
  EXPECT_EQ(r.said[1], "ok");
  EXPECT_NE(r.said[0].find("collective all_reduce #0: rank 1 of 2 did not come within 1500 ms"),
            std::string::npos)
      << r.said[0];
}

TEST(TcpStore, SetGetWaitAndTimeout) {
  TcpStore server("127.0.0.1", 0, /*serve=*/true, std::chrono::seconds(5));
  TcpStore client("127.0.0.1", server.port(), /*serve=*/false, std::chrono::seconds(5));
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    client.Set("k", std::string("a\0b", 3));  // values are bytes
  });
  EXPECT_EQ(server.Get("k"), std::string("a\0b", 3));  // waits for the set
  later.join();
  client.Delete("k");
  ExpectThrowsWith([&] { server.Get("k", std::chrono::milliseconds(50)); },
                   "key 'k' was not set within 50 ms");
  ExpectThrowsWith(
      [] { TcpStore("127.0.0.1", FreeTcpPort(), false, std::chrono::milliseconds(200)); },
      "could not reach 127.0.0.1:", "within 200 ms");
  ExpectThrowsWith([&] { server.Get("k", std::chrono::milliseconds(-1)); },
                   "a timeout of -1 ms for key 'k' is not in 0..");
}

}  // namespace
}  // namespace kiln
