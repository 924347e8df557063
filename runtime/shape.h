// Shapes, strides and the small helpers every layer uses on them: element counts, contiguous
// strides, numpy broadcasting, dim wrapping, and TensorType (shape + dtype + device), the unit
// of shape inference shared by eager execution and graphs.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace kiln {

using Shape = absl::InlinedVector<int64_t, 6>;
using Strides = absl::InlinedVector<int64_t, 6>;
using IntList = absl::Span<const int64_t>;

// The element count of a shape. Throws kiln::Error when it does not fit in int64: shapes that
// reach tensors are checked when they are made (CheckedNumElements), so this is a last guard.
int64_t NumElements(IntList shape);
// The element count, or an error naming the shape when a dim is negative or the count does not
// fit in int64 (2^32 x 2^32 is not 0).
absl::StatusOr<int64_t> CheckedNumElements(IntList shape);
// Row-major strides; a stride that would overflow (only possible next to a size-0 dim, where no
// element uses it) saturates at INT64_MAX.
Strides ContiguousStrides(IntList shape);
std::string ShapeString(IntList shape);  // "[8, 16, 1024]"

// numpy broadcasting of two shapes; error text names both shapes.
absl::StatusOr<Shape> BroadcastShapes(IntList a, IntList b);
// Wraps a possibly negative dim into [0, rank); error if out of range.
absl::StatusOr<int64_t> WrapDim(int64_t dim, int64_t rank);

// The elements a view of `shape` and `strides` reaches from its first one: `span` of them (0 for
// an empty view), the view starting `offset` elements in (negative strides reach below it).
struct StridedSpan {
  int64_t span = 0;
  int64_t offset = 0;
};
StridedSpan SpanOf(IntList shape, IntList strides);

struct TensorType {
  Shape shape;
  DType dtype = DType::kFloat32;
  Device device;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const { return NumElements(shape); }
  std::string str() const;  // "bf16[8, 3072]@cuda:0"
  friend bool operator==(const TensorType&, const TensorType&) = default;
};

// "float32[2, 3] on cpu" — how error messages name an operand.
std::string Describe(const TensorType& t);

}  // namespace kiln
