// The eager dispatcher (see dispatch.h).
#include "ops/dispatch.h"

#include <array>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ops/cuda/gemv_chain.h"
#include "ops/infer.h"
#include "profiler/host.h"
#include "runtime/build_config.h"
#include "runtime/status.h"

namespace kiln {
namespace {

thread_local DispatchHook* g_hook = nullptr;

std::string DescribeOperands(absl::Span<const Tensor> inputs) {
  return absl::StrJoin(inputs, ", ", [](std::string* out, const Tensor& t) {
    absl::StrAppend(out, t.defined() ? Describe(t.type()) : "undefined");
  });
}

std::string DescribeTypes(absl::Span<const TensorType> types) {
  return absl::StrJoin(types, ", ", [](std::string* out, const TensorType& t) {
    absl::StrAppend(out, Describe(t));
  });
}

[[noreturn]] void FailWith(const OpDef& def, const std::string& operands, absl::StatusCode code,
                           const std::string& why) {
  throw Error(absl::Status(code, absl::StrCat(def.name, ": ", why, " (operands: ", operands, ")")));
}

[[noreturn]] void Fail(const OpDef& def, absl::Span<const Tensor> inputs, absl::StatusCode code,
                       const std::string& why) {
  FailWith(def, DescribeOperands(inputs), code, why);
}

void CheckOperands(const OpDef& def, absl::Span<const Tensor> inputs) {
  const int n = static_cast<int>(inputs.size());
  if (n < def.min_inputs || n > def.max_inputs) {
    Fail(def, inputs, absl::StatusCode::kInvalidArgument,
         absl::StrCat("expected ", def.min_inputs,
                      def.min_inputs == def.max_inputs ? "" : absl::StrCat("..", def.max_inputs),
                      " inputs, got ", n));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) {
      Fail(def, inputs, absl::StatusCode::kInvalidArgument,
           absl::StrCat("input ", i, " is an undefined tensor (Tensor())"));
    }
    if (t.is_placeholder()) {  // only reached when no trace records this call
      Fail(def, inputs, absl::StatusCode::kFailedPrecondition,
           absl::StrCat("input ", i, " is a placeholder of a function traced by kiln::compile ",
                        "that escaped its trace; it holds no data and cannot run eagerly"));
    }
    if (t.device() != inputs[0].device()) {
      Fail(def, inputs, absl::StatusCode::kInvalidArgument,
           absl::StrCat("all operands must be on one device, got ", inputs[0].device().str(),
                        " and ", t.device().str()));
    }
  }
}

// The inferred type, or an error when its element count or byte size overflows (broadcasting
// [2^40, 1] with [1, 2^40], or a batch of matmuls, can ask for more than int64 counts).
absl::StatusOr<TensorType> InferSized(const OpDef& def, absl::Span<const TensorType> types,
                                      const OpAttrs& attrs) {
  absl::StatusOr<TensorType> type = def.infer(types, attrs);
  if (!type.ok()) return type;
  int64_t count = 1, bytes = 0;
  bool unusual = false;  // a negative dim or an overflow (which a zero dim may still excuse)
  for (int64_t d : type->shape) unusual |= d < 0 || __builtin_mul_overflow(count, d, &count);
  if (!unusual && !__builtin_mul_overflow(count, DTypeSize(type->dtype), &bytes)) {
    return type;  // the common case, without a StatusOr (as NumElements, then the checked count)
  }
  absl::StatusOr<int64_t> numel = CheckedNumElements(type->shape);
  if (!numel.ok() || __builtin_mul_overflow(*numel, DTypeSize(type->dtype), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("the result shape ", ShapeString(type->shape),
                                                   " has more elements or bytes than fit in "
                                                   "int64"));
  }
  return type;
}

void RunKernel(const OpDef& def, absl::Span<const Tensor> inputs, const Tensor& out,
               const OpAttrs& attrs) {
  const Device device = out.device();
  if (device.is_meta()) return;
  const KernelFn kernel = device.is_cuda() ? def.cuda : def.cpu;
  if (kernel == nullptr) {
    Fail(def, inputs, absl::StatusCode::kUnimplemented,
         absl::StrCat("no kernel for device ", device.str()));
  }
  if (out.numel() == 0) return;
  if constexpr (kWithCuda) {
    // GEMVs a compiled plan's chain region holds launch first (linear's kernel flushes itself
    // where it does not defer): ops/cuda/gemv_chain.h.
    if (device.is_cuda() && def.id != OpId::kLinear) cuda_ops::FlushDeferredGemvs();
  }
  kernel(def, inputs, out, attrs);
}

}  // namespace

TensorType InferOrThrow(const OpDef& def, absl::Span<const Tensor> inputs, const OpAttrs& attrs) {
  CheckOperands(def, inputs);
  absl::InlinedVector<TensorType, 3> types;
  for (const Tensor& t : inputs) types.push_back(t.type());
  absl::StatusOr<TensorType> type = InferSized(def, types, attrs);
  if (!type.ok()) Fail(def, inputs, type.status().code(), std::string(type.status().message()));
  return *std::move(type);
}

TensorType InferTypesOrThrow(const OpDef& def, absl::Span<const TensorType> types,
                             const OpAttrs& attrs) {
  const int n = static_cast<int>(types.size());
  if (n < def.min_inputs || n > def.max_inputs) {
    FailWith(def, DescribeTypes(types), absl::StatusCode::kInvalidArgument,
             absl::StrCat("expected ", def.min_inputs, "..", def.max_inputs, " inputs, got ", n));
  }
  for (const TensorType& t : types) {
    if (t.device != types[0].device) {
      FailWith(def, DescribeTypes(types), absl::StatusCode::kInvalidArgument,
               "all operands must be on one device");
    }
  }
  absl::StatusOr<TensorType> type = InferSized(def, types, attrs);
  if (!type.ok()) {
    FailWith(def, DescribeTypes(types), type.status().code(), std::string(type.status().message()));
  }
  return *std::move(type);
}

namespace {

Tensor RunOp(const OpDef& def, absl::Span<const Tensor> inputs, const OpAttrs& attrs) {
  TensorType type = InferOrThrow(def, inputs, attrs);
  if (def.view != nullptr) return def.view(inputs[0], type, attrs);
  Tensor out = NewOutput(def, type);
  RunKernel(def, inputs, out, attrs);
  return out;
}

// torch's canCast: a result may be written into self unless that turns a floating value into an
// integer, or a number into a bool.
bool CanCast(DType from, DType to) {
  if (IsFloatingPoint(from) && !IsFloatingPoint(to)) return false;
  return from == DType::kBool || to != DType::kBool;
}

// Input i of an in-place op overlapping self as `overlap` says: partly is refused for every such
// op, fully for a kernel that writes only what changes (it would read what it wrote).
void RefuseOverlapWithSelf(const OpDef& def, absl::Span<const Tensor> inputs, size_t i,
                           MemOverlap overlap) {
  if (overlap == MemOverlap::kPartial || (def.updates_self && overlap == MemOverlap::kFull)) {
    Fail(def, inputs, absl::StatusCode::kInvalidArgument,
         absl::StrCat("in-place: some elements of input ", i, " and of self (the written-to ",
                      "tensor) refer to the same memory location; clone() the input first"));
  }
}

// torch's checks on self for an in-place op: the result keeps self's shape, casts to self's
// dtype, self has no element twice, and no input partially overlaps self (nor fully, for a kernel
// that writes only what changes: index_copy_ and scatter_ read their other inputs while self
// changes, so they refuse even self as an input, torch's assert_no_overlap; add_(x, x) reads
// each element before writing it). Returns whether some
// input's overlap with self is too hard to classify: such an input is read through a copy, so
// the result never depends on the order elements are written in.
bool CheckInPlace(const OpDef& def, absl::Span<const Tensor> inputs, const TensorType& type) {
  const Tensor& self = inputs[0];
  auto fail = [&](const std::string& why) {
    Fail(def, inputs, absl::StatusCode::kInvalidArgument, absl::StrCat("in-place: ", why));
  };
  if (def.view != nullptr) fail("a view op has no in-place form");
  if (type.shape != self.shape()) {
    fail(absl::StrCat("the result shape ", ShapeString(type.shape), " differs from self's ",
                      self.shape_string(), " (an in-place op cannot broadcast self)"));
  }
  if (!CanCast(type.dtype, self.dtype())) {
    fail(absl::StrCat("a ", DTypeName(type.dtype), " result cannot be written into ",
                      DTypeName(self.dtype()), " self (torch's casting rule)"));
  }
  if (self.has_internal_overlap()) {
    fail(
        "self is an expanded (broadcast) or overlapping view: more than one of its elements "
        "refers to a single memory location; call clone() or contiguous() first");
  }
  bool too_hard = false;
  for (size_t i = 1; i < inputs.size(); ++i) {
    const MemOverlap overlap = GetMemOverlap(self, inputs[i]);
    RefuseOverlapWithSelf(def, inputs, i, overlap);
    too_hard = too_hard || overlap == MemOverlap::kTooHard;
  }
  return too_hard;
}

// The inputs with a contiguous copy of each whose overlap with self is too hard to classify.
absl::InlinedVector<Tensor, 3> CopyHardOverlaps(absl::Span<const Tensor> inputs) {
  absl::InlinedVector<Tensor, 3> reads(inputs.begin(), inputs.end());
  for (size_t i = 1; i < reads.size(); ++i) {
    if (GetMemOverlap(inputs[0], reads[i]) == MemOverlap::kTooHard) {
      reads[i] = RunOp(GetOpDef(OpId::kContiguous), {reads[i]}, {});
    }
  }
  return reads;
}

const Tensor& RunOpInPlace(const OpDef& def, absl::Span<const Tensor> inputs,
                           const OpAttrs& attrs) {
  const TensorType type = InferOrThrow(def, inputs, attrs);
  if (CheckInPlace(def, inputs, type)) {
    RunKernel(def, CopyHardOverlaps(inputs), inputs[0], attrs);
  } else {
    RunKernel(def, inputs, inputs[0], attrs);  // the common path copies no tensor
  }
  if (inputs[0].storage() != nullptr) inputs[0].storage()->BumpVersion();
  return inputs[0];
}

// True when some input shares memory with `out` (fully, partly, or in a way too hard to tell).
bool ReadsOverlap(absl::Span<const Tensor> inputs, const Tensor& out) {
  for (const Tensor& in : inputs) {
    if (in.defined() && GetMemOverlap(out, in) != MemOverlap::kNo) return true;
  }
  return false;
}

// The profiled paths, out of line so the common path keeps one branch on the profiler flag.
[[gnu::noinline]] Tensor RunOpProfiled(const OpDef& def, absl::Span<const Tensor> inputs,
                                       const OpAttrs& attrs) {
  profiler::OpRange range(def.name, inputs);
  return RunOp(def, inputs, attrs);
}

[[gnu::noinline]] const Tensor& RunOpInPlaceProfiled(const OpDef& def,
                                                     absl::Span<const Tensor> inputs,
                                                     const OpAttrs& attrs) {
  profiler::OpRange range(def.name, inputs);
  return RunOpInPlace(def, inputs, attrs);
}

}  // namespace

Tensor NewOutput(const OpDef& def, const TensorType& type) {
  const int64_t rank = static_cast<int64_t>(type.shape.size());
  if (!def.heads_last_output || rank < 3) return Tensor::Empty(type);
  Shape stored = type.shape;  // [..., L, H, E]
  std::swap(stored[rank - 3], stored[rank - 2]);
  const Tensor t = Tensor::Empty(stored, type.dtype, type.device);
  Strides strides = t.strides();
  std::swap(strides[rank - 3], strides[rank - 2]);
  return t.as_strided(type.shape, strides, t.offset());
}

namespace {

// torch converts each operand of an elementwise op to the common dtype before the op. Only a
// zero-dim operand can be wider than that (infer::ResultType: a float32 0-d tensor against
// bfloat16 x, int64 against int32), so that one is converted here, for every backend and the
// trace alike: compared or combined at its own width, eq(bf16 0.1, f32 0-d 0.1) would be false
// and maximum(int32 5, int64 0-d 2^32 + 1) 2^32 + 1.
struct ZeroDimConversion {
  int operand = -1;  // -1: none
  DType to = DType::kFloat32;
};

// The zero-dim operand of a binary row (OpDef::common_dtype_operands) to convert, from `first`
// on (1 in place, where self is written and keeps its type).
ZeroDimConversion ZeroDimOperandToConvert(const OpDef& def, absl::Span<const Tensor> in,
                                          const OpAttrs& attrs, int first) {
  if (!def.common_dtype_operands || in.size() != 2 || !in[0].defined() || !in[1].defined() ||
      (in[0].dim() == 0) == (in[1].dim() == 0)) {
    return {};
  }
  const int zero = in[0].dim() == 0 ? 0 : 1;
  // A bool's 0 and 1 are exact in every type, and the op's own rules about bools (sub refuses
  // one) must see it as given.
  if (zero < first || in[zero].dtype() == DType::kBool) return {};
  const std::array<TensorType, 2> types = {in[0].type(), in[1].type()};
  const DType common = infer::ResultType(types[0], types[1]);
  if (in[zero].dtype() == common) return {};
  if (!IsFloatingPoint(common)) {
    // A row that computes integers in floating point (div, atan2) reads the operands as they are.
    const absl::StatusOr<TensorType> out = def.infer(types, attrs);
    if (!out.ok() || IsFloatingPoint(out->dtype)) return {};
  }
  return {zero, common};
}

// `in` with the operand `c` names converted.
std::array<Tensor, 2> WithZeroDimConverted(absl::Span<const Tensor> in,
                                           const ZeroDimConversion& c) {
  std::array<Tensor, 2> out = {in[0], in[1]};
  OpAttrs a;
  a.dtype = c.to;
  out[c.operand] = Dispatch(OpId::kCast, {in[c.operand]}, a);
  return out;
}

}  // namespace

Tensor Dispatch(OpId id, absl::Span<const Tensor> inputs, const OpAttrs& attrs) {
  const OpDef& def = GetOpDef(id);
  if (const ZeroDimConversion c = ZeroDimOperandToConvert(def, inputs, attrs, 0);
      KILN_PREDICT_FALSE(c.operand >= 0)) {
    return Dispatch(id, WithZeroDimConverted(inputs, c), attrs);
  }
  if (g_hook != nullptr) return g_hook->Record(def, inputs, attrs, /*in_place=*/false);
  if (KILN_PREDICT_FALSE(profiler::IsActive())) return RunOpProfiled(def, inputs, attrs);
  return RunOp(def, inputs, attrs);
}

// CheckInPlace's overlap rule for a trace, whose tensors have no memory but share a storage
// object where they view one input: an input partly overlapping self, or self itself as an input
// of a kernel that writes only what changes, is refused as eager refuses it.
void RefuseOverlapsInTrace(const OpDef& def, absl::Span<const Tensor> inputs) {
  for (size_t i = 1; i < inputs.size(); ++i) {
    if (inputs[i].defined())
      RefuseOverlapWithSelf(def, inputs, i, GetLayoutOverlap(inputs[0], inputs[i]));
  }
}

const Tensor& DispatchInPlace(OpId id, absl::Span<const Tensor> inputs, const OpAttrs& attrs) {
  const OpDef& def = GetOpDef(id);
  if (const ZeroDimConversion c = ZeroDimOperandToConvert(def, inputs, attrs, 1);
      KILN_PREDICT_FALSE(c.operand >= 0)) {
    const std::array<Tensor, 2> converted = WithZeroDimConverted(inputs, c);
    DispatchInPlace(id, converted, attrs);
    return inputs[0];
  }
  if (g_hook != nullptr) {
    RefuseOverlapsInTrace(def, inputs);
    g_hook->Record(def, inputs, attrs, /*in_place=*/true);
    return inputs[0];
  }
  if (KILN_PREDICT_FALSE(profiler::IsActive())) return RunOpInPlaceProfiled(def, inputs, attrs);
  return RunOpInPlace(def, inputs, attrs);
}

void DispatchOut(OpId id, absl::Span<const Tensor> inputs, const OpAttrs& attrs,
                 const Tensor& out) {
  const OpDef& def = GetOpDef(id);
  if (g_hook != nullptr || def.view != nullptr || !out.defined()) {
    Fail(def, inputs, absl::StatusCode::kInvalidArgument,
         "an out= call needs a defined output, a non-view op and no active trace");
  }
  const TensorType type = InferOrThrow(def, inputs, attrs);
  if (!(type == out.type())) {
    Fail(def, inputs, absl::StatusCode::kInvalidArgument,
         absl::StrCat("out= tensor is ", Describe(out.type()), " but the result is ",
                      Describe(type)));
  }
  if (out.has_internal_overlap()) {
    Fail(def, inputs, absl::StatusCode::kInvalidArgument,
         "out= tensor is an expanded (broadcast) or overlapping view: more than one of its "
         "elements refers to a single memory location");
  }
  std::optional<profiler::OpRange> range;
  if (KILN_PREDICT_FALSE(profiler::IsActive())) range.emplace(def.name, inputs);
  if (ReadsOverlap(inputs, out)) {
    // An input shares memory with out: the result is computed apart and then copied, so no
    // kernel reads an element it has already written (any op, any overlap).
    const Tensor result = RunOp(def, inputs, attrs);
    RunKernel(GetOpDef(OpId::kContiguous), {result}, out, {});
  } else {
    RunKernel(def, inputs, out, attrs);
  }
  if (out.storage() != nullptr) out.storage()->BumpVersion();
}

void CheckDefined(const char* op, const Tensor& x) {
  KILN_CHECK(x.defined(), op, ": the input is an undefined tensor (Tensor())");
}

DispatchHook* CurrentDispatchHook() { return g_hook; }

DispatchHook* SetDispatchHook(DispatchHook* hook) {
  DispatchHook* prev = g_hook;
  g_hook = hook;
  return prev;
}

}  // namespace kiln
