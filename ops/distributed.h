// Collectives over a group of ranks (issue #33): the interface every backend implements, with
// torch.distributed's semantics; the backend whose ranks are threads of one process, on which
// the parallel math is tested on any machine (CI has no GPU); the one whose ranks are processes
// started with torchrun's environment (InitProcessGroup, CPU tensors through a TCP store). The
// NCCL backend (ops/nccl.h, one thread per local GPU) implements the same interface.
//
//   RunThreadRanks(2, [&](ProcessGroup& pg) {
//     Tensor t = full({4}, pg.rank() + 1.0);
//     pg.all_reduce(t);                     // every rank: [3, 3, 3, 3]
//     Tensor g = pg.all_gather(t);          // [8]: rank 0's then rank 1's
//   });
//
// The collectives are also ops (registry rows all_reduce, all_gather, reduce_scatter, broadcast):
// kiln::all_reduce(t, group) and the others below return a fresh result and leave `t` alone, run
// eagerly on kiln's current stream, and are traced as nodes of a compiled graph, where fusion
// stops at them and a plan runs them in the traced order (tensor-parallel models compile that
// way). The graph names the group by its id (`all_reduce(%3){group=2, reduce=sum}`); a plan that
// outlives its group throws when it reaches the collective.
//
// Every rank must call the same collectives in the same order with tensors of the same shape and
// dtype; a rank that calls another collective, passes another shape, or does not come within the
// group's timeout makes every rank's call throw kiln::Error naming the collective, its sequence
// number and the ranks that differ. Reductions run in rank order in the tensor's dtype, so every
// rank gets bit-identical results.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "ops/op_def.h"
#include "runtime/tensor.h"

namespace kiln {

// ReduceOp (kSum, kMax) is in ops/op_def.h: it is also the collective ops' attribute.

class ProcessGroup {
 public:
  ProcessGroup();  // takes the next id and enters the table the collective ops look groups up in
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // This group's id in this process (1, 2, ...; never reused): the collective ops' `group`.
  int64_t id() const { return id_; }
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // torch.distributed's forms. Each runs the op form below (kiln::all_reduce, ...), so inside a
  // compiled function they are traced too (an in-place form as the op and a copy_ into `t`).
  // In place: `t` becomes the elementwise reduction of every rank's `t`.
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::kSum);
  // Every rank's `t` concatenated along dim 0, in rank order (a new tensor on `t`'s device).
  Tensor all_gather(const Tensor& t);
  // The reduction of every rank's `t` (dim 0 a multiple of the world size), split along dim 0
  // into world_size equal parts: this rank's part.
  Tensor reduce_scatter(const Tensor& t, ReduceOp op = ReduceOp::kSum);
  // In place: `t` becomes rank `src`'s `t`.
  void broadcast(Tensor& t, int src);

  // What a backend implements and the ops' kernel calls: the collective over every rank's `in`,
  // this rank's result written into `out` (contiguous, of the result's shape and dtype, on `in`'s
  // device). The op's inference has checked the shapes and `src`; a backend checks what only it
  // knows (the device it works on, the dtypes its library takes).
  virtual void AllReduceInto(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  virtual void AllGatherInto(const Tensor& in, const Tensor& out) = 0;
  virtual void ReduceScatterInto(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  virtual void BroadcastInto(const Tensor& in, const Tensor& out, int src) = 0;

 private:
  int64_t id_;
};

// The live group with id `id`, or nullptr (never made, or destroyed).
ProcessGroup* FindProcessGroup(int64_t id);

// A group as a module split over it keeps it: by id, with its size and this rank, so that using
// the module after the group was destroyed is a clear error rather than a dangling pointer.
class GroupRef {
 public:
  GroupRef() = default;  // none: the module is not split
  explicit GroupRef(const ProcessGroup& group)
      : id_(group.id()), world_(group.world_size()), rank_(group.rank()) {}
  bool defined() const { return id_ != 0; }
  int world_size() const { return world_; }  // 1 when none
  int rank() const { return rank_; }         // 0 when none
  // The group; throws naming `who` when it no longer exists.
  ProcessGroup& get(const char* who) const;

 private:
  int64_t id_ = 0;
  int world_ = 1, rank_ = 0;
};

// The collectives as ops (see above): fresh results, `t` unchanged, traced by compile().
Tensor all_reduce(const Tensor& t, ProcessGroup& group, ReduceOp op = ReduceOp::kSum);
Tensor all_gather(const Tensor& t, ProcessGroup& group);  // dim 0 × world size
Tensor reduce_scatter(const Tensor& t, ProcessGroup& group, ReduceOp op = ReduceOp::kSum);
Tensor broadcast(const Tensor& t, ProcessGroup& group, int src);

// Runs `body` on `world_size` threads, one rank each, sharing one group; returns when all are
// done. If a rank throws, the others' pending and later collectives throw too ("rank R failed"),
// and the first rank's error is rethrown here. `timeout`: how long a collective waits for the
// other ranks before it throws.
void RunThreadRanks(int world_size, const std::function<void(ProcessGroup&)>& body,
                    std::chrono::milliseconds timeout = std::chrono::seconds(60));

struct ProcessGroupOptions {
  std::string backend = "cpu";  // "cpu": CPU tensors through the store; "nccl": see below
  std::chrono::milliseconds timeout = std::chrono::seconds(60);  // joining, and each collective
};
// One process per rank, from torchrun's environment: RANK, WORLD_SIZE, MASTER_PORT and
// MASTER_ADDR (default 127.0.0.1). Rank 0 serves a TCP store (ops/tcp_store.h) that every rank
// joins, on MASTER_PORT (MASTER_PORT + 1 under torchrun's agent, which holds MASTER_PORT for its
// own store; KILN_STORE_PORT overrides both); a rank that does not join, or says another
// WORLD_SIZE, fails every rank's call naming it. The "cpu" backend sends each collective's tensors
// through the store (tests and small CPU jobs: every rank reads every rank's tensor), reduces in
// rank order (identical bits) and names a rank that does not come to a collective within the
// timeout. Destroying rank 0's group waits (at most the timeout) until every rank has destroyed its
// own. Backend "nccl": one GPU per process (cuda:LOCAL_RANK, else cuda:RANK), NCCL's id through the
// store; tensors must be on that GPU (ops/nccl.h).
std::unique_ptr<ProcessGroup> InitProcessGroup(const ProcessGroupOptions& options = {});

class TcpStore;
// How a group made through a store says goodbye: this rank marks itself done; rank 0 (whose
// process serves the store) waits, at most the store's timeout, until every rank has.
void LeaveStore(TcpStore& store, int rank, int world);

}  // namespace kiln
