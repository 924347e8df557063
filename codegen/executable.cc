// The executable plan (see executable.h).
#include "codegen/executable.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "codegen/fused_kernel.h"
#include "codegen/launch_count.h"
#include "ir/printer.h"
#include "ops/cuda/gemv_chain.h"
#include "ops/cuda/index_cuda.h"
#include "ops/dispatch.h"
#include "ops/gather.h"
#include "ops/views.h"
#include "profiler/host.h"
#include "runtime/build_config.h"
#include "runtime/cuda.h"
#include "runtime/status.h"

namespace kiln::codegen {

using ir::Node;
using ir::NodeKind;
using ir::ValueId;

absl::StatusOr<std::unique_ptr<Executable>> Executable::Build(ir::Graph graph,
                                                              SymbolicShapes symbols) {
  std::unique_ptr<Executable> e(new Executable(std::move(graph), std::move(symbols)));
  KILN_RETURN_IF_ERROR(e->Prepare());
  for (ValueId v = 0; v < e->graph_.num_values(); ++v) {
    const Node& n = e->graph_.node(v);
    if (n.kind != NodeKind::kConstant || !n.constant.device().is_cuda()) continue;
    const Storage* st = n.constant.storage().get();
    if (st != nullptr && st->data() != nullptr) e->read_only_.push_back({st->data(), st->nbytes()});
  }
  return e;
}

namespace {

// A window of a graph input (as_strided of it: a non-contiguous caller tensor traced over a flat
// input, ir::Trace's input_strides): a view of the caller's memory, as the registry's views are,
// not the copy as_strided makes of other values (whose layout the plan does not know).
bool IsInputWindow(const ir::Graph& g, const Node& n) {
  return n.kind == NodeKind::kOp && n.op == OpId::kAsStrided &&
         g.node(n.inputs[0]).kind == NodeKind::kInput;
}

// The window input-window node `n` reads of `base` (a flat input, or its layout).
Tensor WindowOf(const Tensor& base, const Node& n) {
  return base.as_strided(n.attrs.dims, n.attrs.strides, base.offset() + n.attrs.offset);
}

// Whether node `n` of `g` is run as a view of its first operand.
bool IsView(const ir::Graph& g, const Node& n) {
  return (n.kind == NodeKind::kOp && GetOpDef(n.op).view != nullptr) || IsInputWindow(g, n);
}

Step::Kind KindOf(const ir::Graph& g, const Node& n) {
  if (n.kind == NodeKind::kResult) return Step::Kind::kResult;
  if (TemplateFor(n) != nullptr) return Step::Kind::kFamily;
  if (IsView(g, n)) return Step::Kind::kView;
  return Step::Kind::kOp;
}

}  // namespace

absl::Status Executable::Prepare() {
  std::vector<int> step_of(graph_.num_values(), -1);
  for (ValueId v = 0; v < graph_.num_values(); ++v) {
    const Node& n = graph_.node(v);
    if (n.kind == NodeKind::kInput || n.kind == NodeKind::kConstant) continue;
    Step s{v, KindOf(graph_, n)};
    if (n.kind == NodeKind::kFusion) s.results.assign(n.body->outputs().size() - 1, -1);
    if (n.kind == NodeKind::kResult) {
      steps_[step_of[n.inputs[0]]].results[n.index - 1] = v;
    }
    step_of[v] = static_cast<int>(steps_.size());
    steps_.push_back(std::move(s));
  }
  PlanLiveness();
  PlanOutputCopies();
  PlanMemory();
  return LowerFamilies();
}

// An output that is a constant, or a view of one, would hand the caller the plan's (or the
// user's weight's) memory: a later in-place op on it would change every later call. Such outputs
// are returned as copies.
void Executable::PlanOutputCopies() {
  for (ValueId v : graph_.outputs()) {
    ValueId base = v;
    while (IsView(graph_, graph_.node(base))) {
      base = graph_.node(base).inputs[0];
    }
    copy_output_.push_back(graph_.node(base).kind == NodeKind::kConstant);
  }
}

// The last step reading each intermediate releases it (never inputs, constants or graph
// outputs); a view keeps its base alive as long as itself.
void Executable::PlanLiveness() {
  std::vector<int> last(graph_.num_values(), -1);
  for (size_t i = 0; i < steps_.size(); ++i) {
    for (ValueId in : graph_.node(steps_[i].value).inputs) last[in] = static_cast<int>(i);
  }
  pinned_.assign(graph_.num_values(), false);
  for (ValueId v : graph_.outputs()) pinned_[v] = true;
  for (ValueId v = graph_.num_values() - 1; v >= 0; --v) {
    const Node& n = graph_.node(v);
    if (!IsView(graph_, n)) continue;
    last[n.inputs[0]] = std::max(last[n.inputs[0]], last[v]);
    pinned_[n.inputs[0]] = pinned_[n.inputs[0]] || pinned_[v];
  }
  for (ValueId v = 0; v < graph_.num_values(); ++v) {
    const NodeKind k = graph_.node(v).kind;
    if (pinned_[v] || last[v] < 0 || k == NodeKind::kInput || k == NodeKind::kConstant) continue;
    steps_[last[v]].last_uses.push_back(v);
  }
  PlanInPlace(last);
}

// An elementwise op whose result has its first operand's type exactly (shape, dtype, device):
// in place on that operand it writes each element where it reads it, as add_ or copy_ does. Not
// with symbolic dims: the traced types agreeing says nothing about the call's.
bool Executable::WritesOverFirstOperand(const Node& n) const {
  const OpDef& def = GetOpDef(n.op);
  if (def.kind != FusionKind::kElementwise && def.kind != FusionKind::kBroadcast) return false;
  return symbols_.empty() && !n.inputs.empty() && graph_.node(n.inputs[0]).type == n.type;
}

// Steps that may update an input in place (see executable.h): an updates_self op, or an
// elementwise one that writes over its first operand (the traced form of add_(input, ...) or
// copy_(input, ...)), whose first operand is an input the function writes, that no later step
// reads (through views neither) and that is not itself an output.
void Executable::PlanInPlace(const std::vector<int>& last_read) {
  for (size_t i = 0; i < steps_.size(); ++i) {
    Step& s = steps_[i];
    const Node& n = graph_.node(s.value);
    const int step = static_cast<int>(i);
    if (s.kind == Step::Kind::kOp && (GetOpDef(n.op).updates_self || WritesOverFirstOperand(n))) {
      s.in_place_input = InPlaceInput(n.inputs[0], step, last_read);
      if (s.in_place_input < 0) continue;
      lowering_notes_.push_back(absl::StrCat("in place: ", GetOpDef(n.op).name, " %", s.value,
                                             " updates input ", s.in_place_input,
                                             " (not copied back after the call)"));
    }
    if (s.kind != Step::Kind::kFamily || n.kind != NodeKind::kFusion) continue;
    const ir::Graph& body = *n.body;
    std::vector<bool> claimed(n.inputs.size(), false);  // an operand is written by one output
    for (size_t o = 0; o < body.outputs().size(); ++o) {
      const Node& b = body.node(body.outputs()[o]);
      if (b.kind != NodeKind::kOp || !GetOpDef(b.op).updates_self) continue;
      const auto& body_inputs = body.inputs();
      const auto at = std::find(body_inputs.begin(), body_inputs.end(), b.inputs[0]);
      if (at == body_inputs.end()) continue;
      const int operand = static_cast<int>(at - body_inputs.begin());
      const int input = claimed[operand] ? -1 : InPlaceInput(n.inputs[operand], step, last_read);
      s.updated_outputs.push_back({static_cast<int>(o), operand, input});
      if (input < 0) continue;
      claimed[operand] = true;
      lowering_notes_.push_back(absl::StrCat("in place: ", n.name, " %", s.value, " output ", o,
                                             " (", GetOpDef(b.op).name, ") updates input ", input,
                                             " (not copied back after the call)"));
    }
  }
}

// The graph input `self` is when step `step` may update it in place: an input the function
// writes, not an output's base, read by no later step; else -1.
int Executable::InPlaceInput(ValueId self, int step, const std::vector<int>& last_read) const {
  const auto& inputs = graph_.inputs();
  const auto input = std::find(inputs.begin(), inputs.end(), self);
  if (input == inputs.end() || pinned_[self] || last_read[self] != step) return -1;
  const int index = static_cast<int>(input - inputs.begin());
  const std::vector<int>& updates = graph_.input_updates();
  return std::find(updates.begin(), updates.end(), index) == updates.end() ? -1 : index;
}

namespace {

// Fusion nodes of one family with the same body and type run the same kernel (a model's repeated
// layers): the key under which they share it ("" for nodes that are not fusions).
std::string SharingKey(const Node& n) {
  if (n.kind != NodeKind::kFusion) return "";
  return absl::StrCat(TemplateFor(n)->name(), "|", ir::PrintType(n.type), "|", n.sym_dims, "|",
                      ir::PrintGraph(*n.body));
}

}  // namespace

// Lowers the nodes kernel families own, each distinct fusion once: their CUDA kernels compile in
// parallel threads, and a fusion identical to an earlier one shares its kernel.
absl::Status Executable::LowerFamilies() {
  std::vector<size_t> lower;                    // steps lowered here
  std::vector<std::pair<size_t, size_t>> same;  // (step, the step whose kernel it shares)
  std::unordered_map<std::string, size_t> first;
  for (size_t i = 0; i < steps_.size(); ++i) {
    if (steps_[i].kind != Step::Kind::kFamily) continue;
    const std::string key = SharingKey(graph_.node(steps_[i].value));
    const auto [it, fresh] = first.emplace(key, i);
    if (key.empty() || fresh) {
      lower.push_back(i);
    } else {
      same.emplace_back(i, it->second);
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<absl::Status> status(lower.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < lower.size(); ++i) {
    threads.emplace_back([&, i] {
      Step& s = steps_[lower[i]];
      const Node& n = graph_.node(s.value);
      try {
        s.kernel = TemplateFor(n)->Lower(graph_, n);
      } catch (const Error& e) {
        status[i] = absl::Status(
            e.code(), absl::StrCat(n.name.empty() ? "%" : n.name, " ",
                                   n.name.empty() ? absl::StrCat(s.value) : "", ": ", e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  lowering_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (const absl::Status& s : status) KILN_RETURN_IF_ERROR(s);
  for (size_t i : lower) {
    if (std::string note = steps_[i].kernel->explain(); !note.empty()) {
      lowering_notes_.push_back(std::move(note));
    }
  }
  for (const auto& [step, shared] : same) {
    steps_[step].kernel = steps_[shared].kernel;
    lowering_notes_.push_back(absl::StrCat(graph_.node(steps_[step].value).name, " runs ",
                                           graph_.node(steps_[shared].value).name,
                                           "'s kernel (the same fusion)"));
  }
  return absl::OkStatus();
}

void Executable::PlanMemory() {
  // Values a step writes into a graph input in place own no memory of their own (a KV cache a
  // decode step appends a row to).
  std::vector<bool> in_place(graph_.num_values(), false);
  for (const Step& s : steps_) {
    if (s.in_place_input >= 0) in_place[s.value] = true;
    for (const UpdatedOutput& u : s.updated_outputs) {
      if (u.input < 0) continue;
      const ValueId v = u.output == 0 ? s.value : s.results[u.output - 1];
      if (v >= 0) in_place[v] = true;
    }
  }
  auto owned_bytes = [&](ValueId v) -> int64_t {
    const Node& n = graph_.node(v);
    if (IsView(graph_, n) || pinned_[v] || in_place[v]) return 0;
    return n.type.numel() * DTypeSize(n.type.dtype);
  };
  int64_t live = 0;
  for (const Step& s : steps_) {
    live += owned_bytes(s.value);
    total_intermediate_bytes_ += owned_bytes(s.value);
    planned_peak_bytes_ = std::max(planned_peak_bytes_, live);
    for (ValueId dead : s.last_uses) live -= owned_bytes(dead);
  }
  // The memory the outputs take: each base an output is (a view of) once, unless it is an input,
  // a constant (returned as a copy of the same size) or written into an input in place.
  std::vector<bool> counted(graph_.num_values(), false);
  for (ValueId v : graph_.outputs()) {
    while (IsView(graph_, graph_.node(v))) v = graph_.node(v).inputs[0];
    const Node& n = graph_.node(v);
    if (counted[v] || in_place[v] || n.kind == NodeKind::kInput) continue;
    counted[v] = true;
    planned_output_bytes_ += n.type.numel() * DTypeSize(n.type.dtype);
  }
}

namespace {

// The broadcast shape of a fused node's operands: its iteration shape at the call's sizes.
Shape BroadcastOf(absl::Span<const Tensor> args) {
  Shape shape;
  for (const Tensor& t : args) shape = ValueOrThrow(BroadcastShapes(shape, t.shape()));
  return shape;
}

}  // namespace

namespace {

// A fresh tensor for output `o` of a fusion body: in the layout its op asks for (an attention
// result's heads-last layout, which the reshape after it views for free), else contiguous.
Tensor NewFusionOutput(const ir::Graph& body, size_t o, const Shape& shape, Device device) {
  const Node& b = body.node(body.outputs()[o]);
  const TensorType type{shape, b.type.dtype, device};
  return b.kind == NodeKind::kOp ? NewOutput(GetOpDef(b.op), type) : Tensor::Empty(type);
}

// Whether a fused kernel may write args[i] in place: it shares no memory with another operand
// and no element of its own is reachable twice (an expanded cache stays out of place, as eager
// index_copy_ refuses to write one).
bool Writable(absl::Span<const Tensor> args, size_t i) {
  if (args[i].has_internal_overlap()) return false;
  for (size_t j = 0; j < args.size(); ++j) {
    if (j != i && GetMemOverlap(args[i], args[j]) != MemOverlap::kNo) return false;
  }
  return true;
}

// Whether inputs[i] shares no memory with another input (an in-place step may then write it).
bool Exclusive(const std::vector<Tensor>& inputs, size_t i) {
  for (size_t j = 0; j < inputs.size(); ++j) {
    if (j != i && GetMemOverlap(inputs[i], inputs[j]) != MemOverlap::kNo) return false;
  }
  return true;
}

}  // namespace

void Executable::RunFamily(const Step& s, absl::Span<const Tensor> args,
                           const std::vector<Tensor>& inputs, std::vector<Tensor>& env) const {
  const Node& n = graph_.node(s.value);
  std::optional<profiler::OpRange> range;  // a fused kernel is one op to the profiler
  if (KILN_PREDICT_FALSE(profiler::IsActive()) && n.kind == NodeKind::kFusion) {
    range.emplace(profiler::Intern(n.name), args);
  }
  absl::InlinedVector<Tensor, 2> outs;
  if (n.kind == NodeKind::kFusion) {
    // Outputs without symbolic dims have their traced shapes (a norm-linear node's differ from
    // each other); with them the node is elementwise-shaped (the norm-linear family refuses
    // symbolic dims), every output the broadcast of its operands (a stored cat: its parts).
    const bool sized = symbols_.empty() || n.sym_dims == 0;
    const Shape shape = sized ? Shape() : BroadcastOf(args);
    for (size_t o = 0; o < n.body->outputs().size(); ++o) {
      const auto updated =
          std::find_if(s.updated_outputs.begin(), s.updated_outputs.end(),
                       [&](const UpdatedOutput& u) { return u.output == static_cast<int>(o); });
      const bool has = updated != s.updated_outputs.end();
      if (has && updated->input >= 0 && Exclusive(inputs, updated->input) &&
          Writable(args, updated->operand)) {
        outs.push_back(args[updated->operand]);
        continue;
      }
      const TensorType& t = n.body->type(n.body->outputs()[o]);
      outs.push_back(NewFusionOutput(
          *n.body, o, sized ? t.shape : FusionOutputShape(*n.body, o, shape), n.type.device));
      if (has) DispatchOut(OpId::kContiguous, {args[updated->operand]}, {}, outs.back());
    }
  } else {
    const OpDef& def = GetOpDef(n.op);  // an op family (attention): the row's result layout
    outs.push_back(NewOutput(def, symbols_.empty() ? n.type : InferOrThrow(def, args, n.attrs)));
  }
  // A node that updates operands runs even when its first output is empty (the writes).
  if (outs[0].numel() > 0 || !s.updated_outputs.empty()) s.kernel->Run(args, outs);
  env[s.value] = outs[0];
  for (size_t k = 0; k < s.results.size(); ++k) {
    if (s.results[k] >= 0) env[s.results[k]] = outs[k + 1];
  }
}

namespace {

// Whether an in-place step may write its first operand: no other operand overlaps it in part (the
// in-place form would refuse such a call; a kernel copies an operand that is all of self first).
bool NoPartialOverlap(absl::Span<const Tensor> args) {
  for (size_t j = 1; j < args.size(); ++j) {
    const MemOverlap overlap = GetMemOverlap(args[0], args[j]);
    if (overlap == MemOverlap::kPartial || overlap == MemOverlap::kTooHard) return false;
  }
  return true;
}

}  // namespace

std::vector<Tensor> Executable::Run(const std::vector<Tensor>& inputs) const {
  std::vector<Tensor> env(graph_.num_values());
  if constexpr (kWithCuda) {
    // On CUDA, one deferred index check for the whole call (unless the caller owns one: a
    // capture). The scope asks whether the stream is being captured only when an index kernel
    // needs its flag.
    std::optional<cuda_ops::IndexCheckScope> checks;
    if (on_cuda() && !cuda_ops::IndexCheckScope::Active()) checks.emplace();
    RunSteps(inputs, env);
    if (checks.has_value() && checks->used()) {
      cuda_ops::ThrowIfIndexFlagged(checks->flag(), "compiled function");
    }
  } else {
    RunSteps(inputs, env);
  }
  WriteBackInputs(inputs, env);
  std::vector<Tensor> outs;
  for (size_t k = 0; k < graph_.num_user_outputs(); ++k) {
    const Tensor& t = env[graph_.outputs()[k]];
    if (!copy_output_[k]) {
      outs.push_back(t);
      continue;
    }
    Tensor copy = Tensor::Empty(t.type());
    DispatchOut(OpId::kContiguous, {t}, {}, copy);
    outs.push_back(std::move(copy));
  }
  return outs;
}

// Inputs the function wrote in place get their new values, last (every read of their old values
// is enqueued before): inside a captured CUDA graph these copies are graph nodes too. An input a
// step updated in place already holds its value.
void Executable::WriteBackInputs(const std::vector<Tensor>& inputs,
                                 const std::vector<Tensor>& env) const {
  const std::vector<int>& updates = graph_.input_updates();
  for (size_t k = 0; k < updates.size(); ++k) {
    const Tensor& value = env[graph_.outputs()[graph_.num_user_outputs() + k]];
    const Tensor& input = inputs[updates[k]];
    if (gather::SameView(value, input)) continue;
    DispatchOut(OpId::kContiguous, {value}, {}, input);
  }
}

namespace {

// This thread's GEMV chain region over a run's steps (ops/cuda/gemv_chain.h): one-row GEMVs of
// consecutive steps launch as one kernel. Steps that launch only through registry ops (ops,
// views, families saying so) keep the region's rule by themselves; any other step runs with the
// region paused (what is pending launches first). On an exception what is pending still
// launches (AbandonGemvChain). Regions nest: a plan inside a caller's region closes only its own.
class ChainRegion {
 public:
  ChainRegion() {
    if constexpr (kWithCuda) {
      opened_ = cuda_ops::BeginGemvChain();
      saved_before_ = cuda_ops::GemvChainLaunchesSaved();
    }
  }
  ~ChainRegion() {
    if constexpr (kWithCuda) {
      paused_.reset();
      if (open_) cuda_ops::AbandonGemvChain(opened_);
    }
  }
  ChainRegion(const ChainRegion&) = delete;
  ChainRegion& operator=(const ChainRegion&) = delete;

  // Before step `s`: a family that launches kernels of its own (not through registry ops) runs
  // with the region paused, so what is pending launches first and nothing it dispatches (a
  // linear inside a GeGLU family, whose output its own kernel then reads) is deferred past it.
  // The pause ends at the next step's Before.
  void Before(const Step& s) {
    if constexpr (kWithCuda) {
      paused_.reset();
      if (s.kind == Step::Kind::kFamily && !s.kernel->LaunchesThroughOps()) paused_.emplace();
    }
  }
  // Launches what is pending; returns the launches the run's chains saved.
  int End() {
    if constexpr (kWithCuda) {
      paused_.reset();
      open_ = false;
      cuda_ops::EndGemvChain(opened_);
      return cuda_ops::GemvChainLaunchesSaved() - saved_before_;
    }
    return 0;
  }

 private:
  bool open_ = true;
  bool opened_ = false;  // BeginGemvChain's result
  int saved_before_ = 0;
  // (a placeholder type without CUDA, where gemv_chain.cc is not built)
  std::optional<std::conditional_t<kWithCuda, cuda_ops::GemvChainPause, int>> paused_;
};

}  // namespace

void Executable::RunSteps(const std::vector<Tensor>& inputs, std::vector<Tensor>& env) const {
  for (size_t i = 0; i < graph_.inputs().size(); ++i) env[graph_.inputs()[i]] = inputs[i];
  for (ValueId v = 0; v < graph_.num_values(); ++v) {
    if (graph_.node(v).kind == NodeKind::kConstant) env[v] = graph_.node(v).constant;
  }
  std::vector<int64_t> symbol_values;
  if (!symbols_.empty()) symbol_values = symbols_.Values(inputs);
  absl::InlinedVector<Tensor, 8> args;
  // The run's constants may be read before a kernel's dependency wait, its first launch plain.
  std::optional<cuda::ScopedPlanRun> run;
  if (on_cuda()) run.emplace(read_only_);
  ChainRegion chain;
  for (const Step& s : steps_) {
    const Node& n = graph_.node(s.value);
    chain.Before(s);
    args.clear();
    for (ValueId in : n.inputs) args.push_back(env[in]);
    switch (s.kind) {
      case Step::Kind::kOp:
        if (s.in_place_input >= 0 && Exclusive(inputs, s.in_place_input) &&
            NoPartialOverlap(args)) {
          env[s.value] = DispatchInPlace(n.op, args, n.attrs);
        } else {
          env[s.value] = Dispatch(n.op, args, n.attrs);
        }
        break;
      case Step::Kind::kView:
        if (IsInputWindow(graph_, n) && args[0].is_contiguous()) {  // a flat input: a view
          env[s.value] = WindowOf(args[0], n);
          break;
        }
        env[s.value] = Dispatch(
            n.op, args, symbol_values.empty() ? n.attrs : InstantiateAttrs(n, symbol_values));
        break;
      case Step::Kind::kFamily:
        RunFamily(s, args, inputs, env);
        break;
      case Step::Kind::kResult:
        break;  // bound by its fusion's step
    }
    for (ValueId dead : s.last_uses) env[dead] = Tensor();
  }
  chain_launches_saved_.store(chain.End(), std::memory_order_relaxed);
}

bool Executable::on_cuda() const {
  for (ValueId v : graph_.inputs()) {
    if (!graph_.node(v).type.device.is_cuda()) return false;
  }
  for (ValueId v : graph_.outputs()) {
    if (!graph_.node(v).type.device.is_cuda()) return false;
  }
  return !graph_.outputs().empty();
}

namespace {

// Strides each value has when the plan runs on contiguous inputs, as Meta tensors (no memory):
// op and fusion outputs are fresh contiguous tensors, constants keep their own strides, views
// follow their input. A reshape whose input cannot be viewed that way is a copy: `copies`.
std::vector<Tensor> PlanLayouts(const ir::Graph& g, std::vector<bool>* copies) {
  std::vector<Tensor> layout(g.num_values());
  copies->assign(g.num_values(), false);
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const Node& n = g.node(v);
    const Tensor fresh = Tensor::Empty(n.type.shape, n.type.dtype, kMeta);
    layout[v] = n.kind == NodeKind::kOp
                    ? NewOutput(GetOpDef(n.op), {n.type.shape, n.type.dtype, kMeta})
                    : fresh;
    if (n.kind == NodeKind::kFusion) layout[v] = NewFusionOutput(*n.body, 0, n.type.shape, kMeta);
    if (n.kind == NodeKind::kConstant) {
      layout[v] = fresh.as_strided(n.constant.shape(), n.constant.strides(), 0);
    } else if (IsInputWindow(g, n)) {
      layout[v] = WindowOf(layout[n.inputs[0]], n);
    } else if (n.kind == NodeKind::kOp && GetOpDef(n.op).view != nullptr) {
      const Tensor& in = layout[n.inputs[0]];
      if (n.op != OpId::kReshape) {
        layout[v] = GetOpDef(n.op).view(in, n.type, n.attrs);
      } else if (auto s = views::ViewStrides(in, n.type.shape)) {
        layout[v] = in.as_strided(n.type.shape, *s, in.offset());
      } else {
        (*copies)[v] = true;
      }
    }
  }
  return layout;
}

// A CUDA tensor with `layout`'s shape and strides (contents undefined), or the constant itself.
Tensor Placeholder(const Node& n, const Tensor& layout) {
  if (n.kind == NodeKind::kConstant) return n.constant;
  int64_t extent = 1;
  for (int64_t d = 0; d < layout.dim(); ++d) {
    extent += (layout.shape()[d] - 1) * layout.strides()[d];
  }
  if (layout.numel() == 0) extent = 0;
  const Tensor base = Tensor::Empty({layout.offset() + extent}, n.type.dtype, n.type.device);
  return base.as_strided(layout.shape(), layout.strides(), layout.offset());
}

}  // namespace

const LaunchTally& Executable::Tally() const {
  std::call_once(tally_once_, [this] { tally_ = CountLaunches(); });
  return tally_;
}

LaunchTally Executable::CountLaunches() const {
  std::vector<bool> copies;
  const std::vector<Tensor> layout = PlanLayouts(graph_, &copies);
  auto placeholders = [&](const Node& n) {
    std::vector<Tensor> args;
    for (ValueId in : n.inputs) args.push_back(Placeholder(graph_.node(in), layout[in]));
    return args;
  };
  LaunchTally t;
  for (const Step& s : steps_) {
    const Node& n = graph_.node(s.value);
    LaunchCount c{0, 0, ""};
    switch (s.kind) {
      case Step::Kind::kFamily:  // the family says (FusedKernel::Launches)
        c = s.kernel->Launches(n.type.device.is_cuda() ? placeholders(n) : std::vector<Tensor>{});
        for (const UpdatedOutput& u : s.updated_outputs) c.kernels += u.input < 0;  // the copy
        break;
      case Step::Kind::kOp:  // one kernel (an updates_self op out of place first copies self)
        if (n.type.device.is_cuda() && GetOpDef(n.op).cuda_launches_vary) {
          c = CountLaunchesOnce(n.op, placeholders(n), n.attrs);
        } else {
          c.kernels = GetOpDef(n.op).updates_self && s.in_place_input < 0 ? 2 : 1;
        }
        break;
      case Step::Kind::kView:
        c.kernels = copies[s.value] ? 1 : 0;
        break;
      case Step::Kind::kResult:
        break;
    }
    t.kernels += c.kernels;
    t.memsets += c.memsets;
  }
  return t;
}

int Executable::input_copy_backs() const {
  int in_place = 0;
  for (const Step& s : steps_) {
    in_place += s.in_place_input >= 0;
    for (const UpdatedOutput& u : s.updated_outputs) in_place += u.input >= 0;
  }
  return static_cast<int>(graph_.input_updates().size()) - in_place;
}

const FusedKernel* Executable::kernel_of(ValueId v) const {
  for (const Step& s : steps_) {
    if (s.value == v) return s.kernel.get();
  }
  return nullptr;
}

int Executable::fused_kernels() const {
  int k = 0;
  for (const Step& s : steps_) k += graph_.node(s.value).kind == NodeKind::kFusion;
  return k;
}

}  // namespace kiln::codegen
