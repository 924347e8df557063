// Collectives over NCCL (issue #33): the ProcessGroup of ops/distributed.h with one rank per GPU,
// each collective on kiln's current stream of its rank's thread (so it is ordered with the ops
// around it). NCCL (libnccl.so.2) is loaded when the first group is made, not linked: programs
// that never make one do not need it, and a build or machine without it says so then.
//
// Single-process mode: one thread per local GPU, rank r on devices[r] (its current device):
//
//   RunNcclRanks({0, 1}, [&](ProcessGroup& pg) {
//     Tensor t = full({4}, pg.rank() + 1.0, DType::kFloat32, CUDA(pg.rank()));
//     pg.all_reduce(t);                          // every rank: [3, 3, 3, 3] on its GPU
//   });
//
// Tensors must be CUDA tensors on the rank's device; reductions take floating and integer
// dtypes (not bool). Unlike the thread-rank backend, a rank that calls another collective,
// never comes or fails can leave the others waiting inside NCCL on a collective they already
// issued (libnccl has no timeout of its own and kiln does not abort communicators yet):
// RunNcclRanks then does not return. Collectives a rank issues after another failed throw. One
// process per GPU: InitProcessGroup({.backend = "nccl"}) (distributed.h). The collective ops
// (distributed.h) use NCCL's out-of-place forms, and a compiled plan's NCCL calls are captured in
// its CUDA graph.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/distributed.h"

namespace kiln {

// Whether NCCL can be used here; when not, why ("built without CUDA", "no CUDA device", the
// loader's message for libnccl.so.2).
bool NcclAvailable(std::string* why = nullptr);

// NCCL's version as it reports it (e.g. 22807 for 2.28.7); throws if NCCL is not available.
int NcclVersion();

// Runs `body` on one thread per entry of `devices` (distinct CUDA device ordinals), rank r on
// devices[r], all sharing one NCCL communicator set; returns when all are done, rethrowing the
// first failure. Once a rank failed the others' later collectives throw instead of being issued;
// one already issued can still wait for the failed rank forever (see above).
void RunNcclRanks(const std::vector<int>& devices, const std::function<void(ProcessGroup&)>& body);

// `n` ranks on this machine, each a thread: on the CPU thread ranks (RunThreadRanks), on a CUDA
// device one rank per GPU over NCCL, rank r on cuda:r (RunNcclRanks). What the examples' --tp
// runs.
void RunLocalRanks(int n, Device device, const std::function<void(ProcessGroup&)>& body);

class TcpStore;
// One process per rank (InitProcessGroup with backend "nccl"): NCCL's id through `store` (rank 0
// makes it), device `device` made current for this thread. The group keeps the store.
std::unique_ptr<ProcessGroup> NcclGroupThroughStore(std::unique_ptr<TcpStore> store, int rank,
                                                    int world, int device);

}  // namespace kiln
