// Never crash, never silently wrong (issue #13): the reproductions of an adversarial battery and
// their siblings, on the CPU and (same code, skipped without a GPU) on CUDA.
//   - undefined tensors (Tensor()) reaching any op, accessor, conversion, module or compiled
//     function raise a clear error;
//   - tracing: the dispatch hook is restored on every exit path, placeholders that escape a trace
//     are refused by eager ops, reading data while tracing raises;
//   - size arithmetic: element and byte counts, reshape, expand, broadcast, arange and slice
//     sizes that overflow int64 raise an error naming the shape;
//   - meta tensors run every registry row as shape inference only.
#include <gtest/gtest.h>

#include <cctype>
#include <climits>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "codegen/compile.h"
#include "ops/dispatch.h"
#include "ops/distributed.h"
#include "ops/factories.h"
#include "ops/modules.h"
#include "ops/ops.h"
#include "runtime/status.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

// Runs `call`, which must throw kiln::Error whose message contains every word of `words`.
void ExpectError(const std::function<void()>& call, const std::vector<std::string>& words,
                 const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << ": no error was raised";
  } catch (const Error& e) {
    for (const std::string& w : words) {
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << what << ": message does not mention '" << w << "': " << e.what();
    }
  }
}

class OnDevice : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().is_cuda()) KILN_SKIP_WITHOUT_GPU();
  }
  Tensor X(std::vector<int64_t> shape = {2, 3}, DType t = DType::kFloat32) {
    Generator gen(1);
    return to(cast(randn(shape, gen), t), GetParam());
  }
};

std::string DeviceName(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cuda() ? "Cuda" : "Cpu";
}

// ---- Undefined tensors. ---------------------------------------------------------------------

using TensorCall = std::function<void(const Tensor& u, const Tensor& x)>;

const std::vector<std::pair<const char*, TensorCall>>& UndefinedCases() {
  static const auto* cases = new std::vector<std::pair<const char*, TensorCall>>{
      {"to_vector", [](const Tensor& u, const Tensor&) { to_vector(u); }},
      {"contiguous", [](const Tensor& u, const Tensor&) { contiguous(u); }},
      {"t", [](const Tensor& u, const Tensor&) { t(u); }},
      {"to_dtype", [](const Tensor& u, const Tensor&) { to(u, DType::kBFloat16); }},
      {"to_device", [](const Tensor& u, const Tensor& x) { to(u, x.device()); }},
      {"to_cpu", [](const Tensor& u, const Tensor&) { to(u, kCPU); }},
      {"cast", [](const Tensor& u, const Tensor&) { cast(u, DType::kInt64); }},
      {"view", [](const Tensor& u, const Tensor&) { view(u, {4}); }},
      {"reshape", [](const Tensor& u, const Tensor&) { reshape(u, {4}); }},
      {"expand", [](const Tensor& u, const Tensor&) { expand(u, {4}); }},
      {"slice", [](const Tensor& u, const Tensor&) { slice(u, 0, 0, 1); }},
      {"transpose", [](const Tensor& u, const Tensor&) { transpose(u, 0, 1); }},
      {"permute", [](const Tensor& u, const Tensor&) { permute(u, {0}); }},
      {"squeeze", [](const Tensor& u, const Tensor&) { squeeze(u); }},
      {"unsqueeze", [](const Tensor& u, const Tensor&) { unsqueeze(u, 0); }},
      {"clone", [](const Tensor& u, const Tensor&) { clone(u); }},
      {"neg", [](const Tensor& u, const Tensor&) { neg(u); }},
      {"gelu", [](const Tensor& u, const Tensor&) { gelu(u, "tanh"); }},
      {"add_lhs", [](const Tensor& u, const Tensor& x) { add(u, x); }},
      {"mul_rhs", [](const Tensor& u, const Tensor& x) { mul(x, u); }},
      {"scalar_op", [](const Tensor& u, const Tensor&) { (void)(u * 2.0); }},
      {"where_cond", [](const Tensor& u, const Tensor& x) { where(u, x, x); }},
      {"masked_fill_mask", [](const Tensor& u, const Tensor& x) { masked_fill(x, u, 1); }},
      {"add_inplace_self", [](const Tensor& u, const Tensor& x) { add_(u, x); }},
      {"add_inplace_other", [](const Tensor& u, const Tensor& x) { add_(x, u); }},
      {"mul_inplace_scalar", [](const Tensor& u, const Tensor&) { mul_(u, 2.0); }},
      {"sum", [](const Tensor& u, const Tensor&) { sum(u); }},
      {"max", [](const Tensor& u, const Tensor&) { max(u, {0}); }},
      {"softmax", [](const Tensor& u, const Tensor&) { softmax(u, -1); }},
      {"layer_norm", [](const Tensor& u, const Tensor&) { layer_norm(u); }},
      {"rms_norm_weight", [](const Tensor& u, const Tensor& x) { rms_norm(u, x); }},
      {"matmul_lhs", [](const Tensor& u, const Tensor& x) { matmul(u, t(x)); }},
      {"matmul_rhs", [](const Tensor& u, const Tensor& x) { matmul(x, u); }},
      {"linear_weight", [](const Tensor& u, const Tensor& x) { linear(x, u); }},
      {"triu", [](const Tensor& u, const Tensor&) { triu(u); }},
  };
  return *cases;
}

TEST_P(OnDevice, UndefinedTensorsRaiseInEveryOp) {
  const Tensor x = X();
  for (const auto& [name, call] : UndefinedCases()) {
    ExpectError([&] { call(Tensor(), x); }, {"undefined"}, name);
  }
  // The dispatcher names the op and which input.
  ExpectError([&] { add(x, Tensor()); }, {"add:", "input 1", "undefined"}, "add");
  ExpectError([&] { to_vector(Tensor()); }, {"to_vector:", "undefined"}, "to_vector");
  EXPECT_EQ(ToString(Tensor()), "tensor(undefined)");
  EXPECT_FALSE(Tensor().shares_storage(x));
  EXPECT_FALSE(Tensor().defined());
}

TEST(Undefined, AccessorsRaiseInsteadOfCrashing) {
  const Tensor u;
  const std::vector<std::pair<const char*, std::function<void()>>> accessors = {
      {"numel", [&] { (void)u.numel(); }},
      {"shape", [&] { (void)u.shape(); }},
      {"strides", [&] { (void)u.strides(); }},
      {"dim", [&] { (void)u.dim(); }},
      {"size", [&] { (void)u.size(0); }},
      {"stride", [&] { (void)u.stride(0); }},
      {"dtype", [&] { (void)u.dtype(); }},
      {"device", [&] { (void)u.device(); }},
      {"offset", [&] { (void)u.offset(); }},
      {"element_size", [&] { (void)u.element_size(); }},
      {"type", [&] { (void)u.type(); }},
      {"shape_string", [&] { (void)u.shape_string(); }},
      {"is_contiguous", [&] { (void)u.is_contiguous(); }},
      {"has_internal_overlap", [&] { (void)u.has_internal_overlap(); }},
      {"storage", [&] { (void)u.storage(); }},
      {"data_ptr", [&] { (void)u.data_ptr(); }},
      {"data", [&] { (void)u.data<float>(); }},
      {"as_strided", [&] { (void)u.as_strided({1}, {1}, 0); }},
      {"is_placeholder", [&] { (void)u.is_placeholder(); }},
  };
  for (const auto& [name, call] : accessors) ExpectError(call, {"undefined tensor"}, name);
}

TEST_P(OnDevice, UndefinedInputsOfModulesAndCompiledFunctions) {
  Generator gen(0);
  Linear lin(3, 4, true, gen, {DType::kFloat32, GetParam()});
  ExpectError([&] { lin(Tensor()); }, {"linear:", "undefined"}, "Linear");
  const Tensor x = X();
  CompiledFn f = compile(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] + in[1]}; }, {x, x});
  ExpectError([&] { f({x, Tensor()}); }, {"input 1", "undefined"}, "compiled call");
  ExpectError(
      [&] {
        compile([](const std::vector<Tensor>& in) { return in; }, {Tensor(), x});
      },
      {"input 0", "undefined"}, "compile");
  ExpectClose(to_vector(f({x, x})[0]), to_vector(x + x), {0, 0}, "still usable");
}

// ---- Tracing state and placeholders. ------------------------------------------------------

TEST_P(OnDevice, TracingStateIsRestoredWhenTheTracedFunctionThrows) {
  const Tensor x = X();
  const std::vector<std::pair<const char*, std::function<void()>>> throwers = {
      {"kiln::Error", [] { KILN_CHECK(false, "boom"); }},
      {"std::runtime_error", [] { throw std::runtime_error("boom"); }},
      {"int", [] { throw 42; }},
      {"bad shapes", [&] { matmul(x, x); }},
  };
  for (const auto& [name, thrower] : throwers) {
    auto fn = [&, thrower = thrower](const std::vector<Tensor>& in) {
      Tensor y = relu(in[0]);
      add_(y, in[0]);
      thrower();
      return std::vector<Tensor>{y};
    };
    EXPECT_ANY_THROW(compile(fn, {x})) << name;
    EXPECT_EQ(CurrentDispatchHook(), nullptr) << name;
    ExpectClose(to_vector(relu(x) * 2.0), to_vector(relu(x) + relu(x)), {0, 0}, name);
  }
}

TEST_P(OnDevice, RetraceOfANewSignatureThatThrowsRestoresTheState) {
  const Tensor x = X();
  CompiledFn f = compile(
      [](const std::vector<Tensor>& in) {
        KILN_CHECK(in[0].size(0) == 2, "only two rows");
        return std::vector<Tensor>{in[0] * 3.0};
      },
      {x});
  ExpectError([&] { f({X({5, 3})}); }, {"only two rows"}, "retrace");
  EXPECT_EQ(CurrentDispatchHook(), nullptr);
  ExpectClose(to_vector(f({x})[0]), to_vector(x * 3.0), {0, 0}, "compiled after the failure");
}

TEST_P(OnDevice, PlaceholdersThatEscapeATraceAreRefusedEagerly) {
  const Tensor x = X();
  Tensor leaked;
  auto fn = [&](const std::vector<Tensor>& in) {
    leaked = tanh(in[0]);
    KILN_CHECK(false, "fail after leaking");
    return std::vector<Tensor>{leaked};
  };
  EXPECT_THROW(compile(fn, {x}), Error);
  ASSERT_TRUE(leaked.defined());
  EXPECT_TRUE(leaked.is_placeholder());
  ExpectError([&] { relu(leaked); }, {"relu:", "placeholder", "escaped"}, "unary");
  ExpectError([&] { add(x, leaked); }, {"add:", "input 1", "placeholder"}, "binary");
  ExpectError([&] { add_(leaked, x); }, {"add:", "placeholder"}, "in place");
  ExpectError([&] { to_vector(leaked); }, {"placeholder"}, "to_vector");
  ExpectError([&] { (void)leaked.data_ptr(); }, {"placeholder"}, "data_ptr");
  ExpectError([&] { ToString(leaked); }, {"placeholder"}, "printing");
}

TEST_P(OnDevice, OpsFromAnotherThreadOfATracedFunctionDoNotCrash) {
  // The trace records the tracing thread's ops; a helper thread sees placeholders, which hold no
  // data, and its eager ops refuse them.
  const Tensor x = X();
  std::string message;
  auto fn = [&](const std::vector<Tensor>& in) {
    std::thread worker([&] {
      try {
        relu(in[0]);
      } catch (const Error& e) {
        message = e.what();
      }
    });
    worker.join();
    return std::vector<Tensor>{in[0] * 2.0};
  };
  CompiledFn f = compile(fn, {x});
  EXPECT_NE(message.find("placeholder"), std::string::npos) << message;
  ExpectClose(to_vector(f({x})[0]), to_vector(x * 2.0), {0, 0}, "compiled");
}

TEST_P(OnDevice, ModulesDoNotCachePlaceholdersWhileTraced) {
  // CausalSelfAttention caches its mask: built while tracing, it must still be a real tensor,
  // or the eager calls after compile would read a placeholder.
  Generator gen(2);
  CausalSelfAttention att(8, 2, gen, {DType::kFloat32, GetParam()});
  const Tensor x = to(randn({2, 5, 8}, gen), GetParam());
  CompiledFn f = compile(att, x);
  const std::vector<double> compiled = to_vector(f({x})[0]);
  ExpectClose(to_vector(att(x)), compiled, {1e-4, 1e-4}, "eager after compile");
}

TEST_P(OnDevice, ReadingDataWhileTracingRaises) {
  const Tensor x = X();
  const std::vector<std::pair<const char*, std::function<void(const Tensor&)>>> reads = {
      {"to_vector", [](const Tensor& t) { to_vector(t); }},
      {"print", [](const Tensor& t) { (void)ToString(t); }},
      {"operator<<",
       [](const Tensor& t) {
         std::ostringstream os;
         os << t;
       }},
      {"data_ptr", [](const Tensor& t) { (void)t.data_ptr(); }},
      {"data", [](const Tensor& t) { (void)t.data<float>(); }},
      {"result data", [](const Tensor& t) { to_vector(exp(t)); }},
      {"to cpu", [](const Tensor& t) { to_vector(to(t, kCPU)); }},
  };
  for (const auto& [name, read] : reads) {
    auto fn = [read = read](const std::vector<Tensor>& in) {
      read(in[0]);
      return std::vector<Tensor>{in[0] + 1.0};
    };
    ExpectError([&] { compile(fn, {x}); }, {"while tracing"}, name);
    EXPECT_EQ(CurrentDispatchHook(), nullptr) << name;
  }
}

// ---- Size arithmetic. ----------------------------------------------------------------------

TEST_P(OnDevice, OverflowingSizesRaiseNamingTheShape) {
  const Device d = GetParam();
  const int64_t k32 = int64_t{1} << 32, k62 = int64_t{1} << 62;
  ExpectError(
      [&] {
        empty({k32, k32}, DType::kFloat32, d);
      },
      {"empty:", "[4294967296, 4294967296]"}, "empty 2^64");
  ExpectError([&] { empty({k62}, DType::kFloat32, d); }, {"empty:", "[4611686018427387904]"},
              "empty 2^62 floats");
  ExpectError([&] { zeros({k32, k32, 0, -1}, DType::kFloat32, d); }, {"negative"}, "negative");
  ExpectError([&] { ones({k32, k32}, DType::kFloat32, d); }, {"[4294967296, 4294967296]"}, "ones");
  ExpectError(
      [&] {
        full({3, k62, 8}, 1.0, DType::kBFloat16, d);
      },
      {"[3, 4611686018427387904, 8]"}, "full");
  Generator gen(0);
  ExpectError([&] { randn({k32, k32}, gen, DType::kFloat32, d); }, {"[4294967296"}, "randn");
  ExpectError(
      [&] {
        from_vector({1, 2}, {k32, k32}, DType::kFloat32, d);
      },
      {"from_vector:", "[4294967296, 4294967296]"}, "from_vector");
  ExpectError([&] { arange(0, 1e19, 1, DType::kInt64, d); }, {"arange:", "1e+19"}, "arange");
  ExpectError([&] { arange(-1e300, 1e300, 1e-300, DType::kFloat32, d); }, {"arange:"}, "arange");
  const Tensor x = X({16});
  ExpectError(
      [&] {
        reshape(x, {k62 + 1, 16});
      },
      {"reshape:", "[4611686018427387905, 16]", "16"}, "reshape");
  ExpectError([&] { reshape(x, {k32, k32, 0}); }, {"reshape:"}, "reshape with a zero dim");
  ExpectError([&] { view(x, {-1, INT64_MAX}); }, {"view:"}, "view");
  ExpectError(
      [&] {
        expand(reshape(x, {16, 1}), {16, k62});
      },
      {"expand:", "[16, 4611686018427387904]"}, "expand");
  ExpectError([&] { expand(reshape(x, {1, 16}), {k32, k32, 16}); }, {"expand:"}, "expand 3-D");
  // Reading after those errors works.
  ExpectClose(to_vector(reshape(x, {4, 4})), to_vector(x), {0, 0}, "read after");
}

TEST(Sizes, BroadcastAndBatchedMatmulResultsThatOverflowRaise) {
  const int64_t k40 = int64_t{1} << 40;
  const Tensor a = empty({k40, 1}, DType::kFloat32, kMeta),
               b = empty({1, k40}, DType::kFloat32, kMeta);
  ExpectError([&] { add(a, b); }, {"add:", "[1099511627776, 1099511627776]"}, "broadcast");
  ExpectError([&] { where(empty({k40, 1, 1}, DType::kBool, kMeta), a, b); }, {"where:"}, "where");
  const Tensor m = empty({k40, 1, 2, 2}, DType::kFloat32, kMeta);
  ExpectError(
      [&] {
        matmul(m, empty({1, k40, 2, 2}, DType::kFloat32, kMeta));
      },
      {"matmul:"}, "matmul batch");
  ExpectError([&] { Tensor::Empty({k40, k40}, DType::kFloat32, kMeta); }, {"empty:"}, "meta");
}

TEST_P(OnDevice, SliceWithHugeStepsAndBounds) {
  const Tensor x = X({5});
  const std::vector<double> v = to_vector(x);
  Tensor s = slice(x, 0, 0, 5, INT64_MAX);
  ASSERT_EQ(s.numel(), 1);
  EXPECT_EQ(to_vector(s)[0], v[0]);
  s = slice(x, 0, 1, INT64_MAX, INT64_MAX - 1);
  ASSERT_EQ(s.numel(), 1);
  EXPECT_EQ(to_vector(s)[0], v[1]);
  EXPECT_EQ(slice(x, 0, INT64_MIN, INT64_MAX, 2).numel(), 3);
  EXPECT_EQ(slice(x, 0, INT64_MAX, INT64_MIN).numel(), 0);
  EXPECT_EQ(slice(x, 0, -2, INT64_MAX, INT64_MAX).numel(), 1);
  EXPECT_EQ(to_vector(slice(x, 0, -2, INT64_MAX, INT64_MAX))[0], v[3]);
  EXPECT_EQ(to_vector(contiguous(slice(x, 0, 4, 5, INT64_MAX)))[0], v[4]);
  ExpectError([&] { slice(x, 0, 0, 5, 0); }, {"slice:", "step"}, "zero step");
  ExpectError([&] { slice(x, 0, 0, 5, INT64_MIN); }, {"slice:", "step"}, "negative step");
  // Views over a huge-step slice: unsqueeze/expand/contiguous stay exact.
  Tensor u = unsqueeze(slice(x, 0, 2, 5, INT64_MAX), 0);
  EXPECT_EQ(to_vector(contiguous(expand(u, {3, 1}))), std::vector<double>(3, v[2]));
}

TEST_P(OnDevice, AsStridedRefusesViewsOutsideTheStorage) {
  const Tensor x = X({2, 3});
  ExpectError(
      [&] {
        x.as_strided({3, 3}, {3, 1}, 0);
      },
      {"as_strided", "[3, 3]", "element 8"}, "past the end");
  ExpectError([&] { x.as_strided({2}, {1}, 5); }, {"as_strided"}, "offset past the end");
  ExpectError([&] { x.as_strided({2}, {-1}, 0); }, {"before the storage"}, "negative stride");
  ExpectError([&] { x.as_strided({2, 2}, {INT64_MAX, 1}, 0); }, {"as_strided"}, "overflow");
  ExpectError([&] { x.as_strided({2}, {1, 1}, 0); }, {"as many strides as dims"}, "rank mismatch");
  EXPECT_EQ(x.as_strided({2}, {-1}, 1).numel(), 2);  // inside, backwards
  EXPECT_EQ(x.as_strided({0, 99}, {99, 1}, 99).numel(), 0);
  EXPECT_EQ(to_vector(x.as_strided({2}, {5}, 0)),
            (std::vector<double>{to_vector(x)[0], to_vector(x)[5]}));
}

TEST_P(OnDevice, FactoryValuesAndEnumsOutsideTheirRangeRaise) {
  const Device d = GetParam();
  ExpectError([&] { full({2}, 1e30, DType::kInt64, d); }, {"full:", "1e+30", "int64", "overflow"},
              "full int64");
  ExpectError([&] { full({2}, 3e9, DType::kInt32, d); }, {"full:", "int32"}, "full int32");
  ExpectError(
      [&] {
        from_vector({1, NAN}, {2}, DType::kInt64, d);
      },
      {"from_vector:", "nan"}, "from_vector nan");
  ExpectError([&] { arange(0, 1e10, 1e9, DType::kInt32, d); }, {"arange:", "int32"},
              "arange int32");
  EXPECT_EQ(to_vector(full({1}, -0x1p63, DType::kInt64, d))[0], -0x1p63);
  EXPECT_EQ(to_vector(full({1}, 2.5, DType::kBool, d))[0], 1);
  const DType bad_dtype = static_cast<DType>(42);
  ExpectError([&] { empty({2}, bad_dtype, d); }, {"unknown dtype"}, "empty");
  ExpectError([&] { cast(X(), bad_dtype); }, {"cast:", "unknown dtype"}, "cast");
  ExpectError([&] { empty({2}, DType::kFloat32, Device(static_cast<DeviceType>(7))); },
              {"unknown device type"}, "device type");
  ExpectError([&] { Dispatch(static_cast<OpId>(9999), {X()}); }, {"no op with id 9999"}, "op id");
}

// ---- Meta tensors: every registry row infers shapes and runs nothing. ------------------------

// Every registry row on Meta tensors (`group`: a live process group for the collectives).
void RunEveryRowOnMeta(const Tensor& m, const Tensor& mask, int64_t group) {
  for (int i = 0; i < kNumOps; ++i) {
    const OpDef& def = GetOpDef(static_cast<OpId>(i));
    std::vector<Tensor> in(def.min_inputs, m);
    OpAttrs a;
    a.dim2 = 1;
    a.group = group;
    if (def.id == OpId::kWhere) in[0] = mask;
    if (def.id == OpId::kMaskedFill) in[1] = mask;
    if (def.id == OpId::kMatmul) in[1] = empty({4, 3}, DType::kFloat32, kMeta);
    if (def.id == OpId::kPermute) a.dims = {1, 0};
    if (def.id == OpId::kReshape || def.id == OpId::kExpand) a.dims = {3, 4};
    if (def.id == OpId::kSlice) a.end = 2;
    if (def.id == OpId::kAsStrided || def.id == OpId::kAsStridedScatter) {
      a.dims = {3, 4};
      a.strides = {4, 1};
    }
    const Tensor index = empty({3, 4}, DType::kInt64, kMeta);
    if (def.id == OpId::kEmbedding) in[0] = index;
    if (def.id == OpId::kIndexSelect) in[1] = empty({2}, DType::kInt64, kMeta);
    if (def.id == OpId::kGather || def.id == OpId::kScatter || def.id == OpId::kScatterAdd) {
      in[1] = index;
    }
    if (def.id == OpId::kIndexCopy) in[1] = empty({3}, DType::kInt64, kMeta);  // all of dim 0
    Tensor out;
    try {
      out = Dispatch(def.id, in, a);
    } catch (const Error& e) {
      ADD_FAILURE() << def.name << " on meta: " << e.what();
      continue;
    }
    EXPECT_TRUE(out.device().is_meta()) << def.name;
    EXPECT_EQ(out.type(), InferOrThrow(def, in, a)) << def.name;
    if (def.is_elementwise() && out.type() == m.type() && def.id != OpId::kWhere) {
      std::vector<Tensor> self_in = in;
      self_in[0] = empty({3, 4}, DType::kFloat32, kMeta);
      EXPECT_NO_THROW(DispatchInPlace(def.id, self_in, a)) << def.name;
    }
  }
}

TEST(Meta, EveryRegistryRowRunsAsShapeInference) {
  const Tensor m = empty({3, 4}, DType::kFloat32, kMeta);
  const Tensor mask = empty({3, 4}, DType::kBool, kMeta);
  RunThreadRanks(1, [&](ProcessGroup& pg) { RunEveryRowOnMeta(m, mask, pg.id()); });
}

TEST(Meta, ApiFunctionsModulesAndCompiledFunctionsOnMeta) {
  const Tensor m = empty({3, 4}, DType::kFloat32, kMeta);
  EXPECT_EQ(t(m).shape(), (Shape{4, 3}));
  EXPECT_EQ(contiguous(transpose(m, 0, 1)).shape(), (Shape{4, 3}));
  EXPECT_EQ(view(m, {12}).shape(), (Shape{12}));
  EXPECT_EQ(reshape(transpose(m, 0, 1), {12}).shape(), (Shape{12}));
  EXPECT_EQ(to(m, DType::kBFloat16).dtype(), DType::kBFloat16);
  EXPECT_TRUE(to(ones({2}), kMeta).device().is_meta());
  EXPECT_EQ(max(m, {1}).shape(), (Shape{3}));
  EXPECT_EQ(ToString(m), "tensor(..., size=[3, 4], dtype=float32, device=meta)");
  ExpectError([&] { to_vector(m); }, {"meta"}, "to_vector");
  ExpectError([&] { (void)m.data_ptr(); }, {"meta"}, "data_ptr");
  ExpectError([&] { to(m, kCPU); }, {"meta"}, "to cpu");
  Generator gen(0);
  GeGLUMLP mlp(4, 8, gen, {DType::kFloat32, kMeta});
  EXPECT_EQ(mlp(m).shape(), (Shape{3, 4}));
  CausalSelfAttention att(4, 2, gen, {DType::kFloat32, kMeta});
  EXPECT_EQ(att(empty({2, 3, 4}, DType::kFloat32, kMeta)).shape(), (Shape{2, 3, 4}));
  // A compiled function over meta inputs never reads memory: it errors or returns meta tensors.
  try {
    CompiledFn f = compile(
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{relu(in[0]) + 1.0}; }, {m});
    const std::vector<Tensor> out = f({m});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].shape(), m.shape());
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("meta"), std::string::npos) << e.what();
  }
}

// ---- Printing. ------------------------------------------------------------------------------

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST_P(OnDevice, PrintingReadsOnlyThePrintedEdges) {
  // 2^40 elements (an expanded view): reading them all could not even be allocated.
  const Tensor huge = expand(X({1}), {int64_t{1} << 40});
  const std::string s = ToString(huge);
  EXPECT_NE(s.find("size=[1099511627776]"), std::string::npos) << s;
  EXPECT_EQ(Count(s, "..."), 1) << s;
  const Tensor wide = expand(reshape(X({1}), {1, 1}), {int64_t{1} << 30, int64_t{1} << 30});
  EXPECT_EQ(Count(ToString(wide), "..."), 7);  // 1 between rows, 6 within the printed rows
}

TEST_P(OnDevice, PrintingEmptyTensorsLikeTorch) {
  // No elements: "[]" and the size (torch), not one "[]" per entry of the other dims.
  const Device d = GetParam();
  EXPECT_EQ(ToString(empty({0}, DType::kFloat32, d)),
            absl::StrCat("tensor([], dtype=float32, device=", d.str(), ")"));
  EXPECT_EQ(
      ToString(empty({int64_t{1} << 62, 0}, DType::kInt64, d)),
      absl::StrCat("tensor([], size=[4611686018427387904, 0], dtype=int64, device=", d.str(), ")"));
  EXPECT_EQ(ToString(X({1}).as_strided({0, INT64_MAX}, {1, 1}, 0)).substr(0, 40),
            "tensor([], size=[0, 9223372036854775807]");
}

TEST_P(OnDevice, PrintingSummarisesEveryDimLikeTorch) {
  // [10]^6 bfloat16: every dim shows 3 + 3 entries, so 6^6 values and one "..." per dim level.
  const Tensor x = X({10, 10, 10, 10, 10, 10}, DType::kBFloat16);
  const std::string s = ToString(x);
  int64_t values = 0;
  for (size_t i = 0; i + 1 < s.size(); ++i) values += s[i] == '.' && std::isdigit(s[i + 1]);
  EXPECT_EQ(values, 6 * 6 * 6 * 6 * 6 * 6);
  // "..." count: 1 (dim 0) + 6 (dim 1) + 36 + 216 + 1296 + 7776 (innermost rows).
  EXPECT_EQ(Count(s, "..."), 1 + 6 + 36 + 216 + 1296 + 7776);
  // An int tensor of 11^3: the edges in order, with exact values.
  std::vector<double> v(1331);
  for (int i = 0; i < 1331; ++i) v[i] = i;
  const std::string ints = ToString(to(from_vector(v, {11, 11, 11}, DType::kInt64), GetParam()));
  EXPECT_EQ(ints.substr(0, 34), "tensor([[[0, 1, 2, ..., 8, 9, 10],") << ints;
  EXPECT_NE(ints.find("[1320, 1321, 1322, ..., 1328, 1329, 1330]]], size=[11, 11, 11]"),
            std::string::npos)
      << ints;
  EXPECT_NE(ints.find("         ...,\n         [88, 89, 90, ..., 96, 97, 98],"), std::string::npos)
      << ints;
  EXPECT_NE(ints.find("120]],\n\n        [[121, 122, 123, ..., 129, 130, 131],"), std::string::npos)
      << ints;
  EXPECT_NE(ints.find("]],\n\n        ...,\n\n        [[968, 969, 970, ..., 976, 977, 978],"),
            std::string::npos)
      << ints;
}

TEST_P(OnDevice, PrintingIsExactForInt64AndSafeWhileTracing) {
  Tensor big = empty({2}, DType::kInt64);
  big.data<int64_t>()[0] = (int64_t{1} << 53) + 1;
  big.data<int64_t>()[1] = INT64_MIN;
  EXPECT_EQ(ToString(to(big, GetParam())).substr(0, 47),
            "tensor([9007199254740993, -9223372036854775808]");
  // Printing a real tensor (a weight) inside a traced function records nothing.
  const Tensor w = X({40, 40});  // summarised: printing slices it, which must not be recorded
  std::string printed;
  CompiledFn f = compile(
      [&](const std::vector<Tensor>& in) {
        printed = ToString(w);
        return std::vector<Tensor>{in[0] + w};
      },
      {w});
  EXPECT_NE(printed.find("tensor([["), std::string::npos) << printed;
  const std::string graph = f.report({w}).traced_graph;
  EXPECT_EQ(graph.find("slice"), std::string::npos) << graph;
  EXPECT_EQ(graph.find("contiguous"), std::string::npos) << graph;
}

INSTANTIATE_TEST_SUITE_P(Devices, OnDevice, ::testing::Values(kCPU, CUDA(0)), DeviceName);

}  // namespace
}  // namespace kiln
