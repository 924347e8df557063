// scaled_dot_product_attention: conformance of every backend against the independent double
// reference (tests/attention_reference.h), table-driven over shapes (lengths 1 and
// non-multiples of the kernel's tiles, head dims 64/128 and odd ones, rank 2..4, [B, T, H, D]
// views), causal or not, bool and additive masks (broadcast, fully masked rows), grouped-query
// heads, custom scales, and float32/float16/bfloat16; the backend choice and its guard (threads
// too), bad input, tracing and compiling, the profiler range; and every variant of the flash
// kernel compiled by NVRTC (no GPU needed); a GPU sweep of random shapes (lengths 1..4096, GQA,
// masks) against float32 math. The CUDA cases skip without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "codegen/compile.h"
#include "codegen/families/attention/flash_attention_cuda.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/tracer.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "profiler/profiler.h"
#include "runtime/build_config.h"
#include "runtime/nvrtc.h"
#include "runtime/status.h"
#include "tests/attention_reference.h"
#include "tests/test_util.h"
#if KILN_WITH_CUDA
#include "tools/flash_attention/fa_lib.h"
#endif

namespace kiln {
namespace {

using Dims = std::vector<int64_t>;

enum class MaskKind { kNone, kBool, kBoolFullRows, kAdditive, kAdditiveInfRows, kAdditiveQDType };

struct SdpaCase {
  std::string name;
  Dims q, k, v;
  MaskKind mask = MaskKind::kNone;
  Dims mask_shape;  // broadcast to [..., L, S]
  bool causal = false;
  bool gqa = false;
  bool bthd = false;  // q/k/v built as [B, T, H, D] and viewed as [B, H, T, D]
  std::optional<double> scale;
};

const std::vector<SdpaCase>& Cases() {
  using M = MaskKind;
  static const auto* cases = new std::vector<SdpaCase>{
      {"basic_d64", {2, 3, 37, 64}, {2, 3, 45, 64}, {2, 3, 45, 64}},
      {"causal_square", {1, 2, 70, 64}, {1, 2, 70, 64}, {1, 2, 70, 64}, M::kNone, {}, true},
      {"causal_more_queries", {1, 2, 50, 64}, {1, 2, 20, 64}, {1, 2, 20, 64}, M::kNone, {}, true},
      {"causal_more_keys", {1, 2, 20, 64}, {1, 2, 83, 64}, {1, 2, 83, 64}, M::kNone, {}, true},
      {"one_query", {2, 2, 1, 64}, {2, 2, 33, 64}, {2, 2, 33, 64}},
      {"one_key", {2, 2, 9, 64}, {2, 2, 1, 64}, {2, 2, 1, 64}, M::kNone, {}, true},
      {"d128_ragged", {1, 2, 65, 128}, {1, 2, 129, 128}, {1, 2, 129, 128}},
      {"d128_causal", {2, 1, 130, 128}, {2, 1, 130, 128}, {2, 1, 130, 128}, M::kNone, {}, true},
      {"odd_head_dims", {1, 2, 10, 40}, {1, 2, 12, 40}, {1, 2, 12, 24}},
      {"rank3", {3, 17, 64}, {3, 23, 64}, {3, 23, 64}},
      {"rank2", {17, 64}, {23, 64}, {23, 64}, M::kNone, {}, true},
      {"gqa", {1, 6, 19, 64}, {1, 2, 25, 64}, {1, 2, 25, 64}, M::kNone, {}, false, true},
      {"gqa_causal_d128",
       {2, 4, 33, 128},
       {2, 1, 33, 128},
       {2, 1, 33, 128},
       M::kNone,
       {},
       true,
       true},
      {"bool_mask_2d", {2, 2, 21, 64}, {2, 2, 67, 64}, {2, 2, 67, 64}, M::kBool, {21, 67}},
      {"bool_mask_full_rows",
       {2, 2, 21, 64},
       {2, 2, 30, 64},
       {2, 2, 30, 64},
       M::kBoolFullRows,
       {2, 1, 21, 30}},
      {"key_padding_mask", {2, 3, 12, 64}, {2, 3, 70, 64}, {2, 3, 70, 64}, M::kBool, {2, 1, 1, 70}},
      {"additive_mask",
       {1, 3, 17, 128},
       {1, 3, 40, 128},
       {1, 3, 40, 128},
       M::kAdditive,
       {1, 3, 17, 40}},
      {"additive_inf_rows",
       {2, 2, 16, 64},
       {2, 2, 72, 64},
       {2, 2, 72, 64},
       M::kAdditiveInfRows,
       {2, 2, 16, 72}},
      {"additive_q_dtype",
       {1, 2, 11, 64},
       {1, 2, 13, 64},
       {1, 2, 13, 64},
       M::kAdditiveQDType,
       {11, 13}},
      {"additive_column", {1, 2, 11, 64}, {1, 2, 13, 64}, {1, 2, 13, 64}, M::kAdditive, {11, 1}},
      {"mask_gqa",
       {1, 4, 9, 64},
       {1, 2, 77, 64},
       {1, 2, 77, 64},
       M::kBool,
       {1, 4, 9, 77},
       false,
       true},
      {"bthd_view",
       {2, 3, 29, 64},
       {2, 3, 31, 64},
       {2, 3, 31, 64},
       M::kNone,
       {},
       true,
       false,
       true},
      {"bthd_view_d128",
       {1, 2, 40, 128},
       {1, 2, 40, 128},
       {1, 2, 40, 128},
       M::kNone,
       {},
       false,
       false,
       true},
      {"custom_scale",
       {1, 2, 15, 64},
       {1, 2, 26, 64},
       {1, 2, 26, 64},
       M::kNone,
       {},
       false,
       false,
       false,
       0.3},
      {"negative_scale",
       {1, 2, 15, 64},
       {1, 2, 26, 64},
       {1, 2, 26, 64},
       M::kNone,
       {},
       true,
       false,
       false,
       -0.2},
      {"no_keys", {1, 2, 5, 64}, {1, 2, 0, 64}, {1, 2, 0, 64}},
  };
  return *cases;
}

// ---- inputs ----------------------------------------------------------------------------------

Tensor Randn(const Dims& shape, DType dtype, Generator& gen) {
  return cast(randn(shape, gen, DType::kFloat32), dtype);
}

// [B, H, T, D] as a transposed view of a [B, T, H, D] tensor.
Tensor BthdView(const Dims& bhtd, DType dtype, Generator& gen) {
  return transpose(Randn({bhtd[0], bhtd[2], bhtd[1], bhtd[3]}, dtype, gen), 1, 2);
}

Tensor MakeMask(const SdpaCase& c, DType q_dtype, Generator& gen) {
  if (c.mask == MaskKind::kNone) return {};
  const Dims& s = c.mask_shape;
  std::vector<double> vals(NumElements(s));
  const int64_t cols = s.back(), rows = vals.size() / std::max<int64_t>(cols, 1);
  for (int64_t r = 0; r < rows; ++r) {
    const bool full_row =
        (c.mask == MaskKind::kBoolFullRows || c.mask == MaskKind::kAdditiveInfRows) && r % 5 == 2;
    for (int64_t j = 0; j < cols; ++j) {
      double& v = vals[r * cols + j];
      if (c.mask == MaskKind::kBool || c.mask == MaskKind::kBoolFullRows) {
        v = !full_row && gen.Uniform() < 0.7;
      } else {
        v = full_row || gen.Uniform() < 0.1 ? -INFINITY : gen.Normal();
        if (c.mask == MaskKind::kAdditive || c.mask == MaskKind::kAdditiveQDType) v = gen.Normal();
      }
    }
  }
  const bool is_bool = c.mask == MaskKind::kBool || c.mask == MaskKind::kBoolFullRows;
  const DType t = is_bool                               ? DType::kBool
                  : c.mask == MaskKind::kAdditiveQDType ? q_dtype
                                                        : DType::kFloat32;
  return from_vector(vals, s, t);
}

struct Operands {
  Tensor q, k, v, mask;
};

Operands MakeOperands(const SdpaCase& c, DType dtype, Device device, uint64_t seed) {
  Generator gen(seed);
  Operands o;
  if (c.bthd) {
    o.q = BthdView(c.q, dtype, gen), o.k = BthdView(c.k, dtype, gen),
    o.v = BthdView(c.v, dtype, gen);
  } else {
    o.q = Randn(c.q, dtype, gen), o.k = Randn(c.k, dtype, gen), o.v = Randn(c.v, dtype, gen);
  }
  o.mask = MakeMask(c, dtype, gen);
  auto move = [&](const Tensor& t) {
    if (!t.defined() || device.is_cpu()) return t;
    // keep the [B, T, H, D] layout of views on the device
    return c.bthd && t.dim() == 4 ? transpose(to(transpose(t, 1, 2), device), 1, 2) : to(t, device);
  };
  o.q = move(o.q), o.k = move(o.k), o.v = move(o.v), o.mask = move(o.mask);
  return o;
}

ref::RefTensor Ref(const Tensor& t) {
  return {Dims(t.shape().begin(), t.shape().end()), to_vector(t)};
}

ref::RefTensor Expected(const SdpaCase& c, const Operands& o) {
  const ref::RefTensor mask = o.mask.defined() ? Ref(o.mask) : ref::RefTensor{};
  ref::SdpaRefArgs a;
  a.mask = o.mask.defined() ? &mask : nullptr;
  a.mask_is_bool = o.mask.defined() && o.mask.dtype() == DType::kBool;
  a.causal = c.causal;
  a.scale = c.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.q.back())));
  return ref::Sdpa(Ref(o.q), Ref(o.k), Ref(o.v), a);
}

Tensor RunSdpa(const SdpaCase& c, const Operands& o) {
  return scaled_dot_product_attention(o.q, o.k, o.v, o.mask, c.causal, c.scale, c.gqa);
}

// bf16 math rounds the scores and the probabilities to 8 bits before the second matmul.
Tolerance AttentionTolerance(DType t) {
  if (t == DType::kBFloat16) return {2e-2, 2e-2};
  if (t == DType::kFloat16) return {4e-3, 4e-3};
  return {2e-5, 2e-5};
}

// ---- conformance -----------------------------------------------------------------------------

struct Param {
  size_t case_index;
  DType dtype;
  Device device;
  SdpaBackend backend;
};

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return absl::StrCat(Cases()[p.case_index].name, "_", DTypeName(p.dtype), "_",
                      SdpaBackendName(p.backend));
}

class SdpaConformance : public ::testing::TestWithParam<Param> {};

TEST_P(SdpaConformance, MatchesReference) {
  const Param& p = GetParam();
  if (p.device.is_cuda()) KILN_SKIP_WITHOUT_GPU();
  const SdpaCase& c = Cases()[p.case_index];
  const Operands o = MakeOperands(c, p.dtype, p.device, 77 + p.case_index);
  SdpaBackendGuard guard(p.backend);
  if (p.backend == SdpaBackend::kFlash) {
    // Only where flash applies; elsewhere the guard must refuse with the reason.
    const SdpaBackendChoice auto_choice = [&] {
      SdpaBackendGuard a(SdpaBackend::kAuto);
      return sdpa_backend_choice(o.q, o.k, o.v, o.mask, c.causal, c.scale, c.gqa);
    }();
    if (auto_choice.backend != SdpaBackend::kFlash) {
      try {
        RunSdpa(c, o);
        FAIL() << "flash guard ran inputs flash does not support: " << auto_choice.reason;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), absl::StatusCode::kUnimplemented) << e.what();
        EXPECT_NE(std::string(e.what()).find("flash backend was selected"), std::string::npos);
      }
      return;
    }
  }
  const Tensor out = RunSdpa(c, o);
  const ref::RefTensor want = Expected(c, o);
  ASSERT_EQ(Dims(out.shape().begin(), out.shape().end()), want.shape);
  EXPECT_EQ(out.dtype(), p.dtype);
  EXPECT_EQ(out.device(), p.device);
  ExpectClose(to_vector(out), want.v, AttentionTolerance(p.dtype), c.name);
}

std::vector<Param> AllParams(Device device) {
  std::vector<Param> out;
  const SdpaBackend backends[] = {SdpaBackend::kAuto, SdpaBackend::kMath, SdpaBackend::kFlash};
  for (size_t i = 0; i < Cases().size(); ++i) {
    for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (SdpaBackend b : backends) out.push_back({i, t, device, b});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cpu, SdpaConformance, ::testing::ValuesIn(AllParams(kCPU)), ParamName);
INSTANTIATE_TEST_SUITE_P(Cuda, SdpaConformance, ::testing::ValuesIn(AllParams(CUDA(0))), ParamName);

// Flash on the series' shape and on long ragged sequences (GPU only): the kernel's many tiles.
TEST(SdpaFlash, LongSequencesMatchMath) {
  KILN_SKIP_WITHOUT_GPU();
  struct Long {
    Dims q, k;
    bool causal;
  };
  for (const Long& l : {Long{{1, 2, 1024, 64}, {1, 2, 1024, 64}, true},
                        Long{{1, 2, 1000, 128}, {1, 2, 1337, 128}, false},
                        Long{{1, 1, 2049, 64}, {1, 1, 2049, 64}, true},
                        // Decode: one or a few new rows against a long cache (split-key kernels).
                        Long{{8, 12, 1, 64}, {8, 12, 1024, 64}, false},
                        Long{{1, 12, 1, 64}, {1, 12, 1024, 64}, false},
                        Long{{2, 4, 3, 128}, {2, 4, 4000, 128}, false},
                        Long{{2, 4, 4, 128}, {2, 4, 77, 128}, true}}) {
    Generator gen(5);
    const Tensor q = to(Randn(l.q, DType::kBFloat16, gen), CUDA(0));
    const Tensor k = to(Randn(l.k, DType::kBFloat16, gen), CUDA(0));
    const Tensor v = to(Randn(l.k, DType::kBFloat16, gen), CUDA(0));
    ASSERT_EQ(sdpa_backend_choice(q, k, v, {}, l.causal).backend, SdpaBackend::kFlash);
    const Tensor flash = scaled_dot_product_attention(q, k, v, {}, l.causal);
    Tensor math;
    {
      SdpaBackendGuard g(SdpaBackend::kMath);
      math = scaled_dot_product_attention(cast(q, DType::kFloat32), cast(k, DType::kFloat32),
                                          cast(v, DType::kFloat32), {}, l.causal);
    }
    ExpectClose(to_vector(flash), to_vector(math), {2e-2, 2e-2}, ShapeString(l.q));
  }
}

// Decode against a KV cache filled to some position: a bool mask [1, 1, 1, S] keeps the first
// `filled` keys and the slots after them hold NaN, which the kernels must never read (they read
// a key's mask before its K and V). Both ways a row's key splits merge on sm_90 (one cluster per
// row; the workspace and the combine kernel, KILN_FD_CLUSTER=off), many split counts (up to 16
// a cluster, 1024 keys a split), and the same launch twice (nothing is left behind between
// calls). The reference is the math form over the filled keys alone, in float32.
TEST(SdpaFlash, DecodeReadsOnlyTheVisibleKeysOfACache) {
  KILN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t b, h, l, s, filled, d;
  };
  for (const char* cluster : {"on", "off"}) {
    ScopedEnv env("KILN_FD_CLUSTER", cluster);
    for (const Case& c : {Case{1, 12, 1, 1024, 537, 64}, Case{8, 12, 1, 1024, 600, 64},
                          Case{2, 4, 1, 16384, 9001, 128}, Case{1, 2, 3, 300, 1, 64},
                          Case{3, 2, 4, 77, 77, 128}, Case{1, 1, 1, 40000, 39999, 64}}) {
      const std::string name = absl::StrCat("cluster ", cluster, " b", c.b, " h", c.h, " l", c.l,
                                            " s", c.s, " filled ", c.filled, " d", c.d);
      Generator gen(7);
      const Tensor q = to(Randn({c.b, c.h, c.l, c.d}, DType::kBFloat16, gen), CUDA(0));
      const Tensor k_seen = Randn({c.b, c.h, c.filled, c.d}, DType::kBFloat16, gen);
      const Tensor v_seen = Randn({c.b, c.h, c.filled, c.d}, DType::kBFloat16, gen);
      auto cache = [&](const Tensor& seen) {
        Tensor t = full({c.b, c.h, c.s, c.d}, NAN, DType::kBFloat16);
        copy_(slice(t, 2, 0, c.filled), seen);
        return to(t, CUDA(0));
      };
      const Tensor k = cache(k_seen), v = cache(v_seen);
      std::vector<double> keep(static_cast<size_t>(c.s), 0.0);
      for (int64_t j = 0; j < c.filled; ++j) keep[j] = 1.0;
      const Tensor mask = from_vector(keep, {1, 1, 1, c.s}, DType::kBool, CUDA(0));
      Tensor want;
      {
        SdpaBackendGuard g(SdpaBackend::kMath);
        want = scaled_dot_product_attention(cast(to(q, kCPU), DType::kFloat32),
                                            cast(k_seen, DType::kFloat32),
                                            cast(v_seen, DType::kFloat32));
      }
      for (int call = 0; call < 2; ++call) {
        const Tensor out = scaled_dot_product_attention(q, k, v, mask);
        ExpectClose(to_vector(out), to_vector(want), {2e-2, 2e-2},
                    absl::StrCat(name, " call ", call));
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// The decode kernel that appends the step's keys and values to the caches itself (a compiled
// index_copy_ x2 + attention, codegen/families/attention/attention_fusion.h) against the same
// step run eagerly (the index_copy kernels, then the decode kernel over the caches): outputs and
// caches alike, both merges of the splits, head dims 64 and 128, both dtypes, grouped-query heads,
// 1 to 4 new rows, causal or a bool mask, caches whose unwritten slots hold NaN (never read).
TEST(SdpaFlash, DecodeKernelAppendsToTheCachesAsTheOpsWould) {
  KILN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t b, h, hk, t, s, d;
    DType dtype;
    bool causal;
  };
  const Case cases[] = {{1, 12, 12, 1, 1024, 64, DType::kBFloat16, false},
                        {8, 4, 2, 1, 300, 128, DType::kFloat16, false},
                        {2, 4, 1, 3, 77, 64, DType::kBFloat16, true},
                        {3, 2, 2, 4, 5000, 128, DType::kBFloat16, false}};
  for (const char* cluster : {"on", "off"}) {
    ScopedEnv env("KILN_FD_CLUSTER", cluster);
    for (const Case& c : cases) {
      const std::string name = absl::StrCat("cluster ", cluster, " b", c.b, " h", c.h, "/", c.hk,
                                            " t", c.t, " s", c.s, " d", c.d);
      Generator gen(17);
      const int64_t filled = c.s / 2;  // slots filled before the step; the step writes the next
      Tensor k = full({c.b, c.hk, c.s, c.d}, NAN, c.dtype),
             v = full({c.b, c.hk, c.s, c.d}, NAN, c.dtype);
      copy_(slice(k, 2, 0, filled), Randn({c.b, c.hk, filled, c.d}, c.dtype, gen));
      copy_(slice(v, 2, 0, filled), Randn({c.b, c.hk, filled, c.d}, c.dtype, gen));
      std::vector<double> slots, keep;
      for (int64_t i = 0; i < c.t; ++i) slots.push_back(static_cast<double>(filled + i));
      for (int64_t i = 0; i < c.t; ++i) {
        for (int64_t j = 0; j < c.s; ++j) keep.push_back(j <= filled + i);
      }
      const std::vector<Tensor> in = {to(Randn({c.b, c.h, c.t, c.d}, c.dtype, gen), CUDA(0)),
                                      to(k, CUDA(0)),
                                      to(v, CUDA(0)),
                                      from_vector(slots, {c.t}, DType::kInt64, CUDA(0)),
                                      to(Randn({c.b, c.hk, c.t, c.d}, c.dtype, gen), CUDA(0)),
                                      to(Randn({c.b, c.hk, c.t, c.d}, c.dtype, gen), CUDA(0)),
                                      from_vector(keep, {1, 1, c.t, c.s}, DType::kBool, CUDA(0))};
      const bool causal = c.causal;
      auto step = [causal](const std::vector<Tensor>& x) {
        index_copy_(x[1], 2, x[3], x[4]);
        index_copy_(x[2], 2, x[3], x[5]);
        // Causal: the new rows' queries see the filled slots by the mask's rule as well.
        return std::vector<Tensor>{scaled_dot_product_attention(
            x[0], x[1], x[2], causal ? Tensor() : x[6], false, std::nullopt, true)};
      };
      std::vector<Tensor> eager = {in[0], clone(in[1]), clone(in[2]), in[3], in[4], in[5], in[6]};
      const Tensor want = step(eager)[0];
      CompiledFn f = compile(step, {in[0], clone(in[1]), clone(in[2]), in[3], in[4], in[5], in[6]});
      for (int call = 0; call < 2; ++call) {
        std::vector<Tensor> x = {in[0], clone(in[1]), clone(in[2]), in[3], in[4], in[5], in[6]};
        const Tensor got = f(x)[0];
        // The appended keys enter the softmax last (the tail), not in key order: the float
        // sums may differ in their last bits, so the rounded outputs by an ulp at most (on the
        // H200 they came out equal); the caches are copies, equal to the bit.
        ExpectClose(to_vector(got), to_vector(want),
                    {1e-6, c.dtype == DType::kBFloat16 ? 8e-3 : 1e-3}, name + " output");
        ExpectClose(to_vector(x[1]), to_vector(eager[1]), {0, 0}, name + " key cache");
        ExpectClose(to_vector(x[2]), to_vector(eager[2]), {0, 0}, name + " value cache");
      }
      const CompileReport& r = f.report(in);
      EXPECT_NE(r.final_graph.find("kiln_fused_index_copy_scaled_dot_product_attention"),
                std::string::npos)
          << name << "\n"
          << r.final_graph;
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Random shapes on the GPU (the conformance sweep): B 1..3, query heads 1..4 with K/V
// heads dividing them (grouped-query), query and key lengths 1..4096 drawn log-uniformly (so
// most are not multiples of the kernel's tiles) and every 4th case 1..4 query rows (the decode
// kernels), head dims 64/128, causal or not, no mask, a bool mask with fully masked rows or an
// additive mask with -inf entries, bf16 and f16. The default backend (flash where it applies)
// is compared with the math form in float32.
TEST(SdpaFlash, RandomShapesMatchFloat32Math) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(2026);
  auto length = [&] {
    return std::max<int64_t>(1, std::llround(std::exp(gen.Uniform() * std::log(4096.0))));
  };
  int flash_runs = 0;
  constexpr int kCases = 48;
  for (int i = 0; i < kCases; ++i) {
    const int64_t b = 1 + static_cast<int64_t>(gen.Uniform() * 3);
    const int64_t hkv = 1 + static_cast<int64_t>(gen.Uniform() * 2);
    const int64_t hq = hkv * (gen.Uniform() < 0.5 ? 1 : 2);
    // Every 4th case has 1..4 query rows (the split-key decode kernels), the rest any length.
    const int64_t lq = i % 4 == 1 ? 1 + static_cast<int64_t>(gen.Uniform() * 4) : length();
    const int64_t lk = i % 3 == 0 ? std::max(lq, length()) : length();
    const int64_t d = gen.Uniform() < 0.5 ? 64 : 128;
    const int mask_kind = i % 3;  // none, bool with fully masked rows, additive with -inf
    const bool causal = mask_kind == 0 && gen.Uniform() < 0.5;  // torch: not both
    const DType dtype = i % 2 == 0 ? DType::kBFloat16 : DType::kFloat16;
    const std::string name =
        absl::StrCat("case ", i, ": q [", b, ",", hq, ",", lq, ",", d, "] k [", b, ",", hkv, ",",
                     lk, ",", d, "] causal ", causal, " mask ", mask_kind, " ", DTypeName(dtype));
    const Tensor q = to(Randn({b, hq, lq, d}, dtype, gen), CUDA(0));
    const Tensor k = to(Randn({b, hkv, lk, d}, dtype, gen), CUDA(0));
    const Tensor v = to(Randn({b, hkv, lk, d}, dtype, gen), CUDA(0));
    Tensor mask;
    if (mask_kind != 0) {
      // Every 7th query row fully masked (bool false / additive -inf); otherwise 80% kept.
      // The mask is [1, 1, Lq, Lk], broadcast over batch and heads.
      std::vector<double> m(static_cast<size_t>(lq * lk));
      for (int64_t r = 0; r < lq; ++r) {
        for (int64_t c = 0; c < lk; ++c) {
          const bool keep = r % 7 != 3 && gen.Uniform() < 0.8;
          m[r * lk + c] = mask_kind == 1 ? keep : (keep ? gen.Normal() : -INFINITY);
        }
      }
      mask =
          from_vector(m, {1, 1, lq, lk}, mask_kind == 1 ? DType::kBool : DType::kFloat32, CUDA(0));
    }
    const bool gqa = hq != hkv;
    if (sdpa_backend_choice(q, k, v, mask, causal, std::nullopt, gqa).backend ==
        SdpaBackend::kFlash) {
      ++flash_runs;
    }
    const Tensor out = scaled_dot_product_attention(q, k, v, mask, causal, std::nullopt, gqa);
    Tensor want;
    {
      SdpaBackendGuard g(SdpaBackend::kMath);
      want =
          scaled_dot_product_attention(cast(q, DType::kFloat32), cast(k, DType::kFloat32),
                                       cast(v, DType::kFloat32), mask, causal, std::nullopt, gqa);
    }
    ExpectClose(to_vector(out), to_vector(want), AttentionTolerance(dtype), name);
    if (::testing::Test::HasFailure()) break;  // one shape's report, not 48
  }
  // The sweep is about the flash kernel: most cases must have run it.
  EXPECT_GE(flash_runs, kCases / 2) << "flash ran " << flash_runs << " of " << kCases;
}

// ---- backend choice --------------------------------------------------------------------------

TEST(SdpaBackends, CpuRunsTheReferenceUnderAutoAndRefusesFlash) {
  const Tensor q = ones({1, 2, 4, 64}, DType::kBFloat16);
  const SdpaBackendChoice c = sdpa_backend_choice(q, q, q);
  EXPECT_EQ(c.backend, SdpaBackend::kMath);
  EXPECT_NE(c.reason.find("on cpu"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("CPU reference kernel"), std::string::npos) << c.reason;
  SdpaBackendGuard g(SdpaBackend::kFlash);
  try {
    scaled_dot_product_attention(q, q, q);
    FAIL() << "flash ran on the CPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(std::string(e.what()).find("runs on CUDA"), std::string::npos) << e.what();
  }
}

TEST(SdpaBackends, GuardsNestAndRestore) {
  EXPECT_EQ(current_sdpa_backend(), SdpaBackend::kAuto);
  {
    SdpaBackendGuard a(SdpaBackend::kMath);
    EXPECT_EQ(current_sdpa_backend(), SdpaBackend::kMath);
    {
      SdpaBackendGuard b(SdpaBackend::kFlash);
      EXPECT_EQ(current_sdpa_backend(), SdpaBackend::kFlash);
    }
    EXPECT_EQ(current_sdpa_backend(), SdpaBackend::kMath);
    const Tensor q = ones({3, 8});
    EXPECT_EQ(sdpa_backend_choice(q, q, q).reason, "selected by SdpaBackendGuard");
  }
  EXPECT_EQ(current_sdpa_backend(), SdpaBackend::kAuto);
}

// What flash supports, from types alone (no GPU needed).
TEST(SdpaBackends, FlashSupportByTypes) {
  auto t = [](Dims s, DType d = DType::kBFloat16, Device dev = CUDA(0)) {
    return TensorType{Shape(s.begin(), s.end()), d, dev};
  };
  using cuda_ops::FlashAttentionTypesUnsupported;
  const TensorType q64 = t({2, 4, 100, 64});
  EXPECT_EQ(FlashAttentionTypesUnsupported({q64, q64, q64}), "");
  EXPECT_EQ(FlashAttentionTypesUnsupported(
                {t({4, 9, 128}, DType::kFloat16), t({4, 3, 128}, DType::kFloat16),
                 t({4, 3, 128}, DType::kFloat16), t({9, 3}, DType::kBool)}),
            "");
  struct No {
    std::vector<TensorType> in;
    std::string says;
  };
  const TensorType q96 = t({1, 2, 8, 96}), f32 = t({1, 2, 8, 64}, DType::kFloat32),
                   cpu = t({1, 2, 8, 64}, DType::kBFloat16, kCPU), r5 = t({1, 1, 2, 8, 64});
  for (const No& n : {No{{q96, q96, q96}, "head dim 96"}, No{{f32, f32, f32}, "dtype float32"},
                      No{{cpu, cpu, cpu}, "on cpu"}, No{{r5, r5, r5}, "rank 5"},
                      No{{q64, q64, t({2, 4, 100, 32})}, "value head dim 32"}}) {
    const std::string why = FlashAttentionTypesUnsupported(n.in);
    EXPECT_NE(why.find(n.says), std::string::npos) << why;
  }
}

TEST(SdpaBackends, CudaAutoPicksFlashOrSaysWhyNot) {
  KILN_SKIP_WITHOUT_GPU();
  Generator gen(3);
  const Tensor q = to(Randn({1, 2, 64, 64}, DType::kBFloat16, gen), CUDA(0));
  EXPECT_EQ(sdpa_backend_choice(q, q, q, {}, true).backend, SdpaBackend::kFlash);
  const Tensor f = cast(q, DType::kFloat32);
  const SdpaBackendChoice c = sdpa_backend_choice(f, f, f);
  EXPECT_EQ(c.backend, SdpaBackend::kMath);
  EXPECT_NE(c.reason.find("dtype float32"), std::string::npos) << c.reason;
  const Tensor strided = slice(to(Randn({1, 2, 64, 65}, DType::kBFloat16, gen), CUDA(0)), 3, 1, 65);
  EXPECT_NE(sdpa_backend_choice(strided, strided, strided).reason.find("16-byte"),
            std::string::npos);
}

// The guard is per thread: two threads under different guards each run their own backend.
TEST(SdpaBackends, GuardIsThreadLocal) {
  const SdpaCase c = Cases()[1];  // causal_square
  const Operands o = MakeOperands(c, DType::kFloat32, kCPU, 9);
  const ref::RefTensor want = Expected(c, o);
  auto worker = [&](SdpaBackend b, std::string* reason, std::vector<double>* got) {
    SdpaBackendGuard g(b);
    for (int i = 0; i < 5; ++i) {
      *reason = sdpa_backend_choice(o.q, o.k, o.v, {}, true).reason;
      *got = to_vector(RunSdpa(c, o));
    }
  };
  std::string r_math, r_auto;
  std::vector<double> g_math, g_auto;
  std::thread t1(worker, SdpaBackend::kMath, &r_math, &g_math);
  std::thread t2(worker, SdpaBackend::kAuto, &r_auto, &g_auto);
  t1.join();
  t2.join();
  EXPECT_EQ(r_math, "selected by SdpaBackendGuard");
  EXPECT_NE(r_auto.find("CPU reference kernel"), std::string::npos) << r_auto;
  ExpectClose(g_math, want.v, AttentionTolerance(DType::kFloat32), "math thread");
  ExpectClose(g_auto, want.v, AttentionTolerance(DType::kFloat32), "auto thread");
}

TEST(SdpaBackends, ProfilerRangeNamesTheBackend) {
  profiler::Profiler prof(profiler::ProfilerOptions{.device = false});
  prof.Start();
  const Tensor q = ones({2, 5, 8});
  {
    SdpaBackendGuard g(SdpaBackend::kMath);
    scaled_dot_product_attention(q, q, q);
  }
  const profiler::ProfileResult r = prof.Stop();
  bool op = false, range = false;
  for (const profiler::HostEvent& e : r.host) {
    op = op || std::string(e.name) == "scaled_dot_product_attention";
    range = range || std::string(e.name) == "sdpa backend: math (selected by SdpaBackendGuard)";
  }
  EXPECT_TRUE(op);
  EXPECT_TRUE(range);
}

// ---- bad input -------------------------------------------------------------------------------

struct BadCase {
  const char* name;
  std::function<void()> call;
  std::vector<std::string> must_mention;
};

TEST(SdpaBadInput, ThrowsClearErrors) {
  auto f = [](Dims s, DType t = DType::kFloat32, Device d = kCPU) {
    return d.is_meta() ? Tensor::Empty(s, t, d) : ones(s, t, d);
  };
  auto sdpa = [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& m = {},
                 bool causal = false, bool gqa = false) {
    scaled_dot_product_attention(q, k, v, m, causal, std::nullopt, gqa);
  };
  const std::vector<BadCase> cases = {
      {"rank1", [&] { sdpa(f({8}), f({8}), f({8})); }, {"at least 2 dims", "[8]"}},
      {"rank_mismatch",
       [&] {
         sdpa(f({2, 3, 8}), f({3, 8}), f({3, 8}));
       },
       {"same number of dims", "[2, 3, 8]", "[3, 8]"}},
      {"head_dim_mismatch",
       [&] {
         sdpa(f({2, 4, 8}), f({2, 5, 16}), f({2, 5, 16}));
       },
       {"head dims", "(8)", "(16)"}},
      {"kv_length_mismatch",
       [&] {
         sdpa(f({2, 4, 8}), f({2, 5, 8}), f({2, 6, 8}));
       },
       {"different lengths", "5 vs 6"}},
      {"heads_differ_without_gqa",
       [&] {
         sdpa(f({1, 8, 4, 8}), f({1, 2, 4, 8}), f({1, 2, 4, 8}));
       },
       {"8 heads", "enable_gqa"}},
      {"heads_not_dividing",
       [&] {
         sdpa(f({1, 8, 4, 8}), f({1, 3, 4, 8}), f({1, 3, 4, 8}), {}, false, true);
       },
       {"must divide", "(3)", "(8)"}},
      {"batch_mismatch",
       [&] {
         sdpa(f({2, 1, 4, 8}), f({1, 1, 4, 8}), f({1, 1, 4, 8}));
       },
       {"batch dim 0", "does not broadcast"}},
      {"mask_not_broadcastable",
       [&] {
         sdpa(f({2, 4, 8}), f({2, 5, 8}), f({2, 5, 8}), f({4, 4}, DType::kBool));
       },
       {"attn_mask", "[4, 4]", "[2, 4, 5]"}},
      {"mask_dtype",
       [&] {
         sdpa(f({2, 4, 8}, DType::kBFloat16), f({2, 5, 8}, DType::kBFloat16),
              f({2, 5, 8}, DType::kBFloat16), f({4, 5}, DType::kFloat16));
       },
       {"attn_mask must be bool, float32", "bfloat16", "float16"}},
      {"mask_with_causal",
       [&] {
         sdpa(f({2, 4, 8}), f({2, 5, 8}), f({2, 5, 8}), f({4, 5}, DType::kBool), true);
       },
       {"is_causal"}},
      {"dtype_mismatch",
       [&] {
         sdpa(f({2, 4, 8}), f({2, 5, 8}, DType::kBFloat16), f({2, 5, 8}));
       },
       {"one floating-point dtype", "float32", "bfloat16"}},
      {"integer_dtype",
       [&] {
         sdpa(f({2, 4, 8}, DType::kInt32), f({2, 5, 8}, DType::kInt32),
              f({2, 5, 8}, DType::kInt32));
       },
       {"floating-point", "int32"}},
      {"device_mismatch",
       [&] {
         sdpa(f({2, 4, 8}), f({2, 5, 8}, DType::kFloat32, kMeta), f({2, 5, 8}));
       },
       {"one device", "cpu", "meta"}},
  };
  for (const BadCase& c : cases) {
    try {
      c.call();
      ADD_FAILURE() << c.name << ": no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << msg;
      EXPECT_NE(msg.find("scaled_dot_product_attention:"), std::string::npos)
          << c.name << ": " << msg;
      for (const std::string& m : c.must_mention) {
        EXPECT_NE(msg.find(m), std::string::npos) << c.name << ": '" << m << "' not in: " << msg;
      }
    }
  }
}

// ---- graphs ----------------------------------------------------------------------------------

TEST(SdpaGraph, TracesToOneNodeThatPrintsAndParses) {
  const Tensor q = ones({1, 4, 16, 64}, DType::kBFloat16),
               kv = ones({1, 2, 16, 64}, DType::kBFloat16);
  auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{
        scaled_dot_product_attention(in[0], in[1], in[1], {}, true, std::nullopt, true)};
  };
  const ir::Graph g = ValueOrThrow(ir::Trace(fn, {q, kv}));
  const std::string text = ir::PrintGraph(g);
  EXPECT_NE(text.find("scaled_dot_product_attention(%0, %1, %1) {scale=0.125, is_causal=true, "
                      "enable_gqa=true} : bf16[1, 4, 16, 64]"),
            std::string::npos)
      << text;
  const ir::Graph back = ValueOrThrow(ir::ParseGraph(text));
  EXPECT_EQ(ir::PrintGraph(back), text);
}

TEST(SdpaGraph, CompiledMatchesEager) {
  const SdpaCase c = Cases()[13];  // bool_mask_2d
  const Operands o = MakeOperands(c, DType::kFloat32, kCPU, 4);
  auto fn = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2], o.mask)};
  };
  CompiledFn f = compile(fn, {o.q, o.k, o.v});
  ExpectClose(to_vector(f({o.q, o.k, o.v})[0]), to_vector(fn({o.q, o.k, o.v})[0]), {1e-6, 1e-6},
              "compiled");
}

// ---- the kernel's sources --------------------------------------------------------------------

// The bytes of kernel `entry`'s one parameter in `ptx` (".param .align 8 .b8 NAME_param_0[N]"),
// or 0 when it is not there.
size_t ParamBytes(const std::string& ptx, const std::string& entry) {
  const std::string key = entry + "_param_0[";
  const size_t at = ptx.find(key);
  return at == std::string::npos ? 0 : std::stoul(ptx.substr(at + key.size()));
}

// Every configuration kiln can launch compiles with NVRTC (to PTX: no GPU needed).
TEST(SdpaFlashSource, EveryVariantCompilesWithNvrtc) {
  KILN_SKIP_WITHOUT_NVRTC();
  using cuda_ops::FlashMask;
  int compiled = 0;
  for (int d : {64, 128}) {
    for (DType t : {DType::kBFloat16, DType::kFloat16}) {
      for (bool causal : {false, true}) {
        for (FlashMask m : {FlashMask::kNone, FlashMask::kBool, FlashMask::kFloat32,
                            FlashMask::kFloat16, FlashMask::kBFloat16}) {
          const auto c = cuda_ops::PlanFlashAttention(d, t, causal, m);
          const std::string name = cuda_ops::FlashAttentionKernelName(c);
          const std::string src = cuda_ops::RenderFlashAttentionSource(c);
          auto ptx = cuda::CompileSource(src, name, "compute_90", /*cubin=*/false);
          ASSERT_TRUE(ptx.ok()) << ptx.status().message();
          EXPECT_NE(ptx->find(name), std::string::npos) << name;
          EXPECT_NE(ptx->find("mma.sync.aligned.m16n8k16"), std::string::npos) << name;
          ++compiled;
          // The split-key kernels for few query rows (decode), both entry points.
          const std::string decode = cuda_ops::FlashDecodeKernelName(c);
          auto decode_ptx = cuda::CompileSource(cuda_ops::RenderFlashDecodeSource(c), decode,
                                                "compute_90", /*cubin=*/false);
          ASSERT_TRUE(decode_ptx.ok()) << decode_ptx.status().message();
          EXPECT_NE(decode_ptx->find(".entry " + decode + "("), std::string::npos) << decode;
          EXPECT_NE(decode_ptx->find(".entry " + decode + "_combine("), std::string::npos);
          // On sm_90 a row's splits merge through their cluster's shared memory; before it
          // (no clusters) the same source compiles without that path.
          EXPECT_NE(decode_ptx->find("barrier.cluster.wait"), std::string::npos) << decode;
          EXPECT_NE(decode_ptx->find("mapa.shared::cluster"), std::string::npos) << decode;
          auto decode_80 = cuda::CompileSource(cuda_ops::RenderFlashDecodeSource(c), decode,
                                               "compute_80", /*cubin=*/false);
          ASSERT_TRUE(decode_80.ok()) << decode_80.status().message();
          EXPECT_EQ(decode_80->find("barrier.cluster"), std::string::npos) << decode;
          // The decode kernel that also appends the new key and value rows to the caches (one
          // row; the four-row variant on one configuration a head dim).
          auto append = c;
          append.kv_append = causal || m != FlashMask::kNone || t != DType::kBFloat16 ? 1 : 4;
          const std::string append_name = cuda_ops::FlashDecodeKernelName(append);
          EXPECT_EQ(append_name, absl::StrCat(decode, "_append", append.kv_append));
          auto append_ptx = cuda::CompileSource(cuda_ops::RenderFlashDecodeSource(append),
                                                append_name, "compute_90", /*cubin=*/false);
          ASSERT_TRUE(append_ptx.ok()) << append_ptx.status().message();
          EXPECT_NE(append_ptx->find(".entry " + append_name + "("), std::string::npos);
          // And that variant rotating the query and the new keys first (RoPE).
          auto rope = append;
          rope.rope = true;
          const std::string rope_name = cuda_ops::FlashDecodeKernelName(rope);
          EXPECT_EQ(rope_name, append_name + "_rope");
          auto rope_ptx = cuda::CompileSource(cuda_ops::RenderFlashDecodeSource(rope), rope_name,
                                              "compute_90", /*cubin=*/false);
          ASSERT_TRUE(rope_ptx.ok()) << rope_ptx.status().message();
          EXPECT_NE(rope_ptx->find(".entry " + rope_name + "("), std::string::npos);
          // The host's mirrors of the kernels' parameter structs are as long as the kernels'.
          EXPECT_EQ(ParamBytes(*ptx, name), sizeof(cuda_ops::FlashParams)) << name;
#if KILN_WITH_CUDA
          for (const auto& [text, entry] :
               {std::pair{&*decode_ptx, decode}, std::pair{&*append_ptx, append_name},
                std::pair{&*rope_ptx, rope_name}}) {
            EXPECT_EQ(ParamBytes(*text, entry), cuda_ops::FlashDecodeParamsBytes()) << entry;
          }
#endif
          EXPECT_EQ(append_ptx->find("shfl.sync.bfly.b32\t%r") == std::string::npos, true);
          // The small-grid tiling (64-row tiles, head dim 64) of the same variant.
          const auto small = cuda_ops::ForGrid(c, 1, 512, 132);
          if (small.block_m == c.block_m) continue;
          const std::string small_name = cuda_ops::FlashAttentionKernelName(small);
          auto small_ptx = cuda::CompileSource(cuda_ops::RenderFlashAttentionSource(small),
                                               small_name, "compute_90", /*cubin=*/false);
          ASSERT_TRUE(small_ptx.ok()) << small_ptx.status().message();
          EXPECT_NE(small_ptx->find(small_name), std::string::npos) << small_name;
          ++compiled;
        }
      }
    }
  }
  EXPECT_EQ(compiled, 60);  // 40 default tilings, 20 small-grid ones (head dim 64)
}

#if KILN_WITH_CUDA  // the harness (tools/flash_attention) is CUDA code
// The standalone GPU harness (tools/flash_attention) compiles the very source kiln compiles.
TEST(SdpaFlashSource, HarnessRendersKilnsSource) {
  for (int d : {64, 128}) {
    for (bool causal : {false, true}) {
      const auto c =
          cuda_ops::PlanFlashAttention(d, DType::kFloat16, causal, cuda_ops::FlashMask::kFloat32);
      const KfConfig k{c.head_dim,   c.block_m,  c.block_n, c.warps,    c.q_in_regs,
                       c.min_blocks, /*bf16=*/0, causal,    /*mask=*/2, c.one_sync};
      EXPECT_EQ(kf::Source(k), cuda_ops::RenderFlashAttentionSource(c));
    }
  }
}
#endif

TEST(SdpaFlashSource, NamesSayWhatTheKernelDoes) {
  const auto c =
      cuda_ops::PlanFlashAttention(64, DType::kBFloat16, true, cuda_ops::FlashMask::kNone);
  const std::string name = cuda_ops::FlashAttentionKernelName(c);
  EXPECT_EQ(name.rfind("kiln_flash_attention_d64_bf16_causal_", 0), 0u) << name;
  const std::string src = cuda_ops::RenderFlashAttentionSource(c);
  EXPECT_NE(src.find("#define KILN_FA_CAUSAL 1"), std::string::npos);
  EXPECT_NE(src.find("#define KILN_FA_HEAD_DIM 64"), std::string::npos);
}

}  // namespace
}  // namespace kiln
