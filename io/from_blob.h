// from_blob: memory that kiln did not allocate, seen as a tensor without a copy (torch.from_blob).
//
//   std::vector<float> buf(6);
//   Tensor x = from_blob(buf.data(), {2, 3}, DType::kFloat32);            // caller keeps buf alive
//   Tensor y = from_blob(p, {3, 2}, {1, 3}, DType::kBFloat16, CUDA(),     // a strided CUDA view
//                        [](void* q) { cudaFree(q); });                    // freed with the tensor
//
// The tensor's storage spans exactly the elements the shape and strides reach; views of it keep
// the memory alive, and `deleter(data)` runs once, when the last of them goes away (never when
// there is no deleter); it must not throw. Not checked: that the memory is as large as the shape
// says. When from_blob throws, the deleter is not called: the memory stays the caller's.
// Writes made outside kiln's ops do not bump the storage's version: a function compiled with
// freeze_weights over such a tensor does not see them.
#pragma once

#include <functional>

#include "runtime/tensor.h"

namespace kiln {

using BlobDeleter = std::function<void(void*)>;

// `strides` count elements and must be non-negative. Throws kiln::Error (naming the shape,
// strides, dtype and device) for negative sizes or strides, a null pointer with elements, a
// meta device, a CUDA device that is not present, or — when a GPU is present — a pointer that
// lives on another device than `device` says.
Tensor from_blob(void* data, IntList shape, IntList strides, DType dtype, Device device = kCPU,
                 BlobDeleter deleter = {});
// Contiguous (row-major) strides.
Tensor from_blob(void* data, IntList shape, DType dtype, Device device = kCPU,
                 BlobDeleter deleter = {});

}  // namespace kiln
