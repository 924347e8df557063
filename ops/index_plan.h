// The element mapping shared by the gather-like ops (embedding, index_select, gather) and cat's
// copies, on CPU and CUDA: output element o (a multi-index over the output's shape) reads
//   src[base(o) + index(o) * select_stride]      with index(o) = idx[idx_offset(o)]
// where base, idx_offset and the output offset are dot products of o with per-operand strides
// (0 where an operand repeats). Without an index (has_index = false) it is a strided copy. A
// scatter plan (index_copy) iterates over the source instead and the index picks the output:
//   out[base_out(o) + index(o) * select_stride] = src[base(o)]
// where an out-of-range index writes nothing (a gather writes zero).
// Plain C++ (no kiln headers) so that nvcc compiles it into the CUDA kernels.
//
//   IndexPlan p = PlanEmbedding(indices, weight, out);   // ops/indexing.h
//   // out[i..., d] = weight[indices[i...], d]
#pragma once

#include <cstdint>

namespace kiln {

inline constexpr int kIndexPlanMaxRank = 8;

struct IndexPlan {
  int rank = 0;                           // of the output
  int64_t sizes[kIndexPlanMaxRank] = {};  // the output's shape (a scatter's: the source's)
  int64_t out_strides[kIndexPlanMaxRank] = {};
  int64_t src_strides[kIndexPlanMaxRank] = {};  // 0 on the indexed dim
  int64_t idx_strides[kIndexPlanMaxRank] = {};  // the index tensor's strides over the output
  int64_t select_stride = 0;  // the indexed operand's stride along the indexed dim
  int64_t bound = 0;          // valid indices are [0, bound)
  bool has_index = false;
  bool scatter = false;        // the index offsets the output, not the source
  bool index_is_int64 = true;  // else int32
  int elem_size = 4;           // bytes per element of src and out (the same dtype)
};

}  // namespace kiln
