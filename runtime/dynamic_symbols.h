// Libraries opened with dlopen and their typed entry points (NVRTC in runtime/nvrtc.cc, cuBLASLt
// in ops/cuda/cublaslt_lib.cc, NCCL in ops/cuda/nccl_group.cc: loaded when first needed, not
// linked).
//
//   std::string why;
//   void* handle = OpenLibrary("libnvrtc.so.13", KILN_NVRTC_PATH, &why);
//   std::string missing;
//   ResolveSymbol(handle, "nvrtcCompileProgram", &lib.CompileProgram, &missing);
//   if (!missing.empty()) error = "it has no " + missing;
#pragma once

#include <dlfcn.h>

#include <string>

namespace kiln {

// The library by its soname (the executable's run path and the loader's search path), else by
// `fallback_path` (the path the build found it at; nullptr: none), opened for the process. nullptr
// when neither loads, with the loader's reason in *why.
inline void* OpenLibrary(const std::string& soname, const char* fallback_path, std::string* why) {
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr && fallback_path != nullptr) {
    handle = dlopen(fallback_path, RTLD_NOW | RTLD_LOCAL);
  }
  if (handle == nullptr) {
    const char* error = dlerror();
    *why = error != nullptr ? error : "not found";
  }
  return handle;
}

// *fn = the symbol's address; on the first symbol that is not there, `missing` names it.
template <typename Fn>
void ResolveSymbol(void* handle, const char* symbol, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (*fn == nullptr && missing->empty()) *missing = symbol;
}

}  // namespace kiln
