// CUDA layer tests. Without a GPU: every generated elementwise kernel variant and the fused
// softmax kernels over their layouts compile with NVRTC (to PTX, no device needed), and the
// kernel cache rejects corrupt files. With a GPU (skipped
// otherwise, required on the GPU machine via KILN_REQUIRE_GPU=1): allocator statistics, the
// out-of-memory error, copies, and the disk cache round trip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "codegen/families/pointwise/elementwise_cuda.h"
#include "codegen/families/softmax/fused_softmax_cuda.h"
#include "ops/cuda/cublaslt_lib.h"
#include "ops/cuda/device_timing.h"
#include "ops/cuda/kernel_render.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "profiler/profiler.h"
#include "runtime/cuda_api.h"
#include "runtime/nvrtc.h"
#include "runtime/settings.h"
#include "runtime/startup.h"
#include "runtime/status.h"
#include "runtime/tensor_map.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

std::vector<DType> InputTypes(const OpDef& def, DType t) {
  std::vector<DType> in(def.min_inputs, t);
  if (def.id == OpId::kWhere) in[0] = DType::kBool;
  if (def.id == OpId::kMaskedFill) in[1] = DType::kBool;
  return in;
}

TEST(NvrtcCodegen, EveryElementwiseVariantCompiles) {
  int compiled = 0;
  for (int i = 0; i < kNumOps; ++i) {
    const OpDef& def = GetOpDef(static_cast<OpId>(i));
    if (!def.is_elementwise()) continue;
    for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kInt64}) {
      OpAttrs attrs;
      attrs.approximate = GeluApprox::kTanh;
      attrs.dtype = t;
      const std::string name = absl::StrCat("kiln_", def.name, "_", DTypeName(t));
      const std::string src = cuda_ops::RenderElementwiseSource(
          name, cuda_ops::RowProgram(def, InputTypes(def, t), t, attrs));
      auto ptx = cuda::CompileSource(src, name, "compute_90", /*cubin=*/false);
      ASSERT_TRUE(ptx.ok()) << ptx.status().message();
      EXPECT_NE(ptx->find(name + "_contig"), std::string::npos);
      EXPECT_NE(ptx->find(name + "_small"), std::string::npos);
      EXPECT_NE(ptx->find(name + "_rows"), std::string::npos);
      EXPECT_NE(ptx->find(name + "_strided"), std::string::npos);
      EXPECT_NE(ptx->find(name + "_stridedv"), std::string::npos);
      ++compiled;
    }
  }
  EXPECT_GT(compiled, 80);
}

// Integer instructions read an integral scalar as a long long and a fractional one as a double
// (int == 2.5 is false, as torch says): eager rows through the iscalar/dscalar parameters, fused
// kernels through literals. The sources compile.
TEST(NvrtcCodegen, IntegerComparisonsWithFractionalScalars) {
  OpAttrs half, two;
  half.scalar = 2.5;
  two.scalar = 2;
  const OpDef& eq = GetOpDef(OpId::kEqScalar);
  const std::string frac = cuda_ops::RenderElementwiseSource(
      "kiln_eq_frac", cuda_ops::RowProgram(eq, {DType::kInt64}, DType::kBool, half));
  const std::string whole = cuda_ops::RenderElementwiseSource(
      "kiln_eq_whole", cuda_ops::RowProgram(eq, {DType::kInt64}, DType::kBool, two));
  EXPECT_NE(frac.find("== dscalar"), std::string::npos) << frac;
  EXPECT_NE(whole.find("== iscalar"), std::string::npos) << whole;
  kir::Program fused({DType::kInt32});
  fused.Store(fused.Apply(OpId::kLtScalar, {fused.Load(0)}, half, DType::kBool), DType::kBool);
  const std::string lit = cuda_ops::RenderElementwiseSource("kiln_lt_frac", fused);
  EXPECT_NE(lit.find("< 2.5"), std::string::npos) << lit;
  for (const auto& [name, src] :
       {std::pair{"kiln_eq_frac", frac}, std::pair{"kiln_eq_whole", whole},
        std::pair{"kiln_lt_frac", lit}}) {
    auto ptx = cuda::CompileSource(src, name, "compute_90", /*cubin=*/false);
    EXPECT_TRUE(ptx.ok()) << name << ": " << ptx.status().message();
  }
}

// Prologue programs of the fused softmax tests: attention's scale and mask (bf16 scores, bool
// mask), a mixed-dtype add, a cast, a where over three inputs.
std::vector<kir::Program> SoftmaxPrologues() {
  std::vector<kir::Program> out;
  OpAttrs scale, fill, cast;
  scale.scalar = 0.125;
  fill.scalar = -INFINITY;
  cast.dtype = DType::kBFloat16;
  kir::Program attention({DType::kBFloat16, DType::kBool});
  const int s = attention.Apply(OpId::kMulScalar, {attention.Load(0)}, scale, DType::kBFloat16);
  attention.Store(
      attention.Apply(OpId::kMaskedFill, {s, attention.Load(1)}, fill, DType::kBFloat16),
      DType::kFloat32);
  out.push_back(attention);
  kir::Program add({DType::kFloat32, DType::kFloat16});
  add.Store(add.Apply(OpId::kAdd, {add.Load(0), add.Load(1)}, {}, DType::kFloat32),
            DType::kFloat32);
  out.push_back(add);
  kir::Program round({DType::kFloat32});
  round.Store(round.Apply(OpId::kCast, {round.Load(0)}, cast, DType::kBFloat16), DType::kFloat32);
  out.push_back(round);
  kir::Program where({DType::kFloat16, DType::kFloat16, DType::kBool});
  where.Store(
      where.Apply(OpId::kWhere, {where.Load(2), where.Load(0), where.Load(1)}, {}, DType::kFloat16),
      DType::kFloat32);
  out.push_back(where);
  return out;
}

// The fused softmax renderer over the layouts (sub-warp, warp, block, loop, run-time row
// length), both variants, and the dtype mixes of attention and of a trailing cast.
TEST(NvrtcCodegen, FusedSoftmaxVariantsCompile) {
  const DType outs[] = {DType::kBFloat16, DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  const std::vector<kir::Program> prologues = SoftmaxPrologues();
  int compiled = 0;
  for (size_t c = 0; c < prologues.size(); ++c) {
    for (int64_t n : {0, 1, 7, 33, 1024, 4099, 8192, 20000}) {
      const std::string name = absl::StrCat("kiln_fused_test_softmax_", compiled);
      const std::string src =
          cuda_ops::RenderFusedSoftmaxSource(name, prologues[c], outs[c], {.row_len = n});
      auto ptx = cuda::CompileSource(src, name, "compute_90", /*cubin=*/false);
      ASSERT_TRUE(ptx.ok()) << ptx.status().message();
      EXPECT_NE(ptx->find(name + "_strided"), std::string::npos);
      const bool vec =
          cuda_ops::FusedSoftmaxVectorWidth(prologues[c].input_types(), outs[c], n) > 0;
      EXPECT_EQ(ptx->find(name + "_vec") != std::string::npos, vec) << name << " row " << n;
      ++compiled;
    }
  }
  EXPECT_EQ(compiled, 32);
}

// The eager forms: one load, run-time row lengths up to a class's length (registers) or any
// (the loop kernel), softmax and log_softmax (the double sum), in every floating dtype.
TEST(NvrtcCodegen, EagerSoftmaxFormsCompile) {
  int compiled = 0;
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    kir::Program load({t});
    load.Store(load.Load(0), t);
    for (int64_t max_len : {0, 1, 16, 1024, 4096, 16384}) {
      for (bool log : {false, true}) {
        const std::string name = absl::StrCat("kiln_test_eager_softmax_", compiled);
        const cuda_ops::SoftmaxForm form{.row_len = 0, .max_row_len = max_len, .log = log};
        const std::string src = cuda_ops::RenderFusedSoftmaxSource(name, load, t, form);
        EXPECT_NE(src.find("const long long kN = row_len;"), std::string::npos) << name;
        const bool registers = max_len > 0 && cuda_ops::PlanSoftmaxRows(max_len, 1).iters > 0;
        if (registers) {  // the row in registers: the helper's log flag
          EXPECT_NE(src.find(absl::StrCat("kVec, ", log ? "true" : "false", ">(v)")),
                    std::string::npos)
              << name;
        } else {  // the loop kernel: log_softmax sums in double
          EXPECT_EQ(src.find("double sum = 0;") != std::string::npos, log) << name;
        }
        auto ptx = cuda::CompileSource(src, name, "compute_90", /*cubin=*/false);
        ASSERT_TRUE(ptx.ok()) << ptx.status().message();
        EXPECT_NE(ptx->find(name + "_strided"), std::string::npos);
        ++compiled;
      }
    }
  }
  EXPECT_EQ(compiled, 36);
  const cuda_ops::SoftmaxForm eager{.row_len = 0, .max_row_len = 2048};
  EXPECT_TRUE(eager.Holds(1025));
  EXPECT_TRUE(eager.Holds(2048));
  EXPECT_FALSE(eager.Holds(2049));
  EXPECT_EQ(eager.Describe(), "at most 2048 (read at run time)");
  EXPECT_TRUE(cuda_ops::SoftmaxForm{}.Holds(1 << 20));
  EXPECT_FALSE(cuda_ops::SoftmaxForm{.row_len = 7}.Holds(8));
}

TEST(NvrtcCodegen, FusedSoftmaxLayoutsKeepRowsInRegisters) {
  using cuda_ops::PlanSoftmaxRows;
  // Attention rows: 1024 bf16 in 8-wide loads, a warp per row, 4 loads (32 values) a lane.
  const cuda_ops::SoftmaxRowLayout attention = PlanSoftmaxRows(1024, 8);
  EXPECT_EQ(attention.group, 32);
  EXPECT_EQ(attention.iters, 4);
  EXPECT_EQ(attention.rows_per_block(), 4);
  EXPECT_EQ(PlanSoftmaxRows(1, 1).group, 1);  // 128 rows of one element a block
  EXPECT_EQ(PlanSoftmaxRows(1, 1).rows_per_block(), 128);
  EXPECT_EQ(PlanSoftmaxRows(7, 1).group, 8);
  EXPECT_EQ(PlanSoftmaxRows(33, 1).group, 32);
  EXPECT_EQ(PlanSoftmaxRows(33, 1).iters, 2);
  // 4099 elements one at a time: a block of 288 threads, 15 values each.
  EXPECT_EQ(PlanSoftmaxRows(4099, 1).threads, 288);
  EXPECT_EQ(PlanSoftmaxRows(4099, 1).group, 288);
  EXPECT_EQ(PlanSoftmaxRows(4099, 1).iters, 15);
  EXPECT_EQ(PlanSoftmaxRows(16384, 8).iters, 4);
  EXPECT_EQ(PlanSoftmaxRows(16384, 8).threads, 512);
  EXPECT_EQ(PlanSoftmaxRows(20000, 1).iters, 0);  // the loop kernel
  for (int64_t n = 1; n <= 20000; n += 97) {
    for (int vec : {1, 2, 4, 8}) {
      const cuda_ops::SoftmaxRowLayout l = PlanSoftmaxRows(n, vec);
      if (l.iters == 0) continue;
      EXPECT_GE(int64_t{l.group} * l.iters * vec, n) << n << " " << vec;  // the row fits
      EXPECT_LE(l.iters * vec, 32) << n << " " << vec;
      EXPECT_EQ(l.threads % l.group, 0) << n << " " << vec;
      EXPECT_LE(l.threads, 512);
    }
  }
}

TEST(NvrtcCodegen, CompileErrorCarriesNameAndLog) {
  auto r = cuda::CompileSource("extern \"C\" __global__ void k() { undefined_thing(); }",
                               "kiln_broken", "compute_90", false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("kiln_broken"), std::string::npos);
  EXPECT_NE(r.status().message().find("undefined_thing"), std::string::npos);
}

// Operand layouts that take the elementwise rows kernel (row strides, row broadcast, column
// broadcast, a mask over leading dims) or its fallbacks (unaligned rows, short rows), against
// the CPU kernels on the same values.
TEST(CudaElementwise, RowsPathLayoutsMatchCpu) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(11);
  struct Case {
    const char* name;
    std::function<Tensor(const std::vector<Tensor>&)> fn;
    std::vector<Shape> shapes;
    DType dtype;
  };
  const std::vector<Case> cases = {
      {"slices of a wider matrix (gelu*mul)",
       [](const std::vector<Tensor>& t) {
         return gelu(slice(t[0], 1, 0, 512), "tanh") * slice(t[0], 1, 512, 1024);
       },
       {{64, 1024}},
       DType::kBFloat16},
      {"bias over rows",
       [](const std::vector<Tensor>& t) { return t[0] + t[1]; },
       {{8, 4, 256}, {256}},
       DType::kFloat32},
      {"column broadcast",
       [](const std::vector<Tensor>& t) { return t[0] * t[1]; },
       {{64, 512}, {64, 1}},
       DType::kFloat16},
      {"mask over leading dims",
       [](const std::vector<Tensor>& t) {
         return masked_fill(t[0], cast(relu(t[1]), DType::kBool), -1.0);
       },
       {{2, 3, 64, 256}, {64, 256}},
       DType::kBFloat16},
      {"odd row start (unaligned)",
       [](const std::vector<Tensor>& t) { return slice(t[0], 1, 1, 513) * 2.0; },
       {{32, 520}},
       DType::kBFloat16},
      {"short rows",
       [](const std::vector<Tensor>& t) { return t[0] - t[1]; },
       {{512, 24}, {24}},
       DType::kFloat32},
      // The vectorised strided kernel: broadcasts over a middle dim (no row stride describes
      // them), as in a KV-cache blend where(onehot [T, 1], new [H, 1, D], cache [H, T, D]).
      {"cache blend (vectorised strided)",
       [](const std::vector<Tensor>& t) { return where(gt(t[0], 0.5), t[1], t[2]); },
       {{1, 1, 96, 1}, {2, 12, 1, 64}, {2, 12, 96, 64}},
       DType::kBFloat16},
      {"middle broadcast, float32",
       [](const std::vector<Tensor>& t) { return t[0] * t[1] + t[2]; },
       {{3, 1, 40}, {3, 7, 40}, {7, 1}},
       DType::kFloat32},
      {"middle broadcast, unaligned rows (strided fallback)",
       [](const std::vector<Tensor>& t) { return slice(t[0], 2, 1, 65) + t[1]; },
       {{4, 5, 72}, {4, 1, 64}},
       DType::kFloat16},
  };
  for (const Case& c : cases) {
    std::vector<Tensor> cpu, gpu;
    for (const Shape& s : c.shapes) {
      cpu.push_back(cast(randn(s, gen), c.dtype));
      gpu.push_back(to(cpu.back(), CUDA(0)));
    }
    ExpectClose(to_vector(c.fn(gpu)), to_vector(c.fn(cpu)), ToleranceFor(c.dtype), c.name);
  }
}

// Contiguous work of one block runs the straight-line _small kernel (one vector a thread, the
// scalar tail in one more thread), larger work the grid-stride _contig kernel: lengths around
// every edge (empty, one element, a partial vector, exactly 256 vectors, one past) give the CPU's
// bits, and the kernel that ran is the one the edge says.
TEST(CudaElementwise, SmallAndContigKernelsMeetAtOneBlock) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(12);
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    const int64_t vec = 16 / DTypeSize(t), edge = cuda_ops::kSmallKernelThreads * vec;
    for (int64_t n : {int64_t{0}, int64_t{1}, vec - 1, vec, vec + 1, int64_t{16}, edge - vec - 1,
                      edge - 1, edge, edge + 1, edge + vec, 3 * edge + 5}) {
      const Tensor a = cast(randn({n}, gen), t), b = cast(randn({n}, gen), t);
      const Tensor sum = add(to(a, CUDA(0)), to(b, CUDA(0)));
      const Tensor scaled = mul(to(a, CUDA(0)), 3.0);
      const std::string what = absl::StrCat(DTypeName(t), " n=", n);
      EXPECT_EQ(to_vector(sum), to_vector(add(a, b))) << what;
      EXPECT_EQ(to_vector(scaled), to_vector(mul(a, 3.0))) << what;
    }
  }
  auto kernel_of = [&gen](int64_t n) {
    const Tensor a = to(randn({n}, gen), CUDA(0));
    profiler::ProfilerOptions o;
    o.active = 1;
    profiler::Profiler p(std::move(o));
    p.Start();
    add(a, a);
    cuda::Synchronize();
    p.Step();
    const profiler::ProfileResult r = p.Stop();
    std::string name;
    for (const profiler::DeviceRecord& d : r.device) {
      if (d.kind == profiler::DeviceKind::kKernel) name = d.name;
    }
    return name;
  };
  const int64_t edge = cuda_ops::kSmallKernelThreads * 4;  // float32: 4 elements a vector
  EXPECT_EQ(kernel_of(16), "kiln_add_float32_float32_to_float32_small");
  EXPECT_EQ(kernel_of(edge), "kiln_add_float32_float32_to_float32_small");
  EXPECT_EQ(kernel_of(edge + 1), "kiln_add_float32_float32_to_float32_contig");
}

// Programmatic dependent launch (runtime/cuda.h LaunchDependent): a kernel launched as a dependent
// of a slow one (which lets dependents launch at its start) and reading after
// kiln_grid_dependency_sync() sees the slow kernel's write, made 2 ms after it started.
class CudaDependentLaunch : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_SKIP_WITHOUT_GPU();
    if (!cuda::DependentLaunchEnabled(0)) GTEST_SKIP() << "needs sm_90 or later and KILN_PDL on";
    // Both kernels fetched (and loaded) first: loading a module between the launches would wait.
    writer_ = Kernel("kiln_test_slow_writer");
    reader_ = Kernel("kiln_test_read_after");
  }

  // The slow writer adds 1 to `flag` 2 ms after it starts; the reader, launched right after it
  // through LaunchDependent (or, `programmatic`, always with the launch attribute), copies `flag`
  // to `out` after its wait.
  void LaunchPair(const Tensor& flag, const Tensor& out, bool programmatic = false) {
    void* flag_ptr = flag.data_ptr();
    void* out_ptr = out.data_ptr();
    long long ns = 2'000'000;  // 2 ms: far longer than a launch
    void* writer_args[] = {&flag_ptr, &ns};
    void* reader_args[] = {&flag_ptr, &out_ptr};
    KILN_CUDA_CHECK(
        cudaLaunchKernel(writer_, dim3(1), dim3(1), writer_args, 0, cuda::CurrentStream()));
    if (!programmatic) {
      KILN_CUDA_CHECK(
          cuda::LaunchDependent(reader_, dim3(1), dim3(1), reader_args, 0, cuda::CurrentStream()));
      return;
    }
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(1);
    config.blockDim = dim3(1);
    config.stream = cuda::CurrentStream();
    config.attrs = &attr;
    config.numAttrs = 1;
    KILN_CUDA_CHECK(cudaLaunchKernelExC(&config, reader_, reader_args));
  }

 private:
  const void* Kernel(const char* name) {
    const std::string src = std::string(cuda_ops::KernelPrelude()) + R"(
__device__ long long kiln_test_now() {
  long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
extern "C" __global__ void kiln_test_slow_writer(int* flag, long long ns) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const long long start = kiln_test_now();
  while (kiln_test_now() - start < ns) {}
  *(volatile int*)flag += 1;
}
extern "C" __global__ void kiln_test_read_after(const int* flag, int* out) {
  kiln_grid_dependency_sync();
  *out = *(volatile const int*)flag;
}
)";
    return reinterpret_cast<const void*>(ValueOrThrow(cuda::GetKernel(src, name)));
  }

  const void* writer_ = nullptr;
  const void* reader_ = nullptr;
};

TEST_F(CudaDependentLaunch, TheWaitOrdersTheDependentAfterItsPredecessor) {
  cuda::Stream stream;  // a created stream, as the compiled plans use
  const cuda::StreamGuard guard(stream.get());
  const Tensor flag = zeros({1}, DType::kInt32, CUDA(0));
  const Tensor out = full({1}, -1, DType::kInt32, CUDA(0));
  LaunchPair(flag, out);
  EXPECT_EQ(to_vector(out)[0], 1) << "the wait lets the reader see the earlier kernel's write";
}

// Captured into a CUDA graph as a programmatic edge (what KILN_PDL_GRAPHS=on makes of every
// dependent launch), every replay's reader sees that replay's write.
TEST_F(CudaDependentLaunch, TheWaitOrdersItInsideACudaGraphToo) {
  cuda::Stream stream;
  const cuda::StreamGuard guard(stream.get());
  const Tensor flag = zeros({1}, DType::kInt32, CUDA(0));
  const Tensor out = full({1}, -1, DType::kInt32, CUDA(0));
  cudaGraph_t graph = nullptr;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  LaunchPair(flag, out, /*programmatic=*/true);
  KILN_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
  cudaGraphExec_t exec = nullptr;
  KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 1; replay <= 3; ++replay) {
    KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
    EXPECT_EQ(to_vector(out)[0], replay) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Eager softmax and log_softmax run the softmax family's kernel (one implementation with the
// compiler's fused softmax): rows of every layout (sub-warp, warp, block, loop), lengths the
// 16-byte vectors do not divide, a non-last dim and a non-contiguous input, against the CPU
// kernels; two lengths of one class share a kernel compiled for the class.
TEST(CudaEagerSoftmax, RunsTheFamilyKernelOverRowClasses) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(21);
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int64_t n : {1, 7, 33, 1000, 1025, 2000, 4099, 8193, 16384, 16385, 20000}) {
      const Tensor cpu = cast(randn({3, n}, gen) * 4.0, t);
      const Tensor gpu = to(cpu, CUDA(0));
      for (bool log : {false, true}) {
        const std::string what =
            absl::StrCat(log ? "log_softmax " : "softmax ", DTypeName(t), " n=", n);
        auto op = [log](const Tensor& x, int64_t dim) {
          return log ? log_softmax(x, dim) : softmax(x, dim);
        };
        ExpectClose(to_vector(op(gpu, -1)), to_vector(op(cpu, -1)), ToleranceFor(t), what);
      }
    }
  }
  const Tensor cpu = cast(randn({5, 6, 40}, gen), DType::kBFloat16);
  const Tensor gpu = to(cpu, CUDA(0));
  ExpectClose(to_vector(softmax(gpu, 1)), to_vector(softmax(cpu, 1)),
              ToleranceFor(DType::kBFloat16), "dim 1");
  ExpectClose(to_vector(log_softmax(slice(gpu, 2, 1, 38), -1)),
              to_vector(log_softmax(slice(cpu, 2, 1, 38), -1)), ToleranceFor(DType::kBFloat16),
              "a slice (unaligned rows)");
  // The kernel is the family's, named by its class: 1100 and 2000 both run "_upto2048".
  std::vector<std::string> names;
  {
    profiler::ProfilerOptions o;
    o.active = 1;
    profiler::Profiler p(std::move(o));
    p.Start();
    for (int64_t n : {1100, 2000}) softmax(to(randn({2, n}, gen), CUDA(0)), -1);
    cuda::Synchronize();
    p.Step();
    const profiler::ProfileResult r = p.Stop();
    ASSERT_TRUE(r.device_available) << r.device_status;
    for (const profiler::DeviceRecord& d : r.device) {
      if (d.kind == profiler::DeviceKind::kKernel && d.name.find("softmax") != std::string::npos) {
        names.push_back(d.name);
      }
    }
  }
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0], "kiln_softmax_float32_upto2048_vec");
  EXPECT_EQ(names[1], names[0]);
}

TEST(CudaRuntime, CopiesRoundTripAndStatsMove) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(0);
  Tensor x = randn({1000}, gen);
  const size_t before = cuda::GetMemoryStats().allocated;
  Tensor d = to(x, CUDA(0));
  EXPECT_GE(cuda::GetMemoryStats().allocated, before + 4000);
  EXPECT_GE(cuda::GetMemoryStats().reserved, cuda::GetMemoryStats().allocated);
  EXPECT_EQ(to_vector(d), to_vector(x));
  EXPECT_EQ(to_vector(to(transpose(reshape(d, {10, 100}), 0, 1), kCPU)),
            to_vector(transpose(reshape(x, {10, 100}), 0, 1)));
}

// The allocator's host cache: a freed small block is handed to the next allocation of its size on
// its stream, never to another stream's, never to work being captured into a CUDA graph; a
// destroyed stream's blocks and EmptyCache() return what it holds to the pool.
TEST(CudaRuntime, SmallBlocksAreReusedOnTheirStreamOnly) {
  KILN_SKIP_WITHOUT_GPU();
  cuda::EmptyCache();
  EXPECT_EQ(cuda::GetMemoryStats().cached, 0u);
  const void* first = nullptr;
  {
    const Tensor t = empty({100}, DType::kFloat32, CUDA(0));
    first = t.data_ptr();
  }
  EXPECT_EQ(cuda::GetMemoryStats().cached, 512u) << "400 bytes round up to one 512-byte block";
  {
    const Tensor again = full({120}, 2.0, DType::kFloat32, CUDA(0));  // 480 bytes: the same block
    EXPECT_EQ(again.data_ptr(), first);
    EXPECT_EQ(cuda::GetMemoryStats().cached, 0u);
    EXPECT_EQ(to_vector(again), std::vector<double>(120, 2.0));
  }
  const size_t cached = cuda::GetMemoryStats().cached;
  {
    cuda::Stream other;
    {
      cuda::StreamGuard guard(other.get());
      const Tensor t = empty({100}, DType::kFloat32, CUDA(0));
      EXPECT_NE(t.data_ptr(), first) << "a block cached for the default stream went to another";
    }
    EXPECT_EQ(cuda::GetMemoryStats().cached, cached + 512);  // a block of each stream
  }
  EXPECT_EQ(cuda::GetMemoryStats().cached, cached) << "the destroyed stream's block went back";
  {
    cuda::Stream capture;
    cuda::StreamGuard guard(capture.get());
    const void* cached_on_capture = empty({100}, DType::kFloat32, CUDA(0)).data_ptr();
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(capture.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    {
      const Tensor in_graph = empty({100}, DType::kFloat32, CUDA(0));
      EXPECT_NE(in_graph.data_ptr(), cached_on_capture);
    }
    ASSERT_EQ(cudaStreamEndCapture(capture.get(), &graph), cudaSuccess);
    cudaGraphDestroy(graph);
    EXPECT_EQ(empty({100}, DType::kFloat32, CUDA(0)).data_ptr(), cached_on_capture)
        << "the capture left the cached block where it was";
  }
  cuda::EmptyCache();
  EXPECT_EQ(cuda::GetMemoryStats().cached, 0u);
}

// Large blocks are cached too, rounded up to 2 MiB: a freed one serves the next allocation of its
// rounded size on its stream. Past the large-block limit (an eighth of the device, at most 4 GiB)
// a freed block first sends the cached blocks of other sizes back to the pool.
TEST(CudaRuntime, LargeBlocksAreCachedBySizeUpToALimit) {
  KILN_SKIP_WITHOUT_GPU();
  constexpr int64_t kMiB = int64_t{1} << 20;
  auto bytes = [](int64_t n) { return empty({n / 4}, DType::kFloat32, CUDA(0)); };
  cuda::EmptyCache();
  const void* first = nullptr;
  {
    const Tensor t = bytes(3 * kMiB);
    first = t.data_ptr();
  }
  EXPECT_EQ(cuda::GetMemoryStats().cached, size_t(4 * kMiB)) << "3 MiB round up to 4";
  {
    const Tensor again = bytes(4 * kMiB - 1024);
    EXPECT_EQ(again.data_ptr(), first);
    EXPECT_EQ(cuda::GetMemoryStats().cached, 0u);
    const Tensor other = bytes(6 * kMiB);  // another size: a new block
    EXPECT_NE(other.data_ptr(), first);
  }
  EXPECT_EQ(cuda::GetMemoryStats().cached, size_t(10 * kMiB));
  cuda::EmptyCache();
  const int64_t limit =
      std::min<int64_t>(cuda::Props(0).total_memory / 8, int64_t{4} << 30) / (2 * kMiB) * 2 * kMiB;
  const int64_t a = limit / 2 / (2 * kMiB) * 2 * kMiB + 2 * kMiB, b = a + 2 * kMiB;
  {
    Tensor ta = bytes(a), tb = bytes(b);
    const void* pb = tb.data_ptr();
    ta = Tensor();
    EXPECT_EQ(cuda::GetMemoryStats().cached, size_t(a));
    tb = Tensor();  // a + b is over the limit: a's block goes back to the pool, b's stays
    EXPECT_EQ(cuda::GetMemoryStats().cached, size_t(b));
    EXPECT_EQ(bytes(b).data_ptr(), pb);
  }
  cuda::EmptyCache();
  EXPECT_EQ(cuda::GetMemoryStats().cached, 0u);
}

TEST(CudaRuntime, OutOfMemoryIsAnError) {
  KILN_SKIP_WITHOUT_GPU();
  try {
    empty({int64_t{1} << 46}, DType::kFloat32, CUDA(0));  // 256 TiB
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(to_vector(ones({2}, DType::kFloat32, CUDA(0))), (std::vector<double>{1, 1}));
}

// The process's resident memory in bytes (Linux /proc/self/statm), 0 when unknown.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  if (!(statm >> pages >> resident)) return 0;
  return resident * 4096;
}

// Factories fill on the device: a request larger than the GPU fails with the out-of-memory error
// before any host memory is staged (the CPU path once filled a host buffer of the full size).
TEST(CudaFactories, HugeRequestsFailWithoutStagingOnTheHost) {
  KILN_SKIP_WITHOUT_GPU();
  const int64_t before = ResidentBytes();
  for (const auto& make : std::vector<std::function<Tensor()>>{
           [] {
             return zeros({500'000'000'000 / 4 / 1000, 1000}, DType::kFloat32, CUDA(0));
           },
           [] {
             return full({500'000'000'000 / 2 / 1000, 1000}, 3.5, DType::kBFloat16, CUDA(0));
           },
           [] { return arange(0, 2e11, 1, DType::kFloat32, CUDA(0)); }}) {
    try {
      make();
      ADD_FAILURE() << "a 500 GB tensor was made";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), absl::StatusCode::kResourceExhausted) << e.what();
    }
  }
  EXPECT_LT(ResidentBytes() - before, int64_t{1} << 30) << "resident memory grew";
}

// full/zeros/ones/arange on CUDA write the CPU's bits for every dtype, on the current stream, and
// run inside a stream capture (no host staging, no synchronisation).
TEST(CudaFactories, MatchTheCpuBitForBitAndCapture) {
  KILN_SKIP_WITHOUT_GPU();
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kBool, DType::kInt32,
                  DType::kInt64}) {
    const double value = t == DType::kBool ? 1 : IsFloatingPoint(t) ? -0.1 : -7;
    const std::vector<std::pair<Tensor, Tensor>> pairs = {
        {full({3, 5}, value, t, CUDA(0)), full({3, 5}, value, t)},
        {zeros({7}, t, CUDA(0)), zeros({7}, t)},
        {ones({2, 2}, t, CUDA(0)), ones({2, 2}, t)},
        {arange(-3, 11, t == DType::kBool ? 1 : 0.7, t, CUDA(0)),
         arange(-3, 11, t == DType::kBool ? 1 : 0.7, t)},
        {full({1000}, -0.0, t, CUDA(0)), full({1000}, -0.0, t)}};
    for (const auto& [gpu, cpu] : pairs) {
      const Tensor back = to(gpu, kCPU);
      ASSERT_EQ(back.shape(), cpu.shape()) << DTypeName(t);
      EXPECT_EQ(std::memcmp(back.data_ptr(), cpu.data_ptr(), cpu.numel() * DTypeSize(t)), 0)
          << DTypeName(t) << ": " << back << " vs " << cpu;
    }
  }
  cuda::Stream stream;
  cuda::StreamGuard guard(stream.get());
  cudaGraph_t graph = nullptr;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  std::string error;
  try {
    const Tensor a = full({64}, 2.5, DType::kBFloat16, CUDA(0));
    const Tensor b = arange(64, DType::kInt64, CUDA(0));
    const Tensor c = zeros({64}, DType::kFloat32, CUDA(0));
  } catch (const Error& e) {
    error = e.what();
  }
  const cudaError_t end = cudaStreamEndCapture(stream.get(), &graph);
  EXPECT_EQ(error, "");
  EXPECT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  if (graph != nullptr) cudaGraphDestroy(graph);
}

// ---- TMA tensor maps: what TMA cannot address is refused before the driver is asked ----------

// `map` failed with InvalidArgument naming `rule`.
void ExpectRefused(const absl::StatusOr<cuda::TensorMap>& map, const std::string& rule) {
  ASSERT_FALSE(map.ok());
  EXPECT_EQ(map.status().code(), absl::StatusCode::kInvalidArgument) << map.status();
  EXPECT_NE(map.status().message().find(rule), std::string::npos) << map.status();
}

// Each copy of `ok` with one field broken (`broken`: the change and the rule it breaks) is
// refused by `encode` with that rule named.
template <typename Map, typename Encode>
void ExpectEachRefused(
    const Map& ok, Encode encode,
    const std::vector<std::pair<std::function<void(Map&)>, std::string>>& broken) {
  for (const auto& [change, rule] : broken) {
    Map t = ok;
    change(t);
    ExpectRefused(encode(t), rule);
  }
}

TEST(TensorMap, RefusesWhatTmaCannotAddress2D) {
  alignas(16) static char data[1 << 16];
  using M = cuda::TensorMap2D;
  const M ok{
      .base = data, .rows = 64, .cols = 64, .row_stride = 64, .box_rows = 64, .box_cols = 64};
  ExpectEachRefused<M>(ok, cuda::EncodeTensorMap2D,
                       {{[&](M& t) { t.base = data + 2; }, "aligned to 16 bytes"},
                        {[](M& t) { t.row_stride = 68; }, "multiple of 16 bytes"},  // 136 bytes
                        {[](M& t) { t.row_stride = 32; }, "at least cols"},  // shorter than a row
                        {[](M& t) { t.box_rows = 257; }, "box sides in 1..256"},
                        {[](M& t) { t.box_cols = 32; }, "128 bytes"},  // 64 with the swizzle
                        {[](M& t) { t.rows = 0; }, "1..2^32 rows"}});
}

TEST(TensorMap, RefusesWhatTmaCannotAddress4D) {
  alignas(16) static char data[1 << 16];
  using M = cuda::TensorMap4D;
  // [2, 4, 16, 64] with a [B, T, H, D] tensor's strides, viewed as [B, H, T, D].
  const M ok{.base = data,
             .batch = 2,
             .heads = 4,
             .rows = 16,
             .cols = 64,
             .batch_stride = 16 * 4 * 64,
             .head_stride = 64,
             .row_stride = 4 * 64,
             .box_rows = 16,
             .box_cols = 64};
  ExpectEachRefused<M>(
      ok, cuda::EncodeTensorMap4D,
      {{[&](M& t) { t.base = data + 8; }, "aligned to 16 bytes"},
       {[](M& t) { t.head_stride = 4; }, "multiples of 16 bytes"},   // 8 bytes between heads
       {[](M& t) { t.batch_stride = 0; }, "multiples of 16 bytes"},  // TMA has no zero stride
       {[](M& t) { t.box_cols = 128; }, "of 128 bytes"},             // 256-byte rows
       {[](M& t) { t.box_rows = 0; }, "box rows in 1..256"},
       {[](M& t) { t.heads = 0; }, "every size in 1..2^32"}});
}

// The strides of size-1 dims are never used, so any value passes the checks (on a GPU the driver
// encodes the map; without one the encoder is unavailable, not the map refused).
TEST(TensorMap, IgnoresTheStridesOfSize1Dims) {
  alignas(16) static char host[1 << 16];
  // The driver encodes device addresses: a GPU's allocation where there is one.
  const Tensor buffer = GpuPresent() ? empty({16, 64}, DType::kBFloat16, CUDA(0)) : Tensor();
  struct Case {
    int64_t batch, heads, rows, batch_stride, head_stride, row_stride;
  };
  const Case cases[] = {
      {1, 1, 16, 0, 3, 64},  // one (batch, head): their strides are anything
      {1, 2, 1, 0, 64, 0},   // one key, its row stride 0 (an expanded view)
      {2, 1, 1, 64, 1, 1},   // one key and one head, strides of 1 element
  };
  for (const Case& c : cases) {
    const cuda::TensorMap4D t{.base = buffer.defined() ? buffer.data_ptr() : host,
                              .batch = c.batch,
                              .heads = c.heads,
                              .rows = c.rows,
                              .cols = 64,
                              .batch_stride = c.batch_stride,
                              .head_stride = c.head_stride,
                              .row_stride = c.row_stride,
                              .box_rows = 16,
                              .box_cols = 64};
    const absl::StatusOr<cuda::TensorMap> map = cuda::EncodeTensorMap4D(t);
    if (GpuPresent()) {
      EXPECT_TRUE(map.ok()) << map.status();
    } else if (!map.ok()) {
      EXPECT_NE(map.status().code(), absl::StatusCode::kInvalidArgument) << map.status();
    }
  }
}

// cuBLASLt is loaded at the first GEMM, not linked (ops/cuda/cublaslt_lib.h): the library of the
// toolkit kiln was built with loads and has every entry point kiln calls, without a GPU too.
TEST(CublasLt, LoadsWithEveryEntryPointAtFirstUse) {
  const cuda_ops::CublasLtLib& lt = cuda_ops::CublasLt();
  for (const void* f :
       {reinterpret_cast<const void*>(lt.Create), reinterpret_cast<const void*>(lt.GetVersion),
        reinterpret_cast<const void*>(lt.GetStatusName),
        reinterpret_cast<const void*>(lt.GetStatusString), reinterpret_cast<const void*>(lt.Matmul),
        reinterpret_cast<const void*>(lt.MatmulDescCreate),
        reinterpret_cast<const void*>(lt.MatmulDescDestroy),
        reinterpret_cast<const void*>(lt.MatmulDescSetAttribute),
        reinterpret_cast<const void*>(lt.MatrixLayoutCreate),
        reinterpret_cast<const void*>(lt.MatrixLayoutDestroy),
        reinterpret_cast<const void*>(lt.MatrixLayoutSetAttribute),
        reinterpret_cast<const void*>(lt.MatmulPreferenceCreate),
        reinterpret_cast<const void*>(lt.MatmulPreferenceDestroy),
        reinterpret_cast<const void*>(lt.MatmulPreferenceSetAttribute),
        reinterpret_cast<const void*>(lt.MatmulAlgoGetHeuristic)}) {
    EXPECT_NE(f, nullptr);
  }
  EXPECT_EQ(lt.GetVersion() / 10000, CUBLAS_VER_MAJOR);  // the major version kiln was built with
  EXPECT_STREQ(lt.GetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
}

TEST(KernelCache, DetectsTruncatedAndCorruptFiles) {
  const std::string dir = cuda::KernelCacheDir();
  if (dir.empty()) GTEST_SKIP() << "disk cache disabled: no writable cache directory";
  const uint64_t key = cuda::Fnv1a("kiln cache test key");
  const std::string payload(1000, 'x');
  cuda::WriteCacheFile(key, payload);
  std::string got;
  ASSERT_TRUE(cuda::ReadCacheFile(key, &got));
  EXPECT_EQ(got, payload);
  const std::string path = absl::StrCat(dir, "/", absl::Hex(key, absl::kZeroPad16), ".cubin");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(500);
    f.put('y');  // corrupt one payload byte: the checksum must catch it
  }
  EXPECT_FALSE(cuda::ReadCacheFile(key, &got));
  cuda::WriteCacheFile(key, payload);
  std::filesystem::resize_file(path, 300);  // truncated
  EXPECT_FALSE(cuda::ReadCacheFile(key, &got));
  std::filesystem::remove(path);
  EXPECT_FALSE(cuda::ReadCacheFile(key, &got));
}

// Per-shape decisions outlive the process in the cache directory: stored values (any text) come
// back under their own key only; a damaged file, another key with the same file, or KILN_RETIME=on
// (the ctest entry decisions_retimed) read as "none stored".
TEST(KernelCache, DecisionsComeBackUnderTheirKeyUnlessRetimed) {
  const std::string dir = cuda::KernelCacheDir();
  if (dir.empty()) GTEST_SKIP() << "disk cache disabled: no writable cache directory";
  const bool retime = EnvBool("KILN_RETIME");
  const std::string key = absl::StrCat("test|gemv [1x768x768 bf16]|GPU driver 1|", getpid());
  cuda_ops::StoreDecision(key, "split\nepilogue choice: 1.0 us vs 2.0 us");
  const std::optional<std::string> got = cuda_ops::LoadDecision(key);
  if (retime) {
    EXPECT_FALSE(got.has_value()) << "KILN_RETIME=on reads no stored decision";
  } else {
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, "split\nepilogue choice: 1.0 us vs 2.0 us");
  }
  EXPECT_FALSE(cuda_ops::LoadDecision(key + " other").has_value());
  const std::string path =
      absl::StrCat(dir, "/", absl::Hex(cuda::Fnv1a(key), absl::kZeroPad16), ".decision");
  ASSERT_TRUE(std::filesystem::exists(path)) << "stored even when retiming";
  // A file whose recorded key differs (a hash collision, an older format) is not this decision.
  cuda::WriteCacheFile(cuda::Fnv1a(key), "kiln decision v1\nanother key\ngemv", ".decision");
  EXPECT_FALSE(cuda_ops::LoadDecision(key).has_value());
  std::filesystem::resize_file(path, 10);  // damaged
  EXPECT_FALSE(cuda_ops::LoadDecision(key).has_value());
  std::filesystem::remove(path);
  EXPECT_FALSE(cuda_ops::LoadDecision(key).has_value());
}

// A source no cache has: GetKernelOrCompileInBackground returns no kernel and compiles it on a
// background thread (once, however often asked); a GetKernel meanwhile waits for that compile;
// once it is done the kernel comes back loaded, and a source NVRTC rejects reports its error.
TEST(KernelCache, BackgroundCompileServesLaterCallsAndWaiters) {
  KILN_SKIP_WITHOUT_GPU();
  // A source unique to this process, so that neither cache has it.
  const std::string name = "kiln_bg_test";
  const std::string src = absl::StrCat(
      "// ", getpid(), " ", std::chrono::steady_clock::now().time_since_epoch().count(),
      "\nextern \"C\" __global__ void ", name, "(float* x) { x[threadIdx.x] += 1.0f; }\n");
  const cuda::KernelCacheStats before = cuda::GetKernelCacheStats();
  auto first = cuda::GetKernelOrCompileInBackground(src, name);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(*first, nullptr) << "nothing cached: no kernel yet";
  auto again = cuda::GetKernelOrCompileInBackground(src, name);
  ASSERT_TRUE(again.ok()) << again.status().message();
  auto waited = cuda::GetKernel(src, name);  // waits for the running compile
  ASSERT_TRUE(waited.ok()) << waited.status().message();
  ASSERT_NE(*waited, nullptr);
  auto later = cuda::GetKernelOrCompileInBackground(src, name);
  ASSERT_TRUE(later.ok()) << later.status().message();
  EXPECT_EQ(*later, *waited);
  const cuda::KernelCacheStats after = cuda::GetKernelCacheStats();
  EXPECT_EQ(after.background_compiles - before.background_compiles, 1) << "compiled once";
  EXPECT_EQ(after.compiles, before.compiles) << "the waiter compiled it again";
  EXPECT_GT(after.background_ms, before.background_ms);
  const Tensor x = zeros({32}, DType::kFloat32, CUDA(0));
  void* px = x.data_ptr();
  void* args[] = {&px};
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(*later), dim3(1), dim3(32), args,
                                   0, cuda::CurrentStream()));
  EXPECT_EQ(to_vector(x), std::vector<double>(32, 1.0));

  const std::string bad = absl::StrCat("// ", getpid(), "\nextern \"C\" __global__ void ", name,
                                       "_bad() { undeclared_name = 1; }\n");
  auto bad_first = cuda::GetKernelOrCompileInBackground(bad, name + "_bad");
  ASSERT_TRUE(bad_first.ok());
  EXPECT_EQ(*bad_first, nullptr);
  cuda::WaitForBackgroundJobs();
  auto bad_later = cuda::GetKernelOrCompileInBackground(bad, name + "_bad");
  ASSERT_FALSE(bad_later.ok());
  EXPECT_NE(std::string(bad_later.status().message()).find("undeclared_name"), std::string::npos)
      << bad_later.status().message();
}

// Run by the ctest entry kernel_cache_unwritable_dir with KILN_CACHE_DIR=/proc/kiln-cache (a
// directory nobody can create, root included): the disk cache turns itself off and kernels
// still compile; skipped in the ordinary run, whose cache directory is writable.
TEST(KernelCache, UnwritableDirectoryTurnsTheDiskCacheOff) {
  const char* env = std::getenv("KILN_CACHE_DIR");
  if (env == nullptr || std::string(env) != "/proc/kiln-cache") {
    GTEST_SKIP() << "runs under the kernel_cache_unwritable_dir ctest entry";
  }
  EXPECT_EQ(cuda::KernelCacheDir(), "");
  const uint64_t key = cuda::Fnv1a("kiln unwritable cache test");
  cuda::WriteCacheFile(key, "payload");  // silently skipped
  std::string got;
  EXPECT_FALSE(cuda::ReadCacheFile(key, &got));
  OpAttrs one;
  one.scalar = 1;
  const std::string src = cuda_ops::RenderElementwiseSource(
      "kiln_cache_off",
      cuda_ops::RowProgram(GetOpDef(OpId::kAddScalar), {DType::kFloat32}, DType::kFloat32, one));
  auto ptx = cuda::CompileSource(src, "kiln_cache_off", "compute_90", /*cubin=*/false);
  ASSERT_TRUE(ptx.ok()) << ptx.status().message();
  if (cuda::IsAvailable()) {  // the whole path: compile, load, no disk
    EXPECT_TRUE(cuda::GetKernel(src, "kiln_cache_off_contig").ok());
  }
}

}  // namespace
}  // namespace kiln
