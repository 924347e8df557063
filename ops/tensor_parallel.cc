// Tensor-parallel linear layers and the GeGLU MLP (see tensor_parallel.h), and the shard and
// row-parallel helpers the modules' in-place ShardTensorParallel use: each rank's shard is a copy
// of its rows or columns of the full weight (the full one can be dropped after).
#include "ops/tensor_parallel.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {

Tensor ShardOf(const Tensor& t, int64_t dim, int rank, int world, int sections, const char* who) {
  KILN_CHECK(t.defined() && dim >= 0 && dim < t.dim() && world >= 1 && rank >= 0 && rank < world &&
                 sections >= 1,
             who, ": no shard ", rank, " of ", world, " along dim ", dim, " in ", sections,
             " sections of ", t.defined() ? t.shape_string() : "an undefined tensor");
  const int64_t size = t.size(dim), section = size / sections, part = section / world;
  KILN_CHECK(size % (int64_t{sections} * world) == 0, who, ": ", size, " ",
             dim == 0 ? "output" : "input", " features",
             sections > 1 ? absl::StrCat(" (", sections, " sections)") : std::string(),
             " do not split over ", world, " ranks");
  std::vector<Tensor> parts;
  for (int s = 0; s < sections; ++s) {
    const int64_t begin = s * section + rank * part;
    parts.push_back(slice(t, dim, begin, begin + part));
  }
  return parts.size() == 1 ? clone(parts[0]) : cat(parts, dim);
}

Tensor RowParallel(const Tensor& x_shard, const Tensor& weight_shard, const Tensor& bias,
                   ProcessGroup& group) {
  const Tensor y = all_reduce(linear(x_shard, weight_shard), group);
  return bias.defined() ? add(y, bias) : y;
}

Tensor RowParallelOrWhole(Linear& layer, const Tensor& x, ProcessGroup* group) {
  if (group == nullptr) return layer(x);
  layer.CheckInitialised();
  return RowParallel(x, layer.weight(), layer.bias(), *group);
}

namespace {

Tensor Shard(const Tensor& t, int64_t dim, const ProcessGroup& group, const char* layer) {
  return ShardOf(t, dim, group.rank(), group.world_size(), 1, layer);
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
  return RowParallel(x_shard, weight_, bias_, group_);
}

TensorParallelGeGLUMLP::TensorParallelGeGLUMLP(GeGLUMLP& full, ProcessGroup& group)
    : gate_(RegisterModule("gate", std::make_unique<ColumnParallelLinear>(full.gate(), group))),
      up_(RegisterModule("up", std::make_unique<ColumnParallelLinear>(full.up(), group))),
      down_(RegisterModule("down", std::make_unique<RowParallelLinear>(full.down(), group))) {}

Tensor TensorParallelGeGLUMLP::forward(const Tensor& x) {
  return down_(gelu(gate_(x), "tanh") * up_(x));
}

}  // namespace kiln
