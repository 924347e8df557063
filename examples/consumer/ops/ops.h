// The consumer's own ops/ops.h: a project's folder named like one of kiln's. It is found as
// "ops/ops.h" while kiln's header is <kiln/ops/ops.h>, so neither hides the other.
#pragma once

namespace consumer {
inline int Twice(int x) { return 2 * x; }
}  // namespace consumer
