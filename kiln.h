// kiln's user-facing API in one include, installed as <kiln/kiln.h>: tensors and dtypes, errors
// (kiln::Error), factories, ops, modules, compile, the profiler and its reports (the
// eager-vs-compiled report as one call: codegen/compare.h), a device timer, weights in and out
// (safetensors, state dicts), DLPack and from_blob, Llama-style models and generate().
//
//   #include <kiln/kiln.h>
//   kiln::Generator gen(0);
//   kiln::GeGLUMLP mlp(64, 256, gen);
//   kiln::Tensor x = kiln::randn({8, 64}, gen);
//   kiln::CompiledFn f = kiln::compile(mlp, x);
//   kiln::save_state_dict(mlp, "mlp.safetensors");
//
// It needs no CUDA header (a CPU-only user compiles without the CUDA include directory): the
// devices and streams (runtime/cuda.h: cuda::IsAvailable(), memory statistics, StreamGuard) name
// CUDA's handles without it, and runtime/build_config.h says whether this kiln was built with CUDA
// (kiln::kWithCuda). CUDA's own API with kiln's checked calls (runtime/cuda_api.h) is installed
// but not included here. kiln's own sources include the headers they need one by one, by their
// path in the tree ("ops/ops.h").
#pragma once

#include "codegen/compare.h"
#include "codegen/compile.h"
#include "io/dlpack.h"
#include "io/from_blob.h"
#include "io/kernel_package.h"
#include "io/safetensors.h"
#include "io/state_dict.h"
#include "models/causal_lm.h"
#include "models/export.h"
#include "models/generate.h"
#include "models/llama.h"
#include "models/sampling.h"
#include "ops/custom_op.h"
#include "ops/distributed.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/nccl.h"
#include "ops/ops.h"
#include "ops/tensor_parallel.h"
#include "profiler/profiler.h"
#include "profiler/report.h"
#include "profiler/timer.h"
#include "runtime/build_config.h"
#include "runtime/cuda.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/random.h"
#include "runtime/shape.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
