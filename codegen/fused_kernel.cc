// Lowering fusion bodies to the kernel IR and evaluating it on the CPU (see fused_kernel.h).
#include "codegen/fused_kernel.h"

#include "absl/container/inlined_vector.h"
#include "ops/cpu/loops.h"
#include "runtime/status.h"

namespace kiln::codegen {
namespace {

using ir::Node;
using ir::NodeKind;
using ir::ValueId;

// Half-precision values are rounded to their dtype where eager would round them: after every op
// (eager materialises each op's result in its dtype), so a fused kernel computes what eager
// computes, op by op, and its outputs agree with each other as eager's do (numerics policy,
// docs/ARCHITECTURE.md). Keeping them in float32 instead (one rounding at the store) let a
// multi-output kernel store a value rounded that its other members read unrounded, and a later
// cancellation of the two cost 8x eager's error (random differential seed 11077).
bool RoundsLikeEager(DType t) { return t == DType::kBFloat16 || t == DType::kFloat16; }

// Lowers the body's values up to `last` into `p`; returns each body value's program value.
std::vector<int> Lower(const ir::Graph& body, ValueId last, kir::Program& p) {
  std::vector<int> value(body.num_values(), -1);
  for (size_t i = 0; i < body.inputs().size(); ++i) {
    value[body.inputs()[i]] = p.Load(static_cast<int>(i));
  }
  for (ValueId v = 0; v <= last; ++v) {
    const Node& n = body.node(v);
    if (n.kind != NodeKind::kOp) continue;
    absl::InlinedVector<int, 3> args;
    for (ValueId in : n.inputs) args.push_back(value[in]);
    value[v] = p.Apply(n.op, args, n.attrs, n.type.dtype);
    const DType t = n.type.dtype;
    if (RoundsLikeEager(t) && n.op != OpId::kCast) {
      OpAttrs cast;
      cast.dtype = t;
      value[v] = p.Apply(OpId::kCast, {value[v]}, cast, t);  // rounds through t
    }
  }
  return value;
}

std::vector<DType> InputTypes(const ir::Graph& body) {
  std::vector<DType> types;
  for (ValueId v : body.inputs()) types.push_back(body.type(v).dtype);
  return types;
}

}  // namespace

kir::Program LowerFusionBody(const ir::Graph& body) {
  kir::Program p(InputTypes(body));
  const std::vector<int> value = Lower(body, body.num_values() - 1, p);
  for (ValueId out : body.outputs()) p.Store(value[out], body.type(out).dtype);
  return p;
}

kir::Program LowerBodyValue(const ir::Graph& body, ValueId v) {
  kir::Program p(InputTypes(body));
  p.Store(Lower(body, v, p)[v], DType::kFloat32);
  return p;
}

namespace {

// One instruction flattened for the element loop: no lookups per element.
struct Step {
  ScalarFn fn = nullptr;  // nullptr: a load
  const OpAttrs* attrs = nullptr;
  absl::InlinedVector<int, 3> args;
  int input = -1;
  bool round = false;  // an explicit cast (or a bool result): round like the eager kernel
  DType dtype;
};

std::vector<Step> Flatten(const kir::Program& p) {
  std::vector<Step> steps;
  for (const kir::Instr& in : p.values()) {
    Step s;
    s.dtype = in.dtype;
    if (in.kind == kir::Instr::Kind::kLoad) {
      s.input = in.input;
    } else {
      s.fn = GetOpDef(in.op).scalar;
      s.attrs = &in.attrs;
      s.args.assign(in.args.begin(), in.args.end());
      s.round = in.op == OpId::kCast || in.dtype == DType::kBool;
    }
    steps.push_back(std::move(s));
  }
  return steps;
}

double RoundThrough(DType t, double v) {
  double scratch;
  StorerFor(t)(&scratch, 0, v);
  return LoaderFor(t)(&scratch, 0);
}

}  // namespace

void EvaluateProgramOnCpu(const kir::Program& p, absl::Span<const Tensor> inputs,
                          absl::Span<const Tensor> outputs) {
  KILN_CHECK(static_cast<int>(inputs.size()) == p.num_inputs() &&
                 static_cast<int>(outputs.size()) == p.num_outputs(),
             "fused kernel on the CPU: the program takes ", p.num_inputs(), " inputs and ",
             p.num_outputs(), " outputs, got ", inputs.size(), " and ", outputs.size());
  const Shape& shape = outputs[0].shape();
  std::vector<Strides> strides;
  for (const Tensor& t : outputs) strides.push_back(cpu::BroadcastStrides(t, shape));
  std::vector<LoadFn> load;
  std::vector<const void*> src;
  for (const Tensor& t : inputs) {
    strides.push_back(cpu::BroadcastStrides(t, shape));
    load.push_back(LoaderFor(t.dtype()));
    src.push_back(t.data_ptr());
  }
  std::vector<StoreFn> store;
  std::vector<void*> dst;
  for (const Tensor& t : outputs) {
    store.push_back(StorerFor(t.dtype()));
    dst.push_back(t.data_ptr());
  }
  const std::vector<Step> steps = Flatten(p);
  const size_t n_out = outputs.size();
  std::vector<double> vals(steps.size());
  cpu::ForEachElement(shape, strides, [&](const int64_t* off) {
    for (size_t v = 0; v < steps.size(); ++v) {
      const Step& s = steps[v];
      if (s.fn == nullptr) {
        vals[v] = load[s.input](src[s.input], off[n_out + s.input]);
        continue;
      }
      double args[3];
      for (size_t k = 0; k < s.args.size(); ++k) args[k] = vals[s.args[k]];
      const double r = s.fn(args, *s.attrs);
      vals[v] = s.round ? RoundThrough(s.dtype, r) : r;
    }
    for (size_t o = 0; o < n_out; ++o) store[o](dst[o], off[o], vals[p.outputs()[o]]);
  });
}

}  // namespace kiln::codegen
