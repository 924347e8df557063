// Collectives (see distributed.h): the group whose ranks are threads of one process. A collective
// is two barriers: each rank leaves its tensor in its slot, all meet, each checks that every rank
// called the same thing and computes its result from the slots (in rank order: identical on every
// rank), all meet again (so no slot is overwritten while another rank reads it), each writes its
// result.
#include "ops/distributed.h"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ops/ops.h"
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

// The state the ranks share.
class ThreadWorld {
 public:
  ThreadWorld(int n, std::chrono::milliseconds timeout)
      : n_(n), timeout_(timeout), slots_(n), joined_(n, false) {}

  int size() const { return n_; }

  // Leaves `call` in `rank`'s slot and returns every rank's, once all have come; throws when the
  // group failed, a rank does not come in time, or the calls differ (then the group fails).
  std::vector<Call> Exchange(int rank, Call call, int64_t seq) {
    const std::string what = absl::StrCat(KindName(call.kind), " #", seq);
    {
      std::lock_guard<std::mutex> lock(mu_);
      slots_[rank] = std::move(call);
    }
    Barrier(rank, what);
    std::vector<Call> calls;
    {
      std::lock_guard<std::mutex> lock(mu_);
      calls = slots_;
    }
    for (int r = 1; r < n_; ++r) {
      const Call &a = calls[0], &b = calls[r];
      if (a.kind != b.kind || a.op != b.op || a.src != b.src ||
          a.input.dtype() != b.input.dtype() || a.input.shape() != b.input.shape()) {
        Fail(absl::StrCat("collective ", what, ": the ranks' calls differ (rank 0: ", a.Describe(),
                          "; rank ", r, ": ", b.Describe(), ")"));
      }
    }
    return calls;
  }

  // After reading the slots: no rank writes its next call before all have read.
  void Done(int rank, int64_t seq) { Barrier(rank, absl::StrCat("collective #", seq, "'s end")); }

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

class ThreadGroup : public ProcessGroup {
 public:
  ThreadGroup(ThreadWorld& world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_.size(); }

  void all_reduce(Tensor& t, ReduceOp op) override {
    const Tensor result = Run(Kind::kAllReduce, op, 0, t,
                              [&](const std::vector<Call>& calls) { return Reduce(calls, op); });
    copy_(t, to(result, t.device()));
  }

  Tensor all_gather(const Tensor& t) override {
    KILN_CHECK(t.dim() >= 1, "all_gather: needs a tensor of rank >= 1, got ",
               ShapeString(t.shape()));
    const Tensor result = Run(Kind::kAllGather, ReduceOp::kSum, 0, t, [](const auto& calls) {
      std::vector<Tensor> parts;
      for (const Call& c : calls) parts.push_back(c.input);
      return cat(parts, 0);
    });
    return to(result, t.device());
  }

  Tensor reduce_scatter(const Tensor& t, ReduceOp op) override {
    const int n = world_.size();
    KILN_CHECK(t.dim() >= 1 && t.size(0) % n == 0, "reduce_scatter: dim 0 of ",
               ShapeString(t.shape()), " must be a multiple of the world size ", n);
    const int64_t part = t.dim() >= 1 ? t.size(0) / n : 0;
    const Tensor result = Run(Kind::kReduceScatter, op, 0, t, [&](const auto& calls) {
      return contiguous(slice(Reduce(calls, op), 0, rank_ * part, (rank_ + 1) * part));
    });
    return to(result, t.device());
  }

  void broadcast(Tensor& t, int src) override {
    KILN_CHECK(src >= 0 && src < world_.size(), "broadcast: source rank ", src, " is not in 0..",
               world_.size() - 1);
    const Tensor result = Run(Kind::kBroadcast, ReduceOp::kSum, src, t,
                              [&](const auto& calls) { return calls[src].input; });
    if (rank_ != src) copy_(t, to(result, t.device()));
  }

 private:
  // The collective's two barriers around `compute` (this rank's result from every rank's call).
  template <typename Fn>
  Tensor Run(Kind kind, ReduceOp op, int src, const Tensor& t, Fn compute) {
    KILN_CHECK(t.defined(), KindName(kind), ": the tensor is undefined");
    const int64_t seq = seq_++;
    // (A throw from here on reaches RunThreadRanks, which fails the group.)
    const Tensor result =
        compute(world_.Exchange(rank_, Call{kind, op, src, contiguous(to(t, kCPU))}, seq));
    world_.Done(rank_, seq);
    return result;
  }

  ThreadWorld& world_;
  const int rank_;
  int64_t seq_ = 0;
};

}  // namespace

void RunThreadRanks(int world_size, const std::function<void(ProcessGroup&)>& body,
                    std::chrono::milliseconds timeout) {
  KILN_CHECK(world_size >= 1 && world_size <= 1024, "RunThreadRanks: world size ", world_size,
             " is not in 1..1024");
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

}  // namespace kiln
