// Bad-input fuzzer (issue #13: never crash) that knows the rules: random calls of the public API
// on a pool of awkward tensors (0-d, empty dims, every dtype, meta, undefined, expanded,
// transposed, sliced, huge meta shapes) with awkward arguments (negative, huge, INT64_MIN/MAX
// dims and steps; NaN, inf and 1e30 scalars), half of the dims, permutations, shapes and
// partners built to be valid instead. Before each call the fuzzer works out from the documented
// rules (tests/api_rules.h) whether the call is valid: a valid call must return, an invalid one
// must throw kiln::Error whose message begins with the op's name ("matmul: ..."). No crash, no
// other exception, no sanitizer report (it runs under ASan/UBSan in CI). CPU in CI; the CUDA
// instance (same code) runs on a GPU machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/status.h"
#include "tests/api_rules.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

// The pool of tensors, the argument generators, and the check of each call's outcome.
class ApiFuzzer {
 public:
  ApiFuzzer(uint64_t seed, Device device);

  // One random call; "" when it went as the rules say, else what went wrong.
  std::string Step();

  // Runs a call of op `op` that the rules find `valid` or not, and checks the outcome: a valid
  // call returns (or runs out of memory: kResourceExhausted is the machine's limit, not a rule),
  // an invalid one raises kiln::Error beginning with "op:".
  template <typename Fn>
  Tensor Run(const char* op, bool valid, Fn&& fn) {
    ++(valid ? valid_calls_ : invalid_calls_);
    try {
      Tensor r = fn();
      if (!valid) {
        failure_ = absl::StrCat(op, ": returned ", r.defined() ? Describe(r.type()) : "undefined",
                                " where the rules refuse the call");
      }
      return r;
    } catch (const Error& e) {
      if (valid) {
        if (e.code() != absl::StatusCode::kResourceExhausted) {
          failure_ = absl::StrCat(op, ": a valid call raised: ", e.what());
        }
      } else if (!absl::StartsWith(e.what(), absl::StrCat(op, ":"))) {
        failure_ = absl::StrCat(op, ": the error does not begin with the op's name: ", e.what());
      }
      return Tensor();
    }
  }

  int valid_calls() const { return valid_calls_; }
  int invalid_calls() const { return invalid_calls_; }
  Device device() const { return device_; }

  // Arguments: awkward ones, and (half the time) ones built to be valid for x.
  int Pick(int n) { return static_cast<int>(gen_.NextU64() % static_cast<uint64_t>(n)); }
  bool Coin() { return Pick(2) == 0; }
  const Tensor& T() { return pool_[Pick(static_cast<int>(pool_.size()))]; }
  int64_t Int();
  double Scalar();
  Shape Ints(int max_len);
  DType AnyDType() { return static_cast<DType>(Pick(kNumDTypes)); }
  int64_t Dim(const Tensor& x);
  Shape Dims(const Tensor& x, int max_len);
  Shape Permutation(const Tensor& x);
  Shape ReshapeSizes(const Tensor& x);
  Shape ExpandSizes(const Tensor& x);
  const Tensor& Partner(const Tensor& x);
  // A new tensor of random values on `device` (meta: no values), for partners built to be valid.
  Tensor Fresh(const Shape& s, DType t, Device device) {
    return device.is_meta() ? empty(s, t, kMeta) : to(cast(randn(s, gen_) * 3.0, t), device);
  }
  // Whether to build x's partner to be valid: half the time, for a defined x of small dims.
  bool Build(const Tensor& x) {
    if (!x.defined() || x.numel() > 64) return false;
    for (int64_t d : x.shape()) {
      if (d > 64) return false;
    }
    return Coin();
  }

 private:
  Tensor Make(const Shape& s, DType t) { return Fresh(s, t, device_); }

  Generator gen_;
  Device device_;
  std::vector<Tensor> pool_;
  std::string failure_;
  int valid_calls_ = 0, invalid_calls_ = 0;
};

ApiFuzzer::ApiFuzzer(uint64_t seed, Device device) : gen_(seed), device_(device) {
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

int64_t ApiFuzzer::Int() {
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

double ApiFuzzer::Scalar() {
  static const double kScalars[] = {0,    1,     -1,  0.5,      2,         3e9,
                                    1e30, -1e19, NAN, INFINITY, -INFINITY, -0.0};
  return kScalars[Pick(12)];
}

Shape ApiFuzzer::Ints(int max_len) {
  Shape s;
  for (int i = Pick(max_len + 1); i > 0; --i) s.push_back(Int());
  return s;
}

int64_t ApiFuzzer::Dim(const Tensor& x) {
  const int64_t n = std::max<int64_t>(x.defined() ? x.dim() : 0, 1);
  return Coin() ? Pick(static_cast<int>(2 * n)) - n : Int();
}

Shape ApiFuzzer::Dims(const Tensor& x, int max_len) {
  Shape s;
  for (int i = Pick(max_len + 1); i > 0; --i) s.push_back(Dim(x));
  return s;
}

Shape ApiFuzzer::Permutation(const Tensor& x) {
  if (Coin() || !x.defined()) return Ints(4);
  Shape p(x.dim());
  for (int64_t i = 0; i < x.dim(); ++i) p[i] = i;
  for (int64_t i = x.dim() - 1; i > 0; --i) std::swap(p[i], p[Pick(static_cast<int>(i + 1))]);
  for (int64_t& d : p) d -= Coin() ? x.dim() : 0;
  return p;
}

// x's shape with two dims merged, a size-1 dim inserted, or one dim left to infer (-1).
Shape ApiFuzzer::ReshapeSizes(const Tensor& x) {
  if (Coin() || !x.defined()) return Ints(4);
  Shape s = x.shape();
  const size_t i = s.size() >= 2 ? Pick(static_cast<int>(s.size() - 1)) : 0;
  int64_t merged = 0;  // (an empty tensor's other dims may be huge)
  if (s.size() >= 2 && Coin() && !__builtin_mul_overflow(s[i], s[i + 1], &merged)) {
    s[i] = merged;
    s.erase(s.begin() + static_cast<int64_t>(i) + 1);
  }
  if (Coin()) s.insert(s.begin() + Pick(static_cast<int>(s.size() + 1)), 1);
  if (!s.empty() && Coin()) s[Pick(static_cast<int>(s.size()))] = -1;
  return s;
}

// x's shape with new leading dims, its size-1 dims grown, and others kept as -1.
Shape ApiFuzzer::ExpandSizes(const Tensor& x) {
  if (Coin() || !x.defined()) return Ints(4);
  Shape s = x.shape();
  for (int64_t& d : s) d = d == 1 ? Pick(4) : Coin() ? -1 : d;
  for (int i = Pick(3); i > 0; --i) s.insert(s.begin(), Pick(3) + 1);
  return s;
}

// Half the time a pool tensor of x's dtype (matmul's and the norms' partners), else any.
const Tensor& ApiFuzzer::Partner(const Tensor& x) {
  if (Coin() || !x.defined()) return T();
  for (int tries = 0; tries < 8; ++tries) {
    const Tensor& p = T();
    if (p.defined() && p.dtype() == x.dtype()) return p;
  }
  return x;
}

using F = ApiFuzzer;

// All defined and on one device (the dispatcher's first rule).
bool Ready(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (!t->defined() || t->device() != (*ts.begin())->device()) return false;
  }
  return true;
}

// ---- The calls, each with its rule. ----

Tensor CallUnary(F& f) {
  using Fn = Tensor (*)(const Tensor&);
  static const std::pair<const char*, Fn> kOps[] = {
      {"neg", neg},   {"exp", exp},         {"log", log},   {"sqrt", sqrt}, {"rsqrt", rsqrt},
      {"tanh", tanh}, {"sigmoid", sigmoid}, {"relu", relu}, {"silu", silu}};
  const auto& [op, fn] = kOps[f.Pick(9)];
  const Tensor& x = f.T();
  // neg and relu keep the operand's dtype, which may not be bool; silu takes floating operands
  // only (torch); the others compute in floats.
  const bool keeps_dtype = std::string_view(op) == "neg" || std::string_view(op) == "relu";
  const bool floats_only = std::string_view(op) == "silu";
  return f.Run(op,
               x.defined() && !(keeps_dtype && x.dtype() == DType::kBool) &&
                   !(floats_only && !IsFloatingPoint(x.dtype())),
               [&] { return fn(x); });
}

Tensor CallGelu(F& f) {
  const Tensor& x = f.T();
  const char* approximate = f.Coin() ? "tanh" : "none";
  return f.Run("gelu", x.defined() && IsFloatingPoint(x.dtype()),
               [&] { return gelu(x, approximate); });
}

Tensor CallCast(F& f) {
  const Tensor& x = f.T();
  const DType t = f.AnyDType();
  return f.Run("cast", x.defined(), [&] { return cast(x, t); });
}

Tensor CallBinary(F& f) {
  using Fn = Tensor (*)(const Tensor&, const Tensor&);
  static const std::pair<const char*, Fn> kOps[] = {
      {"add", add}, {"sub", sub}, {"mul", mul}, {"div", div}};
  const auto& [op, fn] = kOps[f.Pick(4)];
  const Tensor& a = f.T();
  const Tensor& b = f.T();
  bool valid = Ready({&a, &b});
  if (valid) {
    const auto shape = rules::Broadcast(a.shape(), b.shape());
    const DType t = rules::ResultType(a, b);
    valid = shape && rules::Sized(*shape, IsFloatingPoint(t) ? t : DType::kFloat32);
    // torch refuses a difference with a bool operand
    if (std::string(op) == "sub" && (a.dtype() == DType::kBool || b.dtype() == DType::kBool)) {
      valid = false;
    }
  }
  return f.Run(op, valid, [&] { return fn(a, b); });
}

Tensor CallScalar(F& f) {
  const Tensor& a = f.T();
  const double s = f.Scalar();
  const int which = f.Pick(5);
  static const char* const kOps[] = {"add_scalar", "sub_scalar", "mul_scalar", "div_scalar",
                                     "rsub_scalar"};
  const bool subtracts_bool =
      (which == 1 || which == 4) && a.defined() && a.dtype() == DType::kBool;
  const bool valid =
      a.defined() && !subtracts_bool && (which == 3 || rules::ScalarArith(a.dtype(), s));
  return f.Run(kOps[which], valid, [&] {
    switch (which) {
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
  });
}

Tensor CallWhere(F& f) {
  const Tensor& a = f.T();
  const Tensor& b = f.T();
  const Tensor c = f.Build(a) ? f.Fresh(a.shape(), DType::kBool, a.device()) : f.T();
  bool valid = Ready({&c, &a, &b}) && c.dtype() == DType::kBool;
  if (valid) {
    auto shape = rules::Broadcast(c.shape(), a.shape());
    if (shape) shape = rules::Broadcast(*shape, b.shape());
    valid = shape && rules::Sized(*shape, rules::ResultType(a, b));
  }
  return f.Run("where", valid, [&] { return where(c, a, b); });
}

// masked_fill's rule, out of place: a bool mask that broadcasts with x, a value x's dtype holds.
bool MaskedFillOk(const Tensor& x, const Tensor& mask, double value) {
  if (!Ready({&x, &mask}) || mask.dtype() != DType::kBool) return false;
  const auto shape = rules::Broadcast(x.shape(), mask.shape());
  return shape && rules::Sized(*shape, x.dtype()) && rules::FitsValue(value, x.dtype());
}

// Half the time a mask of x's shape, else any pool tensor.
Tensor Mask(F& f, const Tensor& x) {
  return f.Build(x) ? f.Fresh(x.shape(), DType::kBool, x.device()) : f.T();
}

Tensor CallMaskedFill(F& f) {
  const Tensor& x = f.T();
  const Tensor mask = Mask(f, x);
  const double value = f.Scalar();
  return f.Run("masked_fill", MaskedFillOk(x, mask, value),
               [&] { return masked_fill(x, mask, value); });
}

// The in-place rules beyond the op's own: the result has self's shape and casts to self's dtype,
// self is writable, and no input overlaps self partially.
bool InPlaceOk(const Tensor& self, const Shape& shape, DType dtype, const Tensor* other) {
  return shape == self.shape() && rules::CanCast(dtype, self.dtype()) && rules::Writable(self) &&
         (other == nullptr || !rules::PartialOverlap(self, *other));
}

Tensor CallInPlaceTensor(F& f) {
  const Tensor& self = f.T();
  const Tensor& other = f.T();
  const bool is_add = f.Coin();
  bool valid = Ready({&self, &other});
  if (valid) {
    const auto shape = rules::Broadcast(self.shape(), other.shape());
    valid = shape && InPlaceOk(self, *shape, rules::ResultType(self, other), &other);
  }
  return f.Run(is_add ? "add" : "mul", valid,
               [&] { return is_add ? add_(self, other) : mul_(self, other); });
}

Tensor CallInPlaceScalar(F& f) {
  const Tensor& self = f.T();
  const double s = f.Scalar();
  const bool is_add = f.Coin();
  bool valid = self.defined();
  if (valid) {
    const auto dtype = rules::ScalarArith(self.dtype(), s);
    valid = dtype && InPlaceOk(self, self.shape(), *dtype, nullptr);
  }
  return f.Run(is_add ? "add_scalar" : "mul_scalar", valid,
               [&] { return is_add ? add_(self, s) : mul_(self, s); });
}

Tensor CallMaskedFillInPlace(F& f) {
  const Tensor& self = f.T();
  const Tensor mask = Mask(f, self);
  const double value = f.Scalar();
  const bool valid =
      MaskedFillOk(self, mask, value) &&
      InPlaceOk(self, *rules::Broadcast(self.shape(), mask.shape()), self.dtype(), &mask);
  return f.Run("masked_fill", valid, [&] { return masked_fill_(self, mask, value); });
}

// Whether dim i of x is reduced (all of them when dims is empty).
bool Reduced(const Tensor& x, const Shape& dims, int64_t i) {
  return dims.empty() || std::find_if(dims.begin(), dims.end(), [&](int64_t d) {
                           return (d < 0 ? d + x.dim() : d) == i;
                         }) != dims.end();
}

// max has no identity: no reduced dim may be empty.
bool ReducesEmpty(const Tensor& x, const Shape& dims) {
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (Reduced(x, dims, i) && x.shape()[i] == 0) return true;
  }
  return false;
}

// The result's shape: reduced dims dropped, or kept as 1 (an empty x [0, 2^62] gives [1, 2^62],
// which may be too large a tensor).
Shape ReducedShape(const Tensor& x, const Shape& dims, bool keep) {
  Shape out;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (!Reduced(x, dims, i)) out.push_back(x.shape()[i]);
    if (Reduced(x, dims, i) && keep) out.push_back(1);
  }
  return out;
}

Tensor CallReduce(F& f) {
  const Tensor& x = f.T();
  const Shape dims = f.Dims(x, 2);
  const bool keep = f.Coin();
  const int which = f.Pick(3);
  static const char* const kOps[] = {"sum", "mean", "max"};
  bool valid = x.defined() && rules::ReductionDimsOk(dims, x.dim());
  if (valid && which == 1) valid = IsFloatingPoint(x.dtype());
  if (valid && which == 2) valid = !ReducesEmpty(x, dims);
  if (valid) {  // sum widens integers to int64
    const bool widens = which == 0 && !IsFloatingPoint(x.dtype());
    valid = rules::Sized(ReducedShape(x, dims, keep), widens ? DType::kInt64 : x.dtype());
  }
  return f.Run(kOps[which], valid, [&] {
    return which == 0 ? sum(x, dims, keep) : which == 1 ? mean(x, dims, keep) : max(x, dims, keep);
  });
}

Tensor CallSoftmax(F& f) {
  const Tensor& x = f.T();
  const int64_t dim = f.Dim(x);
  const bool log = f.Coin();
  const bool valid = x.defined() && IsFloatingPoint(x.dtype()) && rules::DimOk(dim, x.dim());
  return f.Run(log ? "log_softmax" : "softmax", valid,
               [&] { return log ? log_softmax(x, dim) : softmax(x, dim); });
}

// The norms' common rule: a floating input of rank >= 1, parameters of shape [its last dim].
bool NormOk(const Tensor& x, const std::vector<const Tensor*>& params) {
  if (!x.defined() || !IsFloatingPoint(x.dtype()) || x.dim() < 1) return false;
  for (const Tensor* p : params) {
    if (!Ready({&x, p}) || p->shape() != Shape{x.shape().back()}) return false;
  }
  return true;
}

// layer_norm's dtype rule (torch 2.11): parameters of the input's dtype, or all float32 under a
// half-precision input.
bool LayerNormDTypesOk(const Tensor& x, const std::vector<const Tensor*>& params) {
  bool same = true, all_f32 = true;
  for (const Tensor* p : params) {
    same = same && p->dtype() == x.dtype();
    all_f32 = all_f32 && p->dtype() == DType::kFloat32;
  }
  const bool half = x.dtype() == DType::kBFloat16 || x.dtype() == DType::kFloat16;
  return same || (half && all_f32);
}

// Half the time a parameter of shape [x's last dim] (of dtype t), else any pool tensor.
Tensor NormParameter(F& f, const Tensor& x, DType t) {
  if (!f.Build(x) || x.dim() < 1) return f.Partner(x);
  return f.Coin() ? Tensor() : f.Fresh({x.shape().back()}, t, x.device());
}

// Weight and bias may be undefined (none), but a bias needs a weight.
Tensor CallLayerNorm(F& f) {
  const Tensor& x = f.T();
  const DType t = x.defined() && f.Coin() ? x.dtype() : DType::kFloat32;
  const Tensor w = NormParameter(f, x, t), b = NormParameter(f, x, t);
  const double eps = f.Scalar();
  std::vector<const Tensor*> params;
  if (w.defined()) params.push_back(&w);
  if (w.defined() && b.defined()) params.push_back(&b);
  const bool valid =
      (w.defined() || !b.defined()) && NormOk(x, params) && LayerNormDTypesOk(x, params);
  return f.Run("layer_norm", valid, [&] { return layer_norm(x, w, b, eps); });
}

// Any weight dtype (torch 2.11's rms_norm computes in float32).
Tensor CallRmsNorm(F& f) {
  const Tensor& x = f.T();
  const Tensor w = NormParameter(f, x, f.AnyDType());
  const double eps = f.Scalar();
  std::vector<const Tensor*> params;
  if (w.defined()) params.push_back(&w);
  return f.Run("rms_norm", NormOk(x, params), [&] { return rms_norm(x, w, eps); });
}

// Floating operands of one dtype.
bool SameFloat(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (!IsFloatingPoint(t->dtype()) || t->dtype() != (*ts.begin())->dtype()) return false;
  }
  return true;
}

// Half the time b is [a's last dim] or [a's last dim, n] of a's dtype.
Tensor CallMatmul(F& f) {
  const Tensor& a = f.T();
  Tensor b = f.Partner(a);
  if (f.Build(a) && a.dim() >= 1) {
    const Shape s = f.Coin() ? Shape{a.shape().back()} : Shape{a.shape().back(), f.Pick(4)};
    b = f.Fresh(s, a.dtype(), a.device());
  }
  bool valid = Ready({&a, &b}) && SameFloat({&a, &b});
  if (valid) {
    const auto shape = rules::MatmulShape(a.shape(), b.shape());
    valid = shape && rules::Sized(*shape, a.dtype());
  }
  return f.Run("matmul", valid, [&] { return matmul(a, b); });
}

// x [..., in], weight [out, in], bias (or none) [out], one floating dtype; half the time the
// weight and bias are built to fit x.
Tensor CallLinear(F& f) {
  const Tensor& x = f.T();
  Tensor w = f.Partner(x), b = f.Partner(x);
  if (f.Build(x) && x.dim() >= 1) {
    const int64_t out = f.Pick(4);
    w = f.Fresh({out, x.shape().back()}, x.dtype(), x.device());
    b = f.Coin() ? Tensor() : f.Fresh({out}, x.dtype(), x.device());
  }
  if (w.defined() && w.dim() == 1) {  // torch's weight of shape (in_features): x @ w (+ bias)
    bool valid =
        Ready({&x, &w}) && SameFloat({&x, &w}) && x.dim() >= 1 && x.shape().back() == w.shape()[0];
    Shape out;
    if (valid) out = Shape(x.shape().begin(), x.shape().end() - 1);
    if (valid && b.defined()) {
      const absl::StatusOr<Shape> s = BroadcastShapes(out, b.shape());
      valid = Ready({&x, &b}) && b.dtype() == x.dtype() && s.ok() && *s == out;
    }
    valid = valid && rules::Sized(out, x.dtype());
    return f.Run("linear", valid, [&] { return linear(x, w, b); });
  }
  bool valid = Ready({&x, &w}) && SameFloat({&x, &w}) && x.dim() >= 1 && w.dim() == 2 &&
               x.shape().back() == w.shape()[1];
  if (valid && b.defined()) {
    valid = Ready({&x, &b}) && b.dtype() == x.dtype() && b.shape() == Shape{w.shape()[0]};
  }
  if (valid) {
    Shape out = x.shape();
    out.back() = w.shape()[0];
    valid = rules::Sized(out, x.dtype());
  }
  return f.Run("linear", valid, [&] { return linear(x, w, b); });
}

Tensor CallTranspose(F& f) {
  const Tensor& x = f.T();
  const int64_t d0 = f.Dim(x), d1 = f.Dim(x);
  const bool valid = x.defined() && rules::DimOk(d0, x.dim()) && rules::DimOk(d1, x.dim());
  return f.Run("transpose", valid, [&] { return transpose(x, d0, d1); });
}

Tensor CallT(F& f) {
  const Tensor& x = f.T();
  return f.Run("t", x.defined() && x.dim() <= 2, [&] { return t(x); });
}

Tensor CallPermute(F& f) {
  const Tensor& x = f.T();
  const Shape dims = f.Permutation(x);
  const bool valid = x.defined() && rules::IsPermutation(dims, x.dim());
  return f.Run("permute", valid, [&] { return permute(x, dims); });
}

Tensor CallReshape(F& f) {
  const Tensor& x = f.T();
  const Shape sizes = f.ReshapeSizes(x);
  const bool valid = x.defined() && rules::ReshapeTarget(sizes, x.numel()).has_value();
  return f.Run("reshape", valid, [&] { return reshape(x, sizes); });
}

Tensor CallView(F& f) {
  const Tensor& x = f.T();
  const Shape sizes = f.ReshapeSizes(x);
  std::optional<Shape> shape;
  if (x.defined()) shape = rules::ReshapeTarget(sizes, x.numel());
  const bool valid = shape && rules::Viewable(x, *shape);
  return f.Run("view", valid, [&] { return view(x, sizes); });
}

Tensor CallExpand(F& f) {
  const Tensor& x = f.T();
  const Shape sizes = f.ExpandSizes(x);
  std::optional<Shape> shape;
  if (x.defined()) shape = rules::ExpandTarget(x.shape(), sizes);
  const bool valid = shape && rules::Sized(*shape, x.dtype());
  return f.Run("expand", valid, [&] { return expand(x, sizes); });
}

// Python's slice bounds clamp, so only the tensor, the dim and the step can be wrong.
Tensor CallSlice(F& f) {
  const Tensor& x = f.T();
  const int64_t dim = f.Dim(x), start = f.Int(), end = f.Int(), step = f.Int();
  const bool valid = x.defined() && x.dim() >= 1 && rules::DimOk(dim, x.dim()) && step > 0;
  return f.Run("slice", valid, [&] { return slice(x, dim, start, end, step); });
}

Tensor CallUnsqueeze(F& f) {
  const Tensor& x = f.T();
  const int64_t dim = f.Coin() ? f.Dim(x) : f.Int();
  const bool valid = x.defined() && rules::DimOk(dim, x.dim() + 1);
  return f.Run("unsqueeze", valid, [&] { return unsqueeze(x, dim); });
}

Tensor CallSqueeze(F& f) {
  const Tensor& x = f.T();
  if (f.Coin()) return f.Run("squeeze", x.defined(), [&] { return squeeze(x); });
  const int64_t dim = f.Dim(x);
  const bool valid = x.defined() && rules::DimOk(dim, x.dim());
  return f.Run("squeeze", valid, [&] { return squeeze(x, dim); });
}

// clone is the contiguous row run unconditionally, so both name "contiguous".
Tensor CallContiguous(F& f) {
  const Tensor& x = f.T();
  const bool copy = f.Coin();
  return f.Run("contiguous", x.defined(), [&] { return copy ? clone(x) : contiguous(x); });
}

Tensor CallTri(F& f) {
  const Tensor& x = f.T();
  const int64_t diagonal = f.Int();
  const bool upper = f.Coin();
  return f.Run(upper ? "triu" : "tril", x.defined() && x.dim() >= 2,
               [&] { return upper ? triu(x, diagonal) : tril(x, diagonal); });
}

// A meta tensor holds no data to move to a real device.
Tensor CallTo(F& f) {
  const Tensor& x = f.T();
  const Device device = f.Coin() ? kCPU : f.device();
  const bool valid = x.defined() && (x.device() == device || !x.device().is_meta());
  return f.Run("to", valid, [&] { return to(x, device); });
}

// Half the time small sizes, strides and offset (overlapping windows among them). A method on
// an undefined handle raises the accessors' error (runtime/tensor.h), which names no op.
Tensor CallAsStrided(F& f) {
  const Tensor& x = f.T();
  Shape sizes = f.Ints(3), strides = f.Ints(3);
  int64_t offset = f.Int();
  if (f.Coin()) {
    sizes.assign(f.Pick(4), 0);
    strides.assign(sizes.size(), 0);
    for (size_t i = 0; i < sizes.size(); ++i) sizes[i] = f.Pick(4), strides[i] = f.Pick(4);
    offset = f.Pick(3);
  }
  const bool valid = x.defined() && rules::AsStridedOk(x, sizes, strides, offset);
  return f.Run(x.defined() ? "as_strided" : "undefined tensor", valid,
               [&] { return x.as_strided(sizes, strides, offset); });
}

// Factories on meta (no memory): the shape must fit, and full's value its dtype.
Tensor CallFactory(F& f) {
  static const Shape kThree[] = {{3}, {1, 3}, {3, 1}, {1, 3, 1}};
  const Shape s = f.Coin() ? f.Ints(3) : kThree[f.Pick(4)];
  const DType dtype = f.AnyDType();
  switch (f.Pick(4)) {
    case 0: {
      const double value = f.Scalar();
      return f.Run("full", rules::FitsValue(value, dtype) && rules::Sized(s, dtype),
                   [&] { return full(s, value, dtype, kMeta); });
    }
    case 1:
      return f.Run("empty", rules::Sized(s, dtype), [&] { return empty(s, dtype, kMeta); });
    case 2: {
      const double start = f.Scalar(), end = f.Scalar(), step = f.Scalar();
      return f.Run("arange", rules::ArangeOk(start, end, step, dtype),
                   [&] { return arange(start, end, step, dtype, kMeta); });
    }
    default: {
      const bool valid = rules::Sized(s, DType::kBool) && rules::Count(s) == 3;
      return f.Run("from_vector", valid, [&] { return from_vector({1, 2, 3}, s, dtype, kMeta); });
    }
  }
}

// Reading a small real tensor back; always valid.
Tensor CallRead(F& f) {
  const Tensor& x = f.T();
  if (!x.defined() || x.device().is_meta() || x.numel() > 64) return x;
  f.Run("to_vector", true, [&] {
    (void)to_vector(x);
    return x;
  });
  return x;
}

using Call = Tensor (*)(F&);
const std::pair<const char*, Call> kCalls[] = {
    {"unary", CallUnary},
    {"gelu", CallGelu},
    {"cast", CallCast},
    {"binary", CallBinary},
    {"scalar", CallScalar},
    {"where", CallWhere},
    {"masked_fill", CallMaskedFill},
    {"inplace_tensor", CallInPlaceTensor},
    {"inplace_scalar", CallInPlaceScalar},
    {"inplace_masked_fill", CallMaskedFillInPlace},
    {"reduce", CallReduce},
    {"softmax", CallSoftmax},
    {"layer_norm", CallLayerNorm},
    {"rms_norm", CallRmsNorm},
    {"matmul", CallMatmul},
    {"linear", CallLinear},
    {"transpose", CallTranspose},
    {"t", CallT},
    {"permute", CallPermute},
    {"reshape", CallReshape},
    {"view", CallView},
    {"expand", CallExpand},
    {"slice", CallSlice},
    {"unsqueeze", CallUnsqueeze},
    {"squeeze", CallSqueeze},
    {"contiguous", CallContiguous},
    {"tri", CallTri},
    {"to", CallTo},
    {"as_strided", CallAsStrided},
    {"factory", CallFactory},
    {"read", CallRead},
};

std::string ApiFuzzer::Step() {
  const auto& [name, call] = kCalls[Pick(static_cast<int>(std::size(kCalls)))];
  failure_.clear();
  try {
    Tensor r = call(*this);
    if (r.defined() && !r.device().is_meta() && r.numel() <= 64) {
      if (Pick(4) == 0) (void)ToString(r);
      if (pool_.size() < 200) pool_.push_back(r);
    }
  } catch (const std::exception& e) {
    return absl::StrCat(name, ": an exception escaped the call: ", e.what());
  }
  return failure_.empty() ? "" : absl::StrCat(name, " call: ", failure_);
}

class ApiFuzz : public ::testing::TestWithParam<Device> {};

TEST_P(ApiFuzz, ValidCallsReturnAndInvalidOnesRaiseKilnErrorsNamingTheOp) {
  if (GetParam().is_cuda()) KILN_SKIP_WITHOUT_GPU();
  const int seeds = EnvInt("KILN_API_FUZZ_SEEDS", 100, 0);  // 500 calls each
  int valid = 0, invalid = 0;
  for (int seed = 0; seed < seeds; ++seed) {
    ApiFuzzer fuzzer(seed, GetParam());
    for (int i = 0; i < 500; ++i) {
      const std::string failure = fuzzer.Step();
      ASSERT_EQ(failure, "") << "seed " << seed << " call " << i;
    }
    valid += fuzzer.valid_calls();
    invalid += fuzzer.invalid_calls();
  }
  // Both outcomes must be common, or the fuzzer stopped testing one of them.
  EXPECT_GE(valid, (valid + invalid) / 4) << valid << " valid, " << invalid << " invalid calls";
  EXPECT_GE(invalid, (valid + invalid) / 4) << valid << " valid, " << invalid << " invalid calls";
}

INSTANTIATE_TEST_SUITE_P(Devices, ApiFuzz, ::testing::Values(kCPU, CUDA(0)),
                         [](const auto& info) { return info.param.is_cuda() ? "Cuda" : "Cpu"; });

}  // namespace
}  // namespace kiln
