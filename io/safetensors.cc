// safetensors files: the mapping, lazy per-tensor loads, writing (see safetensors.h).
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "io/safetensors_header.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; kiln reads it in place");

// The file image: a read-only mapping of the file, or bytes owned in memory.
struct SafetensorsFile::Buffer {
  const uint8_t* data = nullptr;
  size_t size = 0;
  void* mapping = nullptr;  // unmapped with the buffer
  std::string owned;

  ~Buffer() {
    if (mapping != nullptr) munmap(mapping, size);
  }
};

namespace {

[[noreturn]] void ThrowIo(const std::string& what, const std::string& path) {
  throw Error(absl::InvalidArgumentError(
      absl::StrCat("safetensors file '", path, "': ", what, ": ", std::strerror(errno))));
}

}  // namespace

SafetensorsFile SafetensorsFile::Open(const std::string& path) {
  // O_NONBLOCK: a FIFO opens at once (and is refused below as not a regular file) instead of
  // blocking until a writer appears; it changes nothing for a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) ThrowIo("cannot open", path);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    ThrowIo("cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(absl::InvalidArgumentError(
        absl::StrCat("safetensors file '", path, "': not a regular file")));
  }
  auto buffer = std::make_shared<Buffer>();
  buffer->size = static_cast<size_t>(st.st_size);
  if (buffer->size > 0) {
    void* p = mmap(nullptr, buffer->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      errno = err;
      ThrowIo("cannot map the file", path);
    }
    buffer->mapping = p;
    buffer->data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return Parse(std::move(buffer), path);
}

SafetensorsFile SafetensorsFile::FromBytes(std::string bytes, std::string name) {
  auto buffer = std::make_shared<Buffer>();
  buffer->owned = std::move(bytes);
  buffer->data = reinterpret_cast<const uint8_t*>(buffer->owned.data());
  buffer->size = buffer->owned.size();
  return Parse(std::move(buffer), std::move(name));
}

SafetensorsFile SafetensorsFile::Parse(std::shared_ptr<const Buffer> buffer, std::string name) {
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(buffer->data, buffer->size);
  if (!header.ok()) {
    throw Error(absl::InvalidArgumentError(
        absl::StrCat("safetensors file '", name, "': ", header.status().message())));
  }
  SafetensorsFile file;
  file.buffer_ = std::move(buffer);
  file.name_ = std::move(name);
  file.data_start_ = header->data_start;
  file.metadata_ = std::move(header->metadata);
  file.entries_ = std::move(header->entries);
  for (size_t i = 0; i < file.entries_.size(); ++i) file.index_[file.entries_[i].name] = i;
  return file;
}

std::optional<DType> SafetensorsEntry::kiln_dtype() const {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kBool, DType::kInt32,
                  DType::kInt64}) {
    if (dtype == SafetensorsDTypeName(t)) return t;
  }
  return std::nullopt;
}

std::vector<std::string> SafetensorsFile::keys() const {
  std::vector<std::string> out;
  for (const SafetensorsEntry& e : entries_) out.push_back(e.name);
  return out;
}

bool SafetensorsFile::contains(std::string_view key) const { return index_.count(key) > 0; }

const SafetensorsEntry& SafetensorsFile::entry(std::string_view key) const {
  const auto it = index_.find(key);
  KILN_CHECK(it != index_.end(), "safetensors file '", name_, "' has no tensor '", std::string(key),
             "' (", entries_.size(), " tensors)");
  return entries_[it->second];
}

const uint8_t* SafetensorsFile::data(std::string_view key) const {
  return buffer_->data + data_start_ + entry(key).begin;
}

Tensor SafetensorsFile::Load(std::string_view key, Device device) const {
  const SafetensorsEntry& e = entry(key);
  const std::optional<DType> dtype = e.kiln_dtype();
  KILN_CHECK(dtype.has_value(), "safetensors file '", name_, "', tensor '", e.name, "': dtype ",
             e.dtype, " has no kiln equivalent (kiln loads F32, F16, BF16, I64, I32, BOOL)");
  const uint8_t* src = data(key);
  if (*dtype == DType::kBool) {
    for (uint64_t i = 0; i < e.nbytes(); ++i) {
      KILN_CHECK(src[i] <= 1, "safetensors file '", name_, "', tensor '", e.name,
                 "': BOOL element ", i, " is the byte ", static_cast<int>(src[i]), ", not 0 or 1");
    }
  }
  Tensor out = Tensor::Empty(e.shape, *dtype, device);
  if (!device.is_meta()) CopyBytes(out.data_ptr(), device, src, kCPU, e.nbytes());
  return out;
}

NamedTensors load_safetensors(const std::string& path, Device device) {
  const SafetensorsFile file = SafetensorsFile::Open(path);
  NamedTensors out;
  for (const SafetensorsEntry& e : file.entries())
    out.emplace_back(e.name, file.Load(e.name, device));
  return out;
}

const char* SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kFloat16:
      return "F16";
    case DType::kBFloat16:
      return "BF16";
    case DType::kBool:
      return "BOOL";
    case DType::kInt32:
      return "I32";
    case DType::kInt64:
      return "I64";
  }
  return "?";
}

namespace {

using ByteSink = std::function<void(const void* data, size_t n)>;

// `text` with every byte outside printable ASCII as \xNN, for an error message.
std::string Escaped(std::string_view text) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    out += c >= 0x20 && c < 0x7F ? std::string(1, ch) : absl::StrFormat("\\x%02X", c);
  }
  return out;
}

// Checks the names and tensors, lays them out as the reference writer does, and streams the file
// image to `sink`: the length, the header, then each tensor (copied to the host one at a time).
void WriteSafetensors(const char* op, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata, const ByteSink& sink) {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(!name.empty() && name != "__metadata__", op, ": invalid tensor name '", name, "'");
    KILN_CHECK(IsUtf8Text(name), op, ": the tensor name '", Escaped(name), "' is not valid UTF-8");
    KILN_CHECK(by_name.emplace(name, &t).second, op, ": the tensor name '", name,
               "' appears twice");
    KILN_CHECK(t.defined(), op, ": tensor '", name, "' is undefined");
    KILN_CHECK(!t.device().is_meta() && (t.numel() == 0 || t.data_ptr() != nullptr), op,
               ": tensor '", name, "' (", Describe(t.type()), ") holds no data");
    KILN_CHECK(t.storage() == nullptr || !t.storage()->uninitialised(), op, ": tensor '", name,
               "' (", Describe(t.type()), ") was made without values (Init::kNone) and never ",
               "written: load its module's weights first");
    SafetensorsEntry e;
    e.name = name;
    e.dtype = SafetensorsDTypeName(t.dtype());
    e.shape = t.shape();
    e.end = static_cast<uint64_t>(t.numel() * t.element_size());
    entries.push_back(std::move(e));
  }
  for (const auto& [key, value] : metadata) {
    KILN_CHECK(IsUtf8Text(key) && IsUtf8Text(value), op, ": the metadata entry '", Escaped(key),
               "' = '", Escaped(value), "' is not valid UTF-8");
  }
  LayOutSafetensors(&entries);
  const std::string header = BuildSafetensorsHeader(entries, metadata);
  KILN_CHECK(header.size() <= kMaxSafetensorsHeader, op, ": the header would take ", header.size(),
             " bytes, over the format's limit of ", kMaxSafetensorsHeader,
             " (too much metadata, or too many tensors): no reader would load the file");
  const uint64_t n = header.size();
  sink(&n, 8);
  sink(header.data(), header.size());
  for (const SafetensorsEntry& e : entries) {
    const Tensor host = contiguous(to(*by_name.at(e.name), kCPU));
    sink(host.data_ptr(), e.nbytes());
  }
}

}  // namespace

std::string serialize_safetensors(const NamedTensors& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::string out;
  WriteSafetensors("serialize_safetensors", tensors, metadata,
                   [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); });
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Written to a temporary file beside `path`, then renamed over it: a failed save leaves the
  // old file as it was. Errors name `path` (the temporary file only where it is the subject).
  struct stat st {};
  KILN_CHECK(path.empty() || path.back() != '/', "save_safetensors: '", path,
             "' names a directory, not a file");
  KILN_CHECK(::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode), "save_safetensors: '", path,
             "' is a directory");
  const std::string tmp = absl::StrCat(path, ".tmp-", ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) ThrowIo(absl::StrCat("cannot create the file beside it, '", tmp, "'"), path);
  try {
    WriteSafetensors("save_safetensors", tensors, metadata, [&](const void* p, size_t n) {
      if (n > 0 && std::fwrite(p, 1, n, f) != n) ThrowIo("write failed", path);
    });
    const int closed = std::fclose(f);
    f = nullptr;
    if (closed != 0) ThrowIo("write failed", path);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      ThrowIo(absl::StrCat("cannot rename the written '", tmp, "' into place"), path);
    }
  } catch (...) {
    if (f != nullptr) std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
}

}  // namespace kiln
