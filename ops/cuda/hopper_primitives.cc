// The Hopper primitives' source and the wgmma wrappers (see hopper_primitives.h).
#include "ops/cuda/hopper_primitives.h"

#include "absl/strings/str_cat.h"

namespace kiln::cuda_ops {
namespace {

constexpr char kHopperPrimitives[] = R"(
// CUDA's CUtensorMap (runtime/tensor_map.h encodes it on the host).
struct alignas(64) KilnTensorMap { unsigned long long opaque[16]; };
__device__ __forceinline__ unsigned kiln_smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void kiln_mbar_init(unsigned bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(arrivals) : "memory");
}
// One arrival that also expects `bytes` of asynchronous copies to complete on the barrier.
__device__ __forceinline__ void kiln_mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void kiln_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
// Waits until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void kiln_mbar_wait(unsigned bar, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
// TMA: the box at element (x: column, y: row) of `map` into shared memory at `dst`, completing
// its bytes on `bar`. Elements outside the tensor arrive as zeros.
__device__ __forceinline__ void kiln_tma_load_2d(unsigned dst, const KilnTensorMap* map,
                                                 unsigned bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];"
      :: "r"(dst), "l"((unsigned long long)map), "r"(bar), "r"(x), "r"(y) : "memory");
}
// wgmma's shared-memory matrix descriptor of K-major rows of 128 bytes with the 128-byte swizzle
// (TMA's layout): 8-row groups 1024 bytes apart. +2 steps 16 elements along K.
__device__ __forceinline__ unsigned long long kiln_wgmma_desc(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ void kiln_wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void kiln_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending> __device__ __forceinline__ void kiln_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across wgmma's asynchronous use.
template <int kN> __device__ __forceinline__ void kiln_fence_operands(float (&d)[kN]) {
  #pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
// Two floats rounded into one 32-bit word of two 16-bit values, `lo` at the lower address.
__device__ __forceinline__ unsigned kiln_pack_bf16x2(float lo, float hi) {
  unsigned v; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(hi), "f"(lo)); return v;
}
__device__ __forceinline__ unsigned kiln_pack_f16x2(float lo, float hi) {
  unsigned v; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(hi), "f"(lo)); return v;
}
// Element e (0: the lower address) of two 16-bit values in one 32-bit word.
__device__ __forceinline__ kiln_u16 kiln_half(unsigned v, int e) {
  return (kiln_u16)(e ? v >> 16 : v & 0xffffu);
}
__device__ __forceinline__ void kiln_st_shared_u32(unsigned addr, unsigned v) {
  asm volatile("st.shared.u32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned kiln_ld_shared_u32(unsigned addr) {
  unsigned v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
// Makes this thread's shared-memory writes visible to the async proxy (a TMA store's reads).
__device__ __forceinline__ void kiln_fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// A barrier of `threads` threads under id `id` (1..15; 0 is __syncthreads').
__device__ __forceinline__ void kiln_named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
// This thread's arrival at barrier `id` without waiting (the waiters use kiln_named_barrier).
__device__ __forceinline__ void kiln_named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
// TMA: shared memory at `src` into the box at element (x: column, y: row) of `map`; elements
// outside the tensor are not written. Tracked by the bulk-group functions below.
__device__ __forceinline__ void kiln_tma_store_2d(const KilnTensorMap* map, unsigned src, int x,
                                                  int y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :: "l"((unsigned long long)map), "r"(src), "r"(x), "r"(y) : "memory");
}
__device__ __forceinline__ void kiln_bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Waits until this thread's committed TMA stores have read their shared memory.
__device__ __forceinline__ void kiln_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// Waits until they have completed.
__device__ __forceinline__ void kiln_bulk_wait() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
// TMA: the box at element (x: column, y: row, z, w) of a rank-4 `map` (runtime/tensor_map.h
// TensorMap4D: z the head, w the batch) into shared memory at `dst`, completing on `bar`.
__device__ __forceinline__ void kiln_tma_load_4d(unsigned dst, const KilnTensorMap* map,
                                                 unsigned bar, int x, int y, int z, int w) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];"
      :: "r"(dst), "l"((unsigned long long)map), "r"(bar), "r"(x), "r"(y), "r"(z), "r"(w)
      : "memory");
}
// The descriptor of an MN-major operand (B of d = a·b with b's N contiguous: attention's V) in
// rows of 128 bytes with the 128-byte swizzle: one row per k, 64 N-elements; 8-row groups along k
// 1024 bytes apart, further 64-element column blocks `lbo` bytes apart. +128 steps 16 rows (k16).
__device__ __forceinline__ unsigned long long kiln_wgmma_desc_mn(unsigned addr, unsigned lbo) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
         (64ull << 32) | (1ull << 62);
}
)";

}  // namespace

const char* HopperPrimitivesSource() { return kHopperPrimitives; }

std::string RenderWgmma(const std::string& name, int n, DType dtype, WgmmaOperands operands) {
  const int regs = n / 2;
  const char* type = dtype == DType::kFloat16 ? "f16" : "bf16";
  std::string list, constraints;
  for (int i = 0; i < regs; ++i) {
    absl::StrAppend(&list, i ? ", " : "", "%", i);
    absl::StrAppend(&constraints, i ? ", " : "", "\"+f\"(d[", i, "])");
  }
  // Operand numbers after the accumulators: a (one descriptor or four registers), b, accumulate.
  const int a_count = operands.a_in_registers ? 4 : 1;
  std::string a_list, a_param, a_inputs;
  if (operands.a_in_registers) {
    a_list = absl::StrCat("{%", regs, ", %", regs + 1, ", %", regs + 2, ", %", regs + 3, "}");
    a_param = "const unsigned (&a)[4]";
    a_inputs = "\"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3])";
  } else {
    a_list = absl::StrCat("%", regs);
    a_param = "unsigned long long da";
    a_inputs = "\"l\"(da)";
  }
  const int b = regs + a_count, accumulate = b + 1;
  // imm-scale-a, imm-scale-b, then imm-trans-a (descriptor A only) and imm-trans-b.
  const std::string flags =
      absl::StrCat(operands.a_in_registers ? "" : ", 0", ", ", operands.b_mn_major ? 1 : 0);
  return absl::StrCat("__device__ __forceinline__ void ", name, "(float (&d)[", regs, "], ",
                      a_param, ", unsigned long long dw, int accumulate) {\n",
                      "  asm volatile(\"{\\n .reg .pred p;\\n setp.ne.b32 p, %", accumulate,
                      ", 0;\\n\"\n", "               \" wgmma.mma_async.sync.aligned.m64n", n,
                      "k16.f32.", type, ".", type, " {", list, "}, ", a_list, ", %", b, ", p, 1, 1",
                      flags, ";\\n}\\n\"\n", "               : ", constraints,
                      "\n               : ", a_inputs, ", \"l\"(dw), \"r\"(accumulate));\n}\n");
}

}  // namespace kiln::cuda_ops
