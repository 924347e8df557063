// Tensor-parallel linear layers and the GeGLU MLP (see tensor_parallel.h): each rank's shard is a
// copy of its rows or columns of the full weight (the full module can be dropped after).
#include "ops/tensor_parallel.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {
namespace {

// Rank r's part [r·size/n, (r+1)·size/n) of `t` along `dim` (a copy); `size` must divide by n.
Tensor Shard(const Tensor& t, int64_t dim, const ProcessGroup& group, const char* layer) {
  const int64_t size = t.size(dim), n = group.world_size(), part = size / n;
  KILN_CHECK(size % n == 0, layer, ": ", size, " ", dim == 0 ? "output" : "input",
             " features do not split over ", n, " ranks");
  return clone(slice(t, dim, group.rank() * part, (group.rank() + 1) * part));
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(const Linear& full, ProcessGroup& group)
    : weight_(RegisterParameter("weight", Shard(full.weight(), 0, group, "ColumnParallelLinear"))),
      bias_(RegisterParameter("bias", full.bias().defined()
                                          ? Shard(full.bias(), 0, group, "ColumnParallelLinear")
                                          : Tensor())) {}

Tensor ColumnParallelLinear::forward(const Tensor& x) { return linear(x, weight_, bias_); }

RowParallelLinear::RowParallelLinear(const Linear& full, ProcessGroup& group)
    : group_(group),
      weight_(RegisterParameter("weight", Shard(full.weight(), 1, group, "RowParallelLinear"))),
      bias_(RegisterParameter("bias", full.bias().defined() ? clone(full.bias()) : Tensor())) {}

Tensor RowParallelLinear::forward(const Tensor& x_shard) {
  KILN_CHECK(x_shard.dim() >= 1 && x_shard.size(-1) == weight_.size(1), "RowParallelLinear: rank ",
             group_.rank(), " takes its ", weight_.size(1), " input features, got a last dim of ",
             x_shard.dim() >= 1 ? x_shard.size(-1) : int64_t{0});
  Tensor y = linear(x_shard, weight_);
  group_.all_reduce(y);
  return bias_.defined() ? add(y, bias_) : y;
}

TensorParallelGeGLUMLP::TensorParallelGeGLUMLP(GeGLUMLP& full, ProcessGroup& group)
    : gate_(RegisterModule("gate", std::make_unique<ColumnParallelLinear>(full.gate(), group))),
      up_(RegisterModule("up", std::make_unique<ColumnParallelLinear>(full.up(), group))),
      down_(RegisterModule("down", std::make_unique<RowParallelLinear>(full.down(), group))) {}

Tensor TensorParallelGeGLUMLP::forward(const Tensor& x) {
  return down_(gelu(gate_(x), "tanh") * up_(x));
}

}  // namespace kiln
