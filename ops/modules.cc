// Modules (see modules.h).
#include "ops/modules.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "ops/module_init.h"
#include "ops/ops.h"
#include "ops/tensor_parallel.h"
#include "runtime/random.h"
#include "runtime/status.h"

namespace kiln {

namespace {

// Marks a module as inside one of the default forwards, so that a module overriding neither
// gets an error instead of endless recursion.
class DefaultForwardGuard {
 public:
  DefaultForwardGuard(bool& flag, const char* type) : flag_(flag) {
    KILN_CHECK(!flag_, type, ": a module must override forward or forward_many");
    flag_ = true;
  }
  ~DefaultForwardGuard() { flag_ = false; }

 private:
  bool& flag_;
};

}  // namespace

std::string Module::Child(const std::string& name) const {
  return path_.empty() ? name : absl::StrCat(path_, ".", name);
}

void Module::SetPath(Module* m, const std::string& path) {
  m->path_ = path;
  for (const auto& [name, child] : m->children_) SetPath(child.get(), m->Child(name));
}

std::string Module::Where() const {
  return path_.empty() ? type_name() : absl::StrCat(type_name(), " (", path_, ")");
}

void Module::CheckInitialised() const {
  // Every call of every module comes here: one load unless a parameter was made without values.
  if (!maybe_uninitialised_.load(std::memory_order_relaxed)) return;
  for (const auto& [name, t] : params_) {
    KILN_CHECK(!t.defined() || t.storage() == nullptr || !t.storage()->uninitialised(), Where(),
               ": parameter '", name, "' ", Describe(t.type()),
               " was made without values (ModuleOptions::init = Init::kNone) and never written; "
               "load_state_dict (or copy_) before calling the module");
  }
  for (const auto& [name, t] : buffers_) {
    KILN_CHECK(!Uninitialised(t), Where(), ": buffer '", name, "' ", Describe(t.type()),
               " got memory from to_empty and was never written");
  }
  maybe_uninitialised_.store(false, std::memory_order_relaxed);  // all written now, for good
}

bool Module::Uninitialised(const Tensor& t) {
  return t.defined() && t.storage() != nullptr && t.storage()->uninitialised();
}

Tensor Module::forward(const Tensor& x) {
  std::vector<Tensor> out;
  {
    DefaultForwardGuard guard(in_default_forward_, type_name());
    out = forward_many({x});
  }
  KILN_CHECK(out.size() == 1, type_name(), ": forward(x) needs exactly one output, the module ",
             "returns ", out.size(), "; call forward_many");
  return out[0];
}

std::vector<Tensor> Module::forward_many(const std::vector<Tensor>& inputs) {
  KILN_CHECK(inputs.size() == 1, type_name(), " takes one input, got ", inputs.size());
  DefaultForwardGuard guard(in_default_forward_, type_name());
  return {forward(inputs[0])};
}

void Module::CollectNamed(bool buffers, const std::string& prefix,
                          std::vector<std::pair<std::string, Tensor>>* out) const {
  for (const auto& [name, t] : buffers ? buffers_ : params_) {
    if (t.defined()) out->emplace_back(prefix + name, t);
  }
  for (const auto& [name, child] : children_) {
    child->CollectNamed(buffers, absl::StrCat(prefix, name, "."), out);
  }
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  CollectNamed(/*buffers=*/false, "", &out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  CollectNamed(/*buffers=*/true, "", &out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  CollectNamed(/*buffers=*/false, "", &out);
  CollectNamed(/*buffers=*/true, "", &out);
  return out;
}

namespace {

// Puts `value` in a parameter or buffer slot; the old tensor's storage, when the new one does not
// share it, is retired: compiled functions that captured it recompile (runtime/storage.h). A
// converted copy of values never written is no more written than they were.
void Replace(Tensor& slot, Tensor value) {
  if (slot.defined() && slot.storage() != nullptr && slot.storage() != value.storage()) {
    slot.storage()->Retire();
    if (slot.storage()->uninitialised() && value.storage() != nullptr) {
      value.storage()->MarkUninitialised();
    }
  }
  slot = std::move(value);
}

}  // namespace

void Module::ReplaceSlot(Tensor& slot, Tensor value) { Replace(slot, std::move(value)); }

void Module::to_empty(Device device) {
  KILN_CHECK(!device.is_meta(), type_name(), ": to_empty needs a device with memory, got meta");
  for (auto& [name, t] : params_) MaterialiseSlot(t, device);
  MaterialiseBuffers(device);
  for (auto& [name, child] : children_) child->to_empty(device);
}

void Module::MaterialiseBuffers(Device device) {
  for (auto& [name, t] : buffers_) MaterialiseSlot(t, device);
}

void Module::MaterialiseSlot(Tensor& t, Device device) {
  if (!t.defined()) return;
  if (!t.device().is_meta()) return Replace(t, kiln::to(t, device));
  Replace(t, module_init::Uninitialised(t.shape(), {t.dtype(), device, Init::kNone}));
  maybe_uninitialised_.store(true, std::memory_order_relaxed);
}

void Module::MarkShard(const std::string& name, ParamShard shard) {
  for (auto& [n, s] : shards_) {
    if (n == name) {
      s = std::move(shard);
      return;
    }
  }
  shards_.emplace_back(name, std::move(shard));
}

std::vector<std::pair<std::string, Module::ParamShard>> Module::named_shards() const {
  std::vector<std::pair<std::string, ParamShard>> out(shards_.begin(), shards_.end());
  for (const auto& [name, child] : children_) {
    for (auto& [n, s] : child->named_shards()) out.emplace_back(absl::StrCat(name, ".", n), s);
  }
  return out;
}

void Module::MarkTied(std::string alias, std::string name) {
  ties_.emplace_back(std::move(alias), std::move(name));
}

std::vector<std::pair<std::string, std::string>> Module::named_ties() const {
  std::vector<std::pair<std::string, std::string>> out(ties_.begin(), ties_.end());
  for (const auto& [name, child] : children_) {
    for (auto& [alias, target] : child->named_ties()) {
      out.emplace_back(absl::StrCat(name, ".", alias), absl::StrCat(name, ".", target));
    }
  }
  return out;
}

namespace {

// Whether a and b are the same view of one storage (a weight registered in two modules).
bool SameView(const Tensor& a, const Tensor& b) {
  return a.storage() != nullptr && a.storage() == b.storage() && a.offset() == b.offset() &&
         a.shape() == b.shape() && a.strides() == b.strides() && a.dtype() == b.dtype();
}

}  // namespace

void Module::ConvertSlots(bool buffers, const std::function<Tensor(const Tensor&)>& convert,
                          std::vector<std::pair<Tensor, Tensor>>* done) {
  for (auto* list : {&params_, &buffers_}) {
    if (list == &buffers_ && !buffers) continue;
    for (auto& [name, t] : *list) {
      if (!t.defined()) continue;
      auto it = std::find_if(done->begin(), done->end(),
                             [&t](const auto& d) { return SameView(d.first, t); });
      if (it == done->end()) {
        done->emplace_back(t, convert(t));
        it = done->end() - 1;
      }
      Replace(t, it->second);
    }
  }
  for (auto& [name, child] : children_) child->ConvertSlots(buffers, convert, done);
}

void Module::to(Device device) {
  std::vector<std::pair<Tensor, Tensor>> done;
  ConvertSlots(/*buffers=*/true, [device](const Tensor& t) { return kiln::to(t, device); }, &done);
}

void Module::to(DType dtype) {
  KILN_CHECK(IsFloatingPoint(dtype), type_name(),
             ".to: parameters convert to floating dtypes only (as torch's Module.to), got ",
             DTypeName(dtype));
  // Only floating parameters convert (torch's Module.to): an integer index table keeps its values.
  std::vector<std::pair<Tensor, Tensor>> done;
  ConvertSlots(/*buffers=*/false,
               [dtype](const Tensor& t) { return IsFloatingPoint(t.dtype()) ? cast(t, dtype) : t; },
               &done);
}

void Module::CheckNewName(const std::string& name, const char* what) const {
  const char* taken = nullptr;
  for (const auto& [n, t] : params_) taken = n == name ? "a parameter" : taken;
  for (const auto& [n, t] : buffers_) taken = n == name ? "a buffer" : taken;
  for (const auto& [n, m] : children_) taken = n == name ? "a submodule" : taken;
  KILN_CHECK(!name.empty() && taken == nullptr, Where(), ": cannot register ", what, " \"", name,
             "\": ", name.empty() ? "the name is empty" : absl::StrCat("it is already ", taken),
             " (as torch's register_", what, " refuses it; a second tensor under one name would ",
             "never be loaded)");
}

Tensor& Module::RegisterParameter(std::string name, Tensor value) {
  CheckNewName(name, "parameter");
  if (Uninitialised(value)) maybe_uninitialised_.store(true, std::memory_order_relaxed);
  params_.emplace_back(std::move(name), std::move(value));
  return params_.back().second;
}

Tensor& Module::RegisterBuffer(std::string name, Tensor value) {
  CheckNewName(name, "buffer");
  buffers_.emplace_back(std::move(name), std::move(value));
  return buffers_.back().second;
}

Module& ModuleList::operator[](int64_t i) const {
  const auto n = static_cast<int64_t>(modules_.size());
  KILN_CHECK(i >= -n && i < n, "ModuleList: index ", i, " is out of range for a list of ", n,
             " modules");
  return *modules_[static_cast<size_t>(i < 0 ? i + n : i)];
}

Tensor ModuleList::forward(const Tensor& x) {
  Tensor h = x;
  for (Module* m : modules_) h = (*m)(h);
  return h;
}

namespace module_init {

ModuleOptions WithGenerator(ModuleOptions o, Generator& gen) {
  o.generator = &gen;
  return o;
}

ModuleOptions FloatingChecked(const char* module, const ModuleOptions& o) {
  KILN_CHECK(IsFloatingPoint(o.dtype), module, ": parameters must be floating point, got dtype ",
             DTypeName(o.dtype), " (ModuleOptions::dtype)");
  return o;
}

void SizeChecked(const char* module, IntList shape) {
  KILN_CHECK(CheckedNumElements(shape).ok(), module, ": a parameter of shape ", ShapeString(shape),
             " has more elements than fit in int64");
}

Tensor Uninitialised(IntList shape, const ModuleOptions& o) {
  Tensor t = empty(shape, o.dtype, o.device);
  if (t.storage() != nullptr) t.storage()->MarkUninitialised();
  return t;
}

namespace {

// Runs `draw` with the options' generator, or the default one under its lock.
Tensor Draw(const ModuleOptions& o, const std::function<Tensor(Generator&)>& draw) {
  if (o.generator != nullptr) return draw(*o.generator);
  Tensor out;
  WithDefaultGenerator([&](Generator& gen) { out = draw(gen); });
  return out;
}

}  // namespace

Tensor Uniform(IntList shape, double bound, const ModuleOptions& o) {
  if (o.init == Init::kNone) return Uninitialised(shape, o);
  const Tensor u = Draw(o, [&](Generator& gen) { return rand(shape, gen, DType::kFloat32, kCPU); });
  return to(cast((u * (2 * bound)) - bound, o.dtype), o.device);
}

Tensor Normal(IntList shape, const ModuleOptions& o) {
  if (o.init == Init::kNone) return Uninitialised(shape, o);
  return Draw(o, [&](Generator& gen) { return randn(shape, gen, o.dtype, o.device); });
}

Tensor Full(IntList shape, double value, const ModuleOptions& o) {
  if (o.init == Init::kNone) return Uninitialised(shape, o);
  return full(shape, value, o.dtype, o.device);
}

}  // namespace module_init

Linear::Linear(int64_t in, int64_t out, bool bias, Generator& gen, ModuleOptions o)
    : Linear(in, out, bias, module_init::WithGenerator(o, gen)) {}

namespace {

// `o`, once the sizes are valid: checked before the first parameter is drawn, so that a bad size
// is named by the module, not by the factory drawing its weight.
ModuleOptions LinearChecked(int64_t in, int64_t out, ModuleOptions o) {
  KILN_CHECK(in > 0 && out > 0, "Linear: features must be positive, got in=", in, " out=", out);
  module_init::SizeChecked("Linear", {out, in});
  return module_init::FloatingChecked("Linear", o);
}

int64_t HeadsChecked(const char* module, int64_t dim, int64_t heads) {
  KILN_CHECK(heads > 0 && dim > 0 && dim % heads == 0, module, ": dim ", dim,
             " must be a positive multiple of heads ", heads);
  return heads;
}

}  // namespace

Linear::Linear(int64_t in, int64_t out, bool bias, ModuleOptions o)
    : weight_(RegisterParameter(
          "weight", module_init::Uniform({out, in}, 1.0 / std::sqrt(std::max<int64_t>(in, 1)),
                                         LinearChecked(in, out, o)))),
      bias_(RegisterParameter(
          "bias", bias ? module_init::Uniform({out}, 1.0 / std::sqrt(std::max<int64_t>(in, 1)), o)
                       : Tensor())) {}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight_, bias_); }

void Linear::KeepShard(int dim, int rank, int world, int sections, const char* who) {
  KILN_CHECK(dim == 0 || dim == 1, who, ": shards split dim 0 or 1 of the weight, got ", dim);
  const Shape whole_weight = weight_.shape();
  Replace(weight_, ShardOf(weight_, dim, rank, world, sections, who));
  MarkShard("weight", {whole_weight, dim, rank, world, sections, false});
  if (dim == 0 && bias_.defined()) {
    const Shape whole_bias = bias_.shape();
    Replace(bias_, ShardOf(bias_, 0, rank, world, sections, who));
    MarkShard("bias", {whole_bias, 0, rank, world, sections, false});
  }
}

void Linear::KeepPaddedRows(int rank, int world) {
  MarkShard("weight", {weight_.shape(), 0, rank, world, 1, true});
  Replace(weight_, PaddedRowShard(weight_, rank, world));
  if (bias_.defined()) {
    MarkShard("bias", {bias_.shape(), 0, rank, world, 1, true});
    Replace(bias_, PaddedRowShard(bias_, rank, world));
  }
}

GeGLUMLP::GeGLUMLP(int64_t dim, int64_t hidden, Generator& gen, ModuleOptions o)
    : GeGLUMLP(dim, hidden, module_init::WithGenerator(o, gen)) {}

GeGLUMLP::GeGLUMLP(int64_t dim, int64_t hidden, ModuleOptions o)
    : gate_(RegisterModule("gate", std::make_unique<Linear>(dim, hidden, false, o))),
      up_(RegisterModule("up", std::make_unique<Linear>(dim, hidden, false, o))),
      down_(RegisterModule("down", std::make_unique<Linear>(hidden, dim, false, o))) {}

Tensor GeGLUMLP::forward(const Tensor& x) { return down_(gelu(gate_(x), "tanh") * up_(x)); }

MLP::MLP(const std::vector<int64_t>& dims, Generator& gen, ModuleOptions o) {
  KILN_CHECK(dims.size() >= 2, "MLP: needs at least {in, out} dims, got ", dims.size());
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    layers_.push_back(&RegisterModule(
        absl::StrCat("fc", i), std::make_unique<Linear>(dims[i], dims[i + 1], true, gen, o)));
  }
}

Tensor MLP::forward(const Tensor& x) {
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    h = (*layers_[i])(h);
    if (i + 1 < layers_.size()) h = gelu(h, "tanh");
  }
  return h;
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        bool inplace) {
  KILN_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2,
             "causal_attention: q, k and v must be [..., T, D], got q ", q.shape_string(), ", k ",
             k.shape_string(), ", v ", v.shape_string());
  const int64_t t_len = q.size(-2), s_len = k.size(-2), head_dim = q.size(-1);
  KILN_CHECK(k.size(-1) == head_dim && v.size(-2) == s_len, "causal_attention: k must be [..., S, ",
             head_dim, "] (q's D) and v [..., S, Dv] (k's S), got q ", q.shape_string(), ", k ",
             k.shape_string(), ", v ", v.shape_string());
  // Query i sees keys 0..i, as SDPA's is_causal (aligned at the top left when S != T).
  const Tensor m = mask.defined() ? mask : triu(ones({t_len, s_len}, DType::kBool, q.device()), 1);
  Tensor scores = matmul(q, transpose(k, -2, -1)) * (1.0 / std::sqrt(double(head_dim)));
  if (inplace) {
    masked_fill_(scores, m, -INFINITY);
  } else {
    scores = masked_fill(scores, m, -INFINITY);
  }
  return matmul(softmax(scores, -1), v);
}

CausalSelfAttention::CausalSelfAttention(int64_t dim, int64_t heads, Generator& gen,
                                         ModuleOptions o, bool inplace)
    : heads_(HeadsChecked("CausalSelfAttention", dim, heads)),
      inplace_(inplace),
      qkv_(RegisterModule("qkv", std::make_unique<Linear>(dim, 3 * dim, true, gen, o))),
      proj_(RegisterModule("proj", std::make_unique<Linear>(dim, dim, true, gen, o))) {}

Tensor CausalSelfAttention::CausalMask(const Tensor& x) {
  const int64_t t_len = x.size(1);
  std::lock_guard<std::mutex> lock(mask_mu_);
  if (!mask_.defined() || mask_.size(0) != t_len || mask_.device() != x.device()) {
    mask_ = triu(ones({t_len, t_len}, DType::kBool, x.device()), 1);
  }
  return mask_;
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  KILN_CHECK(x.dim() == 3, "CausalSelfAttention: expected x [B, T, dim], got ", x.shape_string());
  const int64_t b = x.size(0), t_len = x.size(1), dim = x.size(2), hd = dim / heads_;
  // While tracing the mask is built inside the traced function (the compiler folds it and finds
  // it causal), never cached: a traced value must not outlive the trace. Eagerly the mask of the
  // last length is cached (under a lock: forward may run in several threads).
  const bool tracing = CurrentDispatchHook() != nullptr;
  const Tensor mask =
      tracing ? triu(ones({t_len, t_len}, DType::kBool, x.device()), 1) : CausalMask(x);
  // [B, T, 3, H, hd] -> [3, B, H, T, hd]
  const Tensor qkv = permute(reshape(qkv_(x), {b, t_len, 3, heads_, hd}), {2, 0, 3, 1, 4});
  auto part = [&](int64_t i) { return squeeze(slice(qkv, 0, i, i + 1), 0); };
  const Tensor y = causal_attention(part(0), part(1), part(2), mask, inplace_);
  return proj_(reshape(permute(y, {0, 2, 1, 3}), {b, t_len, dim}));
}

}  // namespace kiln
