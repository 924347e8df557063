// The tracer (see tracer.h): a DispatchHook that records into a Graph.
#include "ir/tracer.h"

#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "ops/dispatch.h"
#include "ops/views.h"
#include "runtime/status.h"

namespace kiln::ir {
namespace {

Tensor MakePlaceholder(const TensorType& type) {
  // Storage of 0 bytes on Meta: no memory, a unique identity; the handle claims the real device.
  auto storage = std::make_shared<Storage>(0, kMeta);
  return Tensor(std::move(storage), 0, type.shape, ContiguousStrides(type.shape), type.dtype,
                type.device);
}

// Where a tensor lies in its storage.
struct Layout {
  int64_t offset;
  Shape shape;
  Strides strides;
  friend bool operator<(const Layout& a, const Layout& b) {
    return std::tie(a.offset, a.shape, a.strides) < std::tie(b.offset, b.shape, b.strides);
  }
};

Layout LayoutOf(const Tensor& t) { return {t.offset(), t.shape(), t.strides()}; }

// A real tensor's identity for the trace: its memory and where and how it reads it.
using RealKey = std::tuple<const Storage*, int64_t, Shape, Strides, DType>;
RealKey RealKeyOf(const Tensor& t) {
  return {t.storage().get(), t.offset(), t.shape(), t.strides(), t.dtype()};
}

// How a view of a real tensor was made, recorded into the graph when the view is first read.
struct RealView {
  const OpDef* def;
  OpAttrs attrs;
  Tensor input;
};

// A traced storage: the value holding all of it (contiguous, of `shape`), and the values of views
// of it read since that value was last written.
struct Alias {
  ValueId base;
  Shape shape;
  std::map<Layout, ValueId> views;
  // Pins the placeholder storage for the trace: aliases are keyed by its address, and a storage
  // freed mid-trace could come back at that address as a real tensor the function makes (a
  // constant from full()), which would then read as a window of an unrelated traced value.
  std::shared_ptr<const Storage> pin;
  // A tensor the traced function made (a factory's result) and wrote: `base` starts as a constant
  // of its contents, and the writes stay inside the trace (eager makes it afresh on every call).
  bool local = false;
};

// View op `def`'s result of type `type` over `in`'s memory, as eager makes it; nullopt for a
// reshape that must copy.
std::optional<Tensor> EagerView(const OpDef& def, const Tensor& in, const TensorType& type,
                                const OpAttrs& attrs) {
  if (def.id != OpId::kReshape) return def.view(in, type, attrs);
  const std::optional<Strides> s = views::ViewStrides(in, type.shape);
  if (!s) return std::nullopt;
  return in.as_strided(type.shape, *s, in.offset());
}

// Records ops into a graph. Views made while tracing share their base's placeholder storage (as
// eager views share memory), so an in-place op on a view is recorded functionally: the result,
// then as_strided_scatter of it into the base, which becomes the storage's new value; later reads
// of any view of that storage are windows (as_strided) of the new base. In-place ops on graph
// inputs are thus visible at the end of the trace as inputs whose storage holds a new value.
// A view of a real tensor is its eager view (same memory), recorded when it is read, so a write
// through it reaches the tensor: a captured one becomes an input (AdoptCaptured), one the function
// made a value of the trace (AdoptLocal).
class Tracer final : public DispatchHook {
 public:
  // `captured` (may be null: writes to captured tensors are then refused) receives the tensors
  // the function writes in place without receiving them as inputs.
  Tracer(Graph* graph, std::vector<Tensor>* captured)
      : graph_(graph), captured_(captured), first_serial_(Storage::NextSerial()) {}

  // `strides` empty: a contiguous input; else the view of a flat input over what it reaches.
  Tensor AddInput(const TensorType& type, const Strides& strides, int index) {
    TensorType stored = type;
    StridedSpan reach;
    if (!strides.empty()) {
      reach = SpanOf(type.shape, strides);
      stored.shape = {reach.span};
    }
    const ValueId v = graph_->AddInput(stored, absl::StrCat("input", index));
    Tensor p = MakePlaceholder(stored);
    aliases_[p.storage().get()] = Alias{v, stored.shape, {}, p.storage()};
    inputs_.push_back(p.storage().get());
    return strides.empty() ? p : p.as_strided(type.shape, strides, reach.offset);
  }

  ValueId ValueOf(const Tensor& t) {
    KILN_CHECK(t.defined(), "trace: an undefined tensor was used as an op input");
    if (auto it = aliases_.find(t.storage().get()); it != aliases_.end()) {
      return ViewValue(it->second, t);
    }
    KILN_CHECK(t.data_ptr() != nullptr || t.numel() == 0, "trace: tensor ", Describe(t.type()),
               " holds no data and was not produced inside the traced function");
    const RealKey key = RealKeyOf(t);
    if (auto it = constants_.find(key); it != constants_.end()) return it->second;
    ValueId v;
    if (auto view = real_views_.find(key); view != real_views_.end()) {
      const RealView& r = view->second;
      v = graph_->AddOp(r.def->id, {ValueOf(r.input)}, r.attrs);
    } else {
      v = graph_->AddConstant(t, absl::StrCat("const", num_constants_++));
    }
    constants_.emplace(key, v);
    return v;
  }

  Tensor Record(const OpDef& def, absl::Span<const Tensor> inputs, const OpAttrs& attrs,
                bool in_place) override {
    if (!in_place && def.view != nullptr) {
      if (std::optional<Tensor> view = ViewOfRealTensor(def, inputs, attrs)) return *view;
    }
    if (in_place && !aliases_.contains(inputs[0].storage().get())) {
      if (MadeWhileTracing(inputs[0])) {
        AdoptLocal(inputs[0]);
      } else {
        AdoptCaptured(def, inputs[0]);
      }
    }
    absl::InlinedVector<ValueId, 3> ids;
    for (const Tensor& t : inputs) ids.push_back(ValueOf(t));
    const ValueId v = graph_->AddOp(def.id, ids, attrs);
    if (in_place) return WriteInPlace(def, inputs[0], v);
    if (def.view != nullptr) {
      if (std::optional<Tensor> view = ViewOfPlaceholder(def, inputs[0], v, attrs)) return *view;
    }
    Tensor p = MakePlaceholder(graph_->type(v));
    aliases_[p.storage().get()] = Alias{v, graph_->type(v).shape, {}, p.storage()};
    return p;
  }

  // Where `t` lies in the memory of one of the caller's
  // inputs (the first `placeholders.size()` graph inputs), if it does: the input itself when it
  // is the tensor the function received (as eager returns the caller's tensor object).
  std::optional<OutputAlias> AliasOf(const Tensor& t,
                                     const std::vector<Tensor>& placeholders) const {
    for (size_t i = 0; i < placeholders.size() && i < inputs_.size(); ++i) {
      if (inputs_[i] != t.storage().get()) continue;
      OutputAlias a{static_cast<int>(i), t.offset(), t.shape(), t.strides()};
      a.whole_input = t.is_same(placeholders[i]);
      return a;
    }
    return std::nullopt;
  }

  // Per output: AliasOf, else, for a window of a storage the function computed whose whole is
  // another output (y and a view of y it wrote through, both returned), that window of that output,
  // so the caller gets views of one tensor, as eager returns them.
  std::vector<std::optional<OutputAlias>> OutputAliases(
      const std::vector<Tensor>& outs, const std::vector<Tensor>& placeholders) const {
    std::vector<std::optional<OutputAlias>> aliases;
    for (const Tensor& t : outs) aliases.push_back(AliasOf(t, placeholders));
    for (size_t k = 0; k < outs.size(); ++k) {
      auto it = aliases_.find(outs[k].storage().get());
      if (aliases[k] || it == aliases_.end() || IsWhole(it->second, outs[k])) continue;
      for (size_t j = 0; j < outs.size(); ++j) {
        if (aliases[j] || outs[j].storage() != outs[k].storage() || !IsWhole(it->second, outs[j]) ||
            outs[j].dtype() != outs[k].dtype()) {
          continue;
        }
        aliases[k] = OutputAlias{.input = -1,
                                 .offset = outs[k].offset(),
                                 .shape = outs[k].shape(),
                                 .strides = outs[k].strides(),
                                 .output = static_cast<int>(j)};
        break;
      }
    }
    return aliases;
  }

  // The value each graph input's storage holds at the end (the input itself if never written).
  std::vector<ValueId> FinalInputValues() const {
    std::vector<ValueId> out;
    for (const Storage* s : inputs_) out.push_back(aliases_.at(s).base);
    return out;
  }

  // Throws if a tensor the function made and wrote in place outlives the call (a module or a
  // global keeps it): eager's writes would persist in it, a compiled call's would not. Call once
  // the function's results are dropped; forgets the views of real tensors.
  void CheckWrittenLocalsStayed() {
    real_views_.clear();
    for (const auto& [storage, alias] : aliases_) {
      if (alias.local && HeldOutsideTheTrace(storage, alias)) {
        KILN_FAIL("compile: the function writes ", Describe(graph_->type(alias.base)),
                  " in place, a tensor it made itself (zeros, full, ...), and keeps it past the "
                  "call (in a module or a global): eager's writes would persist in it, a compiled "
                  "call's would not. Make the tensor before compiling (a captured tensor is "
                  "written back), pass it as an input, or return it");
      }
    }
  }

 private:
  // Whether a tensor object other than the graph's constants (each its own handle) and the pin
  // holds `storage`.
  bool HeldOutsideTheTrace(const Storage* storage, const Alias& alias) const {
    long holders = 1;  // the pin
    for (const Node& n : graph_->nodes()) {
      if (n.kind != NodeKind::kConstant || n.constant.storage().get() != storage) continue;
      if (n.constant.handle_count() != 1) return true;
      ++holders;
    }
    return alias.pin.use_count() != holders;
  }

  // Made by the function while it was traced (a factory's result), not captured from outside.
  bool MadeWhileTracing(const Tensor& t) const {
    return t.storage() != nullptr && t.storage()->serial() >= first_serial_;
  }

  // A view op over a real tensor (a weight, a captured buffer, one the function made): its eager
  // view, over the same memory, recorded into the graph when it is read (ValueOf). nullopt: not a
  // real tensor, or a reshape that must copy (a new value).
  std::optional<Tensor> ViewOfRealTensor(const OpDef& def, absl::Span<const Tensor> inputs,
                                         const OpAttrs& attrs) {
    if (inputs.size() != 1 || !inputs[0].defined()) return std::nullopt;
    const Tensor& in = inputs[0];
    if (aliases_.contains(in.storage().get()) || in.data_ptr() == nullptr) return std::nullopt;
    const TensorType in_type = in.type();
    const TensorType type = InferTypesOrThrow(def, {&in_type, 1}, attrs);
    const std::optional<Tensor> view = EagerView(def, in, type, attrs);
    if (!view) return std::nullopt;
    // A layout `in` already has or derives from reads as that (transpose back, a full slice):
    // recording it would close a cycle.
    const RealKey key = RealKeyOf(*view);
    if (!DerivesFrom(in, key)) real_views_.emplace(key, RealView{&def, attrs, in});
    return view;
  }

  // Whether `t` or a real tensor it is a recorded view of has layout `key`.
  bool DerivesFrom(const Tensor& t, const RealKey& key) const {
    for (const Tensor* u = &t;;) {
      const RealKey k = RealKeyOf(*u);
      if (k == key) return true;
      auto it = real_views_.find(k);
      if (it == real_views_.end()) return false;
      u = &it->second.input;
    }
  }

  // The whole storage of a real tensor `self`: `self` when it is all of it (a [B, H, T, D] cache:
  // writes of rows then run in place on it), else a flat tensor over it (self is a window of it).
  static Tensor StorageRoot(const Tensor& self) {
    const int64_t elements = static_cast<int64_t>(self.storage()->nbytes()) / self.element_size();
    const bool all = self.offset() == 0 && self.is_contiguous() && self.numel() == elements;
    return Tensor(self.storage(), 0, all ? self.shape() : Shape{elements},
                  all ? self.strides() : Strides{1}, self.dtype(), self.device());
  }

  // `self`, a tensor the function made, written in place: its storage's value starts as a
  // constant of what it holds now (the factory's values) and the writes are recorded on it.
  void AdoptLocal(const Tensor& self) {
    const Tensor root = StorageRoot(self);
    const ValueId v = ValueOf(root);
    Alias a{v, root.shape(), {}, self.storage()};
    a.local = true;
    aliases_.emplace(self.storage().get(), std::move(a));
  }

  // Whether `t` is all of traced storage `a` (its base value).
  static bool IsWhole(const Alias& a, const Tensor& t) {
    return t.offset() == 0 && t.shape() == a.shape && t.strides() == ContiguousStrides(a.shape);
  }

  // The value of `t`, a tensor over a traced storage: the base, a view recorded since the base
  // was last written, or a window of the base.
  ValueId ViewValue(Alias& a, const Tensor& t) {
    if (IsWhole(a, t)) return a.base;
    const Layout l = LayoutOf(t);
    if (auto it = a.views.find(l); it != a.views.end()) return it->second;
    OpAttrs w;
    w.dims = l.shape;
    w.strides = l.strides;
    w.offset = l.offset;
    const ValueId v = graph_->AddOp(OpId::kAsStrided, {a.base}, w);
    a.views.emplace(l, v);
    return v;
  }

  // A view op over a traced tensor returns a view of the same placeholder storage, remembered as
  // value `v` (a reshape that must copy is a new tensor instead: nullopt).
  std::optional<Tensor> ViewOfPlaceholder(const OpDef& def, const Tensor& in, ValueId v,
                                          const OpAttrs& attrs) {
    auto it = aliases_.find(in.storage().get());
    if (it == aliases_.end()) return std::nullopt;  // an empty real tensor's: a value of its own
    const std::optional<Tensor> view = EagerView(def, in, graph_->type(v), attrs);
    if (view) it->second.views.emplace(LayoutOf(*view), v);
    return view;
  }

  // `self` was written with value `v`: the storage's new base value. A result of another
  // floating type is cast to self's (as eager writes it).
  const Tensor& WriteInPlace(const OpDef& def, const Tensor& self, ValueId v) {
    KILN_CHECK(graph_->type(v).shape == self.shape(), def.name, "_: in-place result shape ",
               ShapeString(graph_->type(v).shape), " differs from self's ", self.shape_string());
    // torch's casting rule, as eager's in-place ops: no floating result into an integer or bool
    // self, no integer result into a bool self.
    const DType result = graph_->type(v).dtype;
    KILN_CHECK((!IsFloatingPoint(result) || IsFloatingPoint(self.dtype())) &&
                   (self.dtype() != DType::kBool || result == DType::kBool),
               def.name, "_: in-place: a ", DTypeName(result), " result cannot be written into ",
               DTypeName(self.dtype()), " self (torch's casting rule)");
    if (graph_->type(v).dtype != self.dtype()) {
      OpAttrs to;
      to.dtype = self.dtype();
      v = graph_->AddOp(OpId::kCast, {v}, to);
    }
    KILN_CHECK(!self.has_internal_overlap(), def.name,
               "_: self is a broadcast (expanded) view whose elements overlap; call contiguous() "
               "first");
    auto it = aliases_.find(self.storage().get());  // adopted by Record if it was captured
    Alias& a = it->second;
    if (IsWhole(a, self)) {
      a.base = v;
      a.views.clear();
      return self;
    }
    OpAttrs w;
    w.dims = self.shape();
    w.strides = self.strides();
    w.offset = self.offset();
    a.base = graph_->AddOp(OpId::kAsStridedScatter, {a.base, v}, w);
    a.views.clear();
    a.views.emplace(LayoutOf(self), v);
    return self;
  }

  // `self`, a real tensor (a module buffer such as a KV cache, a captured tensor) written in place:
  // its whole storage becomes a further graph input, read at call time and written back like an
  // input the caller passed (the compiled function passes the tensor itself for it).
  std::unordered_map<const Storage*, Alias>::iterator AdoptCaptured(const OpDef& def,
                                                                    const Tensor& self) {
    const std::string what = absl::StrCat(def.name, "_: an in-place op on ", Describe(self.type()),
                                          ", a tensor the traced function did not receive as an "
                                          "input (a weight or a captured tensor),");
    KILN_CHECK(captured_ != nullptr, what, " is not supported here (a symbolic trace)");
    KILN_CHECK(self.storage() != nullptr && self.data_ptr() != nullptr, what, " holds no data");
    for (const auto& [key, value] : constants_) {
      KILN_CHECK(std::get<0>(key) != self.storage().get(), what,
                 " was read before this write; compile supports writes to a captured tensor only "
                 "before the function reads it (or pass it as an input)");
    }
    const Tensor root = StorageRoot(self);
    const ValueId v = graph_->AddInput(root.type(), absl::StrCat("captured", captured_->size()));
    captured_->push_back(root);
    inputs_.push_back(self.storage().get());
    return aliases_.emplace(self.storage().get(), Alias{v, root.shape(), {}, self.storage()}).first;
  }

  Graph* graph_;
  std::vector<Tensor>* captured_;
  std::unordered_map<const Storage*, Alias> aliases_;  // traced storages
  std::vector<const Storage*> inputs_;                 // the graph inputs' storages
  std::map<RealKey, ValueId> constants_;  // real tensors read: constants and views of them
  std::map<RealKey, RealView> real_views_;
  int num_constants_ = 0;
  uint64_t first_serial_;  // storages from this serial on were made while tracing
};

// Constants only the graph holds now that the function returned (each node's tensor object is
// its own, and every holder of the storage is such a node) were made while tracing.
void MarkLocalConstants(Graph& graph) {
  std::unordered_map<const Storage*, long> holders;
  for (const Node& n : graph.nodes()) {
    if (n.kind == NodeKind::kConstant) ++holders[n.constant.storage().get()];
  }
  for (Node& n : graph.mutable_nodes()) {
    if (n.kind != NodeKind::kConstant) continue;
    const Storage* s = n.constant.storage().get();
    n.local = n.constant.handle_count() == 1 && n.constant.storage().use_count() == holders[s];
  }
}

// Runs `fn` on placeholders under a tracer that records into `graph`.
void Record(const TensorFn& fn, const std::vector<TensorType>& examples,
            const std::vector<Strides>& input_strides, std::vector<Tensor>* captured,
            std::vector<std::optional<OutputAlias>>* output_aliases, Graph& graph) {
  Tracer tracer(&graph, captured);
  std::vector<Tensor> placeholders;
  for (size_t i = 0; i < examples.size(); ++i) {
    placeholders.push_back(tracer.AddInput(examples[i], input_strides[i], static_cast<int>(i)));
  }
  std::vector<Tensor> outs;
  {
    ScopedDispatchHook scope(&tracer);
    outs = fn(placeholders);
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    KILN_CHECK(outs[k].defined(), "compile: output ", k,
               " of the function is an undefined Tensor; a compiled function returns defined "
               "tensors (leave it out, or return an empty tensor)");
  }
  std::vector<ValueId> out_ids;
  for (const Tensor& t : outs) out_ids.push_back(tracer.ValueOf(t));
  if (output_aliases != nullptr) {
    *output_aliases = tracer.OutputAliases(outs, placeholders);
  }
  outs.clear();
  tracer.CheckWrittenLocalsStayed();
  // Inputs written in place: their new values are further outputs, copied back after a call.
  const std::vector<ValueId> finals = tracer.FinalInputValues();
  for (size_t i = 0; i < finals.size(); ++i) {
    if (finals[i] == graph.inputs()[i]) continue;
    out_ids.push_back(finals[i]);
    graph.mutable_input_updates().push_back(static_cast<int>(i));
  }
  graph.SetOutputs(std::move(out_ids));
}

}  // namespace

Strides InputStrides(const Tensor& t) {
  if (t.numel() == 0 || t.is_contiguous()) return {};
  for (size_t d = 0; d < t.strides().size(); ++d) {
    KILN_CHECK(
        t.strides()[d] >= 0 || t.shape()[d] <= 1, "compiled function: an input of ",
        Describe(t.type()), " has strides ", ShapeString(t.strides()),
        "; compiled functions take inputs of non-negative strides (call contiguous() on it, ",
        "or run the function eagerly)");
  }
  return t.strides();
}

Tensor FlatInput(const Tensor& t) {
  const StridedSpan reach = SpanOf(t.shape(), t.strides());
  return Tensor(t.storage(), t.offset() - reach.offset, {reach.span}, {1}, t.dtype(), t.device());
}

absl::StatusOr<Graph> Trace(const TensorFn& fn, const std::vector<Tensor>& examples,
                            std::vector<Tensor>* captured) {
  std::vector<TensorType> types;
  std::vector<Strides> strides;
  for (size_t i = 0; i < examples.size(); ++i) {
    if (!examples[i].defined()) {
      return absl::InvalidArgumentError(absl::StrCat("trace: example input ", i, " is undefined"));
    }
    types.push_back(examples[i].type());
    try {
      strides.push_back(InputStrides(examples[i]));
    } catch (const Error& e) {
      return e.status();
    }
  }
  return Trace(fn, types, strides, captured);
}

absl::StatusOr<Graph> Trace(const TensorFn& fn, const std::vector<TensorType>& examples,
                            std::vector<Tensor>* captured) {
  return Trace(fn, examples, std::vector<Strides>(examples.size()), captured);
}

absl::StatusOr<Graph> Trace(const TensorFn& fn, const std::vector<TensorType>& examples,
                            const std::vector<Strides>& input_strides,
                            std::vector<Tensor>* captured,
                            std::vector<std::optional<OutputAlias>>* output_aliases) {
  Graph graph;
  try {
    Record(fn, examples, input_strides, captured, output_aliases, graph);
  } catch (const Error& e) {
    return absl::Status(e.code(), absl::StrCat("while tracing: ", e.what()));
  }
  MarkLocalConstants(graph);  // the tracer is gone: only the graph and the caller hold tensors
  return graph;
}

}  // namespace kiln::ir
