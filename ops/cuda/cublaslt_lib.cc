// cuBLASLt loaded at first use (see cublaslt_lib.h).
#include "ops/cuda/cublaslt_lib.h"

#include <cuda.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/dynamic_symbols.h"
#include "runtime/status.h"

namespace kiln::cuda_ops {
namespace {

struct Loaded {
  CublasLtLib lib;
  std::string error;  // "" when every entry point resolved
};

Loaded Load() {
  Loaded l;
  const std::string soname = absl::StrCat("libcublasLt.so.", CUBLAS_VER_MAJOR);
  std::string why;
  // KILN_CUBLASLT_PATH: where the build found cuBLASLt (CMakeLists.txt defines it).
  void* handle = OpenLibrary(soname, KILN_CUBLASLT_PATH, &why);
  if (handle == nullptr) {
    l.error = absl::StrCat("cuBLASLt (", soname, ") could not be loaded: ", why,
                           "; kiln's CUDA matmuls and linears need it");
    return l;
  }
  CublasLtLib& lib = l.lib;
  std::string missing;
  ResolveSymbol(handle, "cublasLtCreate", &lib.Create, &missing);
  ResolveSymbol(handle, "cublasLtGetVersion", &lib.GetVersion, &missing);
  ResolveSymbol(handle, "cublasLtGetStatusName", &lib.GetStatusName, &missing);
  ResolveSymbol(handle, "cublasLtGetStatusString", &lib.GetStatusString, &missing);
  ResolveSymbol(handle, "cublasLtMatmul", &lib.Matmul, &missing);
  ResolveSymbol(handle, "cublasLtMatmulDescCreate", &lib.MatmulDescCreate, &missing);
  ResolveSymbol(handle, "cublasLtMatmulDescDestroy", &lib.MatmulDescDestroy, &missing);
  ResolveSymbol(handle, "cublasLtMatmulDescSetAttribute", &lib.MatmulDescSetAttribute, &missing);
  ResolveSymbol(handle, "cublasLtMatrixLayoutCreate", &lib.MatrixLayoutCreate, &missing);
  ResolveSymbol(handle, "cublasLtMatrixLayoutDestroy", &lib.MatrixLayoutDestroy, &missing);
  ResolveSymbol(handle, "cublasLtMatrixLayoutSetAttribute", &lib.MatrixLayoutSetAttribute,
                &missing);
  ResolveSymbol(handle, "cublasLtMatmulPreferenceCreate", &lib.MatmulPreferenceCreate, &missing);
  ResolveSymbol(handle, "cublasLtMatmulPreferenceDestroy", &lib.MatmulPreferenceDestroy, &missing);
  ResolveSymbol(handle, "cublasLtMatmulPreferenceSetAttribute", &lib.MatmulPreferenceSetAttribute,
                &missing);
  ResolveSymbol(handle, "cublasLtMatmulAlgoGetHeuristic", &lib.MatmulAlgoGetHeuristic, &missing);
  if (!missing.empty()) {
    l.error = absl::StrCat("cuBLASLt (", soname, ") is unusable: it has no ", missing);
  }
  return l;  // the handle stays open for the process
}

}  // namespace

const CublasLtLib& CublasLt() {
  static const Loaded* loaded = new Loaded(Load());
  if (!loaded->error.empty()) throw Error(absl::FailedPreconditionError(loaded->error));
  return loaded->lib;
}

}  // namespace kiln::cuda_ops
