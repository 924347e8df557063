// kiln's flash attention kernel compiled and launched (see flash_attention_cuda.h; which inputs
// it takes, its configuration and its sources are flash_attention_plan.cc).
#include "codegen/families/attention/flash_attention_cuda.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "codegen/families/attention/flash_attention_sm90_source.h"
#include "codegen/families/attention/flash_attention_source.h"
#include "codegen/families/attention/flash_decode_source.h"
#include "runtime/cuda_api.h"
#include "runtime/nvrtc.h"
#include "runtime/settings.h"
#include "runtime/status.h"
#include "runtime/tensor_map.h"

namespace kiln::cuda_ops {
namespace {

// Mirrors KilnDecodeParams (flash_decode_source.h).
struct DecodeParams {
  FlashParams f;
  float* part = nullptr;
  int splits = 1, split_len = 1;
  const void *k_new = nullptr, *v_new = nullptr;
  const void* slots = nullptr;
  long long slot_stride = 0;
  long long kn_batch = 0, kn_head = 0, kn_row = 0, vn_batch = 0, vn_head = 0, vn_row = 0;
  unsigned* bad = nullptr;
  int n_new = 0, slots64 = 0;
  const void *cos = nullptr, *sin = nullptr;
  long long cos_batch = 0, cos_row = 0, sin_batch = 0, sin_row = 0;
};

}  // namespace

size_t FlashDecodeParamsBytes() { return sizeof(DecodeParams); }

namespace {

// The fused append's fields of the decode parameters.
void SetAppend(const FlashKvAppend& a, DecodeParams* d) {
  d->k_new = a.k_new.data_ptr();
  d->v_new = a.v_new.data_ptr();
  d->slots = a.slots.data_ptr();
  d->slot_stride = a.slots.stride(0);
  d->slots64 = a.slots.dtype() == DType::kInt64 ? 1 : 0;
  d->n_new = static_cast<int>(a.slots.numel());
  d->bad = a.bad;
  const FlashBatchStrides k = FlashStridesOf(a.k_new), v = FlashStridesOf(a.v_new);
  d->kn_batch = k.batch, d->kn_head = k.head, d->kn_row = k.row;
  d->vn_batch = v.batch, d->vn_head = v.head, d->vn_row = v.row;
  if (a.cos.defined()) {
    d->cos = a.cos.data_ptr();
    d->sin = a.sin.data_ptr();
    const FlashBatchStrides c = FlashStridesOf(a.cos), s = FlashStridesOf(a.sin);
    d->cos_batch = c.batch, d->cos_row = c.row;
    d->sin_batch = s.batch, d->sin_row = s.row;
  }
}

struct FlashKernel {
  cudaKernel_t kernel = nullptr;
  FlashAttentionConfig config;
};

// The compiled kernel of a configuration for the current device, cached (rendering the source
// and hashing it costs more than a launch).
const FlashKernel& KernelFor(const FlashAttentionConfig& c) {
  static std::mutex mu;  // guards `cache`; held while compiling, so a kernel compiles once
  static auto* cache = new std::map<std::string, FlashKernel>();
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  const std::string name = FlashAttentionKernelName(c);
  const std::string key = absl::StrCat(name, "@", device);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  FlashKernel k{ValueOrThrow(cuda::GetKernel(RenderFlashAttentionSource(c), name)), c};
  KILN_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(k.kernel),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       c.shared_bytes()));
  return cache->emplace(key, k).first->second;
}

// The (batch, head) pairs whose CTAs a flash kernel runs together (kiln_flash_work_item): as many
// as keep their K and V (kv_len keys of head_dim, 2 bytes each) within a third of L2, so that each
// is read from memory once; every pair at once (one row tile of each in turn) with
// KILN_FLASH_L2_SECTIONS off.
int L2Section(int device, int64_t kv_len, int64_t head_dim, int64_t pairs) {
  if (!EnvBool("KILN_FLASH_L2_SECTIONS")) return static_cast<int>(pairs);
  const int64_t l2 = static_cast<int64_t>(cuda::Props(device).l2_bytes);
  const int64_t kv_bytes = std::max<int64_t>(kv_len * head_dim * 4, 1);
  return static_cast<int>(std::clamp<int64_t>(l2 / 3 / kv_bytes, 1, pairs));
}

// The decode kernels of a configuration (split and combine), cached like the flash kernel, and
// the most splits a row may have as one cluster on this device (0: no clusters, the workspace
// and the combine kernel).
struct DecodeKernels {
  cudaKernel_t split = nullptr, combine = nullptr;
  int max_cluster = 0;
};

// 16 CTAs a cluster where the device can hold one (a non-portable size), else the portable 8;
// 0 before sm_90.
int MaxClusterSplits(cudaKernel_t kernel, int device) {
  if (cuda::Props(device).major < 9) return 0;
  const void* f = reinterpret_cast<const void*>(kernel);
  if (cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    cudaGetLastError();
    return 8;
  }
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1, attr.val.clusterDim.y = 16, attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1, 16);
  config.blockDim = dim3(128);
  config.attrs = &attr;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, f, &config) != cudaSuccess) {
    cudaGetLastError();
    return 8;
  }
  return clusters > 0 ? 16 : 8;
}

const DecodeKernels& DecodeKernelsFor(const FlashAttentionConfig& c) {
  static std::mutex mu;  // guards `cache`; held while compiling, so a kernel compiles once
  static auto* cache = new std::map<std::string, DecodeKernels>();
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  const std::string name = FlashDecodeKernelName(c);
  const std::string key = absl::StrCat(name, "@", device);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  const std::string source = RenderFlashDecodeSource(c);
  DecodeKernels k{ValueOrThrow(cuda::GetKernel(source, name)),
                  ValueOrThrow(cuda::GetKernel(source, name + "_combine"))};
  k.max_cluster = MaxClusterSplits(k.split, device);
  return cache->emplace(key, k).first->second;
}

// Splits of the keys so that the grid holds about 6 CTAs per SM, each run a multiple of the
// keys a CTA takes per iteration (64 at head dim 64, 32 at 128), at most `max_splits` runs a row.
void ChooseSplits(int64_t rows, int64_t kv_len, int head_dim, int sm_count, int64_t max_splits,
                  DecodeParams* d) {
  const int64_t step = head_dim == 64 ? 64 : 32;  // kiln_fd::STEP
  const int64_t target = 6 * static_cast<int64_t>(std::max(sm_count, 1));
  const int64_t most = std::clamp<int64_t>((kv_len + step - 1) / step, 1, max_splits);
  const int64_t want = std::clamp<int64_t>((target + rows - 1) / rows, 1, most);
  const int64_t runs = (kv_len + want - 1) / want;
  const int64_t len = std::max<int64_t>(step, (runs + step - 1) / step * step);
  d->split_len = static_cast<int>(len);
  d->splits = static_cast<int>(std::max<int64_t>(1, (kv_len + len - 1) / len));
}

void LaunchFlashDecode(const FlashParams& p, const FlashAttentionConfig& config, int64_t rows,
                       Device device, const FlashKvAppend* append) {
  const DecodeKernels& kernels = DecodeKernelsFor(config);
  DecodeParams d{p};
  if (append != nullptr) SetAppend(*append, &d);
  // KILN_FD_CLUSTER=off: the workspace path (A/B, and its tests on sm_90), read per launch.
  const bool cluster = kernels.max_cluster > 0 && EnvBool("KILN_FD_CLUSTER");
  ChooseSplits(rows, p.kv_len, config.head_dim, cuda::Props(device.index).sm_count,
               cluster ? kernels.max_cluster : 1024, &d);
  void* args[] = {&d};
  const dim3 grid(static_cast<unsigned>(rows), d.splits);
  if (cluster || d.splits == 1) {  // one kernel: the row's splits merge through their cluster
    KILN_CUDA_CHECK(cuda::LaunchDependent(reinterpret_cast<const void*>(kernels.split), grid,
                                          dim3(128), args, 0, cuda::CurrentStream(),
                                          dim3(1, d.splits, 1)));
    return;
  }
  // The splits' partial results, freed (stream-ordered) after the combine.
  Tensor part = Tensor::Empty({rows * d.splits * (config.head_dim + 2)}, DType::kFloat32, device);
  d.part = static_cast<float*>(part.data_ptr());
  KILN_CUDA_CHECK(cuda::LaunchDependent(reinterpret_cast<const void*>(kernels.split), grid,
                                        dim3(128), args, 0, cuda::CurrentStream()));
  KILN_CUDA_CHECK(cuda::LaunchDependent(reinterpret_cast<const void*>(kernels.combine),
                                        dim3(static_cast<unsigned>(rows)), dim3(128), args, 0,
                                        cuda::CurrentStream()));
}

// The Hopper kernel of a configuration, compiled for sm_90a and cached like KernelFor's.
cudaKernel_t Sm90KernelFor(const FlashSm90Config& c) {
  static std::mutex mu;  // guards `cache`; held while compiling, so a kernel compiles once
  static auto* cache = new std::map<std::string, cudaKernel_t>();
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  const std::string name = c.Name();
  const std::string key = absl::StrCat(name, "@", device);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  cudaKernel_t k =
      ValueOrThrow(cuda::GetKernel(RenderFlashSm90Source(c), name, {.arch_specific = true}));
  KILN_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(k),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       c.shared_bytes()));
  return cache->emplace(key, k).first->second;
}

// The rank-4 TMA map of q, k or v ([B, H, T, D] of any strides, ranks 2..4), in boxes of
// `box_rows` rows and 64 columns; an error where TMA cannot address the tensor.
absl::StatusOr<cuda::TensorMap> AttentionMap(const Tensor& t, int box_rows) {
  const int64_t r = t.dim();
  const FlashBatchStrides s = FlashStridesOf(t);
  return cuda::EncodeTensorMap4D({.base = t.data_ptr(),
                                  .batch = r >= 4 ? t.size(0) : 1,
                                  .heads = r >= 3 ? t.size(r - 3) : 1,
                                  .rows = t.size(r - 2),
                                  .cols = t.size(r - 1),
                                  .batch_stride = s.batch,
                                  .head_stride = s.head,
                                  .row_stride = s.row,
                                  .box_rows = box_rows,
                                  .box_cols = 64});
}

// Runs the Hopper kernel (flash_attention_sm90_source.h) where it applies: an sm_90 GPU, no mask,
// head dim 64 or 128, KILN_FLASH_SM90 on, operands TMA can address. False: the caller runs the
// mma.sync kernel.
bool LaunchFlashSm90(absl::Span<const Tensor> in, const OpAttrs& a, const FlashParams& p,
                     int64_t batch, int64_t heads) {
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  const int head_dim = static_cast<int>(q.size(-1));
  const cuda::DeviceProps& props = cuda::Props(q.device().index);
  if (in.size() > 3 || props.major != 9 || props.minor != 0 || !EnvBool("KILN_FLASH_SM90") ||
      (head_dim != 64 && head_dim != 128) || v.size(-1) != head_dim) {
    return false;
  }
  const FlashSm90Config c = PlanFlashSm90(head_dim, q.dtype(), a.is_causal, p.kv_len);
  const int64_t tiles = (p.q_len + c.block_m() - 1) / c.block_m(), pairs = batch * heads;
  if (tiles > 65535 || pairs * tiles > INT_MAX || p.kv_len < 1) return false;
  absl::StatusOr<cuda::TensorMap> q_map = AttentionMap(q, c.block_m()),
                                  k_map = AttentionMap(k, c.block_n),
                                  v_map = AttentionMap(v, c.block_n);
  if (!q_map.ok() || !k_map.ok() || !v_map.ok()) return false;
  const cudaKernel_t kernel = Sm90KernelFor(c);
  FlashParams params = p;
  params.section = L2Section(q.device().index, p.kv_len, head_dim, pairs);
  int q_tiles = static_cast<int>(tiles), works = static_cast<int>(pairs * tiles);
  // The dynamic schedule's counter of items taken, zeroed for this launch (freed stream-ordered).
  Tensor counter;
  int* next_work = nullptr;
  if (c.dynamic) {
    counter = Tensor::Empty({1}, DType::kInt32, q.device());
    next_work = static_cast<int*>(counter.data_ptr());
    KILN_CUDA_CHECK(cudaMemsetAsync(next_work, 0, sizeof(int), cuda::CurrentStream()));
  }
  void* args[] = {&*q_map, &*k_map, &*v_map, &params, &q_tiles, &works, &next_work};
  // One CTA per (pair, row tile), or (two consumers) one persistent CTA an SM.
  const dim3 grid = c.consumers == 1
                        ? dim3(static_cast<unsigned>(pairs), static_cast<unsigned>(tiles))
                        : dim3(static_cast<unsigned>(std::min(works, props.sm_count)));
  KILN_CUDA_CHECK(cuda::LaunchDependent(reinterpret_cast<const void*>(kernel), grid,
                                        dim3(c.threads()), args, c.shared_bytes(),
                                        cuda::CurrentStream()));
  return true;
}

}  // namespace

void LaunchFlashAttention(absl::Span<const Tensor> in, const OpAttrs& a, const Tensor& out,
                          const FlashKvAppend* append) {
  const Tensor &q = in[0], &k = in[1];
  const bool has_mask = in.size() > 3;
  const int64_t rank = q.dim();
  const int64_t batch = rank >= 4 ? q.size(0) : 1, heads = rank >= 3 ? q.size(-3) : 1;
  FlashAttentionConfig config =
      ForGrid(PlanFlashAttention(static_cast<int>(q.size(-1)), q.dtype(), a.is_causal,
                                 has_mask ? FlashMaskOf(in[3].dtype()) : FlashMask::kNone),
              batch * heads, q.size(-2), cuda::Props(q.device().index).sm_count);
  // One new row (a decode step) compares each key with one slot; more take the 4-row variant.
  config.kv_append = append == nullptr ? 0 : append->slots.numel() == 1 ? 1 : 4;
  config.rope = append != nullptr && append->cos.defined();
  KILN_CHECK(append == nullptr || append->bad != nullptr,
             "scaled_dot_product_attention: a fused KV-cache append needs an index-error flag");
  FlashParams p = MakeFlashParams(in, a, out);
  if (p.q_len <= kFlashDecodeMaxQueries) {
    LaunchFlashDecode(p, config, batch * heads * p.q_len, q.device(), append);
    return;
  }
  KILN_CHECK(append == nullptr, "scaled_dot_product_attention: a fused KV-cache append needs at ",
             "most ", kFlashDecodeMaxQueries, " query rows, got ", p.q_len);
  if (LaunchFlashSm90(in, a, p, batch, heads)) return;
  // The mma.sync kernel (two CTAs an SM, not persistent) keeps causal work longest first over
  // every pair: in sections its last section's long tiles start late (H200, [8,16,1024,128]
  // causal: 156.5 us in sections against 130.6), while without a mask sections win (4096 keys,
  // head dim 128: 3125 against 3376).
  p.section = a.is_causal ? static_cast<int>(batch * heads)
                          : L2Section(q.device().index, p.kv_len, k.size(-1), batch * heads);
  const FlashKernel& kernel = KernelFor(config);
  const dim3 grid(static_cast<unsigned>(batch * heads),
                  static_cast<unsigned>((p.q_len + config.block_m - 1) / config.block_m));
  void* args[] = {&p};
  KILN_CUDA_CHECK(cuda::LaunchDependent(reinterpret_cast<const void*>(kernel.kernel), grid,
                                        dim3(config.threads()), args, config.shared_bytes(),
                                        cuda::CurrentStream()));
}

}  // namespace kiln::cuda_ops
