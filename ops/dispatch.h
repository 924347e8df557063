// The eager dispatcher: every op call goes through Dispatch().
//
//   op call -> registry row by OpId -> Infer (shared with graphs) -> hook (tracing, if active)
//           -> views: new metadata | Meta: an empty meta tensor | else: allocate + device kernel
//
// No string lookups on this path and no heap work beyond the output and its handle. A higher
// layer (the tracer in ir/) installs a DispatchHook to record ops instead of running them.
#pragma once

#include "ops/op_def.h"

namespace kiln {

Tensor Dispatch(OpId id, absl::Span<const Tensor> inputs, const OpAttrs& attrs = {});

// Runs op(inputs) into inputs[0] (torch's `x.add_(y)`): the result must have self's shape
// (no in-place on a broadcast), self must not be an expanded view, and a floating result
// cannot be written into an integer tensor. Returns inputs[0].
const Tensor& DispatchInPlace(OpId id, absl::Span<const Tensor> inputs, const OpAttrs& attrs = {});

// Runs op(inputs) into `out`, whose type must be the inferred one (torch's out= argument; the
// compiled plans use it to write into buffers they allocated). Not for views; not while tracing.
void DispatchOut(OpId id, absl::Span<const Tensor> inputs, const OpAttrs& attrs, const Tensor& out);

// A new tensor for the result of `def` of `type` (contents undefined): contiguous, or in the
// layout the row asks for (OpDef::heads_last_output). Dispatch allocates results with it; the
// compiled plan predicts layouts with it (on the meta device).
Tensor NewOutput(const OpDef& def, const TensorType& type);

// Infers the output type of an op call, throwing kiln::Error naming the op and operands.
TensorType InferOrThrow(const OpDef& def, absl::Span<const Tensor> inputs, const OpAttrs& attrs);
// The same over types alone (graphs): arity, one device, then the row's Infer.
TensorType InferTypesOrThrow(const OpDef& def, absl::Span<const TensorType> types,
                             const OpAttrs& attrs);

// Throws kiln::Error naming `op` when `x` is undefined (Tensor()): for API functions that read
// a tensor's metadata before dispatching it.
void CheckDefined(const char* op, const Tensor& x);

// Interface for layers above ops that intercept dispatch (the tracer). Thread-local.
class DispatchHook {
 public:
  virtual ~DispatchHook() = default;
  // Called instead of running the op (before any checks: the hook infers the type from its
  // own view of the operands); returns the tensor that stands for the result. `in_place` marks
  // calls like add_(self, ...), whose result replaces inputs[0].
  virtual Tensor Record(const OpDef& def, absl::Span<const Tensor> inputs, const OpAttrs& attrs,
                        bool in_place) = 0;
};
DispatchHook* CurrentDispatchHook();
// Installs `hook` for the current thread and returns the previous one.
DispatchHook* SetDispatchHook(DispatchHook* hook);

// Installs `hook` (nullptr: none, ops run eagerly) for the guard's lifetime.
class ScopedDispatchHook {
 public:
  explicit ScopedDispatchHook(DispatchHook* hook) : prev_(SetDispatchHook(hook)) {}
  ~ScopedDispatchHook() { SetDispatchHook(prev_); }
  ScopedDispatchHook(const ScopedDispatchHook&) = delete;
  ScopedDispatchHook& operator=(const ScopedDispatchHook&) = delete;

 private:
  DispatchHook* prev_;
};

}  // namespace kiln
