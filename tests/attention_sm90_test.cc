// The attention family's Hopper kernel (codegen/families/attention/flash_attention_sm90_source.h):
// every configuration compiles for sm_90a with NVRTC without spilling (no GPU needed), names say
// what each instance is, configurations outside the ranges are refused; on an sm_90 GPU, random
// shapes (ragged lengths, causal with Lq != Lk, grouped-query heads, [B, T, H, D] views, head dims
// 64 and 128, bf16 and f16, every tiling) against float32 math and against the mma.sync kernel, the
// kernel the profiler sees, and the fallbacks (a mask, KILN_FLASH_SM90=off).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "codegen/compile.h"
#include "codegen/families/attention/flash_attention_sm90_source.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "profiler/profiler.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "runtime/status.h"
#include "tests/kernel_test_util.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

using cuda_ops::FlashSm90Config;

// The planner's instance of every form (one, two or three consumer warpgroups), with the other
// tile width at two stages, with another share of exponentials on the FMA pipe, and the
// persistent forms without turns and (causal) with the fixed schedule: every instance the
// planner or the A/B settings of the plan produce (three consumers at head dim 128 have the
// registers for 64-key tiles only).
std::vector<FlashSm90Config> AllConfigs() {
  std::vector<FlashSm90Config> all;
  for (int d : {64, 128}) {
    for (DType t : {DType::kBFloat16, DType::kFloat16}) {
      for (bool causal : {false, true}) {
        for (const char* consumers : {"1", "2", "3"}) {
          ScopedEnv w("KILN_FLASH_SM90_CONSUMERS", consumers);
          const FlashSm90Config c = cuda_ops::PlanFlashSm90(d, t, causal, 1024);
          all.push_back(c);
          FlashSm90Config split = c;  // 3 of 8 exponentials on the FMA pipe
          split.exp2_on_fma = c.exp2_on_fma == 3 ? 8 : 3;
          all.push_back(split);
          if (c.consumers != 3 || d != 128) {
            FlashSm90Config other = c;  // the other tile width, two stages
            other.block_n = c.block_n == 64 ? 128 : 64;
            other.stages = 2;
            all.push_back(other);
          }
          if (c.consumers > 1) {
            FlashSm90Config unordered = c;
            unordered.pingpong = false;
            all.push_back(unordered);
          }
          if (c.dynamic) {  // causal persistent forms: the fixed schedule too
            FlashSm90Config fixed = c;
            fixed.dynamic = false;
            all.push_back(fixed);
          }
        }
      }
    }
  }
  return all;
}

TEST(FlashSm90Source, EveryConfigCompilesForSm90aWithoutSpills) {
  KILN_SKIP_WITHOUT_NVRTC();
  for (const FlashSm90Config& c : AllConfigs()) {
    std::string log;
    auto cubin = CompileForReport(cuda_ops::RenderFlashSm90Source(c), c.Name(), "sm_90a", &log);
    ASSERT_TRUE(cubin.ok()) << c.Name() << ": " << cubin.status().message().substr(0, 4000);
    EXPECT_EQ(SpillBytes(log), 0) << c.Name() << ":\n" << log;
    EXPECT_NE(log.find(c.Name()), std::string::npos) << log;
  }
}

TEST(FlashSm90Source, NamesSayWhatEachInstanceIs) {
  std::set<std::string> names;
  for (const FlashSm90Config& c : AllConfigs()) EXPECT_TRUE(names.insert(c.Name()).second);
  const FlashSm90Config c = cuda_ops::PlanFlashSm90(64, DType::kBFloat16, true, 1024);
  EXPECT_EQ(c.Name(), "kiln_flash_sm90_d64_bf16_causal_64x64_s2_b3");
  EXPECT_EQ(cuda_ops::PlanFlashSm90(128, DType::kFloat16, false, 1024).Name(),
            "kiln_flash_sm90_d128_f16_128x128_s3_persistent");
  EXPECT_EQ(cuda_ops::PlanFlashSm90(64, DType::kBFloat16, false, 1024).Name(),
            "kiln_flash_sm90_d64_bf16_192x128_s4_persistent");
  EXPECT_EQ(cuda_ops::PlanFlashSm90(128, DType::kBFloat16, true, 1024).Name(),
            "kiln_flash_sm90_d128_bf16_causal_128x128_s3_persistent_dynamic");
  // Causal at head dim 64: one-warpgroup CTAs under 2048 keys, three consumers from there.
  EXPECT_EQ(cuda_ops::PlanFlashSm90(64, DType::kBFloat16, true, 2047).Name(),
            "kiln_flash_sm90_d64_bf16_causal_64x64_s2_b3");
  EXPECT_EQ(cuda_ops::PlanFlashSm90(64, DType::kBFloat16, true, 2048).Name(),
            "kiln_flash_sm90_d64_bf16_causal_192x128_s4_persistent_dynamic");
}

TEST(FlashSm90Source, RefusesConfigsOutsideItsRanges) {
  FlashSm90Config c;
  c.head_dim = 96;
  ExpectThrowsWith([&] { cuda_ops::RenderFlashSm90Source(c); }, "head dim 64 or 128");
  c = FlashSm90Config{};
  c.dtype = DType::kFloat32;
  ExpectThrowsWith([&] { cuda_ops::RenderFlashSm90Source(c); }, "bf16 or f16");
  c = FlashSm90Config{};
  c.head_dim = 128;
  c.stages = 8;  // 8 x 64 KB of K/V
  ExpectThrowsWith([&] { cuda_ops::RenderFlashSm90Source(c); }, "bytes of shared memory");
  c = FlashSm90Config{};
  c.stages = 1;  // tile j's K would wait for tile j-1's V to leave the one slot: a deadlock
  ExpectThrowsWith([&] { cuda_ops::RenderFlashSm90Source(c); }, "2..8 stages");
  for (int keys : {48, 72, 272}) {  // wgmma and the softmax take 64..256 keys by 16
    c = FlashSm90Config{};
    c.block_n = keys;
    ExpectThrowsWith([&] { cuda_ops::RenderFlashSm90Source(c); }, "64..256 keys");
  }
  c = FlashSm90Config{};
  c.consumers = 4;
  ExpectThrowsWith([&] { cuda_ops::RenderFlashSm90Source(c); }, "1..3 consumer warpgroups");
  c = FlashSm90Config{};
  c.exp2_on_fma = 9;
  ExpectThrowsWith([&] { cuda_ops::RenderFlashSm90Source(c); }, "0..8 of 8 exponentials");
  c = FlashSm90Config{};
  c.dynamic = true;  // one consumer: CTAs are not persistent, nothing to schedule
  ExpectThrowsWith([&] { cuda_ops::RenderFlashSm90Source(c); }, "2..3 for the dynamic schedule");
}

TEST(FlashSm90Source, TheAbSettingsChangeThePlan) {
  ScopedEnv n("KILN_FLASH_SM90_BLOCK_N", "64"), s("KILN_FLASH_SM90_STAGES", "4"),
      w("KILN_FLASH_SM90_CONSUMERS", "2");
  const FlashSm90Config c = cuda_ops::PlanFlashSm90(64, DType::kBFloat16, false, 1024);
  EXPECT_EQ(c.block_n, 64);
  EXPECT_EQ(c.stages, 4);
  EXPECT_EQ(c.consumers, 2);
  EXPECT_EQ(c.Name(), "kiln_flash_sm90_d64_bf16_128x64_s4_persistent");
  ScopedEnv pp("KILN_FLASH_SM90_PINGPONG", "off");
  EXPECT_EQ(cuda_ops::PlanFlashSm90(64, DType::kBFloat16, false, 1024).Name(),
            "kiln_flash_sm90_d64_bf16_128x64_s4_persistent_unordered");
  ScopedEnv e("KILN_FLASH_SM90_EXP2_FMA", "5");
  EXPECT_EQ(cuda_ops::PlanFlashSm90(64, DType::kBFloat16, false, 1024).Name(),
            "kiln_flash_sm90_d64_bf16_128x64_s4_persistent_unordered_fma5");
  {  // the schedule is dynamic for causal work only, unless the setting is off
    EXPECT_TRUE(cuda_ops::PlanFlashSm90(64, DType::kBFloat16, true, 1024).dynamic);
    ScopedEnv dynamic_off("KILN_FLASH_SM90_DYNAMIC", "off");
    EXPECT_FALSE(cuda_ops::PlanFlashSm90(64, DType::kBFloat16, true, 1024).dynamic);
  }
  EXPECT_FALSE(cuda_ops::PlanFlashSm90(64, DType::kBFloat16, false, 1024).dynamic);
  ScopedEnv bad("KILN_FLASH_SM90_EXP2_FMA", "9");
  ExpectThrowsWith([] { cuda_ops::PlanFlashSm90(64, DType::kBFloat16, false, 1024); }, "-1..8");
}

// ---- on an sm_90 GPU -------------------------------------------------------------------------

bool OnSm90() {
  if (!GpuPresent()) return false;
  const cuda::DeviceProps& p = cuda::Props(0);
  return p.major == 9 && p.minor == 0;
}

#define SKIP_WITHOUT_SM90()                                         \
  do {                                                              \
    KILN_SKIP_WITHOUT_GPU();                                        \
    if (!OnSm90()) GTEST_SKIP() << "the kernel needs an sm_90 GPU"; \
  } while (0)

bool Ran(const std::vector<std::string>& names, const std::string& prefix) {
  for (const std::string& n : names) {
    if (n.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

Tensor RandnOn(const std::vector<int64_t>& shape, DType dtype, Generator& gen) {
  return to(cast(randn(shape, gen, DType::kFloat32), dtype), CUDA(0));
}

Tolerance Loose(DType t) {  // bf16 rounds P to 8 bits before the second product
  return t == DType::kBFloat16 ? Tolerance{2e-2, 2e-2} : Tolerance{4e-3, 4e-3};
}

struct Shape {
  int64_t b, hq, hkv, lq, lk, d;
  bool causal, bthd;
  DType dtype;
  std::string Name() const {
    return absl::StrCat("q [", b, ",", hq, ",", lq, ",", d, "] k [", b, ",", hkv, ",", lk, ",", d,
                        "]", causal ? " causal" : "", bthd ? " bthd" : "", " ", DTypeName(dtype));
  }
};

// q, k, v of the shape ([B, T, H, D] storage viewed as [B, H, T, D] when bthd).
std::vector<Tensor> Operands(const Shape& s, Generator& gen) {
  auto make = [&](int64_t h, int64_t l) {
    if (!s.bthd) return RandnOn({s.b, h, l, s.d}, s.dtype, gen);
    return transpose(RandnOn({s.b, l, h, s.d}, s.dtype, gen), 1, 2);
  };
  return {make(s.hq, s.lq), make(s.hkv, s.lk), make(s.hkv, s.lk)};
}

Tensor Sdpa(const std::vector<Tensor>& in, const Shape& s) {
  return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), s.causal, std::nullopt,
                                      s.hq != s.hkv);
}

Tensor Float32Math(const std::vector<Tensor>& in, const Shape& s) {
  SdpaBackendGuard g(SdpaBackend::kMath);
  return scaled_dot_product_attention(cast(in[0], DType::kFloat32), cast(in[1], DType::kFloat32),
                                      cast(in[2], DType::kFloat32), Tensor(), s.causal,
                                      std::nullopt, s.hq != s.hkv);
}

// Random shapes: lengths 5..3000 drawn log-uniformly (most not multiples of 64 or 128), causal
// with Lq != Lk both ways, GQA, views; each against float32 math, and the mma.sync kernel's result
// on the same inputs (KILN_FLASH_SM90=off) within the same tolerance.
TEST(FlashSm90, RandomShapesMatchFloat32MathAndTheMmaSyncKernel) {
  SKIP_WITHOUT_SM90();
  Generator gen(90);
  auto length = [&] {
    return std::max<int64_t>(5, std::llround(std::exp(gen.Uniform() * std::log(3000.0))));
  };
  for (int i = 0; i < 24; ++i) {
    Shape s;
    s.b = 1 + static_cast<int64_t>(gen.Uniform() * 2);
    s.hkv = 1 + static_cast<int64_t>(gen.Uniform() * 2);
    s.hq = s.hkv * (i % 3 == 0 ? 2 : 1);
    s.lq = length();
    s.lk = i % 4 == 0 ? s.lq : length();
    s.d = i % 2 == 0 ? 64 : 128;
    s.causal = i % 3 != 1;
    s.bthd = i % 5 == 2;
    s.dtype = i % 4 < 2 ? DType::kBFloat16 : DType::kFloat16;
    const std::vector<Tensor> in = Operands(s, gen);
    Tensor out;
    const std::vector<std::string> names = KernelNames([&] { out = Sdpa(in, s); });
    EXPECT_TRUE(Ran(names, "kiln_flash_sm90_")) << s.Name();
    Tensor mma;
    {
      ScopedEnv off("KILN_FLASH_SM90", "off");
      mma = Sdpa(in, s);
    }
    const std::vector<double> got = to_vector(out);
    ExpectClose(got, to_vector(Float32Math(in, s)), Loose(s.dtype), s.Name() + " vs float32");
    ExpectClose(got, to_vector(mma), Loose(s.dtype), s.Name() + " vs mma.sync");
    if (::testing::Test::HasFailure()) break;  // one shape's report
  }
}

// Every tiling the A/B settings select computes the same as the plan's: every form (one, two or
// three consumer warpgroups; two without turns), three tile widths, 2 and 3 stages; causal with
// Lq < Lk and Lq > Lk.
TEST(FlashSm90, EveryTilingMatchesFloat32Math) {
  SKIP_WITHOUT_SM90();
  Generator gen(91);
  for (const char* consumers : {"1", "2", "2u", "3"}) {  // 2u: two consumers without turns
    for (const char* block_n : {"64", "128", "176"}) {
      for (const char* stages : {"2", "3"}) {
        for (int64_t d : {64, 128}) {
          const bool turns = std::string(consumers) != "2u";
          const FlashSm90Config c{.head_dim = static_cast<int>(d),
                                  .block_n = std::atoi(block_n),
                                  .stages = std::atoi(stages),
                                  .consumers = std::atoi(consumers),
                                  .pingpong = turns};
          if (c.shared_bytes() > 227 * 1024) continue;
          const std::string n_consumers = absl::StrCat(c.consumers);
          ScopedEnv w("KILN_FLASH_SM90_CONSUMERS", n_consumers.c_str()),
              n("KILN_FLASH_SM90_BLOCK_N", block_n), st("KILN_FLASH_SM90_STAGES", stages),
              pp("KILN_FLASH_SM90_PINGPONG", turns ? "on" : "off");
          for (const auto& [lq, lk] : {std::pair<int64_t, int64_t>{333, 517}, {700, 300}}) {
            const Shape s{2, 2, 1, lq, lk, d, true, false, DType::kBFloat16};
            const std::vector<Tensor> in = Operands(s, gen);
            ExpectClose(to_vector(Sdpa(in, s)), to_vector(Float32Math(in, s)), Loose(s.dtype),
                        absl::StrCat(s.Name(), " ", c.Name()));
          }
        }
      }
    }
  }
}

// Any share of the exponentials on the FMA pipe (the polynomial) matches float32 math, every form
// and both dtypes, ragged and causal; a NaN in q or k still gives NaN rows, as ex2 and torch do.
TEST(FlashSm90, ExponentialsOnTheFmaPipeMatchFloat32Math) {
  SKIP_WITHOUT_SM90();
  Generator gen(95);
  for (const char* share : {"1", "3", "8"}) {
    ScopedEnv e("KILN_FLASH_SM90_EXP2_FMA", share);
    for (const char* consumers : {"1", "2", "3"}) {
      ScopedEnv w("KILN_FLASH_SM90_CONSUMERS", consumers);
      for (int64_t d : {64, 128}) {
        for (bool causal : {false, true}) {
          for (DType t : {DType::kBFloat16, DType::kFloat16}) {
            const Shape s{1, 2, 2, 300, 333, d, causal, false, t};
            const std::vector<Tensor> in = Operands(s, gen);
            Tensor out;
            const std::vector<std::string> names = KernelNames([&] { out = Sdpa(in, s); });
            const std::string name = absl::StrCat("_fma", share);
            EXPECT_TRUE(std::any_of(names.begin(), names.end(), [&](const std::string& n) {
              return n.find(name) != std::string::npos;
            })) << s.Name();
            ExpectClose(to_vector(out), to_vector(Float32Math(in, s)), Loose(s.dtype),
                        absl::StrCat(s.Name(), " consumers ", consumers, " fma ", share));
          }
        }
      }
    }
  }
  // NaN in row 7 of q: that row's output is NaN and no other's; NaN in key 3 poisons every row
  // that sees it (non-causal: all of them).
  ScopedEnv e("KILN_FLASH_SM90_EXP2_FMA", "8");
  const Shape s{1, 1, 1, 64, 64, 64, false, false, DType::kBFloat16};
  std::vector<Tensor> in = Operands(s, gen);
  std::vector<double> q = to_vector(in[0]);
  q[7 * 64 + 5] = NAN;
  in[0] = from_vector(q, in[0].shape(), DType::kBFloat16, CUDA(0));
  std::vector<double> got = to_vector(Sdpa(in, s));
  for (int64_t r = 0; r < 64; ++r) EXPECT_EQ(std::isnan(got[r * 64]), r == 7) << "row " << r;
  std::vector<double> k = to_vector(in[1]);
  k[3 * 64] = NAN;
  in[0] = Operands(s, gen)[0];
  in[1] = from_vector(k, in[1].shape(), DType::kBFloat16, CUDA(0));
  got = to_vector(Sdpa(in, s));
  for (int64_t r = 0; r < 64; ++r) EXPECT_TRUE(std::isnan(got[r * 64])) << "row " << r;
}

// Lengths at and around the tile edges, down to one key, run the Hopper kernel (the launcher
// takes every TMA-addressable operand) and match float32 math.
TEST(FlashSm90, EdgeLengthsRunTheHopperKernelAndMatchFloat32Math) {
  SKIP_WITHOUT_SM90();
  Generator gen(94);
  for (int64_t d : {64, 128}) {
    for (int64_t lk : {1, 2, 63, 64, 65, 128, 129}) {
      for (int64_t lq : {5, 64, 129}) {
        for (bool causal : {false, true}) {
          const Shape s{1, 2, 2, lq, lk, d, causal, false, DType::kBFloat16};
          const std::vector<Tensor> in = Operands(s, gen);
          Tensor out;
          const std::vector<std::string> names = KernelNames([&] { out = Sdpa(in, s); });
          EXPECT_TRUE(Ran(names, "kiln_flash_sm90_")) << s.Name();
          ExpectClose(to_vector(out), to_vector(Float32Math(in, s)), Loose(s.dtype), s.Name());
        }
      }
    }
  }
}

// Scales of any sign: zero, negative (the per-element path, whose max needs no positive scale),
// large (logits far apart: the running max moves).
TEST(FlashSm90, ScalesOfAnySignMatchFloat32Math) {
  SKIP_WITHOUT_SM90();
  Generator gen(92);
  const Shape s{1, 2, 2, 200, 300, 64, false, false, DType::kBFloat16};
  const std::vector<Tensor> in = Operands(s, gen);
  for (double scale : {0.0, -0.125, 4.0}) {
    const Tensor out =
        scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), false, scale, false);
    SdpaBackendGuard g(SdpaBackend::kMath);
    const Tensor want =
        scaled_dot_product_attention(cast(in[0], DType::kFloat32), cast(in[1], DType::kFloat32),
                                     cast(in[2], DType::kFloat32), Tensor(), false, scale, false);
    ExpectClose(to_vector(out), to_vector(want), Loose(s.dtype), absl::StrCat("scale ", scale));
  }
}

// Causal work on the persistent forms takes its items from a counter (the dynamic schedule):
// with far more items than SMs, each is computed exactly once. The output's memory is filled with
// NaN first (the allocator hands the block back), so an item never computed shows; the result
// equals the fixed schedule's within a bf16 rounding and float32 math within the usual tolerance;
// the counter is zeroed for every launch, replays of a captured CUDA graph included (an
// unzeroed counter would leave each replay's items undone, holding the previous call's values).
TEST(FlashSm90, DynamicScheduleComputesEveryItemOnce) {
  SKIP_WITHOUT_SM90();
  Generator gen(95);
  const Tolerance one_rounding{1e-6, 8e-3};
  auto poisoned = [](const Shape& s, const std::function<Tensor()>& run) {
    { Tensor nan = full({s.b, s.hq, s.lq, s.d}, NAN, s.dtype, CUDA(0)); }
    return run();
  };
  for (const char* consumers : {"2", "3"}) {
    ScopedEnv w("KILN_FLASH_SM90_CONSUMERS", consumers);
    for (int64_t d : {64, 128}) {
      for (const auto& [lq, lk] :
           {std::pair<int64_t, int64_t>{1100, 1100}, {900, 1500}, {1500, 700}}) {
        const Shape s{2, 16, 8, lq, lk, d, true, false, DType::kBFloat16};
        const std::vector<Tensor> in = Operands(s, gen);
        const std::string what = absl::StrCat(s.Name(), " consumers ", consumers);
        // (The plan, not CUPTI, says which kernel runs: this test also runs under
        // compute-sanitizer, where CUPTI records nothing.)
        ASSERT_TRUE(cuda_ops::PlanFlashSm90(static_cast<int>(d), s.dtype, true, s.lk).dynamic)
            << what;
        const Tensor dynamic = poisoned(s, [&] { return Sdpa(in, s); });
        Tensor fixed;
        {
          ScopedEnv off("KILN_FLASH_SM90_DYNAMIC", "off");
          fixed = poisoned(s, [&] { return Sdpa(in, s); });
        }
        const std::vector<double> got = to_vector(dynamic);
        ExpectClose(got, to_vector(fixed), one_rounding, what + " vs the fixed schedule");
        ExpectClose(got, to_vector(Float32Math(in, s)), Loose(s.dtype), what + " vs float32");
        ExpectClose(to_vector(poisoned(s, [&] { return Sdpa(in, s); })), got, one_rounding,
                    what + " again");
        if (::testing::Test::HasFailure()) return;  // one shape's report
      }
    }
  }
  const Shape s{2, 16, 16, 1000, 1000, 128, true, false, DType::kBFloat16};
  CompileOptions o;
  o.mode = CompileOptions::Mode::kCompiled;
  o.cuda_graphs = true;
  auto fn = [&](const std::vector<Tensor>& t) { return std::vector<Tensor>{Sdpa(t, s)}; };
  CompiledFn f = compile(fn, Operands(s, gen), o);
  for (int call = 0; call < 4; ++call) {  // call 0 captures, the rest replay
    const std::vector<Tensor> in = Operands(s, gen);
    ExpectClose(to_vector(f(in)[0]), to_vector(Sdpa(in, s)), one_rounding,
                absl::StrCat("compiled + CUDA graph, call ", call));
  }
  EXPECT_EQ(f.report(Operands(s, gen)).cuda_graph.rfind("on: ", 0), 0u);
}

// A mask, or the setting off, runs the mma.sync kernel instead.
TEST(FlashSm90, MasksAndTheSettingFallBackToTheMmaSyncKernel) {
  SKIP_WITHOUT_SM90();
  Generator gen(93);
  const Shape s{1, 2, 2, 100, 100, 64, false, false, DType::kBFloat16};
  const std::vector<Tensor> in = Operands(s, gen);
  const Tensor mask = to(full({100, 100}, 1.0, DType::kBool), CUDA(0));
  std::vector<std::string> names = KernelNames(
      [&] { scaled_dot_product_attention(in[0], in[1], in[2], mask, false, std::nullopt, false); });
  EXPECT_FALSE(Ran(names, "kiln_flash_sm90_"));
  EXPECT_TRUE(Ran(names, "kiln_flash_attention_"));
  ScopedEnv off("KILN_FLASH_SM90", "off");
  names = KernelNames([&] { Sdpa(in, s); });
  EXPECT_FALSE(Ran(names, "kiln_flash_sm90_"));
  EXPECT_TRUE(Ran(names, "kiln_flash_attention_"));
}

}  // namespace
}  // namespace kiln
