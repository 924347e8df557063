// Lowering fusion bodies to the kernel IR and evaluating it on the CPU (see fused_kernel.h).
#include "codegen/fused_kernel.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "ops/cpu/loops.h"
#include "runtime/status.h"

namespace kiln::codegen {
namespace {

using ir::Node;
using ir::NodeKind;
using ir::ValueId;

// Half-precision values are computed in float32 and rounded to their dtype where more than one
// reader sees them (numerics policy, docs/ARCHITECTURE.md): a value with two readers (two ops,
// or an op and the store) is rounded once, before all of them, so no two readers, inside the
// kernel or after it, see different versions of it, as none do in eager. Two versions of one
// value let a later cancellation cost 8x eager's error (seed 11077: stored rounded, read
// unrounded; seed 755: exp(x) read unrounded by a sub and, through a stored add, rounded). A
// value with one reader stays in float32, closer to the float32 reference than eager, and cheap:
// rounding after every op, as eager does, turned a bf16 GELU chain ALU-bound (1.85x slower on
// the H200).
bool IsHalf(DType t) { return t == DType::kBFloat16 || t == DType::kFloat16; }

// The values to round after they are computed: those with two readers or more, counting each op
// that reads a value once and the store (a value in `stored`) as one more.
std::vector<bool> RoundedValues(const ir::Graph& body, const std::vector<ValueId>& stored) {
  std::vector<int> readers(body.num_values(), 0);
  for (ValueId v = 0; v < body.num_values(); ++v) {
    const Node& n = body.node(v);
    if (n.kind != NodeKind::kOp || n.op == OpId::kCat) continue;  // a cat's operands: stores
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const bool repeated =
          std::find(n.inputs.begin(), n.inputs.begin() + i, n.inputs[i]) != n.inputs.begin() + i;
      if (!repeated) ++readers[n.inputs[i]];
    }
  }
  for (ValueId v : stored) ++readers[v];
  std::vector<bool> round(body.num_values(), false);
  for (ValueId v = 0; v < body.num_values(); ++v) {
    const Node& n = body.node(v);
    round[v] =
        n.kind == NodeKind::kOp && n.op != OpId::kCast && IsHalf(n.type.dtype) && readers[v] >= 2;
  }
  return round;
}

// Lowers the body's values up to `last` into `p`, rounding the values `round` marks, all but
// `skip` (a trailing cat: its operands are stored); returns each body value's program value.
std::vector<int> Lower(const ir::Graph& body, ValueId last, const std::vector<bool>& round,
                       kir::Program& p, ValueId skip = -1) {
  std::vector<int> value(body.num_values(), -1);
  for (size_t i = 0; i < body.inputs().size(); ++i) {
    value[body.inputs()[i]] = p.Load(static_cast<int>(i));
  }
  for (ValueId v = 0; v <= last; ++v) {
    const Node& n = body.node(v);
    if (n.kind != NodeKind::kOp || v == skip) continue;
    absl::InlinedVector<int, 3> args;
    for (ValueId in : n.inputs) args.push_back(value[in]);
    value[v] = p.Apply(n.op, args, n.attrs, n.type.dtype);
    if (round[v]) {
      OpAttrs cast;
      cast.dtype = n.type.dtype;
      value[v] = p.Apply(OpId::kCast, {value[v]}, cast, n.type.dtype);  // rounds through it
    }
  }
  return value;
}

std::vector<DType> InputTypes(const ir::Graph& body) {
  std::vector<DType> types;
  for (ValueId v : body.inputs()) types.push_back(body.type(v).dtype);
  return types;
}

// The body values the program stores, in store order: the outputs, a trailing cat's operands in
// place of the cat.
std::vector<ValueId> StoredValues(const ir::Graph& body) {
  const std::vector<ValueId>& outs = body.outputs();
  if (CatSinkOf(body).parts == 0) return outs;
  std::vector<ValueId> stored(body.node(outs[0]).inputs.begin(), body.node(outs[0]).inputs.end());
  stored.insert(stored.end(), outs.begin() + 1, outs.end());
  return stored;
}

}  // namespace

CatSink CatSinkOf(const ir::Graph& body) {
  const Node& root = body.node(body.outputs()[0]);
  if (root.kind != NodeKind::kOp || root.op != OpId::kCat) return {};
  const int rank = static_cast<int>(root.type.rank());
  const int dim = static_cast<int>(root.attrs.dim < 0 ? root.attrs.dim + rank : root.attrs.dim);
  return {dim, static_cast<int>(root.inputs.size())};
}

Shape FusionOutputShape(const ir::Graph& body, size_t o, Shape iteration) {
  const CatSink cat = CatSinkOf(body);
  if (o == 0 && cat.parts > 0) iteration[cat.dim] *= cat.parts;
  return iteration;
}

std::vector<Tensor> StoreTargets(const CatSink& cat, absl::Span<const Tensor> outputs) {
  if (cat.parts == 0) return {outputs.begin(), outputs.end()};
  const Tensor& whole = outputs[0];
  Shape part = whole.shape();
  KILN_CHECK(part[cat.dim] % cat.parts == 0, "fused cat: dim ", cat.dim, " of ",
             whole.shape_string(), " does not split into ", cat.parts, " equal parts");
  part[cat.dim] /= cat.parts;
  std::vector<Tensor> targets;
  for (int k = 0; k < cat.parts; ++k) {
    const int64_t offset = whole.offset() + k * part[cat.dim] * whole.stride(cat.dim);
    targets.push_back(whole.as_strided(part, whole.strides(), offset));
  }
  targets.insert(targets.end(), outputs.begin() + 1, outputs.end());
  return targets;
}

ir::Graph SegmentBody(const ir::Graph& body, const passes::BodySegment& s) {
  ir::Graph sub;
  std::vector<ValueId> map(body.num_values(), -1);
  for (int i : s.inputs) map[body.inputs()[i]] = sub.AddInput(body.type(body.inputs()[i]));
  for (ValueId v : s.ops) map[v] = sub.AddCopy(body.node(v), map);
  std::vector<ValueId> outs;
  for (int o : s.outputs) outs.push_back(map[body.outputs()[o]]);
  sub.SetOutputs(std::move(outs));
  return sub;
}

kir::Program LowerFusionBody(const ir::Graph& body) {
  kir::Program p(InputTypes(body));
  const std::vector<ValueId> stored = StoredValues(body);
  const ValueId cat = CatSinkOf(body).parts == 0 ? -1 : body.outputs()[0];
  const std::vector<int> value =
      Lower(body, body.num_values() - 1, RoundedValues(body, stored), p, cat);
  for (ValueId v : stored) p.Store(value[v], body.type(v).dtype);
  return p;
}

kir::Program LowerBodyValue(const ir::Graph& body, ValueId v) {
  // The value's reader (a softmax) reads it rounded, as eager materialises it.
  const std::vector<bool> round = RoundedValues(body, {v, v});
  kir::Program p(InputTypes(body));
  p.Store(Lower(body, v, round, p)[v], DType::kFloat32);
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
      vals[v] = s.round ? RoundToDType(s.dtype, r) : r;
    }
    for (size_t o = 0; o < n_out; ++o) store[o](dst[o], off[o], vals[p.outputs()[o]]);
  });
}

}  // namespace kiln::codegen
