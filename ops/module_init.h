// How kiln's modules make their parameters (ModuleOptions, modules.h): random draws from the
// options' generator or the default one, constants, or uninitialised memory (Init::kNone).
// Internal to the module sources.
#pragma once

#include "ops/modules.h"

namespace kiln::module_init {

// `o`, once its dtype is floating point (torch's modules refuse integer and bool parameters at
// construction, since their initialisers draw floats): the error names `module`.
ModuleOptions FloatingChecked(const char* module, const ModuleOptions& o);
// Throws unless `shape`'s element count fits int64, naming `module` (not the factory).
void SizeChecked(const char* module, IntList shape);

// The options with `gen` as their generator (the constructors that take a Generator&).
ModuleOptions WithGenerator(ModuleOptions o, Generator& gen);

// U(-bound, bound), drawn in float32 on the CPU (so every device gets the same values).
Tensor Uniform(IntList shape, double bound, const ModuleOptions& o);
// N(0, 1), drawn where the parameter lives (the same values on every device).
Tensor Normal(IntList shape, const ModuleOptions& o);
// Filled with `value`.
Tensor Full(IntList shape, double value, const ModuleOptions& o);
// Allocated, marked as never written: the module refuses to run until something writes it.
Tensor Uninitialised(IntList shape, const ModuleOptions& o);

}  // namespace kiln::module_init
