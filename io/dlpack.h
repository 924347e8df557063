// DLPack: exchanging tensors with other libraries (PyTorch, JAX, CuPy, TVM, ...) without copies.
//
//   DLManagedTensor* m = to_dlpack(x);      // shares x's memory; x's storage lives until
//   other_library_consume(m);               //   the consumer calls m->deleter(m)
//   Tensor y = from_dlpack(producer());     // a view of the producer's memory; its deleter
//                                           //   runs when the last kiln view is gone
//
// DLPack 0.6 (Debian's libdlpack-dev, <dlpack/dlpack.h>; kiln's header only declares the
// struct, include that header to read it). Devices: kDLCPU and kDLCUDA (kDLCUDAHost, pinned
// host memory, imports as CPU; kDLCUDAManaged as CUDA). dtypes: float32/16, bfloat16 (kDLBfloat),
// int32/64 and bool (code 6, kDLBool of DLPack >= 0.8, 8 bits), one lane. Layout is kept
// exactly: shape, strides (always written, in elements) and the byte offset (to_dlpack writes
// the storage's start as `data` and the tensor's offset as `byte_offset`, so `data` keeps the
// allocation's alignment; from_dlpack keeps a byte offset that is a multiple of the element
// size as the tensor's offset). Nothing synchronizes: CUDA work kiln queued on the tensor runs
// on kiln's current stream (runtime/cuda.h); the consumer must order itself after it. Writes by
// the other library are invisible to kiln's version counters (see from_blob.h).
#pragma once

#include "runtime/tensor.h"

struct DLManagedTensor;  // <dlpack/dlpack.h>

namespace kiln {

// The DLPack tensor of `t` (same memory). The caller owns the result and calls its deleter once.
// Throws kiln::Error for an undefined or meta tensor, or one without memory (a placeholder).
DLManagedTensor* to_dlpack(const Tensor& t);

// A tensor over `managed`'s memory, taking ownership of it (its deleter runs when the last
// tensor on it goes away). Throws kiln::Error naming the field for what kiln cannot represent
// (another device type, a dtype kiln lacks, several lanes, negative sizes or strides); then the
// caller still owns `managed`.
Tensor from_dlpack(DLManagedTensor* managed);

}  // namespace kiln
