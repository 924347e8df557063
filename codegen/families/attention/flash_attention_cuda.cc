// kiln's flash attention kernel on the host side (see flash_attention_cuda.h).
#include "codegen/families/attention/flash_attention_cuda.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "codegen/families/attention/flash_attention_source.h"
#include "codegen/families/attention/flash_decode_source.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "runtime/settings.h"
#include "runtime/status.h"

namespace kiln::cuda_ops {
namespace {

// Mirrors KilnFlashParams in the kernel source, field for field.
struct FlashParams {
  const void *q, *k, *v;
  void* o;
  const void* mask;
  long long q_batch, q_head, q_row;
  long long k_batch, k_head, k_row;
  long long v_batch, v_head, v_row;
  long long o_batch, o_head, o_row;
  long long m_batch, m_head, m_row, m_col;
  int heads, group, q_len, kv_len;
  float scale_log2;
};

// Mirrors KilnDecodeParams (flash_decode_source.h).
struct DecodeParams {
  FlashParams f;
  float* part;
  int splits, split_len;
};

constexpr double kLog2e = 1.4426950408889634;
constexpr int64_t kMaxGridY = 65535;

const char* MaskSuffix(FlashMask m) {
  static constexpr const char* kNames[] = {"", "_boolmask", "_f32mask", "_f16mask", "_bf16mask"};
  return kNames[static_cast<int>(m)];
}

// Strides of a [B, H, T, D]-like tensor of rank 2..4 (0 for absent or size-1 dims).
struct BatchStrides {
  long long batch = 0, head = 0, row = 0;
};
BatchStrides StridesOf(const Tensor& t) {
  const int64_t r = t.dim();
  auto at = [&](int64_t d) -> long long { return t.size(d) == 1 ? 0 : t.stride(d); };
  return {r >= 4 ? at(0) : 0, r >= 3 ? at(r - 3) : 0, at(r - 2)};
}

std::string LayoutUnsupported(const Tensor& t, const char* what) {
  if (t.size(-1) > 1 && t.stride(-1) != 1) {
    return absl::StrCat(what, " is not contiguous along its head dim (stride ", t.stride(-1),
                        "); the flash kernel reads rows of 16 bytes");
  }
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) {
    return absl::StrCat(what, "'s data is not 16-byte aligned");
  }
  const BatchStrides s = StridesOf(t);
  if (s.batch % 8 != 0 || s.head % 8 != 0 || s.row % 8 != 0) {
    return absl::StrCat(what, "'s strides ", ShapeString(t.strides()),
                        " are not multiples of 8 elements (16-byte aligned rows)");
  }
  return "";
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

void SetStrides(const Tensor& t, long long* batch, long long* head, long long* row) {
  const BatchStrides s = StridesOf(t);
  *batch = s.batch;
  *head = s.head;
  *row = s.row;
}

// The mask's strides over the output's [..., L, S] (0 where it broadcasts).
void SetMaskStrides(const Tensor& mask, int64_t rank, FlashParams* p) {
  int64_t st[4] = {0, 0, 0, 0};  // over [B, H, L, S] of a rank-`rank` output
  const int64_t lead = rank - mask.dim();
  for (int64_t d = 0; d < mask.dim(); ++d) {
    st[4 - rank + lead + d] = mask.size(d) == 1 ? 0 : mask.stride(d);
  }
  p->m_batch = st[0];
  p->m_head = st[1];
  p->m_row = st[2];
  p->m_col = st[3];
}

}  // namespace

FlashMask FlashMaskOf(DType t) {
  switch (t) {
    case DType::kBool:
      return FlashMask::kBool;
    case DType::kFloat32:
      return FlashMask::kFloat32;
    case DType::kFloat16:
      return FlashMask::kFloat16;
    case DType::kBFloat16:
      return FlashMask::kBFloat16;
    default:
      return FlashMask::kNone;
  }
}

FlashAttentionConfig PlanFlashAttention(int head_dim, DType dtype, bool causal, FlashMask mask) {
  FlashAttentionConfig c;
  c.head_dim = head_dim;
  c.dtype = dtype;
  c.causal = causal;
  c.mask = mask;
  // Measured on the H200 against the other tilings (tools/flash_attention/README.md): 4 warps
  // of 32 rows (two m16 tiles share every K/V fragment), 64 keys a tile, two CTAs per SM.
  c.block_m = 128, c.block_n = 64, c.warps = 4, c.min_blocks = 2;
  // Head dim 64: Q stays in registers, one barrier per tile. 128: Q is re-read from shared
  // memory (registers are full with the 128-wide O) and V waits for its own barrier (the one-
  // barrier order spills there).
  c.q_in_regs = head_dim == 64;
  c.one_sync = head_dim == 64;
  return c;
}

std::string FlashAttentionKernelName(const FlashAttentionConfig& c) {
  return absl::StrCat("kiln_flash_attention_d", c.head_dim,
                      c.dtype == DType::kBFloat16 ? "_bf16" : "_f16", c.causal ? "_causal" : "",
                      MaskSuffix(c.mask), "_", c.block_m, "x", c.block_n, "w", c.warps,
                      c.q_in_regs ? "" : "s", c.one_sync ? "" : "_2sync");
}

std::string RenderFlashAttentionSource(const FlashAttentionConfig& c) {
  const std::string name = FlashAttentionKernelName(c);
  std::string s = absl::StrCat("// ", name, ": kiln's flash attention forward\n");
  auto define = [&s](const char* key, const auto& value) {
    absl::StrAppend(&s, "#define ", key, " ", value, "\n");
  };
  define("KILN_FA_NAME", name);
  define("KILN_FA_HEAD_DIM", c.head_dim);
  define("KILN_FA_BLOCK_M", c.block_m);
  define("KILN_FA_BLOCK_N", c.block_n);
  define("KILN_FA_WARPS", c.warps);
  define("KILN_FA_Q_IN_REGS", c.q_in_regs ? 1 : 0);
  define("KILN_FA_MIN_BLOCKS", c.min_blocks);
  define("KILN_FA_BF16", c.dtype == DType::kBFloat16 ? 1 : 0);
  define("KILN_FA_CAUSAL", c.causal ? 1 : 0);
  define("KILN_FA_MASK", static_cast<int>(c.mask));
  define("KILN_FA_ONE_SYNC", c.one_sync ? 1 : 0);
  return s + kFlashParamsSource + kFlashAttentionSource;
}

std::string FlashAttentionTypesUnsupported(absl::Span<const TensorType> in) {
  const TensorType &q = in[0], &v = in[2];
  if (!q.device.is_cuda()) {
    return absl::StrCat("the inputs are on ", q.device.str(), "; the flash kernel runs on CUDA");
  }
  if (q.dtype != DType::kBFloat16 && q.dtype != DType::kFloat16) {
    return absl::StrCat("dtype ", DTypeName(q.dtype),
                        "; the flash kernel takes bfloat16 and float16");
  }
  const int64_t e = q.shape.back();
  if (e != 64 && e != 128) {
    return absl::StrCat("head dim ", e, "; the flash kernel is built for head dims 64 and 128");
  }
  if (v.shape.back() != e) {
    return absl::StrCat("value head dim ", v.shape.back(), " differs from the query/key head dim ",
                        e);
  }
  if (q.rank() > 4) {
    return absl::StrCat("rank ", q.rank(), "; the flash kernel takes up to 4 dims [B, H, T, D]");
  }
  return "";
}

std::string FlashAttentionUnsupportedReason(absl::Span<const Tensor> in, const OpAttrs& a) {
  std::vector<TensorType> types;
  for (const Tensor& t : in) types.push_back(t.type());
  if (std::string why = FlashAttentionTypesUnsupported(types); !why.empty()) return why;
  const char* names[] = {"query", "key", "value"};
  for (int i = 0; i < 3; ++i) {
    if (std::string why = LayoutUnsupported(in[i], names[i]); !why.empty()) return why;
  }
  const cuda::DeviceProps& props = cuda::Props(in[0].device().index);
  if (props.major < 8) {
    return absl::StrCat("the GPU is sm_", props.major, props.minor,
                        "; the flash kernel needs sm_80 or newer (mma.sync on bf16)");
  }
  const int64_t l = in[0].size(-2), s = in[1].size(-2);
  const int64_t bh = in[0].numel() / std::max<int64_t>(l * in[0].size(-1), 1);
  const FlashAttentionConfig c =
      PlanFlashAttention(static_cast<int>(in[0].size(-1)), in[0].dtype(), a.is_causal, {});
  if (l > INT_MAX || s > INT_MAX || bh > INT_MAX || (l + c.block_m - 1) / c.block_m > kMaxGridY) {
    return absl::StrCat("sizes beyond the kernel's grid: ", bh, " (batch, head) pairs, query ",
                        "length ", l, ", key length ", s);
  }
  return "";
}

namespace {

// The decode kernels of a configuration (split and combine), cached like the flash kernel.
struct DecodeKernels {
  cudaKernel_t split = nullptr, combine = nullptr;
};
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
  return cache->emplace(key, k).first->second;
}

// Splits of the keys so that the grid holds about 8 CTAs per SM, each run at least 32 keys, at
// most 1024 runs a row (the combine kernel's shared arrays).
void ChooseSplits(int64_t rows, int64_t kv_len, int sm_count, DecodeParams* d) {
  const int64_t target = 8 * static_cast<int64_t>(std::max(sm_count, 1));
  const int64_t max_splits = std::clamp<int64_t>((kv_len + 31) / 32, 1, 1024);
  const int64_t want = std::clamp<int64_t>((target + rows - 1) / rows, 1, max_splits);
  const int64_t len = std::max<int64_t>(1, (kv_len + want - 1) / want);
  d->split_len = static_cast<int>(len);
  d->splits = static_cast<int>(std::max<int64_t>(1, (kv_len + len - 1) / len));
}

void LaunchFlashDecode(const FlashParams& p, const FlashAttentionConfig& config, int64_t rows,
                       Device device) {
  const DecodeKernels& kernels = DecodeKernelsFor(config);
  DecodeParams d{p, nullptr, 1, 1};
  ChooseSplits(rows, p.kv_len, cuda::Props(device.index).sm_count, &d);
  Tensor part;  // the splits' partial results, freed (stream-ordered) after the combine
  if (d.splits > 1) {
    part = Tensor::Empty({rows * d.splits * (config.head_dim + 2)}, DType::kFloat32, device);
    d.part = static_cast<float*>(part.data_ptr());
  }
  void* args[] = {&d};
  KILN_CUDA_CHECK(cuda::LaunchDependent(reinterpret_cast<const void*>(kernels.split),
                                        dim3(static_cast<unsigned>(rows), d.splits), dim3(128),
                                        args, 0, cuda::CurrentStream()));
  if (d.splits > 1) {
    KILN_CUDA_CHECK(cuda::LaunchDependent(reinterpret_cast<const void*>(kernels.combine),
                                          dim3(static_cast<unsigned>(rows)), dim3(128), args, 0,
                                          cuda::CurrentStream()));
  }
}

}  // namespace

std::string FlashDecodeKernelName(const FlashAttentionConfig& c) {
  return absl::StrCat("kiln_flash_decode_d", c.head_dim,
                      c.dtype == DType::kBFloat16 ? "_bf16" : "_f16", c.causal ? "_causal" : "",
                      MaskSuffix(c.mask));
}

std::string RenderFlashDecodeSource(const FlashAttentionConfig& c) {
  const std::string name = FlashDecodeKernelName(c);
  std::string s = absl::StrCat("// ", name, ": kiln's split-key attention for few query rows\n");
  auto define = [&s](const char* key, const auto& value) {
    absl::StrAppend(&s, "#define ", key, " ", value, "\n");
  };
  define("KILN_FD_NAME", name);
  define("KILN_FD_COMBINE_NAME", name + "_combine");
  define("KILN_FD_HEAD_DIM", c.head_dim);
  define("KILN_FD_BF16", c.dtype == DType::kBFloat16 ? 1 : 0);
  define("KILN_FD_CAUSAL", c.causal ? 1 : 0);
  define("KILN_FD_MASK", static_cast<int>(c.mask));
  return s + kFlashParamsSource + kFlashDecodeSource;
}

FlashAttentionConfig ForGrid(FlashAttentionConfig c, int64_t bh, int64_t q_len, int sm_count) {
  static const bool enabled = EnvBool("KILN_FLASH_SMALL_GRID");
  const int64_t ctas = bh * ((q_len + c.block_m - 1) / c.block_m);
  if (!enabled || c.head_dim != 64 || c.block_m != 128 || ctas >= sm_count) return c;
  c.block_m = 64, c.block_n = 64, c.warps = 4, c.min_blocks = 3;
  return c;
}

bool FlashCanWrite(const Tensor& out) { return LayoutUnsupported(out, "out").empty(); }

void LaunchFlashAttention(absl::Span<const Tensor> in, const OpAttrs& a, const Tensor& out) {
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  const bool has_mask = in.size() > 3;
  const int64_t rank = q.dim();
  const int64_t batch = rank >= 4 ? q.size(0) : 1, heads = rank >= 3 ? q.size(-3) : 1;
  const FlashAttentionConfig config =
      ForGrid(PlanFlashAttention(static_cast<int>(q.size(-1)), q.dtype(), a.is_causal,
                                 has_mask ? FlashMaskOf(in[3].dtype()) : FlashMask::kNone),
              batch * heads, q.size(-2), cuda::Props(q.device().index).sm_count);
  FlashParams p{};
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.o = out.data_ptr();
  SetStrides(q, &p.q_batch, &p.q_head, &p.q_row);
  SetStrides(k, &p.k_batch, &p.k_head, &p.k_row);
  SetStrides(v, &p.v_batch, &p.v_head, &p.v_row);
  SetStrides(out, &p.o_batch, &p.o_head, &p.o_row);
  if (has_mask) {
    p.mask = in[3].data_ptr();
    SetMaskStrides(in[3], rank, &p);
  }
  p.heads = static_cast<int>(heads);
  p.group = static_cast<int>(rank >= 3 ? heads / k.size(-3) : 1);
  p.q_len = static_cast<int>(q.size(-2));
  p.kv_len = static_cast<int>(k.size(-2));
  p.scale_log2 = static_cast<float>(a.scale * kLog2e);
  if (p.q_len <= kFlashDecodeMaxQueries) {
    LaunchFlashDecode(p, config, batch * heads * p.q_len, q.device());
    return;
  }
  const FlashKernel& kernel = KernelFor(config);
  const dim3 grid(static_cast<unsigned>(batch * heads),
                  static_cast<unsigned>((p.q_len + config.block_m - 1) / config.block_m));
  void* args[] = {&p};
  KILN_CUDA_CHECK(cuda::LaunchDependent(reinterpret_cast<const void*>(kernel.kernel), grid,
                                        dim3(config.threads()), args, config.shared_bytes(),
                                        cuda::CurrentStream()));
}

}  // namespace kiln::cuda_ops
