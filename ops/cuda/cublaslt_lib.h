// cuBLASLt's entry points, loaded when the first GEMM needs them (dlopen), not linked: a process
// that runs no cuBLASLt GEMM never maps the library. Its static initialisers alone touch ~100 MB
// at load (on the development machine: 25,571 page faults and ~70 ms a process, 89 % of the
// faults in libcublasLt's initialisers), which every test process, every CPU-only program and
// every process start paid. matmul_cuda.cc and device_timing.cc call it through CublasLt().
#pragma once

#include <cublasLt.h>

#include <string>

namespace kiln::cuda_ops {

struct CublasLtLib {
  decltype(&cublasLtCreate) Create = nullptr;
  decltype(&cublasLtGetVersion) GetVersion = nullptr;
  decltype(&cublasLtGetStatusName) GetStatusName = nullptr;
  decltype(&cublasLtGetStatusString) GetStatusString = nullptr;
  decltype(&cublasLtMatmul) Matmul = nullptr;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy = nullptr;
  decltype(&cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;
};

// The library of the toolkit kiln was built with, loaded on the first call by its soname (the
// executable's run path and the loader's search path), else by the path the build found it at;
// every entry point above resolved. Throws kiln's error saying why when it cannot be loaded or
// lacks one of them (each later call throws the same).
const CublasLtLib& CublasLt();

}  // namespace kiln::cuda_ops
