// Collectives (see distributed.h) over an exchange of every rank's call, computed on each rank
// in rank order (identical bits everywhere). Threads of one process: two barriers, each rank
// leaves its tensor in its slot, all meet, each checks that every rank called the same thing and
// computes its result from the slots, all meet again (so no slot is overwritten while another
// rank reads it). Processes (InitProcessGroup): each call goes through the TCP store.
#include "ops/distributed.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ops/factories.h"
#include "ops/nccl.h"
#include "ops/ops.h"
#include "ops/tcp_store.h"
#include "runtime/cuda.h"
#include "runtime/status.h"

namespace kiln {
namespace {

enum class Kind { kAllReduce, kAllGather, kReduceScatter, kBroadcast };

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kBroadcast:
      return "broadcast";
  }
  return "?";
}

// One rank's call: what it asked for and its tensor, on the CPU.
struct Call {
  Kind kind = Kind::kAllReduce;
  ReduceOp op = ReduceOp::kSum;
  int src = 0;
  Tensor input;
  std::string Describe() const {
    return absl::StrCat(KindName(kind), kind == Kind::kBroadcast ? absl::StrCat(" from ", src) : "",
                        " of ", DTypeName(input.dtype()), " ", ShapeString(input.shape()),
                        op == ReduceOp::kMax ? " (max)" : "");
  }
};

// Empty when every rank called the same collective with the same shape and dtype; else what
// differs, naming the first rank that differs from rank 0.
std::string Disagreement(const std::vector<Call>& calls, const std::string& what) {
  for (size_t r = 1; r < calls.size(); ++r) {
    const Call &a = calls[0], &b = calls[r];
    if (a.kind != b.kind || a.op != b.op || a.src != b.src || a.input.dtype() != b.input.dtype() ||
        a.input.shape() != b.input.shape()) {
      return absl::StrCat("collective ", what, ": the ranks' calls differ (rank 0: ", a.Describe(),
                          "; rank ", r, ": ", b.Describe(), ")");
    }
  }
  return "";
}

// The state the ranks share.
class ThreadWorld {
 public:
  ThreadWorld(int n, std::chrono::milliseconds timeout)
      : n_(n), timeout_(timeout), slots_(n), joined_(n, false), busy_(n, false) {}

  int size() const { return n_; }

  // Leaves `call` in `rank`'s slot and returns every rank's, once all have come; throws when the
  // group failed, a rank does not come in time, or the calls differ (then the group fails).
  std::vector<Call> Exchange(int rank, Call call, int64_t seq) {
    const std::string what = absl::StrCat(KindName(call.kind), " #", seq);
    bool second = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      second = busy_[rank];
      if (!second) {
        busy_[rank] = true;
        slots_[rank] = std::move(call);
      }
    }
    if (second) {
      Fail(
          absl::StrCat(what, ": rank ", rank, " issued it while another collective of that rank ",
                       "is still in progress (two threads of one rank issue collectives: a rank's ",
                       "collectives must come one at a time, in one order on every rank)"));
    }
    Barrier(rank, what);
    std::vector<Call> calls;
    {
      std::lock_guard<std::mutex> lock(mu_);
      calls = slots_;
    }
    if (const std::string differ = Disagreement(calls, what); !differ.empty()) Fail(differ);
    return calls;
  }

  // After reading the slots: no rank writes its next call before all have read.
  void Done(int rank, int64_t seq) {
    Barrier(rank, absl::StrCat("collective #", seq, "'s end"));
    std::lock_guard<std::mutex> lock(mu_);
    busy_[rank] = false;
  }

  // Marks the group failed (the first reason is kept) and wakes every waiting rank.
  void Abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.empty()) failed_ = why;
    cv_.notify_all();
  }

 private:
  [[noreturn]] void Fail(const std::string& why) {
    Abort(why);
    throw Error(absl::InvalidArgumentError(why));
  }

  void Barrier(int rank, const std::string& what) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!failed_.empty()) {
      throw Error(absl::AbortedError(absl::StrCat("rank ", rank, ": ", what, ": ", failed_)));
    }
    const int64_t generation = generation_;
    joined_[rank] = true;
    if (++count_ == n_) {
      count_ = 0;
      ++generation_;
      std::fill(joined_.begin(), joined_.end(), false);
      cv_.notify_all();
      return;
    }
    const bool woke =
        cv_.wait_for(lock, timeout_, [&] { return generation_ != generation || !failed_.empty(); });
    if (woke && generation_ != generation) return;
    if (!woke) {
      std::vector<int> missing;
      for (int r = 0; r < n_; ++r) {
        if (!joined_[r]) missing.push_back(r);
      }
      if (failed_.empty()) {
        failed_ = absl::StrCat(what, ": rank(s) ", absl::StrJoin(missing, ", "), " of ", n_,
                               " did not come within ", timeout_.count(), " ms");
      }
      cv_.notify_all();
    }
    throw Error(absl::AbortedError(absl::StrCat("rank ", rank, ": ", what, ": ", failed_)));
  }

  const int n_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call> slots_;
  std::vector<bool> joined_;
  std::vector<bool> busy_;  // a rank between its Exchange and its Done
  int count_ = 0;
  int64_t generation_ = 0;
  std::string failed_;  // non-empty once the group failed
};

Tensor Reduce(const std::vector<Call>& calls, ReduceOp op) {
  Tensor acc = calls[0].input;
  for (size_t r = 1; r < calls.size(); ++r) {
    acc = op == ReduceOp::kSum ? add(acc, calls[r].input) : maximum(acc, calls[r].input);
  }
  return acc;
}

// The four collectives over an exchange of every rank's call (its tensor on the CPU), which the
// backends provide: the thread group through shared slots, the store group through a TcpStore.
class ExchangeGroup : public ProcessGroup {
 public:
  void AllReduceInto(const Tensor& in, const Tensor& out, ReduceOp op) override {
    Store(out, Run(Kind::kAllReduce, op, 0, in,
                   [&](const std::vector<Call>& calls) { return Reduce(calls, op); }));
  }

  void AllGatherInto(const Tensor& in, const Tensor& out) override {
    Store(out, Run(Kind::kAllGather, ReduceOp::kSum, 0, in, [](const auto& calls) {
            std::vector<Tensor> parts;
            for (const Call& c : calls) parts.push_back(c.input);
            return cat(parts, 0);
          }));
  }

  void ReduceScatterInto(const Tensor& in, const Tensor& out, ReduceOp op) override {
    const int64_t part = out.size(0);
    Store(out, Run(Kind::kReduceScatter, op, 0, in, [&](const auto& calls) {
            return slice(Reduce(calls, op), 0, rank() * part, (rank() + 1) * part);
          }));
  }

  void BroadcastInto(const Tensor& in, const Tensor& out, int src) override {
    // A copy, taken before the exchange ends: rank src may write its tensor right after.
    Store(out, Run(Kind::kBroadcast, ReduceOp::kSum, src, in,
                   [&](const auto& calls) { return clone(calls[src].input); }));
  }

 protected:
  // Every rank's call of collective `seq` (this rank's is `mine`), once all have come; throws
  // when a rank does not come in time or the calls differ.
  virtual std::vector<Call> Exchange(Call mine, int64_t seq) = 0;
  // After this rank computed its result of collective `seq`.
  virtual void Done(int64_t seq) = 0;

 private:
  // The exchange around `compute` (this rank's result from every rank's call). The result is read
  // after the exchange ends, when the other ranks may already write their tensors again: it must
  // not alias another rank's input (a copy, or a new tensor computed from them).
  template <typename Fn>
  Tensor Run(Kind kind, ReduceOp op, int src, const Tensor& t, Fn compute) {
    KILN_CHECK(t.defined(), KindName(kind), ": the tensor is undefined");
    KILN_CHECK(!t.device().is_cuda() || !cuda::Capturing(), KindName(kind),
               ": this group's collectives go through the host (ranks as threads, or a TCP store), "
               "which a CUDA graph cannot capture: use an NCCL group, or run without CUDA graphs");
    const int64_t seq = seq_++;
    const Tensor result = compute(Exchange(Call{kind, op, src, contiguous(to(t, kCPU))}, seq));
    Done(seq);
    return result;
  }

  // This rank's result (on the CPU) into `out`.
  static void Store(const Tensor& out, const Tensor& result) {
    copy_(out, to(result, out.device()));
  }

  int64_t seq_ = 0;
};

class ThreadGroup : public ExchangeGroup {
 public:
  ThreadGroup(ThreadWorld& world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_.size(); }

 private:
  // (A throw from here on reaches RunThreadRanks, which fails the group.)
  std::vector<Call> Exchange(Call mine, int64_t seq) override {
    return world_.Exchange(rank_, std::move(mine), seq);
  }
  void Done(int64_t seq) override { world_.Done(rank_, seq); }

  ThreadWorld& world_;
  const int rank_;
};

// ---- One process per rank (InitProcessGroup) -------------------------------------------------

// The most dims a tensor may have to go through the store (as torch's tensors).
constexpr int kStoreMaxDims = 64;

// A call as bytes: "kind op src dtype rank d0 d1 ...\n" then the tensor's bytes.
std::string Encode(const Call& c) {
  KILN_CHECK(c.input.dim() <= kStoreMaxDims, c.Describe(), ": a tensor of ", c.input.dim(),
             " dims; collectives between processes carry at most ", kStoreMaxDims);
  std::string s = absl::StrCat(static_cast<int>(c.kind), " ", static_cast<int>(c.op), " ", c.src,
                               " ", static_cast<int>(c.input.dtype()), " ", c.input.dim());
  for (int64_t d : c.input.shape()) absl::StrAppend(&s, " ", d);
  s += "\n";
  const size_t bytes = static_cast<size_t>(c.input.numel() * DTypeSize(c.input.dtype()));
  if (bytes > 0) s.append(static_cast<const char*>(c.input.data_ptr()), bytes);
  return s;
}

Call Decode(const std::string& s, const std::string& what) {
  const size_t eol = s.find('\n');
  KILN_CHECK(eol != std::string::npos, what, ": a malformed message in the store");
  std::istringstream in(s.substr(0, eol));
  int kind = 0, op = 0, dtype = 0;
  int64_t rank = 0;
  Call c;
  in >> kind >> op >> c.src >> dtype >> rank;
  KILN_CHECK(!in.fail() && kind >= 0 && kind <= 3 && op >= 0 && op <= 1 && dtype >= 0 &&
                 dtype < kNumDTypes && rank >= 0 && rank <= kStoreMaxDims,
             what, ": a malformed message in the store");
  Shape shape(static_cast<size_t>(rank));
  for (int64_t& d : shape) {
    in >> d;
    KILN_CHECK(!in.fail() && d >= 0, what, ": a malformed shape in the store");
  }
  c.kind = static_cast<Kind>(kind);
  c.op = static_cast<ReduceOp>(op);
  c.input = empty(shape, static_cast<DType>(dtype));
  const size_t bytes = static_cast<size_t>(c.input.numel() * DTypeSize(c.input.dtype()));
  KILN_CHECK(s.size() - eol - 1 == bytes, what, ": a message of ", s.size() - eol - 1,
             " bytes for ", ShapeString(shape));
  if (bytes > 0) std::memcpy(c.input.data_ptr(), s.data() + eol + 1, bytes);
  return c;
}

// Each collective publishes this rank's call under "c<seq>/<rank>" and reads every rank's: a
// rank that does not come within the store's timeout is named. A rank deletes its previous key
// once every rank has published the next one (so all have read it).
class StoreGroup : public ExchangeGroup {
 public:
  StoreGroup(std::unique_ptr<TcpStore> store, int rank, int world)
      : store_(std::move(store)), rank_(rank), world_(world) {}
  ~StoreGroup() override { LeaveStore(*store_, rank_, world_); }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

 private:
  static std::string Key(int64_t seq, int rank) { return absl::StrCat("c", seq, "/", rank); }

  std::vector<Call> Exchange(Call mine, int64_t seq) override {
    const std::string what = absl::StrCat(KindName(mine.kind), " #", seq);
    store_->Set(Key(seq, rank_), Encode(mine));
    std::vector<Call> calls(world_);
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) {
        calls[r] = mine;
        continue;
      }
      std::string bytes;
      try {
        bytes = store_->Get(Key(seq, r));
      } catch (const Error& e) {
        if (e.status().code() != absl::StatusCode::kDeadlineExceeded) throw;
        throw Error(absl::DeadlineExceededError(
            absl::StrCat("rank ", rank_, ": collective ", what, ": rank ", r, " of ", world_,
                         " did not come within ", store_->timeout().count(), " ms")));
      }
      calls[r] = Decode(bytes, what);
    }
    const std::string differ = Disagreement(calls, what);
    KILN_CHECK(differ.empty(), "rank ", rank_, ": ", differ);
    if (seq > 0) store_->Delete(Key(seq - 1, rank_));
    return calls;
  }
  void Done(int64_t) override {}

  std::unique_ptr<TcpStore> store_;
  const int rank_, world_;
};

// An integer environment variable, or the error naming it.
int EnvInt(const char* name, int lo, int hi) {
  const char* v = std::getenv(name);
  KILN_CHECK(v != nullptr && *v != '\0', "InitProcessGroup: ", name,
             " is not set (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)");
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  KILN_CHECK(*end == '\0' && n >= lo && n <= hi, "InitProcessGroup: ", name, "='", v,
             "' is not an integer in ", lo, "..", hi);
  return static_cast<int>(n);
}

// The store's port: KILN_STORE_PORT when set; under torchrun's agent (which serves its own store
// on MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE set) MASTER_PORT + 1; else MASTER_PORT.
int StorePort() {
  if (const char* own = std::getenv("KILN_STORE_PORT"); own != nullptr && *own != '\0') {
    return EnvInt("KILN_STORE_PORT", 1, 65535);
  }
  const int master = EnvInt("MASTER_PORT", 1, 65535);
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool torchrun = agent != nullptr && *agent != '\0' && std::string(agent) != "False" &&
                        std::string(agent) != "0";
  KILN_CHECK(!torchrun || master < 65535, "InitProcessGroup: MASTER_PORT ", master,
             " leaves no port after it for kiln's store (set KILN_STORE_PORT)");
  return torchrun ? master + 1 : master;
}

}  // namespace

void RunThreadRanks(int world_size, const std::function<void(ProcessGroup&)>& body,
                    std::chrono::milliseconds timeout) {
  KILN_CHECK(world_size >= 1 && world_size <= 1024, "RunThreadRanks: world size ", world_size,
             " is not in 1..1024");
  KILN_CHECK(timeout.count() > 0, "RunThreadRanks: the timeout must be positive, got ",
             timeout.count(), " ms");
  ThreadWorld world(world_size, timeout);
  // Each rank's error, and whether it is only the echo of another rank's failure (kAborted).
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<char> echo(world_size, 0);  // not vector<bool>: the ranks write it at once
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      ThreadGroup group(world, r);
      try {
        body(group);
      } catch (const Error& e) {
        errors[r] = std::current_exception();
        echo[r] = e.status().code() == absl::StatusCode::kAborted;
        world.Abort(absl::StrCat("rank ", r, " failed: ", e.what()));
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        world.Abort(absl::StrCat("rank ", r, " failed: ", e.what()));
      } catch (...) {
        errors[r] = std::current_exception();
        world.Abort(absl::StrCat("rank ", r, " failed"));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // The first rank's own error comes back before the echoes it caused in the others.
  for (bool echoes : {false, true}) {
    for (int r = 0; r < world_size; ++r) {
      if (errors[r] != nullptr && (echo[r] != 0) == echoes) std::rethrow_exception(errors[r]);
    }
  }
}

namespace {

// This rank marks `prefix`/<rank> in the store; rank 0, whose process serves it, then waits (each
// at most the store's timeout) until every other rank not in `absent` has marked too, so that no
// rank still reading loses the store. A rank gone or slow ends the wait: its own error says why.
void MarkAndAwaitOthers(TcpStore& store, const std::string& prefix, int rank, int world,
                        const std::vector<int>& absent = {}) {
  try {
    store.Set(absl::StrCat(prefix, "/", rank), "");
    if (rank != 0) return;
    for (int r = 1; r < world; ++r) {
      if (std::find(absent.begin(), absent.end(), r) == absent.end()) {
        store.Get(absl::StrCat(prefix, "/", r));
      }
    }
  } catch (const Error&) {
    // A rank that already failed: nothing more to wait for.
  }
}

// A failed rendezvous: every rank that came reports it itself (the missing rank, not rank 0's
// exit), rank 0 keeping the store up until they have.
[[noreturn]] void FailRendezvous(TcpStore& store, int rank, int world,
                                 const std::vector<int>& missing, const std::string& failure) {
  MarkAndAwaitOthers(store, "join_failed", rank, world, missing);
  throw Error(absl::InvalidArgumentError(failure));
}

}  // namespace

std::unique_ptr<ProcessGroup> InitProcessGroup(const ProcessGroupOptions& options) {
  KILN_CHECK(options.backend == "cpu" || options.backend == "nccl", "InitProcessGroup: backend '",
             options.backend, "' is not one of \"cpu\", \"nccl\"");
  const int world = EnvInt("WORLD_SIZE", 1, 1024), rank = EnvInt("RANK", 0, world - 1);
  const int port = StorePort();
  const char* addr = std::getenv("MASTER_ADDR");
  const std::string host = addr != nullptr && *addr != '\0' ? addr : "127.0.0.1";
  auto store = std::make_unique<TcpStore>(host, port, rank == 0, options.timeout);
  // Rendezvous: every rank says it is here and what world it expects.
  store->Set(absl::StrCat("join/", rank), std::to_string(world));
  std::vector<int> missing;
  std::string failure;
  for (int r = 0; r < world; ++r) {
    try {
      const std::string theirs =
          store->Get(absl::StrCat("join/", r),
                     missing.empty() ? options.timeout : std::chrono::milliseconds(1));
      if (theirs != std::to_string(world) && failure.empty()) {
        failure = absl::StrCat("InitProcessGroup: rank ", r, " has WORLD_SIZE ", theirs, ", rank ",
                               rank, " has ", world);
      }
    } catch (const Error& e) {
      if (e.status().code() != absl::StatusCode::kDeadlineExceeded) throw;
      missing.push_back(r);
    }
  }
  if (!missing.empty()) {
    failure = absl::StrCat("InitProcessGroup: rank(s) ", absl::StrJoin(missing, ", "), " of ",
                           world, " did not join within ", options.timeout.count(), " ms (rank ",
                           rank, ", store at ", host, ":", port, ")");
  }
  if (!failure.empty()) FailRendezvous(*store, rank, world, missing, failure);
  if (options.backend == "nccl") {
    const char* local = std::getenv("LOCAL_RANK");
    const int device = local != nullptr && *local != '\0' ? EnvInt("LOCAL_RANK", 0, 1023) : rank;
    return NcclGroupThroughStore(std::move(store), rank, world, device);
  }
  return std::make_unique<StoreGroup>(std::move(store), rank, world);
}

void RunLocalRanks(int n, Device device, const std::function<void(ProcessGroup&)>& body) {
  if (!device.is_cuda()) return RunThreadRanks(n, body);
  KILN_CHECK(n >= 1, "RunLocalRanks: needs one or more ranks, got ", n);
  std::vector<int> devices;
  for (int i = 0; i < n; ++i) devices.push_back(i);
  RunNcclRanks(devices, body);
}

void LeaveStore(TcpStore& store, int rank, int world) {
  MarkAndAwaitOthers(store, "done", rank, world);
}

}  // namespace kiln
