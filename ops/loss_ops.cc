// Loss functions with torch.nn.functional's names and semantics (see ops.h): cross_entropy,
// nll_loss, mse_loss, l1_loss, smooth_l1_loss, huber_loss, binary_cross_entropy(_with_logits)
// and kl_div, written with the registry's ops (eager runs their kernels, a trace records them).
// Half inputs compute in float32 and the result is rounded once to the input's dtype.
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "ops/composite_helpers.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {
using namespace composite;  // NOLINT: the helpers of every composite file

namespace {

// Throws naming `fn` unless `reduction` is one torch's losses take ("batchmean" only for kl_div).
void CheckReduction(const char* fn, std::string_view reduction, bool batchmean = false) {
  KILN_CHECK(reduction == "mean" || reduction == "sum" || reduction == "none" ||
                 (batchmean && reduction == "batchmean"),
             fn, ": reduction must be \"mean\", \"sum\", \"none\"",
             batchmean ? " or \"batchmean\"" : "", ", got \"", std::string(reduction), "\"");
}

// The elementwise `loss` reduced as asked: its mean, its sum, or itself.
Tensor Reduce(const Tensor& loss, std::string_view reduction) {
  if (reduction == "sum") return sum(loss);
  if (reduction == "mean") return mean(loss);
  return loss;
}

// Checks a pointwise loss's operands: defined, floating, and (as torch) of one shape when
// `same_shape`, else broadcastable; returns their common floating dtype.
DType CheckPointwise(const char* fn, const Tensor& input, const Tensor& target,
                     std::string_view reduction, bool same_shape) {
  CheckDefined(fn, input);
  CheckDefined(fn, target);
  CheckReduction(fn, reduction);
  const std::string got =
      absl::StrCat("input ", Describe(input.type()), ", target ", Describe(target.type()));
  KILN_CHECK(IsFloatingPoint(input.dtype()) && IsFloatingPoint(target.dtype()), fn,
             ": input and target must be floating tensors (as in torch), got ", got);
  if (same_shape) {
    KILN_CHECK(input.shape() == target.shape(), fn,
               ": the target must have the input's shape (as in torch), got ", got);
  } else {
    KILN_CHECK(BroadcastShapes(input.shape(), target.shape()).ok(), fn,
               ": input and target do not broadcast, got ", got);
  }
  return PromoteTypes(input.dtype(), target.dtype());
}

// loss(input, target) computed in float32, reduced, in their common dtype.
template <typename F>
Tensor PointwiseLoss(const char* fn, const Tensor& input, const Tensor& target,
                     std::string_view reduction, bool same_shape, F&& loss) {
  const DType t = CheckPointwise(fn, input, target, reduction, same_shape);
  return Named(fn, [&] {
    const DType f32 = DType::kFloat32;
    return cast(Reduce(loss(cast(input, f32), cast(target, f32)), reduction), t);
  });
}

// The class dim of a classification loss's input ([N, C, ...] or [C]) and the target's shape it
// needs, or the error naming `fn`.
int64_t CheckClassShapes(const char* fn, const Tensor& x, const Tensor& target) {
  const std::string got = absl::StrCat("input ", Shapes(x), ", target ", Shapes(target));
  KILN_CHECK(x.dim() >= 1, fn, ": the input must have a class dim, got ", got);
  KILN_CHECK(IsFloatingPoint(x.dtype()), fn, ": the input must be floating, got ",
             DTypeName(x.dtype()), " (", got, ")");
  KILN_CHECK(!IsFloatingPoint(target.dtype()) && target.dtype() != DType::kBool, fn,
             ": the target must hold class indices (an integer tensor), got ",
             DTypeName(target.dtype()), " (", got, "); probability targets are not supported");
  const int64_t class_dim = x.dim() == 1 ? 0 : 1;
  Shape want = x.shape();
  want.erase(want.begin() + class_dim);
  KILN_CHECK(target.shape() == want, fn, ": the target must be ", ShapeString(want),
             " (the input's shape without the class dim ", class_dim, "), got ", got);
  KILN_CHECK(x.size(class_dim) > 0, fn, ": no classes (", got, ")");
  return class_dim;
}

// ClassificationLoss's work on checked arguments.
template <typename F>
Tensor PickedLoss(const Tensor& input, const Tensor& target, int64_t c, int64_t ignore_index,
                  std::string_view reduction, F&& loss_of) {
  const Tensor x = cast(input, DType::kFloat32);
  const Tensor kept = ne(target, ignore_index);
  // Ignored elements read class 0 (their index may be anything); a kept one outside [0, C) is
  // gather's error.
  const Tensor index = unsqueeze(where(kept, target, zeros_like(target)), c);
  const Tensor picked = squeeze(gather(x, c, cast(index, DType::kInt64)), c);
  const Tensor loss = where(kept, loss_of(x, picked, c), zeros_like(picked));
  Tensor out = loss;
  if (reduction == "sum") out = sum(loss);
  if (reduction == "mean") out = div(sum(loss), sum(cast(kept, x.dtype())));
  return cast(out, input.dtype());
}

// The classification loss `fn`: loss_of(x, picked, c) per element, where c is the class dim
// and picked x's value at the target class along it (x in float32); elements whose target is
// ignore_index count for nothing, and "mean" averages over the others (NaN when none is left).
// Bad arguments are errors naming `fn`.
template <typename F>
Tensor ClassificationLoss(const char* fn, const Tensor& input, const Tensor& target,
                          int64_t ignore_index, std::string_view reduction, F&& loss_of) {
  CheckDefined(fn, input);
  CheckDefined(fn, target);
  CheckReduction(fn, reduction);
  const int64_t c = CheckClassShapes(fn, input, target);
  return Named(fn, [&] { return PickedLoss(input, target, c, ignore_index, reduction, loss_of); });
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                     std::string_view reduction) {
  return ClassificationLoss("cross_entropy", logits, target, ignore_index, reduction,
                            [](const Tensor& x, const Tensor& picked, int64_t c) {
                              return sub(logsumexp(x, {c}), picked);
                            });
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index,
                std::string_view reduction) {
  return ClassificationLoss(
      "nll_loss", log_probs, target, ignore_index, reduction,
      [](const Tensor&, const Tensor& picked, int64_t) { return neg(picked); });
}

Tensor mse_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  return PointwiseLoss("mse_loss", input, target, reduction, /*same_shape=*/false,
                       [](const Tensor& x, const Tensor& y) {
                         const Tensor d = sub(x, y);
                         return mul(d, d);
                       });
}

Tensor l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  return PointwiseLoss("l1_loss", input, target, reduction, /*same_shape=*/false,
                       [](const Tensor& x, const Tensor& y) { return abs(sub(x, y)); });
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction,
                      double beta) {
  KILN_CHECK(beta >= 0, "smooth_l1_loss: beta must be >= 0 (as in torch), got ", beta);
  if (beta == 0) return Named("smooth_l1_loss", [&] { return l1_loss(input, target, reduction); });
  return PointwiseLoss("smooth_l1_loss", input, target, reduction, /*same_shape=*/false,
                       [beta](const Tensor& x, const Tensor& y) {
                         const Tensor d = abs(sub(x, y));
                         return where(lt(d, beta), mul(mul(d, d), 0.5 / beta), sub(d, 0.5 * beta));
                       });
}

Tensor huber_loss(const Tensor& input, const Tensor& target, std::string_view reduction,
                  double delta) {
  KILN_CHECK(delta > 0, "huber_loss: delta must be > 0 (as in torch), got ", delta);
  return PointwiseLoss("huber_loss", input, target, reduction, /*same_shape=*/false,
                       [delta](const Tensor& x, const Tensor& y) {
                         const Tensor d = abs(sub(x, y));
                         return where(le(d, delta), mul(mul(d, d), 0.5),
                                      mul(sub(d, 0.5 * delta), delta));
                       });
}

namespace {

// torch's rule for binary_cross_entropy's input: every element in [0, 1] (a NaN is not). Read
// eagerly, a sync on CUDA (torch asserts on the device); a traced call records no check, and an
// element outside [0, 1] gives NaN there.
void CheckProbabilities(const char* fn, const Tensor& x) {
  if (CurrentDispatchHook() != nullptr || x.device().is_meta() || x.numel() == 0) return;
  KILN_CHECK(item<bool>(all(logical_and(ge(x, 0.0), le(x, 1.0)))), fn,
             ": all elements of input should be between 0 and 1 (input ", Shapes(x), ")");
}

}  // namespace

Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, std::string_view reduction) {
  // -(t log x + (1 - t) log(1 - x)), each log clamped at -100 as torch's (so 0 and 1 are finite).
  return PointwiseLoss("binary_cross_entropy", input, target, reduction, /*same_shape=*/true,
                       [](const Tensor& x, const Tensor& t) {
                         CheckProbabilities("binary_cross_entropy", x);
                         const Tensor log_x = clamp_min(log(x), -100.0);
                         const Tensor log_1mx = clamp_min(log((1.0 - x)), -100.0);
                         return neg(add(mul(t, log_x), mul((1.0 - t), log_1mx)));
                       });
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        std::string_view reduction, const Tensor& pos_weight) {
  CheckDefined("binary_cross_entropy_with_logits", input);
  CheckDefined("binary_cross_entropy_with_logits", target);
  if (pos_weight.defined()) {
    const absl::StatusOr<Shape> joint = BroadcastShapes(pos_weight.shape(), input.shape());
    KILN_CHECK(IsFloatingPoint(pos_weight.dtype()) && joint.ok() && *joint == input.shape(),
               "binary_cross_entropy_with_logits: pos_weight must be a floating tensor that "
               "broadcasts to the input's shape, got pos_weight ",
               Describe(pos_weight.type()), ", input ", Shapes(input));
  }
  // (1 - t) x + (1 + (p - 1) t) (log1p(exp(-|x|)) + max(-x, 0)): stable for any x.
  return PointwiseLoss("binary_cross_entropy_with_logits", input, target, reduction,
                       /*same_shape=*/true, [&](const Tensor& x, const Tensor& t) {
                         const Tensor soft = add(log1p(exp(neg(abs(x)))), clamp_min(neg(x), 0.0));
                         Tensor scale = ones_like(t);
                         if (pos_weight.defined()) {
                           scale = add(mul(sub(cast(pos_weight, t.dtype()), 1.0), t), 1.0);
                         }
                         return add(mul((1.0 - t), x), mul(scale, soft));
                       });
}

Tensor kl_div(const Tensor& input, const Tensor& target, std::string_view reduction,
              bool log_target) {
  CheckReduction("kl_div", reduction, /*batchmean=*/true);
  const bool batchmean = reduction == "batchmean";
  // torch's form: xlogy(t, t) - t x (xlogy is 0 where t is 0, so a NaN input still shows);
  // log_target: exp(t) (t - x).
  const Tensor loss = PointwiseLoss(
      "kl_div", input, target, "none", /*same_shape=*/false, [&](const Tensor& x, const Tensor& t) {
        if (log_target) return mul(exp(t), sub(t, x));
        const Tensor xlogy = where(eq(t, 0.0), zeros_like(t), mul(t, log(t)));
        return sub(xlogy, mul(t, x));
      });
  return Named("kl_div", [&] {
    if (!batchmean) return Reduce(loss, reduction);
    const int64_t batch = input.dim() == 0 ? 1 : input.size(0);
    return div(sum(loss), static_cast<double>(batch));
  });
}

}  // namespace kiln
