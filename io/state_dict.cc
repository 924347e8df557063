// load_state_dict / save_state_dict and the GPT-2 name mapping (see state_dict.h).
#include "io/state_dict.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "io/files.h"
#include "io/json_text.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "ops/tensor_parallel.h"
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

// One safetensors file, or several as one checkpoint (a sharded one: model-00001-of-00002,
// ...; a key in two of them is an error). The files are the caller's, read lazily.
class FilesSource final : public Source {
 public:
  FilesSource(std::vector<const SafetensorsFile*> files, std::string what)
      : files_(std::move(files)), what_(std::move(what)) {
    for (size_t i = 0; i < files_.size(); ++i) {
      for (std::string& key : files_[i]->keys()) {
        const auto [it, added] = owner_.emplace(key, i);
        KILN_CHECK(added, "load_state_dict: the key '", key, "' is in two shards of ", what_, ": '",
                   files_[it->second]->name(), "' and '", files_[i]->name(), "'");
        keys_.push_back(std::move(key));
      }
    }
  }
  const std::string& what() const override { return what_; }
  std::vector<std::string> keys() const override { return keys_; }
  Shape shape(const std::string& key) const override { return File(key).entry(key).shape; }
  std::optional<DType> dtype(const std::string& key) const override {
    return File(key).entry(key).kiln_dtype();
  }
  std::string dtype_name(const std::string& key) const override {
    return File(key).entry(key).dtype;
  }
  Tensor Load(const std::string& key) const override { return File(key).Load(key, kCPU); }

 private:
  const SafetensorsFile& File(const std::string& key) const { return *files_[owner_.at(key)]; }

  std::vector<const SafetensorsFile*> files_;
  std::string what_;
  std::map<std::string, size_t> owner_;
  std::vector<std::string> keys_;
};

// The shards a sharded checkpoint's index names (transformers' model.safetensors.index.json:
// {"weight_map": {tensor name: file name in the index's folder}}), each opened once, in the order
// named; every tensor the index names must be in its file.
std::vector<SafetensorsFile> OpenShards(const std::string& index_path) {
  const absl::StatusOr<std::string> text = ReadFileBytes(index_path);
  KILN_CHECK(text.ok(), "load_state_dict: cannot read the index '", index_path,
             "': ", text.status().message());
  nlohmann::json j = ValueOrThrow(
      ParseJsonStrictly(*text, absl::StrCat("load_state_dict: the index '", index_path, "'")));
  KILN_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object() &&
                 !j["weight_map"].empty(),
             "load_state_dict: the index '", index_path,
             "' has no \"weight_map\" object of tensor names to file names");
  const std::filesystem::path folder = std::filesystem::path(index_path).parent_path();
  std::vector<SafetensorsFile> files;
  std::map<std::string, size_t> opened;
  for (const auto& [key, value] : j["weight_map"].items()) {
    KILN_CHECK(value.is_string(), "load_state_dict: the index '", index_path, "' maps '", key,
               "' to ", JsonForMessage(value), ", not a file name");
    const std::string name = value.get<std::string>();
    const std::filesystem::path relative(name);
    KILN_CHECK(!name.empty() && relative.is_relative() &&
                   std::none_of(relative.begin(), relative.end(),
                                [](const std::filesystem::path& p) { return p == ".."; }),
               "load_state_dict: the index '", index_path, "' names the file '", name, "' for '",
               key, "': shards must lie in the index's folder");
    // One file however it is spelled ("a.safetensors", "./a.safetensors", "x/../a.safetensors").
    const std::string file = relative.lexically_normal().generic_string();
    auto it = opened.find(file);
    if (it == opened.end()) {
      files.push_back(SafetensorsFile::Open((folder / relative).string()));
      it = opened.emplace(file, files.size() - 1).first;
    }
    KILN_CHECK(files[it->second].contains(key), "load_state_dict: the index '", index_path,
               "' puts '", key, "' in '", name, "', which does not hold it");
  }
  return files;
}

class NamedSource final : public Source {
 public:
  explicit NamedSource(const NamedTensors& tensors) : what_("named tensors") {
    for (const auto& [name, t] : tensors) {
      KILN_CHECK(t.defined(), "load_state_dict: the tensor '", name, "' is undefined");
      // Checked here, before any parameter is written: a failed load leaves the module as it was.
      KILN_CHECK(!t.device().is_meta() && !t.is_placeholder() &&
                     (t.storage() == nullptr || !t.storage()->uninitialised()),
                 "load_state_dict: the tensor '", name, "' (", Describe(t.type()),
                 ") holds no values to load (a meta tensor, or one made without values)");
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

std::string ListKeys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 8;
  std::vector<std::string> shown(keys.begin(), keys.begin() + std::min(keys.size(), kShown));
  std::string out = absl::StrCat("[", absl::StrJoin(shown, ", "));
  if (keys.size() > kShown) absl::StrAppend(&out, ", ... (", keys.size(), " in all)");
  return out + "]";
}

std::string RowsString(int64_t start, int64_t length) {
  int64_t end = 0;
  if (__builtin_add_overflow(start, length, &end)) {
    return absl::StrCat("rows [", start, ", ", start, " + ", length, ")");
  }
  return absl::StrCat("rows [", start, ", ", end, ")");
}

// One checkpoint tensor's rows bound for rows of one parameter.
struct Piece {
  std::string key;  // the checkpoint's name
  bool transpose = false;
  Rows from, to;  // resolved: lengths filled in; whole = from {0, 0} and to {0, 0} as given
  bool whole = true;
};

// One parameter and what fills it. A split parameter (Module::ParamShard) is filled from the
// whole tensor the checkpoint holds: `shape` is the whole one's (the pieces are checked against
// it), the copy takes this rank's part.
struct ParamPlan {
  Tensor param;
  Shape shape;  // what the checkpoint's pieces fill: the parameter's, or the whole one's
  std::optional<Module::ParamShard> shard;
  std::vector<Piece> pieces;
  std::vector<Piece> tied;  // whole tensors under an alias of the parameter (Module::named_ties)
};

// The shape of `s`'s part of its whole tensor (ShardOf's or PaddedRowShard's), or why none.
std::optional<Shape> PartShape(const Module::ParamShard& s) {
  Shape part = s.whole;
  if (s.world < 1 || s.rank < 0 || s.rank >= s.world || s.dim < 0 ||
      s.dim >= static_cast<int>(part.size())) {
    return std::nullopt;
  }
  if (s.padded) {
    part[0] = PaddedRowsOf(part[0], s.rank, s.world).part;
    return part;
  }
  if (part[s.dim] % (int64_t{s.world} * s.sections) != 0) return std::nullopt;
  part[s.dim] /= s.world;
  return part;
}

// The checkpoint tensor's shape as kiln sees it (transposed when the mapping says so).
Shape OrientedShape(const Source& source, const std::string& where, const Piece& piece) {
  Shape found = source.shape(piece.key);
  const std::string held = absl::StrCat(source.dtype_name(piece.key), ShapeString(found));
  KILN_CHECK(!piece.transpose || found.size() == 2, where, "): the mapping transposes it but the ",
             "checkpoint holds ", held, ", not a matrix");
  if (piece.transpose) std::swap(found[0], found[1]);
  return found;
}

// Throws unless the checkpoint tensor's rows fit the parameter's (shape, dtype, memory); fills in
// the rows' lengths.
void CheckPiece(const Source& source, const std::string& name, const Tensor& p, const Shape& want,
                Piece& piece, const LoadOptions& options) {
  const std::string where = absl::StrCat("load_state_dict from ", source.what(), ": parameter '",
                                         name, "' (checkpoint key '", piece.key, "'");
  KILN_CHECK(!p.device().is_meta() && (p.numel() == 0 || p.data_ptr() != nullptr), where,
             "): the parameter ", Describe(p.type()), " holds no memory to load into");
  KILN_CHECK(p.is_contiguous(), where, "): the parameter ", Describe(p.type()),
             " is not contiguous");
  const std::optional<DType> dtype = source.dtype(piece.key);
  const std::string held =
      absl::StrCat(source.dtype_name(piece.key), ShapeString(source.shape(piece.key)));
  KILN_CHECK(dtype.has_value(), where, "): the checkpoint holds ", held,
             ", a dtype kiln has no tensors of");
  const Shape found = OrientedShape(source, where, piece);
  const std::string transposed =
      piece.transpose ? absl::StrCat(", ", ShapeString(found), " once transposed") : "";
  KILN_CHECK(*dtype == p.dtype() || options.convert_dtype, where,
             "): dtype mismatch: the module expects ", DTypeName(p.dtype()), ShapeString(p.shape()),
             ", the checkpoint holds ", held, " (LoadOptions::convert_dtype is off)");
  const std::string split =
      want == p.shape() ? "" : absl::StrCat(" (this rank's part of ", ShapeString(want), ")");
  if (piece.whole) {
    KILN_CHECK(found == want, where, "): size mismatch: the module expects ", DTypeName(p.dtype()),
               ShapeString(p.shape()), split, ", the checkpoint holds ", held, transposed);
    piece.from = piece.to = {0, want.empty() ? 1 : want[0]};
    return;
  }
  KILN_CHECK(!want.empty() && found.size() == want.size() &&
                 std::equal(found.begin() + 1, found.end(), want.begin() + 1),
             where, "): size mismatch: rows of the checkpoint's ", held, transposed,
             " cannot fill rows of the module's ", DTypeName(p.dtype()), ShapeString(want),
             " (all dims but the first must agree)");
  const bool starts_in = piece.from.start >= 0 && piece.from.start <= found[0] &&
                         piece.to.start >= 0 && piece.to.start <= want[0];
  if (starts_in && piece.from.length == 0) piece.from.length = found[0] - piece.from.start;
  if (piece.to.length == 0) piece.to.length = piece.from.length;
  // Written so that no sum can overflow: starts within the dims, lengths within what is left.
  KILN_CHECK(
      starts_in && piece.from.length > 0 && piece.from.length <= found[0] - piece.from.start &&
          piece.to.length <= want[0] - piece.to.start && piece.to.length == piece.from.length,
      where, "): the mapping sends ", RowsString(piece.from.start, piece.from.length),
      " of the checkpoint's ", held, transposed, " to ",
      RowsString(piece.to.start, piece.to.length), " of the module's ", DTypeName(p.dtype()),
      ShapeString(want), ": out of range, or of different lengths");
}

// Throws unless the pieces of one parameter cover its rows exactly once (or it has none).
void CheckCoverage(const Source& source, const std::string& name, ParamPlan& plan) {
  std::vector<Piece>& pieces = plan.pieces;
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.to.start < b.to.start; });
  const int64_t rows = plan.shape.empty() ? 1 : plan.shape[0];
  int64_t next = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    KILN_CHECK(p.to.start >= next, "load_state_dict from ", source.what(),
               ": the checkpoint keys '", pieces[i - 1].key, "' and '", p.key,
               "' both map to parameter '", name, "' (", RowsString(p.to.start, p.to.length),
               " written twice)");
    KILN_CHECK(p.to.start == next, "load_state_dict from ", source.what(), ": parameter '", name,
               "' ", Describe(plan.param.type()), ": no checkpoint key fills its ",
               RowsString(next, p.to.start - next), " (the others come from ", ListKeys([&] {
                 std::vector<std::string> keys;
                 for (const Piece& q : pieces) keys.push_back(q.key);
                 return keys;
               }()),
               "); nothing was loaded");
    next = p.to.start + p.to.length;
  }
  KILN_CHECK(pieces.empty() || next == rows, "load_state_dict from ", source.what(),
             ": parameter '", name, "' ", Describe(plan.param.type()),
             ": no checkpoint key fills its ", RowsString(next, rows - next),
             "; nothing was loaded");
}

// The whole tensor a split parameter is a part of, on the host: the checkpoint's tensor, or its
// pieces' rows put together.
Tensor WholeOnHost(const Source& source, const ParamPlan& plan) {
  auto oriented = [&](const Piece& piece) {
    Tensor src = source.Load(piece.key);
    return piece.transpose ? transpose(src, 0, 1) : src;
  };
  if (plan.pieces.size() == 1 && plan.pieces[0].whole) return oriented(plan.pieces[0]);
  Tensor whole;
  for (const Piece& piece : plan.pieces) {
    const Tensor src = oriented(piece);
    if (!whole.defined()) whole = empty(plan.shape, src.dtype(), kCPU);
    copy_(slice(whole, 0, piece.to.start, piece.to.start + piece.to.length),
          to(slice(src, 0, piece.from.start, piece.from.start + piece.from.length), kCPU));
  }
  return whole;
}

// A tied alias's tensor (a tied LM head's "lm_head.weight") fills its parameter where the
// parameter's own key is absent.
void AdoptTied(ParamPlan& plan) {
  if (plan.pieces.empty() && !plan.tied.empty()) plan.pieces.push_back(plan.tied.front());
}

// Where the parameter's own key and a tied alias are both present they must agree, since the
// model has one tensor for the two (transformers would silently keep one of them).
void CheckTiedAgree(const Source& source, const std::string& name, const ParamPlan& plan) {
  if (plan.tied.empty() || plan.pieces.empty()) return;
  // Compared in float32 where the dtypes differ (exact for every floating dtype kiln has), so a
  // difference one of them cannot hold still shows.
  Tensor held = WholeOnHost(source, plan);
  for (const Piece& alias : plan.tied) {
    if (alias.key == plan.pieces.front().key) continue;  // adopted: the parameter's own
    Tensor other = to(source.Load(alias.key), kCPU);
    if (alias.transpose) other = transpose(other, 0, 1);
    if (other.dtype() != held.dtype()) {
      other = cast(other, DType::kFloat32);
      held = cast(held, DType::kFloat32);
    }
    held = contiguous(held);
    other = contiguous(other);
    const size_t bytes = static_cast<size_t>(held.numel() * held.element_size());
    KILN_CHECK(std::memcmp(other.data_ptr(), held.data_ptr(), bytes) == 0, "load_state_dict from ",
               source.what(), ": checkpoint key '", alias.key, "' names parameter '", name,
               "' (the model ties the two), but its values differ from ", ListKeys([&] {
                 std::vector<std::string> keys;
                 for (const Piece& q : plan.pieces) keys.push_back(q.key);
                 return keys;
               }()),
               "'s: an untied model (tie_word_embeddings = false) keeps both; nothing was loaded");
  }
}

// `src`, or a copy of it where it shares memory with `param` (which is about to be written).
Tensor Detached(const Tensor& src, const Tensor& param) {
  return src.shares_storage(param) ? clone(src) : src;
}

void CopyInto(const Source& source, const std::string& name, const ParamPlan& plan) {
  const Tensor& param = plan.param;
  if (plan.shard.has_value()) {  // this rank's part of the whole tensor
    const Module::ParamShard& s = *plan.shard;
    const Tensor whole = WholeOnHost(source, plan);
    Tensor part = s.padded ? PaddedRowShard(whole, s.rank, s.world)
                           : ShardOf(whole, s.dim, s.rank, s.world, s.sections, name.c_str());
    if (part.dtype() != param.dtype()) part = cast(part, param.dtype());
    part = Detached(contiguous(part), param);
    CopyBytes(param.data_ptr(), param.device(), part.data_ptr(), part.device(),
              static_cast<size_t>(part.numel() * part.element_size()));
    param.storage()->BumpVersion();
    return;
  }
  const int64_t row_bytes =
      param.dim() == 0 ? param.element_size()
                       : param.numel() / std::max<int64_t>(param.size(0), 1) * param.element_size();
  // Every piece is read before any is written: a source that is (a view of) the parameter itself,
  // e.g. a module's own state dict with rows moved by the mapping, reads the old values.
  std::vector<std::pair<char*, Tensor>> writes;
  for (const Piece& piece : plan.pieces) {
    Tensor src = source.Load(piece.key);
    if (piece.transpose) src = transpose(src, 0, 1);
    if (!piece.whole) src = slice(src, 0, piece.from.start, piece.from.start + piece.from.length);
    if (src.dtype() != param.dtype()) src = cast(src, param.dtype());
    src = contiguous(src);
    char* dst = static_cast<char*>(param.data_ptr()) + piece.to.start * row_bytes;
    if (src.data_ptr() == dst && src.device() == param.device()) continue;
    writes.emplace_back(dst, Detached(src, param));
  }
  for (const auto& [dst, src] : writes) {
    CopyBytes(dst, param.device(), src.data_ptr(), src.device(),
              static_cast<size_t>(src.numel() * src.element_size()));
  }
  param.storage()->BumpVersion();  // a write, as an in-place op's: frozen plans recompile
}

LoadReport LoadFrom(Module& module, const Source& source, const LoadOptions& options) {
  const NamedTensors params = module.named_parameters();
  std::map<std::string, ParamPlan> plans;  // by parameter name
  for (const auto& [name, p] : params) {
    plans[name].param = p;
    plans[name].shape = p.shape();
  }
  for (const auto& [name, shard] : module.named_shards()) {
    const auto plan = plans.find(name);
    if (plan == plans.end()) continue;
    const std::optional<Shape> part = PartShape(shard);
    KILN_CHECK(part.has_value() && *part == plan->second.param.shape(),
               "load_state_dict: parameter '", name, "' ", Describe(plan->second.param.type()),
               " is recorded as rank ", shard.rank, " of ", shard.world, "'s part of ",
               ShapeString(shard.whole), ", which it is not (a shard changed after the split?)");
    plan->second.shape = shard.whole;
    plan->second.shard = shard;
  }
  const std::vector<std::pair<std::string, std::string>> tied = module.named_ties();
  const std::map<std::string, std::string> ties(tied.begin(), tied.end());  // alias -> parameter
  LoadReport report;
  for (const std::string& key : source.keys()) {
    const KeyMappings m = options.map ? options.map(key) : KeyMappings(KeyMapping{key});
    if (m.dropped()) {
      report.dropped_keys.push_back(key);
      continue;
    }
    bool unexpected = false;
    for (const KeyMapping& target : m.list()) {
      const bool whole = target.from.start == 0 && target.from.length == 0 &&
                         target.to.start == 0 && target.to.length == 0;
      Piece piece{key, target.transpose, target.from, target.to, whole};
      const auto tie = ties.find(target.name);
      if (tie != ties.end() && whole && plans.count(tie->second)) {
        ParamPlan& pp = plans.at(tie->second);
        CheckPiece(source, tie->second, pp.param, pp.shape, piece, options);
        pp.tied.push_back(std::move(piece));
        continue;
      }
      const auto plan = plans.find(target.name);
      if (plan == plans.end()) {
        unexpected = true;
        continue;
      }
      KILN_CHECK(plan->second.pieces.empty() || !whole, "load_state_dict from ", source.what(),
                 ": the checkpoint keys '", plan->second.pieces[0].key, "' and '", key,
                 "' both map to parameter '", target.name, "'");
      ParamPlan& pp = plan->second;
      Shape held = source.shape(key);  // as kiln sees it (CheckPiece checks the transpose)
      if (piece.transpose && held.size() == 2) std::swap(held[0], held[1]);
      if (pp.shard.has_value() && whole && held == pp.param.shape()) {
        pp.shard.reset();  // a checkpoint of this rank's part (a split model's own save)
        pp.shape = pp.param.shape();
      }
      CheckPiece(source, target.name, pp.param, pp.shape, piece, options);
      plan->second.pieces.push_back(std::move(piece));
    }
    if (unexpected) report.unexpected_keys.push_back(key);
  }
  for (const auto& [name, p] : params) {
    ParamPlan& plan = plans.at(name);
    AdoptTied(plan);
    CheckCoverage(source, name, plan);
    CheckTiedAgree(source, name, plan);
    (plan.pieces.empty() ? report.missing_keys : report.loaded).push_back(name);
  }
  KILN_CHECK(!options.strict || (report.missing_keys.empty() && report.unexpected_keys.empty()),
             "load_state_dict from ", source.what(), " (strict): missing keys ",
             ListKeys(report.missing_keys), ", unexpected keys ", ListKeys(report.unexpected_keys),
             "; LoadOptions::map renames keys, strict = false loads what matches");
  // Values are checked before anything is written (a BOOL byte other than 0 or 1 is found by
  // reading the tensor), so a failed load leaves the module as it was.
  for (const std::string& name : report.loaded) {
    for (const Piece& piece : plans.at(name).pieces) {
      if (source.dtype(piece.key) == DType::kBool) source.Load(piece.key);
    }
  }
  for (const std::string& name : report.loaded) CopyInto(source, name, plans.at(name));
  return report;
}

}  // namespace

LoadReport load_state_dict(Module& module, const SafetensorsFile& file,
                           const LoadOptions& options) {
  return LoadFrom(
      module, FilesSource({&file}, absl::StrCat("safetensors file '", file.name(), "'")), options);
}

LoadReport load_state_dict(Module& module, const std::string& path, const LoadOptions& options) {
  if (absl::EndsWith(path, ".json")) {
    const std::vector<SafetensorsFile> shards = OpenShards(path);
    std::vector<const SafetensorsFile*> files;
    for (const SafetensorsFile& f : shards) files.push_back(&f);
    return LoadFrom(module,
                    FilesSource(std::move(files), absl::StrCat("sharded checkpoint '", path, "'")),
                    options);
  }
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

std::string LoadReport::str() const {
  std::vector<std::string> lines;
  auto add = [&](const char* what, const std::vector<std::string>& keys) {
    if (!keys.empty())
      lines.push_back(absl::StrCat(what, " (", keys.size(), "): ", ListKeys(keys)));
  };
  add("missing keys", missing_keys);
  add("unexpected keys", unexpected_keys);
  add("dropped keys", dropped_keys);
  if (lines.empty()) return absl::StrCat("all ", loaded.size(), " parameters loaded");
  lines.insert(lines.begin(), absl::StrCat(loaded.size(), " parameters loaded"));
  return absl::StrJoin(lines, "\n");
}

namespace {

// One parameter's rows bound for rows of one checkpoint tensor (a save).
struct SavePiece {
  std::string param;
  Tensor rows;  // the parameter's rows, kiln's orientation
  int64_t to_start = 0;
  bool transpose = false;
};

// The checkpoint tensor of one key: its pieces joined in row order (they must tile it), then
// transposed if the mapping says so.
Tensor JoinPieces(const std::string& key, std::vector<SavePiece> pieces) {
  std::sort(pieces.begin(), pieces.end(),
            [](const SavePiece& a, const SavePiece& b) { return a.to_start < b.to_start; });
  int64_t next = 0;
  std::vector<Tensor> parts;
  for (const SavePiece& p : pieces) {
    KILN_CHECK(p.to_start == next && p.transpose == pieces[0].transpose &&
                   (pieces.size() == 1 || p.rows.dim() >= 1),
               "state_dict: the mapping's pieces of checkpoint key '", key,
               "' leave a gap or overlap at row ", next, " (parameter '", p.param, "' goes to row ",
               p.to_start, "), or disagree on transposing");
    next += p.rows.dim() == 0 ? 1 : p.rows.size(0);
    parts.push_back(p.rows);
  }
  Tensor joined = parts.size() == 1 ? parts[0] : cat(parts, 0);
  KILN_CHECK(!pieces[0].transpose || joined.dim() == 2, "state_dict: the mapping transposes '", key,
             "' but it is ", Describe(joined.type()), ", not a matrix");
  return pieces[0].transpose ? contiguous(transpose(joined, 0, 1)) : joined;
}

}  // namespace

NamedTensors state_dict(const Module& module, const KeyMapper& map) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<SavePiece>> by_key;
  for (auto& [name, p] : module.named_parameters()) {
    const KeyMappings m = map ? map(name) : KeyMappings(KeyMapping{name});
    for (const KeyMapping& target : m.list()) {
      Tensor rows = p;
      if (target.from.start != 0 || target.from.length != 0) {
        KILN_CHECK(p.dim() >= 1 && target.from.start >= 0 && target.from.length >= 0 &&
                       target.from.start + target.from.length <= p.size(0),
                   "state_dict: the mapping takes ",
                   RowsString(target.from.start, target.from.length), " of '", name, "' ",
                   Describe(p.type()), ": out of range");
        const int64_t len =
            target.from.length == 0 ? p.size(0) - target.from.start : target.from.length;
        rows = slice(p, 0, target.from.start, target.from.start + len);
      }
      if (!by_key.count(target.name)) order.push_back(target.name);
      by_key[target.name].push_back({name, rows, target.to.start, target.transpose});
    }
  }
  NamedTensors out;
  for (const std::string& key : order) out.emplace_back(key, JoinPieces(key, by_key.at(key)));
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

KeyMapper llama_load_mapping() {
  return [](const std::string& key) -> std::optional<KeyMapping> {
    std::string name = key;
    if (absl::StartsWith(name, "model.")) name = name.substr(6);
    if (absl::EndsWith(name, "rotary_emb.inv_freq")) return std::nullopt;
    return KeyMapping{std::move(name)};
  };
}

KeyMapper llama_save_mapping() {
  return [](const std::string& name) -> std::optional<KeyMapping> {
    if (absl::StartsWith(name, "lm_head.")) return KeyMapping{name};
    return KeyMapping{absl::StrCat("model.", name)};
  };
}

}  // namespace kiln
