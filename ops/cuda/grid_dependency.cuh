// Programmatic dependent launch for kiln's precompiled kernels (runtime/cuda.h LaunchDependent
// says what it buys and the rule that keeps it correct). The .cu files build with plain nvcc -c,
// without kiln's runtime headers: the host adapter passes whether to launch this way.
//
//   __global__ void K(...) { /* prefetch weights */ GridDependencySync(); /* the work */ }
//   LaunchMaybeDependent(dependent, K, grid, block, 0, stream, args...);
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace kiln::cuda_kernels {

// Waits until every earlier kernel has finished and its writes are visible, then lets the next
// kernel on the stream start launching (returns at once without the launch attribute, or below
// sm_90). Before it a kernel reads nothing an earlier kernel may write and writes nothing. The
// order bounds the overlap to one kernel ahead: signalled before the wait, each waiting kernel
// would let the next launch too, and a chain of waiting kernels could hold SM slots.
__device__ __forceinline__ void GridDependencySync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches `kernel` (which calls GridDependencySync() before its dependent accesses) as a
// programmatic dependent launch when `dependent`, else plainly; returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t LaunchMaybeDependent(bool dependent, void (*kernel)(Params...), dim3 grid, dim3 block,
                                 size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = dependent ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace kiln::cuda_kernels
