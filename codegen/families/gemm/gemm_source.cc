// The GEMM family's sm_90a kernel source (see gemm_source.h): the Hopper primitives as thin
// inline-PTX wrappers, then the warp-specialised persistent kernel for one GemmConfig.
#include "codegen/families/gemm/gemm_source.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ops/cuda/hopper_primitives.h"
#include "ops/cuda/kernel_render.h"
#include "runtime/status.h"

namespace kiln::cuda_ops {
namespace {

constexpr int kMaxSharedBytes = 227 * 1024;  // per CTA on sm_90
constexpr int kTileGroupM = 8;               // tiles along M that share w's tiles in L2

// FNV-1a: a stable hash of an epilogue's text for the kernel's name.
uint32_t Fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char ch : s) h = (h ^ ch) * 16777619u;
  return h;
}

// `kiln_wgmma(d, da, dw, accumulate)`: one wgmma.mma_async m64n<bn>k16 into the bn / 2
// accumulators of each thread (accumulate 0: d = a·w, else d += a·w).
std::string WgmmaWrapper(const GemmConfig& c) {
  return RenderWgmma("kiln_wgmma", c.bn, c.dtype, {});
}

// Output tile `tile` as (tm, tn): column tiles walk groups of kTileGroupM row tiles, so the CTAs
// running at once share w's tiles (and a's) in L2.
std::string TileOrder() {
  return absl::StrCat(
      "__device__ __forceinline__ void kiln_tile_of(int tile, int tiles_m, int tiles_n, int& tm,"
      " int& tn) {\n  const int per_group = ",
      kTileGroupM, " * tiles_n, first_m = tile / per_group * ", kTileGroupM,
      ";\n  const int rows = min(tiles_m - first_m, ", kTileGroupM,
      "), in_group = tile % per_group;\n  tm = first_m + in_group % rows;\n"
      "  tn = in_group / rows;\n}\n");
}

// Input `i` of the epilogue program (GemmConfig::epilogue) as stored at this thread's element
// (RenderValues converts it to float): output column group jo (the box's jj), row half h,
// element e of the pair (see Epilogue).
std::string EpilogueLoad(const GemmConfig& c, int i) {
  const int accs = c.geglu ? 2 : 1;
  // The accumulator group of output group jo: itself, or the gate's (2jo) and the up's (2jo + 1).
  auto group = [&](int k) { return c.geglu ? absl::StrCat("(2 * jo + ", k, ")") : "jo"; };
  if (i < accs) return absl::StrCat("d[4 * ", group(i), " + 2 * h + e]");
  i -= accs;
  if (c.bias) {
    if (i < accs) return absl::StrCat("kiln_half(bias2[", group(i), "], e)");
    i -= accs;
  }
  return std::string("kiln_half(res2[jj][h], e)");
}

// This thread's residual pairs of a box's 8 column groups (two rows each), loaded before the
// box's values are computed: 16 loads in flight. Rows past m and columns past the output's read
// nothing.
std::string ResidualLoads(const GemmConfig& c) {
  if (!c.residual) return "";
  return absl::StrCat(
      "      unsigned res2[8][2];\n      #pragma unroll\n      for (int jj = 0; jj < 8; ++jj) {\n",
      "        const int col = tn * kOutCols + jb * 64 + 8 * jj + 2 * (t % 4);\n",
      "        #pragma unroll\n        for (int h = 0; h < 2; ++h) {\n",
      "          const int row = tm * kBM", c.pingpong ? "" : " + c * 64", " + r0 + 8 * h;\n",
      "          res2[jj][h] = row < m && col < ", c.geglu ? "n / 2" : "n",
      " ? *reinterpret_cast<const unsigned*>(residual + (long long)row * ldr + col) : 0u;\n",
      "        }\n      }\n");
}

// The consumer's epilogue: thread (warp w, lane l) of consumer c holds rows
// 64c + 16w + l/4 (+8) and columns 8j + 2(l%4) (+1) of the tile in d[4j + 2h + {0,1}]. The
// epilogue program computes each output from them (with the bias and residual) in float32,
// rounded once; the values go into the consumer's staging area of shared memory as kOutCols / 64
// boxes of [64 rows][64 columns] in TMA's 128-byte swizzle (16-byte chunk q of row r at chunk
// q ^ (r % 8): the warp's 32 four-byte writes hit 32 banks), then one thread stores the boxes
// with TMA while the consumer goes on to its next tile. The staging area is rewritten only once
// the previous tile's stores have read it.
std::string Epilogue(const GemmConfig& c) {
  const char* pack = c.dtype == DType::kFloat16 ? "kiln_pack_f16x2" : "kiln_pack_bf16x2";
  const kir::Program p = c.Epilogue();
  const std::string values = RenderValues(
      p, [&](int i) { return EpilogueLoad(c, i); }, "            ");
  return absl::StrCat(
      "    if (t == 0) kiln_bulk_wait_read();\n", "    kiln_named_barrier(1 + c, 128);\n",
      "    const unsigned stage_c = staging + c * kOutCols * 128;\n",
      "    const int r0 = (t / 32) * 16 + (t % 32) / 4;  // this thread's first row of 64\n",
      "    #pragma unroll\n    for (int jb = 0; jb < kOutCols / 64; ++jb) {  // a box\n",
      ResidualLoads(c), "      const unsigned box = stage_c + jb * 8192;\n",
      "      #pragma unroll\n      for (int jj = 0; jj < 8; ++jj) {\n",
      "        const int jo = jb * 8 + jj;\n",
      "        #pragma unroll\n        for (int h = 0; h < 2; ++h) {\n",
      "          const int r = r0 + 8 * h;\n", "          float y[2];\n",
      "          #pragma unroll\n          for (int e = 0; e < 2; ++e) {\n", values,
      "            y[e] = ", ValueRef(p, p.outputs()[0]), ";\n", "          }\n",
      "          kiln_st_shared_u32(box + r * 128 + ((jj ^ (r % 8)) * 16) + (t % 4) * 4, ", pack,
      "(y[0], y[1]));\n", "        }\n      }\n    }\n", "    kiln_fence_async_shared();\n",
      "    kiln_named_barrier(1 + c, 128);\n", "    if (t == 0) {\n",
      "      #pragma unroll\n      for (int b = 0; b < kOutCols / 64; ++b) {\n",
      "        kiln_tma_store_2d(&out_map, stage_c + b * 8192, tn * kOutCols + b * 64,"
      " tm * kBM",
      c.pingpong ? "" : " + c * 64", ");\n", "      }\n      kiln_bulk_commit();\n    }\n");
}

// The bias of this thread's columns of the tile, loaded into registers before the mainloop (their
// latency hidden under it): two 16-bit values per 32-bit load (n is a multiple of 8 and the bias
// 4-byte aligned, so a pair is in or out of the tensor whole).
std::string BiasPreload(const GemmConfig& c) {
  if (!c.bias) return "";
  return "    unsigned bias2[kBN / 8];\n"
         "    #pragma unroll\n"
         "    for (int j = 0; j < kBN / 8; ++j) {\n"
         "      const int col = tn * kBN + 8 * j + 2 * (t % 4);\n"
         "      bias2[j] = col < n ? *reinterpret_cast<const unsigned*>(bias + col) : 0u;\n"
         "    }\n";
}

// The consumer's loop over its tiles, up to its k-blocks: both consumers walk this CTA's tiles
// and their slots together, or (ping-pong) consumer c takes the CTA's tiles c, c + 2, ... and
// starts a tile's mainloop once the other consumer has issued its previous tile's (named barrier
// 3 + c: 128 waiting threads and the other's 128 arriving ones), consumer 0's first tile at once.
std::string ConsumerLoopHead(const GemmConfig& c) {
  if (!c.pingpong) {
    return "  const int c = wg - 1;  // this consumer's 64 rows of the tile\n"
           "  float d[kBN / 2];\n  int it = 0;\n"
           "  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {\n"
           "    int tm, tn;\n    kiln_tile_of(tile, tiles_m, tiles_n, tm, tn);\n";
  }
  return "  const int c = wg - 1;  // this consumer's tiles: the CTA's c-th, (c + 2)-th, ...\n"
         "  float d[kBN / 2];\n"
         "  for (int tile = blockIdx.x + c * gridDim.x, i = c; tile < tiles;\n"
         "       tile += 2 * gridDim.x, i += 2) {\n"
         "    int tm, tn;\n    kiln_tile_of(tile, tiles_m, tiles_n, tm, tn);\n"
         "    int it = i * kblocks;  // the ring's position of this tile's first slot\n"
         "    if (i > 0) kiln_named_barrier(3 + c, 256);  // the other consumer's mainloop "
         "issued\n";
}

std::string Kernel(const GemmConfig& c) {
  // Registers: the producer warpgroup keeps 40, the consumers share the rest of the 64K.
  const int consumer_regs = c.consumers == 1 ? 240 : 232;
  return absl::StrCat(
      "extern \"C\" __global__ void __launch_bounds__(", c.threads(), ", 1) ", c.Name(), "(\n",
      "    const __grid_constant__ KilnTensorMap a_map, const __grid_constant__ KilnTensorMap "
      "w_map,\n",
      "    const __grid_constant__ KilnTensorMap out_map, const kiln_u16* __restrict__ bias,\n",
      "    const kiln_u16* __restrict__ residual, long long ldr, int m, int n, int k) {\n",
      "  constexpr int kBM = ", c.bm(), ", kBN = ", c.bn, ", kBK = ", kGemmBlockK,
      ", kStages = ", c.stages, ", kConsumers = ", c.consumers, ", kOutCols = ", c.out_cols(),
      ";\n", "  constexpr unsigned kABytes = kBM * kBK * 2, kWBytes = kBN * kBK * 2;\n",
      "  constexpr unsigned kSlotBytes = kABytes + kWBytes;\n",
      "  extern __shared__ unsigned char kiln_shared[];\n",
      "  // Slots at a 1024-byte boundary (the swizzle's period), the barriers after them.\n",
      "  const unsigned base = (kiln_smem_addr(kiln_shared) + 1023u) & ~1023u;\n",
      "  const unsigned staging = base + kStages * kSlotBytes;  // the consumers' output tiles\n",
      "  const unsigned full = staging + kConsumers * kOutCols * 128, empty = full + 8 * "
      "kStages;\n",
      "  const int tiles_m = (m + kBM - 1) / kBM, tiles_n = (n + kBN - 1) / kBN;\n",
      "  const int tiles = tiles_m * tiles_n, kblocks = (k + kBK - 1) / kBK;\n",
      "  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;\n", "  if (threadIdx.x == 0) {\n",
      "    for (int s = 0; s < kStages; ++s) {\n", "      kiln_mbar_init(full + 8 * s, 1);\n",
      "      kiln_mbar_init(empty + 8 * s, ", c.pingpong ? 1 : c.consumers, ");\n    }\n",
      "    asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");\n  }\n",
      "  __syncthreads();\n", "  kiln_grid_dependency_sync();\n",
      "  if (wg == 0) {  // the producer\n",
      "    asm volatile(\"setmaxnreg.dec.sync.aligned.u32 40;\");\n", "    if (t != 0) return;\n",
      "    int it = 0;\n", "    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {\n",
      "      int tm, tn;\n      kiln_tile_of(tile, tiles_m, tiles_n, tm, tn);\n",
      "      for (int kb = 0; kb < kblocks; ++kb, ++it) {\n",
      "        const int s = it % kStages;\n",
      "        kiln_mbar_wait(empty + 8 * s, ((it / kStages) & 1) ^ 1);\n",
      "        kiln_mbar_expect_tx(full + 8 * s, kSlotBytes);\n",
      "        kiln_tma_load_2d(base + s * kSlotBytes, &a_map, full + 8 * s, kb * kBK, tm * "
      "kBM);\n",
      "        kiln_tma_load_2d(base + s * kSlotBytes + kABytes, &w_map, full + 8 * s, kb * kBK,"
      " tn * kBN);\n",
      "      }\n    }\n    return;\n  }\n", "  asm volatile(\"setmaxnreg.inc.sync.aligned.u32 ",
      consumer_regs, ";\");\n", ConsumerLoopHead(c), BiasPreload(c),
      "    for (int kb = 0; kb < kblocks; ++kb, ++it) {\n", "      const int s = it % kStages;\n",
      "      kiln_mbar_wait(full + 8 * s, (it / kStages) & 1);\n",
      "      const unsigned long long da = kiln_wgmma_desc(base + s * kSlotBytes",
      c.pingpong ? "" : " + c * 64 * 128", ");\n",
      "      const unsigned long long dw = kiln_wgmma_desc(base + s * kSlotBytes + kABytes);\n",
      "      kiln_fence_operands(d);\n", "      kiln_wgmma_fence();\n",
      "      #pragma unroll\n      for (int kk = 0; kk < kBK / 16; ++kk) {\n",
      "        kiln_wgmma(d, da + 2 * kk, dw + 2 * kk, kb > 0 || kk > 0);\n      }\n",
      "      kiln_wgmma_commit();\n", "      kiln_fence_operands(d);\n",
      "      // The slot before this one is read by now: give it back to the producer.\n",
      "      kiln_wgmma_wait<1>();\n",
      "      if (kb > 0 && t == 0) kiln_mbar_arrive(empty + 8 * ((it - 1) % kStages));\n",
      "    }\n",
      c.pingpong ? "    // The other consumer's turn (when it has a next tile).\n"
                   "    if (tile + gridDim.x < tiles) kiln_named_arrive(4 - c, 256);\n"
                 : "",
      "    kiln_wgmma_wait<0>();\n", "    kiln_fence_operands(d);\n",
      "    if (t == 0) kiln_mbar_arrive(empty + 8 * ((it - 1) % kStages));\n", Epilogue(c),
      "  }\n  if (t == 0) kiln_bulk_wait();\n}\n");
}

}  // namespace

int GemmConfig::shared_bytes() const {
  return stages * (bm() + bn) * kGemmBlockK * 2 + consumers * out_cols() * 128 + 2 * 8 * stages +
         1024;
}

int GemmConfig::MostStages() const {
  GemmConfig c = *this;
  c.stages = 2;
  while (c.stages < 64) {
    ++c.stages;
    if (c.shared_bytes() > kMaxSharedBytes) return c.stages - 1;
  }
  return c.stages;
}

std::string GemmConfig::Name() const {
  std::string name =
      absl::StrCat("kiln_gemm_sm90_", dtype == DType::kFloat16 ? "f16" : "bf16", "_", bm(), "x", bn,
                   "_s", stages, pingpong ? "_pp" : "", bias ? "_bias" : "", geglu ? "_geglu" : "",
                   residual ? "_res" : "");
  if (epilogue.has_value()) {
    const std::string text = epilogue->ToString();
    if (text != GemmDefaultEpilogue(*this).ToString()) {
      absl::StrAppend(&name, absl::StrFormat("_ep%08x", Fnv1a(text)));
    }
  }
  return name;
}

std::vector<DType> GemmConfig::EpilogueInputTypes() const {
  const int accs = geglu ? 2 : 1;
  std::vector<DType> types(accs, DType::kFloat32);
  if (bias) types.insert(types.end(), accs, dtype);
  if (residual) types.push_back(dtype);
  return types;
}

kir::Program GemmConfig::Epilogue() const {
  return epilogue.has_value() ? *epilogue : GemmDefaultEpilogue(*this);
}

kir::Program GemmDefaultEpilogue(const GemmConfig& c) {
  kir::Program p(c.EpilogueInputTypes());
  const int accs = c.geglu ? 2 : 1;
  std::vector<int> acc;
  for (int i = 0; i < accs; ++i) {
    acc.push_back(p.Load(i));
    if (c.bias) acc[i] = p.Apply(OpId::kAdd, {acc[i], p.Load(accs + i)}, {}, DType::kFloat32);
  }
  int y = acc[0];
  if (c.geglu) {
    OpAttrs tanh;
    tanh.approximate = GeluApprox::kTanh;
    const int gelu = p.Apply(OpId::kGelu, {acc[0]}, tanh, DType::kFloat32);
    y = p.Apply(OpId::kMul, {gelu, acc[1]}, {}, DType::kFloat32);
  }
  if (c.residual) {
    y = p.Apply(OpId::kAdd, {y, p.Load(accs * (c.bias ? 2 : 1))}, {}, DType::kFloat32);
  }
  p.Store(y, c.dtype);
  return p;
}

std::string RenderGemmSource(const GemmConfig& c) {
  KILN_CHECK((c.dtype == DType::kBFloat16 || c.dtype == DType::kFloat16) && c.bn >= 64 &&
                 c.bn <= 256 && c.bn % 64 == 0 && c.consumers >= 1 && c.consumers <= 2 &&
                 c.stages >= 2 && c.shared_bytes() <= kMaxSharedBytes &&
                 (!c.geglu || c.bn % 128 == 0) && (!c.pingpong || c.consumers == 2),
             "sm_90 GEMM kernel: needs bf16 or f16, 64 <= bn <= 256 in steps of 64, 1 or 2 ",
             "consumer warpgroups, >= 2 stages, at most ", kMaxSharedBytes,
             " bytes of shared memory, for GeGLU bn 128 or 256, for ping-pong 2 consumers; got ",
             DTypeName(c.dtype), ", bn ", c.bn, c.geglu ? " (GeGLU)" : "",
             c.pingpong ? " (ping-pong)" : "", ", ", c.consumers, " consumers, ", c.stages,
             " stages (", c.shared_bytes(), " bytes)");
  const kir::Program ep = c.Epilogue();
  KILN_CHECK(ep.input_types() == c.EpilogueInputTypes() && ep.num_outputs() == 1 &&
                 ep.output_types()[0] == c.dtype && !ep.scalar_param(),
             "sm_90 GEMM kernel ", c.Name(), ": the epilogue program must read ",
             c.EpilogueInputTypes().size(), " inputs (the accumulator", c.geglu ? "s" : "",
             c.bias ? ", the bias" : "", c.residual ? ", the residual" : "", ") and store one ",
             DTypeName(c.dtype), " output with literal scalars; got\n", ep.ToString());
  return absl::StrCat(KernelPrelude(), HopperPrimitivesSource(), WgmmaWrapper(c), TileOrder(),
                      Kernel(c));
}

}  // namespace kiln::cuda_ops
