// Tensor parallelism, Megatron-style (issue #33): linear layers split across the ranks of a
// ProcessGroup (ops/distributed.h), built from the full single-device module so that loading a
// checkpoint and keeping each rank's shard is one constructor call.
//
//   ColumnParallelLinear: rank r keeps rows [r·out/n, (r+1)·out/n) of the weight and bias; its
//     output is rank r's slice of the last dim. No communication.
//   RowParallelLinear: rank r keeps columns [r·in/n, (r+1)·in/n) of the weight; its input is rank
//     r's slice of the last dim; the partial products are all-reduced (sum) and the bias, whole
//     on every rank, added once after the reduction.
//   TensorParallelGeGLUMLP: gate and up column-parallel, down row-parallel: one all-reduce.
//
// Whole models shard in place instead: Attention::ShardTensorParallel (heads split, grouped-query
// heads included), FeedForward::ShardTensorParallel and the models' own (LlamaForCausalLM's) keep
// each rank's part of the loaded full weights (or, built on the meta device, get memory for their
// parts and load only those: io/state_dict.h), so the model's forward, Step and generate() run
// tensor-parallel unchanged, eager or compiled (the all-reduce is the all_reduce op, a node of
// the traced graph). The models split their LM head by the vocabulary (PaddedRowShard; the
// logits gathered, GatherVocab; a tied head through VocabParallelLogits): a rank reads 1/world
// of it per token. The embedding table stays whole on every rank (a lookup reads only its rows).
//
//   RunThreadRanks(2, [&](ProcessGroup& pg) {
//     TensorParallelGeGLUMLP tp(full_mlp, pg);
//     Tensor y = tp(x);  // every rank: full_mlp(x), up to the reduction's rounding
//   });
//
// The split sizes must divide by the world size (a clear error names the layer and the sizes);
// only the vocabulary need not (its last ranks' rows are padded).
#pragma once

#include "ops/distributed.h"
#include "ops/modules.h"

namespace kiln {

// Rank `rank`'s part of `world` of `t` along `dim` (a copy); with `sections` > 1 the dim holds
// that many equal blocks and the part is taken from each, in order. The sizes must divide (the
// error names `who`, the sizes and the world size).
Tensor ShardOf(const Tensor& t, int64_t dim, int rank, int world, int sections, const char* who);
// The row-parallel product: x_shard · weight_shardᵀ summed over `group`, then `bias` (whole, may
// be undefined) added once.
Tensor RowParallel(const Tensor& x_shard, const Tensor& weight_shard, const Tensor& bias,
                   ProcessGroup& group);
// Rank `rank`'s share of `rows` split over `world` like a vocabulary that need not divide: every
// rank a part of ceil(rows / world) rows, [begin, end) of them real (fewer on the last ranks).
struct PaddedRows {
  int64_t begin, end, part;
};
PaddedRows PaddedRowsOf(int64_t rows, int rank, int world);
// Rank `rank`'s PaddedRows of `t` (a copy), the missing rows zeros.
Tensor PaddedRowShard(const Tensor& t, int rank, int world);
// Vocabulary-parallel logits: every rank's `part` [..., p] (its rows of an LM head split by
// PaddedRowShard) gathered along the last dim in rank order and cut to `vocab` (the padding
// dropped): [..., vocab], the same on every rank.
Tensor GatherVocab(const Tensor& part, int64_t vocab, ProcessGroup& group);
// Tied-embedding logits split by the vocabulary: `h` [..., dim] against this rank's rows of the
// whole `table` [vocab, dim] (a view: no copy, and it follows the table wherever it moves), padded
// with zero logits to PaddedRowShard's size and gathered: [..., vocab] on every rank.
Tensor VocabParallelLogits(const Tensor& h, const Tensor& table, ProcessGroup& group);
// A module's last projection: `layer`(x) when `group` is none (not sharded), else the
// row-parallel product of this rank's part of x and of the layer's weight over `group`.
Tensor RowParallelOrWhole(Linear& layer, const Tensor& x, const GroupRef& group);

class ColumnParallelLinear : public Module {
 public:
  ColumnParallelLinear(const Linear& full, ProcessGroup& group);
  Tensor forward(const Tensor& x) override;
  const char* type_name() const override { return "ColumnParallelLinear"; }

 private:
  Tensor& weight_;
  Tensor& bias_;
};

class RowParallelLinear : public Module {
 public:
  RowParallelLinear(const Linear& full, ProcessGroup& group);
  // `x_shard`: this rank's slice of the input's last dim.
  Tensor forward(const Tensor& x_shard) override;
  const char* type_name() const override { return "RowParallelLinear"; }

 private:
  GroupRef group_;
  Tensor& weight_;
  Tensor& bias_;
};

class TensorParallelGeGLUMLP : public Module {
 public:
  TensorParallelGeGLUMLP(GeGLUMLP& full, ProcessGroup& group);
  Tensor forward(const Tensor& x) override;  // x whole on every rank; the result too
  const char* type_name() const override { return "TensorParallelGeGLUMLP"; }

 private:
  ColumnParallelLinear& gate_;
  ColumnParallelLinear& up_;
  RowParallelLinear& down_;
};

}  // namespace kiln
