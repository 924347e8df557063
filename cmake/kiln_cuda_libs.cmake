# The CUDA libraries kiln uses, as imported targets: kiln::cuda_nvrtc, kiln::cuda_cublasLt and
# kiln::cuda_cupti (NVRTC and cuBLASLt are not linked: runtime/nvrtc.cc loads NVRTC at the first
# compile and ops/cuda/cublaslt_lib.cc cuBLASLt at the first GEMM, by soname or else by this
# target's path). Used by kiln's build
# and, installed next to kilnConfig.cmake, by projects that find_package(kiln), so the installed
# package names no path of the machine it was built on. Expects find_package(CUDAToolkit).
#
# NVRTC and cuBLASLt are found by path, not through CUDA::nvrtc / CUDA::cublasLt, whose
# interfaces pull in the driver stub (libcuda.so): kiln must load on machines without a driver.
# CUPTI (the profiler's device activity) likewise; libcupti itself needs no driver to load.

find_library(KILN_CUPTI cupti
  HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT}/extras/CUPTI/lib64
        ${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/lib64)

foreach(lib nvrtc cublasLt cupti)
  if(lib STREQUAL "cupti")
    set(path "${KILN_CUPTI}")
  else()
    set(path "${CUDA_${lib}_LIBRARY}")
  endif()
  if(NOT path)
    message(FATAL_ERROR "kiln: the CUDA library ${lib} was not found (CUDAToolkit at "
                        "'${CUDAToolkit_LIBRARY_DIR}')")
  endif()
  if(NOT TARGET kiln::cuda_${lib})
    add_library(kiln::cuda_${lib} UNKNOWN IMPORTED)
    set_target_properties(kiln::cuda_${lib} PROPERTIES IMPORTED_LOCATION "${path}")
  endif()
endforeach()
