// The flash attention family's host side that needs no GPU (see flash_attention_cuda.h): which
// inputs the kernel takes and why not, its configuration, and its sources. In every build: the
// CPU's attention reports the same backend choice, and a build without CUDA renders the same
// sources. Compiling and launching is flash_attention_cuda.cc.
#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "codegen/families/attention/flash_attention_cuda.h"
#include "codegen/families/attention/flash_attention_source.h"
#include "codegen/families/attention/flash_decode_source.h"
#include "runtime/cuda.h"
#include "runtime/settings.h"
#include "runtime/status.h"

namespace kiln::cuda_ops {
namespace {

constexpr int64_t kMaxGridY = 65535;

const char* MaskSuffix(FlashMask m) {
  static constexpr const char* kNames[] = {"", "_boolmask", "_f32mask", "_f16mask", "_bf16mask"};
  return kNames[static_cast<int>(m)];
}

std::string LayoutUnsupported(const Tensor& t, const char* what) {
  if (t.size(-1) > 1 && t.stride(-1) != 1) {
    return absl::StrCat(what, " is not contiguous along its head dim (stride ", t.stride(-1),
                        "); the flash kernel reads rows of 16 bytes");
  }
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) {
    return absl::StrCat(what, "'s data is not 16-byte aligned");
  }
  const FlashBatchStrides s = FlashStridesOf(t);
  if (s.batch % 8 != 0 || s.head % 8 != 0 || s.row % 8 != 0) {
    return absl::StrCat(what, "'s strides ", ShapeString(t.strides()),
                        " are not multiples of 8 elements (16-byte aligned rows)");
  }
  return "";
}

// Why the decode kernel cannot rotate q and the new rows by these tables ("" when it can): q's
// dtype, [.., half] broadcast over the heads to [B, 1, rows, half] (rows the query rows, then
// also the new rows), rows 16-byte aligned.
std::string RotaryTablesUnsupported(const Tensor& q, const FlashKvAppend& append) {
  const int64_t half = q.size(-1) / 2, rows = q.size(-2), n_new = append.slots.numel();
  const int64_t batch = q.dim() >= 4 ? q.size(0) : 1;
  for (const Tensor* t : {&append.cos, &append.sin}) {
    const char* what = t == &append.cos ? "rotary cos" : "rotary sin";
    const int64_t r = t->dim();
    const bool fits = r >= 1 && r <= 4 && t->size(-1) == half &&
                      (r < 2 || t->size(-2) == 1 || (t->size(-2) == rows && rows == n_new)) &&
                      (r < 3 || t->size(-3) == 1) &&
                      (r < 4 || t->size(0) == 1 || t->size(0) == batch);
    if (t->dtype() != q.dtype() || !fits) {
      return absl::StrCat(what, " ", Describe(t->type()), " is not ", DTypeName(q.dtype()),
                          " [.., ", half, "] broadcasting to [", batch, ", 1, ", rows, ", ", half,
                          "] (one row per query and new row)");
    }
    if (std::string why = LayoutUnsupported(*t, what); !why.empty()) return why;
  }
  return "";
}

// "#define KEY VALUE" and a newline: the specialisation a kernel source starts with.
template <typename V>
void AppendDefine(std::string* source, const char* key, const V& value) {
  absl::StrAppend(source, "#define ", key, " ", value, "\n");
}

}  // namespace

FlashBatchStrides FlashStridesOf(const Tensor& t) {
  const int64_t r = t.dim();
  auto at = [&](int64_t d) -> long long { return t.size(d) == 1 ? 0 : t.stride(d); };
  return {r >= 4 ? at(0) : 0, r >= 3 ? at(r - 3) : 0, at(r - 2)};
}

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
  auto define = [&s](const char* key, const auto& value) { AppendDefine(&s, key, value); };
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

std::string FlashKvAppendUnsupportedReason(absl::Span<const Tensor> in, const OpAttrs& a,
                                           const FlashKvAppend& append) {
  if (std::string why = FlashAttentionUnsupportedReason(in, a); !why.empty()) return why;
  const Tensor &q = in[0], &k = in[1], &slots = append.slots;
  if (q.size(-2) > kFlashDecodeMaxQueries) {
    return absl::StrCat(q.size(-2), " query rows; the decode kernel appends for up to ",
                        kFlashDecodeMaxQueries);
  }
  if (slots.dim() != 1 || slots.numel() < 1 || slots.numel() > kFlashDecodeMaxQueries ||
      (slots.dtype() != DType::kInt64 && slots.dtype() != DType::kInt32)) {
    return absl::StrCat("slots ", Describe(slots.type()), "; the decode kernel appends 1 to ",
                        kFlashDecodeMaxQueries, " rows at int64 or int32 slots");
  }
  const char* names[] = {"new key", "new value"};
  const Tensor* rows[] = {&append.k_new, &append.v_new};
  for (int i = 0; i < 2; ++i) {
    const Tensor& cache = in[1 + i];
    Shape want = cache.shape();
    want[cache.dim() - 2] = slots.numel();
    if (rows[i]->dtype() != k.dtype() || rows[i]->shape() != want) {
      return absl::StrCat(names[i], " ", Describe(rows[i]->type()), " is not ",
                          DTypeName(k.dtype()), ShapeString(want),
                          " (the cache's shape with one row a slot)");
    }
    if (std::string why = LayoutUnsupported(*rows[i], names[i]); !why.empty()) return why;
  }
  return append.cos.defined() ? RotaryTablesUnsupported(q, append) : "";
}

std::string FlashDecodeKernelName(const FlashAttentionConfig& c) {
  return absl::StrCat("kiln_flash_decode_d", c.head_dim,
                      c.dtype == DType::kBFloat16 ? "_bf16" : "_f16", c.causal ? "_causal" : "",
                      MaskSuffix(c.mask),
                      c.kv_append > 0 ? absl::StrCat("_append", c.kv_append) : "",
                      c.kv_append > 0 && c.rope ? "_rope" : "");
}

std::string RenderFlashDecodeSource(const FlashAttentionConfig& c) {
  const std::string name = FlashDecodeKernelName(c);
  std::string s = absl::StrCat("// ", name, ": kiln's split-key attention for few query rows\n");
  auto define = [&s](const char* key, const auto& value) { AppendDefine(&s, key, value); };
  define("KILN_FD_NAME", name);
  define("KILN_FD_COMBINE_NAME", name + "_combine");
  define("KILN_FD_HEAD_DIM", c.head_dim);
  define("KILN_FD_BF16", c.dtype == DType::kBFloat16 ? 1 : 0);
  define("KILN_FD_CAUSAL", c.causal ? 1 : 0);
  define("KILN_FD_MASK", static_cast<int>(c.mask));
  define("KILN_FD_APPEND", c.kv_append);
  define("KILN_FD_ROPE", c.kv_append > 0 && c.rope ? 1 : 0);
  return s + kFlashParamsSource + kFlashDecodeSource;
}

namespace {

void SetStrides(const Tensor& t, long long* batch, long long* head, long long* row) {
  const FlashBatchStrides s = FlashStridesOf(t);
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

FlashParams MakeFlashParams(absl::Span<const Tensor> in, const OpAttrs& a, const Tensor& out) {
  constexpr double kLog2e = 1.4426950408889634;
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  const int64_t rank = q.dim();
  const int64_t batch = rank >= 4 ? q.size(0) : 1, heads = rank >= 3 ? q.size(-3) : 1;
  FlashParams p{};
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.o = out.data_ptr();
  SetStrides(q, &p.q_batch, &p.q_head, &p.q_row);
  SetStrides(k, &p.k_batch, &p.k_head, &p.k_row);
  SetStrides(v, &p.v_batch, &p.v_head, &p.v_row);
  SetStrides(out, &p.o_batch, &p.o_head, &p.o_row);
  if (in.size() > 3) {
    p.mask = in[3].data_ptr();
    SetMaskStrides(in[3], rank, &p);
  }
  p.heads = static_cast<int>(heads);
  p.group = static_cast<int>(rank >= 3 ? heads / k.size(-3) : 1);
  p.q_len = static_cast<int>(q.size(-2));
  p.kv_len = static_cast<int>(k.size(-2));
  p.scale_log2 = static_cast<float>(a.scale * kLog2e);
  p.section = static_cast<int>(batch * heads);
  return p;
}

FlashLaunchDescription DescribeFlashLaunch(const FlashAttentionConfig& c,
                                           absl::Span<const Tensor> in, const OpAttrs& a,
                                           const Tensor& out) {
  const std::string why = FlashAttentionUnsupportedReason(in, a);
  KILN_CHECK(why.empty(), "flash attention (prebuilt): ", why);
  KILN_CHECK(FlashCanWrite(out), "flash attention (prebuilt): the output's layout is not one the ",
             "kernel writes (", Describe(out.type()), ")");
  const FlashMask mask = in.size() > 3 ? FlashMaskOf(in[3].dtype()) : FlashMask::kNone;
  KILN_CHECK(c.head_dim == in[0].size(-1) && c.dtype == in[0].dtype() && c.causal == a.is_causal &&
                 c.mask == mask,
             "flash attention (prebuilt): the kernel ", FlashAttentionKernelName(c),
             " does not fit these operands (head dim ", in[0].size(-1), ", ",
             DTypeName(in[0].dtype()), a.is_causal ? ", causal" : "", ", mask kind ",
             static_cast<int>(mask), ")");
  const FlashParams p = MakeFlashParams(in, a, out);
  FlashLaunchDescription d;
  d.grid[0] = static_cast<unsigned>(p.section);  // every (batch, head) pair
  d.grid[1] = static_cast<unsigned>((p.q_len + c.block_m - 1) / c.block_m);
  d.block[0] = static_cast<unsigned>(c.threads());
  d.shared_bytes = c.shared_bytes();
  d.params.assign(reinterpret_cast<const char*>(&p), sizeof(p));
  return d;
}

FlashAttentionConfig ForGrid(FlashAttentionConfig c, int64_t bh, int64_t q_len, int sm_count) {
  static const bool enabled = EnvBool("KILN_FLASH_SMALL_GRID");
  const int64_t ctas = bh * ((q_len + c.block_m - 1) / c.block_m);
  if (!enabled || c.head_dim != 64 || c.block_m != 128 || ctas >= sm_count) return c;
  c.block_m = 64, c.block_n = 64, c.warps = 4, c.min_blocks = 3;
  return c;
}

bool FlashCanWrite(const Tensor& out) { return LayoutUnsupported(out, "out").empty(); }

}  // namespace kiln::cuda_ops
