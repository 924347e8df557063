// Typed entry points of a library opened with dlopen (NVRTC in runtime/nvrtc.cc, NCCL in
// ops/cuda/nccl_group.cc: loaded when first needed, not linked).
//
//   std::string missing;
//   ResolveSymbol(handle, "nvrtcCompileProgram", &lib.CompileProgram, &missing);
//   if (!missing.empty()) error = "it has no " + missing;
#pragma once

#include <dlfcn.h>

#include <string>

namespace kiln {

// *fn = the symbol's address; on the first symbol that is not there, `missing` names it.
template <typename Fn>
void ResolveSymbol(void* handle, const char* symbol, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (*fn == nullptr && missing->empty()) *missing = symbol;
}

}  // namespace kiln
