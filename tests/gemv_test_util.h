// Scoped settings of the GEMV tests (CUDA builds only): the GEMV mode (ops/cuda/matmul_cuda.h)
// and GEMV chains (ops/cuda/gemv_chain.h), each restored when the scope ends.
#pragma once

#include "ops/cuda/gemv_chain.h"
#include "ops/cuda/matmul_cuda.h"

namespace kiln {

class ScopedGemvMode {
 public:
  explicit ScopedGemvMode(cuda_ops::GemvMode mode) : prev_(cuda_ops::CurrentGemvMode()) {
    cuda_ops::SetGemvMode(mode);
  }
  ~ScopedGemvMode() { cuda_ops::SetGemvMode(prev_); }
  ScopedGemvMode(const ScopedGemvMode&) = delete;
  ScopedGemvMode& operator=(const ScopedGemvMode&) = delete;

 private:
  cuda_ops::GemvMode prev_;
};

class ScopedGemvChain {
 public:
  explicit ScopedGemvChain(bool on) : prev_(cuda_ops::GemvChainEnabled()) {
    cuda_ops::SetGemvChainEnabled(on);
  }
  ~ScopedGemvChain() { cuda_ops::SetGemvChainEnabled(prev_); }
  ScopedGemvChain(const ScopedGemvChain&) = delete;
  ScopedGemvChain& operator=(const ScopedGemvChain&) = delete;

 private:
  bool prev_;
};

}  // namespace kiln
