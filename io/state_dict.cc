// load_state_dict / save_state_dict and the GPT-2 name mapping (see state_dict.h).
#include "io/state_dict.h"

#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {
namespace {

// What a checkpoint offers, whether a file (read lazily) or tensors in memory.
class Source {
 public:
  virtual ~Source() = default;
  virtual const std::string& what() const = 0;  // for errors: "safetensors file 'x'"
  virtual std::vector<std::string> keys() const = 0;
  virtual Shape shape(const std::string& key) const = 0;
  virtual std::optional<DType> dtype(const std::string& key) const = 0;
  virtual std::string dtype_name(const std::string& key) const = 0;
  virtual Tensor Load(const std::string& key) const = 0;  // on the host, or where it lives
};

class FileSource final : public Source {
 public:
  explicit FileSource(const SafetensorsFile& file)
      : file_(file), what_(absl::StrCat("safetensors file '", file.name(), "'")) {}
  const std::string& what() const override { return what_; }
  std::vector<std::string> keys() const override { return file_.keys(); }
  Shape shape(const std::string& key) const override { return file_.entry(key).shape; }
  std::optional<DType> dtype(const std::string& key) const override {
    return file_.entry(key).kiln_dtype();
  }
  std::string dtype_name(const std::string& key) const override { return file_.entry(key).dtype; }
  Tensor Load(const std::string& key) const override { return file_.Load(key, kCPU); }

 private:
  const SafetensorsFile& file_;
  std::string what_;
};

class NamedSource final : public Source {
 public:
  explicit NamedSource(const NamedTensors& tensors) : what_("named tensors") {
    for (const auto& [name, t] : tensors) {
      KILN_CHECK(t.defined(), "load_state_dict: the tensor '", name, "' is undefined");
      KILN_CHECK(by_name_.emplace(name, t).second, "load_state_dict: the key '", name,
                 "' appears twice in the named tensors");
      keys_.push_back(name);
    }
  }
  const std::string& what() const override { return what_; }
  std::vector<std::string> keys() const override { return keys_; }
  Shape shape(const std::string& key) const override { return by_name_.at(key).shape(); }
  std::optional<DType> dtype(const std::string& key) const override {
    return by_name_.at(key).dtype();
  }
  std::string dtype_name(const std::string& key) const override {
    return DTypeName(by_name_.at(key).dtype());
  }
  Tensor Load(const std::string& key) const override { return by_name_.at(key); }

 private:
  std::string what_;
  std::vector<std::string> keys_;
  std::map<std::string, Tensor> by_name_;
};

// One checkpoint tensor bound for one parameter.
struct Assignment {
  std::string key;  // the checkpoint's name
  bool transpose = false;
  Tensor param;
};

std::string ListKeys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 8;
  std::vector<std::string> shown(keys.begin(), keys.begin() + std::min(keys.size(), kShown));
  std::string out = absl::StrCat("[", absl::StrJoin(shown, ", "));
  if (keys.size() > kShown) absl::StrAppend(&out, ", ... (", keys.size(), " in all)");
  return out + "]";
}

// Throws unless the checkpoint tensor `key` fits parameter `name` (shape, dtype, memory).
void CheckAssignment(const Source& source, const std::string& name, const Assignment& a,
                     const LoadOptions& options) {
  const std::string where = absl::StrCat("load_state_dict from ", source.what(), ": parameter '",
                                         name, "' (checkpoint key '", a.key, "'");
  const Tensor& p = a.param;
  KILN_CHECK(!p.device().is_meta() && (p.numel() == 0 || p.data_ptr() != nullptr), where,
             "): the parameter ", Describe(p.type()), " holds no memory to load into");
  KILN_CHECK(p.is_contiguous(), where, "): the parameter ", Describe(p.type()),
             " is not contiguous");
  const std::optional<DType> dtype = source.dtype(a.key);
  Shape found = source.shape(a.key);
  const std::string held = absl::StrCat(source.dtype_name(a.key), ShapeString(found));
  KILN_CHECK(dtype.has_value(), where, "): the checkpoint holds ", held,
             ", a dtype kiln has no tensors of");
  KILN_CHECK(!a.transpose || found.size() == 2, where, "): the mapping transposes it but the ",
             "checkpoint holds ", held, ", not a matrix");
  if (a.transpose) std::swap(found[0], found[1]);
  const std::string transposed =
      a.transpose ? absl::StrCat(", ", ShapeString(found), " once transposed") : "";
  KILN_CHECK(found == p.shape(), where, "): size mismatch: the module expects ",
             DTypeName(p.dtype()), ShapeString(p.shape()), ", the checkpoint holds ", held,
             transposed);
  KILN_CHECK(*dtype == p.dtype() || options.convert_dtype, where,
             "): dtype mismatch: the module expects ", DTypeName(p.dtype()), ShapeString(p.shape()),
             ", the checkpoint holds ", held, " (LoadOptions::convert_dtype is off)");
}

void CopyInto(const Source& source, const Assignment& a) {
  Tensor src = source.Load(a.key);
  if (a.transpose) src = transpose(src, 0, 1);
  if (src.dtype() != a.param.dtype()) src = cast(src, a.param.dtype());
  src = contiguous(src);
  if (src.data_ptr() == a.param.data_ptr() && src.device() == a.param.device()) return;
  CopyBytes(a.param.data_ptr(), a.param.device(), src.data_ptr(), src.device(),
            static_cast<size_t>(a.param.numel() * a.param.element_size()));
  a.param.storage()->BumpVersion();  // a write, as an in-place op's: frozen plans recompile
}

LoadReport LoadFrom(Module& module, const Source& source, const LoadOptions& options) {
  const NamedTensors params = module.named_parameters();
  std::map<std::string, Tensor> by_name(params.begin(), params.end());
  std::map<std::string, Assignment> plan;  // by parameter name
  LoadReport report;
  for (const std::string& key : source.keys()) {
    const std::optional<KeyMapping> m = options.map ? options.map(key) : KeyMapping{key};
    if (!m) {
      report.dropped_keys.push_back(key);
      continue;
    }
    const auto param = by_name.find(m->name);
    if (param == by_name.end()) {
      report.unexpected_keys.push_back(key);
      continue;
    }
    const auto [it, inserted] = plan.emplace(m->name, Assignment{key, m->transpose, param->second});
    KILN_CHECK(inserted, "load_state_dict from ", source.what(), ": the checkpoint keys '",
               it->second.key, "' and '", key, "' both map to parameter '", m->name, "'");
    CheckAssignment(source, m->name, it->second, options);
  }
  for (const auto& [name, p] : params) {
    (plan.count(name) ? report.loaded : report.missing_keys).push_back(name);
  }
  KILN_CHECK(!options.strict || (report.missing_keys.empty() && report.unexpected_keys.empty()),
             "load_state_dict from ", source.what(), " (strict): missing keys ",
             ListKeys(report.missing_keys), ", unexpected keys ", ListKeys(report.unexpected_keys),
             "; LoadOptions::map renames keys, strict = false loads what matches");
  for (const std::string& name : report.loaded) CopyInto(source, plan.at(name));
  return report;
}

}  // namespace

LoadReport load_state_dict(Module& module, const SafetensorsFile& file,
                           const LoadOptions& options) {
  return LoadFrom(module, FileSource(file), options);
}

LoadReport load_state_dict(Module& module, const std::string& path, const LoadOptions& options) {
  return load_state_dict(module, SafetensorsFile::Open(path), options);
}

LoadReport load_state_dict(Module& module, const NamedTensors& tensors,
                           const LoadOptions& options) {
  return LoadFrom(module, NamedSource(tensors), options);
}

LoadReport load_state_dict(Module& module, const SafetensorsFile& file, bool strict) {
  return load_state_dict(module, file, LoadOptions{.strict = strict});
}
LoadReport load_state_dict(Module& module, const std::string& path, bool strict) {
  return load_state_dict(module, path, LoadOptions{.strict = strict});
}
LoadReport load_state_dict(Module& module, const NamedTensors& tensors, bool strict) {
  return load_state_dict(module, tensors, LoadOptions{.strict = strict});
}

NamedTensors state_dict(const Module& module, const KeyMapper& map) {
  NamedTensors out;
  for (auto& [name, p] : module.named_parameters()) {
    const std::optional<KeyMapping> m = map ? map(name) : KeyMapping{name};
    if (!m) continue;
    KILN_CHECK(!m->transpose || p.dim() == 2, "state_dict: the mapping transposes '", name,
               "' but it is ", Describe(p.type()), ", not a matrix");
    out.emplace_back(m->name, m->transpose ? contiguous(transpose(p, 0, 1)) : p);
  }
  return out;
}

void save_state_dict(const Module& module, const std::string& path, const SaveOptions& options) {
  save_safetensors(path, state_dict(module, options.map), options.metadata);
}

namespace {

// True if the last components of the dotted `name` are `suffix` ("h.0.attn.bias" ends with
// "attn.bias"; "h.0.attn.c_attn.bias" does not).
bool EndsWithComponents(const std::string& name, const std::string& suffix) {
  return name == suffix || absl::EndsWith(name, absl::StrCat(".", suffix));
}

bool IsGpt2Conv1DWeight(const std::string& name) {
  for (const char* suffix :
       {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}) {
    if (EndsWithComponents(name, suffix)) return true;
  }
  return false;
}

}  // namespace

KeyMapper gpt2_load_mapping() {
  return [](const std::string& key) -> std::optional<KeyMapping> {
    std::string name = key;
    if (absl::StartsWith(name, "transformer.")) name = name.substr(12);
    if (EndsWithComponents(name, "attn.bias") || EndsWithComponents(name, "attn.masked_bias") ||
        name == "lm_head.weight") {
      return std::nullopt;
    }
    const bool transpose = IsGpt2Conv1DWeight(name);
    return KeyMapping{std::move(name), transpose};
  };
}

KeyMapper gpt2_save_mapping() {
  return [](const std::string& name) -> std::optional<KeyMapping> {
    return KeyMapping{name, IsGpt2Conv1DWeight(name)};
  };
}

}  // namespace kiln
