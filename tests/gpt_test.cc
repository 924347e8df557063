// The GPT example's model (examples/gpt.h): the KV cache against a full forward, the compiled
// prefill and decode steps against eager (in-place writes to the caches and the decode state),
// the GPT-2 loader on a hand-made HF-layout file; and a tracer regression it found.
#include "examples/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "codegen/compile.h"
#include "io/safetensors.h"
#include "io/state_dict.h"
#include "ops/factories.h"
#include "ops/ops.h"

namespace kiln {
namespace {

CompileOptions Compiled() {
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  o.freeze_weights = true;
  return o;
}

// A tensor the traced function makes (full()) after traced temporaries died must stay a
// constant: the tracer keyed placeholders by storage address, and a freed placeholder's address
// coming back for the new tensor made it read as a window of an unrelated traced value.
TEST(TraceRegression, TensorMadeAfterTemporariesDieIsAConstant) {
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor x = in[0];
    for (int i = 0; i < 16; ++i) x = x * 2.0 + 1.0;  // temporaries, freed while tracing
    const Tensor c = full({1}, 3, DType::kInt64);
    return std::vector<Tensor>{x, in[1] + c};
  };
  const std::vector<Tensor> in = {ones({4}), from_vector({5}, {1}, DType::kInt64)};
  const auto eager = fn(in);
  const auto compiled = compile(fn, in, Compiled())(in);
  EXPECT_EQ(to_vector(compiled[0]), to_vector(eager[0]));
  EXPECT_EQ(to_vector<int64_t>(compiled[1]), std::vector<int64_t>{8});
}

}  // namespace
}  // namespace kiln
