// Tracing: runs a model function once with placeholder tensors and records every op it
// dispatches into a Graph, instead of running it.
//
// Placeholders carry the shape, dtype and device of the example inputs but no memory (like
// torch's FakeTensor), so no device work happens. Real tensors the function touches (weights,
// masks it builds) become constants that refer to their existing storage. In-place ops are
// recorded functionally: add_(x, y) becomes x' = add(x, y) and later uses of x read x'; on a view
// of x (views share their base's placeholder storage, as eager views share memory) the result is
// scattered into x (as_strided_scatter) and later views of x are read from the new x. An input
// written in place gets its final value as a further graph output (Graph::input_updates), which
// the compiled function copies back into the caller's tensor. An in-place op on a real tensor the
// function did not receive (a module buffer such as a KV cache) makes its storage a further input
// (after the function's own, as a flat tensor over the whole storage) returned in `captured`:
// the compiled function passes it on every call, so the write lands in that tensor. Reading such
// a tensor before writing it, or writing it in a trace that gives no `captured` list, is an error.
// A view op over a real tensor is its eager view (same memory), recorded when read, so writes
// through it reach the tensor. A tensor the function makes itself (zeros, full) and writes is a
// value of the trace that starts from the factory's values on every call, as eager makes it
// afresh; one that outlives the call (kept by a module or a global) is refused.
//
//   KILN_ASSIGN_OR_RETURN(ir::Graph g, ir::Trace(fn, example_inputs));
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"

namespace kiln::ir {

using TensorFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Traces `fn` on placeholders shaped like `examples`; kiln::Error thrown inside `fn` (bad
// shapes, using data while tracing) becomes the returned status. A non-contiguous example is
// traced with its layout (see InputStrides below).
absl::StatusOr<Graph> Trace(const TensorFn& fn, const std::vector<Tensor>& examples,
                            std::vector<Tensor>* captured = nullptr);
// The same from the input types alone (symbolic compiles trace at probe sizes).
absl::StatusOr<Graph> Trace(const TensorFn& fn, const std::vector<TensorType>& input_types,
                            std::vector<Tensor>* captured = nullptr);

// The same with input layouts: input i with non-empty `input_strides[i]` (a non-contiguous
// input) is the graph input of type [SpanOf(shape, strides).span] (runtime/shape.h), a flat tensor
// over what the view reaches, and the function receives the view of it, so eager's decisions hold
// (reshape and contiguous() copy where eager copies, view() refuses, writes land through the view).
// The caller binds such an input to the flat tensor over its memory (FlatInput).
// An output of the traced function that is (a view of) the memory of its input `input`: where,
// in the coordinates of that input's graph value. The compiled function returns that view of the
// caller's tensor (the tensor itself for all of it), as eager returns it. With `output` set
// (input -1): a window of output `output`, which is all of a tensor the function computed (it
// wrote through the window and returned both), returned as that view of the plan's result.
struct OutputAlias {
  int input = 0;
  int64_t offset = 0;
  Shape shape;
  Strides strides;
  bool whole_input = false;  // the tensor the function received, itself (at any size)
  int output = -1;
};
// `output_aliases` (may be null) gets one entry per output the function returned.
absl::StatusOr<Graph> Trace(const TensorFn& fn, const std::vector<TensorType>& input_types,
                            const std::vector<Strides>& input_strides,
                            std::vector<Tensor>* captured,
                            std::vector<std::optional<OutputAlias>>* output_aliases = nullptr);
// Empty strides for a contiguous (or empty) tensor, else its own: what Trace's input_strides
// holds for it.
Strides InputStrides(const Tensor& t);
// The flat tensor over what `t` reaches: the graph input for a non-contiguous `t`.
Tensor FlatInput(const Tensor& t);

}  // namespace kiln::ir
