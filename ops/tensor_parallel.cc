// Tensor-parallel linear layers and the GeGLU MLP (see tensor_parallel.h), and the shard and
// row-parallel helpers the modules' in-place ShardTensorParallel use: each rank's shard is a copy
// of its rows or columns of the full weight (the full one can be dropped after).
#include "ops/tensor_parallel.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "ops/factories.h"
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

PaddedRows PaddedRowsOf(int64_t rows, int rank, int world) {
  KILN_CHECK(world >= 1 && rank >= 0 && rank < world && rows >= 0, "PaddedRowsOf: rank ", rank,
             " of a world of ", world, " over ", rows, " rows (needs world >= 1, 0 <= rank < ",
             "world, rows >= 0)");
  const int64_t part = rows / world + (rows % world != 0);  // ceil, without rows + world overflow
  const int64_t begin = std::min(rows, rank * part);
  return {begin, std::min(rows, begin + part), part};
}

namespace {

// `t` grown to `size` along `dim` with zeros (`t` itself when it is that size already).
Tensor ZeroPadded(const Tensor& t, int64_t dim, int64_t size) {
  if (t.size(dim) == size) return t;
  Shape pad = t.shape();
  pad[dim < 0 ? dim + t.dim() : dim] = size - t.size(dim);
  return cat({t, zeros(pad, t.dtype(), t.device())}, dim);
}

}  // namespace

Tensor PaddedRowShard(const Tensor& t, int rank, int world) {
  KILN_CHECK(t.defined() && t.dim() >= 1 && world >= 1 && rank >= 0 && rank < world,
             "PaddedRowShard: no shard ", rank, " of ", world, " of ",
             t.defined() ? t.shape_string() : "an undefined tensor");
  const PaddedRows r = PaddedRowsOf(t.size(0), rank, world);
  const Tensor mine = slice(t, 0, r.begin, r.end);
  return r.end - r.begin == r.part ? clone(mine) : ZeroPadded(mine, 0, r.part);
}

Tensor GatherVocab(const Tensor& part, int64_t vocab, ProcessGroup& group) {
  // PaddedRowShard's parts. Wider ones would put rank r's logits past where rank r's vocabulary
  // rows are, and the cut would keep rank 0's padding instead.
  const int64_t width =
      PaddedRowsOf(std::max<int64_t>(vocab, 0), group.rank(), group.world_size()).part;
  KILN_CHECK(part.defined() && part.dim() >= 1 && vocab >= 1 && part.size(-1) == width,
             "GatherVocab: ", group.world_size(), " parts of ",
             part.defined() ? part.shape_string() : "an undefined tensor",
             " are not a vocabulary of ", vocab, " split by PaddedRowShard (the last dim must be ",
             "ceil(vocab / world) = ", width, ")");
  const int64_t p = part.size(-1), rows = part.numel() / std::max<int64_t>(p, 1);
  // all_gather joins dim 0: the vocabulary moved there and back.
  const Tensor by_vocab = contiguous(transpose(reshape(part, {rows, p}), 0, 1));  // [p, rows]
  Tensor logits = transpose(all_gather(by_vocab, group), 0, 1);  // [rows, world·p]
  if (logits.size(1) != vocab) logits = slice(logits, 1, 0, vocab);
  Shape shape = part.shape();
  shape.back() = vocab;
  return reshape(logits, shape);
}

Tensor VocabParallelLogits(const Tensor& h, const Tensor& table, ProcessGroup& group) {
  KILN_CHECK(h.defined() && table.defined() && table.dim() == 2,
             "VocabParallelLogits: needs h and a ", "[vocab, dim] table, got ",
             table.defined() ? table.shape_string() : "an undefined table");
  const int64_t vocab = table.size(0);
  const PaddedRows r = PaddedRowsOf(vocab, group.rank(), group.world_size());
  // The last ranks' missing rows give zero logits.
  const Tensor logits = ZeroPadded(linear(h, slice(table, 0, r.begin, r.end)), -1, r.part);
  return GatherVocab(logits, vocab, group);
}

Tensor RowParallelOrWhole(Linear& layer, const Tensor& x, const GroupRef& group) {
  if (!group.defined()) return layer(x);
  layer.CheckInitialised();
  return RowParallel(x, layer.weight(), layer.bias(), group.get("a row-parallel projection"));
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
  return RowParallel(x_shard, weight_, bias_, group_.get("RowParallelLinear"));
}

TensorParallelGeGLUMLP::TensorParallelGeGLUMLP(GeGLUMLP& full, ProcessGroup& group)
    : gate_(RegisterModule("gate", std::make_unique<ColumnParallelLinear>(full.gate(), group))),
      up_(RegisterModule("up", std::make_unique<ColumnParallelLinear>(full.up(), group))),
      down_(RegisterModule("down", std::make_unique<RowParallelLinear>(full.down(), group))) {}

Tensor TensorParallelGeGLUMLP::forward(const Tensor& x) {
  return down_(gelu(gate_(x), "tanh") * up_(x));
}

}  // namespace kiln
