// Bad-input fuzzer (issue #13: never crash): random calls of the public API on a pool of awkward
// tensors (0-d, empty dims, every dtype, meta, undefined, expanded, transposed, sliced, huge meta
// shapes) with awkward arguments (negative, huge, INT64_MIN/MAX dims and steps; NaN, inf and
// 1e30 scalars). Every call must either return or throw kiln::Error: no crash, no other
// exception, no sanitizer report (it runs under ASan/UBSan in CI). CPU in CI; the CUDA instance
// (same code) runs on a GPU machine.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/status.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

class ApiFuzzer {
 public:
  ApiFuzzer(uint64_t seed, Device device) : gen_(seed), device_(device) {
    for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kBool, DType::kInt32,
                    DType::kInt64}) {
      for (const Shape& s : {Shape{}, Shape{0}, Shape{3}, Shape{2, 3}, Shape{1, 4}, Shape{2, 0, 3},
                             Shape{2, 1, 3, 1}}) {
        pool_.push_back(Make(s, t));
      }
    }
    pool_.push_back(Tensor());
    pool_.push_back(empty({int64_t{1} << 40, 1}, DType::kFloat32, kMeta));
    pool_.push_back(empty({3, 4}, DType::kFloat32, kMeta));
    pool_.push_back(expand(Make({1, 3}, DType::kFloat32), {4, 3}));
    pool_.push_back(transpose(Make({3, 5}, DType::kFloat32), 0, 1));
    pool_.push_back(slice(Make({9, 2}, DType::kFloat32), 0, 1, 9, 3));
  }

  // One random call; "" when it returned or raised kiln::Error, else what went wrong.
  std::string Step() {
    const int which = Pick(static_cast<int>(Calls().size()));
    const auto& [name, call] = Calls()[which];
    try {
      Tensor r = call(*this);
      if (r.defined() && !r.device().is_meta() && r.numel() <= 64) {
        if (Pick(4) == 0) (void)ToString(r);
        if (pool_.size() < 200) pool_.push_back(r);
      }
    } catch (const Error&) {
      // bad input, reported clearly: fine
    } catch (const std::exception& e) {
      return absl::StrCat(name, ": a non-kiln exception: ", e.what());
    }
    return "";
  }

 private:
  using Call = std::function<Tensor(ApiFuzzer&)>;

  int Pick(int n) { return static_cast<int>(gen_.NextU64() % static_cast<uint64_t>(n)); }
  Tensor Make(const Shape& s, DType t) { return to(cast(randn(s, gen_) * 3.0, t), device_); }
  const Tensor& T() { return pool_[Pick(static_cast<int>(pool_.size()))]; }
  int64_t Int() {
    static const int64_t kInts[] = {0,
                                    1,
                                    2,
                                    3,
                                    -1,
                                    -2,
                                    5,
                                    100,
                                    64,
                                    -7,
                                    17,
                                    4,
                                    INT64_MAX,
                                    INT64_MIN,
                                    int64_t{1} << 40,
                                    int64_t{1} << 62};
    return kInts[Pick(16)];
  }
  double Scalar() {
    static const double kScalars[] = {0,    1,     -1,  0.5,      2,         3e9,
                                      1e30, -1e19, NAN, INFINITY, -INFINITY, -0.0};
    return kScalars[Pick(12)];
  }
  Shape Ints(int max_len) {
    Shape s;
    for (int i = Pick(max_len + 1); i > 0; --i) s.push_back(Int());
    return s;
  }
  DType AnyDType() { return static_cast<DType>(Pick(kNumDTypes)); }

  static const std::vector<std::pair<std::string, Call>>& Calls() {
    using F = ApiFuzzer;
    static const auto* calls = new std::vector<std::pair<std::string, Call>>{
        {"unary",
         [](F& f) {
           return std::vector<Tensor (*)(const Tensor&)>{
               neg, exp, log, sqrt, rsqrt, tanh, sigmoid, relu, silu}[f.Pick(9)](f.T());
         }},
        {"gelu", [](F& f) { return gelu(f.T(), f.Pick(2) ? "tanh" : "none"); }},
        {"cast", [](F& f) { return cast(f.T(), f.AnyDType()); }},
        {"binary",
         [](F& f) {
           const Tensor& a = f.T();
           const Tensor& b = f.T();
           switch (f.Pick(4)) {
             case 0:
               return add(a, b);
             case 1:
               return sub(a, b);
             case 2:
               return mul(a, b);
             default:
               return div(a, b);
           }
         }},
        {"scalar",
         [](F& f) {
           const Tensor& a = f.T();
           const double s = f.Scalar();
           switch (f.Pick(5)) {
             case 0:
               return a + s;
             case 1:
               return a - s;
             case 2:
               return a * s;
             case 3:
               return a / s;
             default:
               return s - a;
           }
         }},
        {"where", [](F& f) { return where(f.T(), f.T(), f.T()); }},
        {"masked_fill", [](F& f) { return masked_fill(f.T(), f.T(), f.Scalar()); }},
        {"inplace",
         [](F& f) {
           const Tensor& self = f.T();
           switch (f.Pick(5)) {
             case 0:
               return add_(self, f.T());
             case 1:
               return mul_(self, f.T());
             case 2:
               return add_(self, f.Scalar());
             case 3:
               return mul_(self, f.Scalar());
             default:
               return masked_fill_(self, f.T(), f.Scalar());
           }
         }},
        {"reduce",
         [](F& f) {
           const Tensor& x = f.T();
           const Shape dims = f.Ints(2);
           const bool keep = f.Pick(2);
           switch (f.Pick(3)) {
             case 0:
               return sum(x, dims, keep);
             case 1:
               return mean(x, dims, keep);
             default:
               return max(x, dims, keep);
           }
         }},
        {"softmax",
         [](F& f) { return f.Pick(2) ? softmax(f.T(), f.Int()) : log_softmax(f.T(), f.Int()); }},
        {"norm",
         [](F& f) {
           return f.Pick(2) ? layer_norm(f.T(), f.T(), f.T(), f.Scalar())
                            : rms_norm(f.T(), f.T(), f.Scalar());
         }},
        {"matmul", [](F& f) { return matmul(f.T(), f.T()); }},
        {"linear", [](F& f) { return linear(f.T(), f.T(), f.T()); }},
        {"transpose", [](F& f) { return transpose(f.T(), f.Int(), f.Int()); }},
        {"t", [](F& f) { return t(f.T()); }},
        {"permute", [](F& f) { return permute(f.T(), f.Ints(4)); }},
        {"reshape", [](F& f) { return reshape(f.T(), f.Ints(4)); }},
        {"view", [](F& f) { return view(f.T(), f.Ints(4)); }},
        {"expand", [](F& f) { return expand(f.T(), f.Ints(4)); }},
        {"slice", [](F& f) { return slice(f.T(), f.Int(), f.Int(), f.Int(), f.Int()); }},
        {"unsqueeze", [](F& f) { return unsqueeze(f.T(), f.Int()); }},
        {"squeeze", [](F& f) { return f.Pick(2) ? squeeze(f.T(), f.Int()) : squeeze(f.T()); }},
        {"contiguous", [](F& f) { return f.Pick(2) ? contiguous(f.T()) : clone(f.T()); }},
        {"tri", [](F& f) { return f.Pick(2) ? triu(f.T(), f.Int()) : tril(f.T(), f.Int()); }},
        {"to", [](F& f) { return f.Pick(2) ? to(f.T(), kCPU) : to(f.T(), f.device_); }},
        {"as_strided", [](F& f) { return f.T().as_strided(f.Ints(3), f.Ints(3), f.Int()); }},
        {"factory",
         [](F& f) {
           const Shape s = f.Ints(3);
           switch (f.Pick(4)) {
             case 0:
               return full(s, f.Scalar(), f.AnyDType(), kMeta);
             case 1:
               return empty(s, f.AnyDType(), kMeta);
             case 2:
               return arange(f.Scalar(), f.Scalar(), f.Scalar(), f.AnyDType(), kMeta);
             default:
               return from_vector({1, 2, 3}, s, f.AnyDType(), kMeta);
           }
         }},
        {"read",
         [](F& f) {
           const Tensor& x = f.T();
           if (x.defined() && !x.device().is_meta() && x.numel() <= 64) (void)to_vector(x);
           return x;
         }},
    };
    return *calls;
  }

  Generator gen_;
  Device device_;
  std::vector<Tensor> pool_;
};

class ApiFuzz : public ::testing::TestWithParam<Device> {};

TEST_P(ApiFuzz, RandomCallsReturnOrRaiseKilnErrors) {
  if (GetParam().is_cuda()) KILN_SKIP_WITHOUT_GPU();
  const int seeds = EnvInt("KILN_API_FUZZ_SEEDS", 100, 0);  // 500 calls each
  for (int seed = 0; seed < seeds; ++seed) {
    ApiFuzzer fuzzer(seed, GetParam());
    for (int i = 0; i < 500; ++i) {
      const std::string failure = fuzzer.Step();
      ASSERT_EQ(failure, "") << "seed " << seed << " call " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, ApiFuzz, ::testing::Values(kCPU, CUDA(0)),
                         [](const auto& info) { return info.param.is_cuda() ? "Cuda" : "Cpu"; });

}  // namespace
}  // namespace kiln
