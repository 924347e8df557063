// CUDA's runtime API for kiln's CUDA backend, with kiln's checked calls and its dependent launch.
// Only the backend's sources include it (ops/cuda/, the families' *_cuda.cc, runtime/cuda.cc...):
// everything else uses runtime/cuda.h, which needs no CUDA header.
//
//   KILN_CUDA_CHECK(cudaMemsetAsync(p, 0, n, kiln::cuda::CurrentStream()));
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "runtime/cuda.h"

namespace kiln::cuda {

// Programmatic dependent launch (sm_90 and later): launches `kernel` (a __global__ function, or a
// cudaKernel_t cast to const void*) on `stream` so that it may begin while the kernel before it
// finishes: its blocks become resident and wait on the device, and the launch latency and ramp-up
// overlap the predecessor's tail. The rule that keeps it correct: such a kernel executes
// griddepcontrol.wait (kiln_grid_dependency_sync() in generated sources, GridDependencySync() in
// ops/cuda) before it reads anything an earlier kernel may write or writes anything an earlier
// kernel may read; before it, only loads of data that no kernel still running writes (a
// compiled plan's constants, runtime/cuda.h ScopedPlanRun; the GEMV's first weights) and L2
// prefetches (hints, never stale). The wait covers every earlier kernel (each waited for its own
// predecessor), so a buffer the memory planner reuses is safe. A kernel lets its dependent launch
// only after its own wait, so at most one kernel waits ahead of the running one. Into a CUDA graph
// capture the launch becomes a programmatic edge (KILN_PDL_GRAPHS, on by default) where the kernel
// before it is the node before it: the capture allocates from its plan's arena
// (runtime/capture_arena.h), so no memory node stands between two kernels (GPT-2's decode step: 3 %
// more tokens/s at batch 1 on the H100; docs/BENCHMARKS.md). Kernels without the wait, and every
// kernel with KILN_PDL=off or on an older GPU, launch plainly. A `cluster` other than 1x1x1
// launches the grid as thread-block clusters of that shape (sm_90; the grid a multiple of it).
// Returns the launch's error.
cudaError_t LaunchDependent(const void* kernel, dim3 grid, dim3 block, void** args,
                            size_t shared_bytes, StreamHandle stream, dim3 cluster = dim3(1, 1, 1));
// Throws kiln::Error naming `call` and the CUDA error string unless `err` is cudaSuccess.
// Out-of-memory becomes kResourceExhausted, everything else kInternal.
void Check(cudaError_t err, const char* call, const char* file, int line);
// The same as a Status, for infrastructure code.
absl::Status ToStatus(cudaError_t err, const char* call);

}  // namespace kiln::cuda

#define KILN_CUDA_CHECK(call) ::kiln::cuda::Check((call), #call, __FILE__, __LINE__)
