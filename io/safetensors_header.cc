// The safetensors header: parsing with nlohmann::json, validation, building (see
// safetensors_header.h).
#include "io/safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "io/json_text.h"
#include "runtime/status.h"

namespace kiln {
namespace {

using Json = nlohmann::json;

struct FormatDType {
  std::string_view name;
  int size;
};
// The format's dtypes in the reference implementation's order (its writer sorts by it).
constexpr FormatDType kFormatDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
    {"F32", 4},  {"C64", 8}, {"F64", 8}, {"I64", 8},     {"U64", 8},
};

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// Parses the header's JSON text (io/json_text.h: a key twice or deep nesting is an error).
absl::StatusOr<Json> ParseJson(const uint8_t* text, size_t n) {
  KILN_ASSIGN_OR_RETURN(
      Json json,
      ParseJsonStrictly(std::string_view(reinterpret_cast<const char*>(text), n), "the header"));
  if (!json.is_object()) return Invalid("the header is JSON ", json.type_name(), ", not an object");
  return json;
}

absl::Status ParseMetadata(const Json& value, std::map<std::string, std::string>* out) {
  if (!value.is_object()) {
    return Invalid("__metadata__ must be an object of strings, got ", value.type_name());
  }
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      return Invalid("__metadata__ must map strings to strings: '", key, "' is ", v.type_name());
    }
    (*out)[key] = v.get<std::string>();
  }
  return absl::OkStatus();
}

// Reads `field` of a tensor's object as a list of unsigned integers, each at most INT64_MAX.
absl::StatusOr<std::vector<uint64_t>> UnsignedList(const Json& entry, const char* field,
                                                   const std::string& name) {
  const auto it = entry.find(field);
  if (it == entry.end() || !it->is_array()) {
    return Invalid("tensor '", name, "': '", field, "' must be a list of integers");
  }
  std::vector<uint64_t> out;
  for (const Json& v : *it) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > std::numeric_limits<int64_t>::max()) {
      return Invalid("tensor '", name, "': '", field, "' holds ", JsonForMessage(v),
                     ", not a non-negative integer");
    }
    out.push_back(v.get<uint64_t>());
  }
  return out;
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const Json& value) {
  if (!value.is_object()) {
    return Invalid("tensor '", name, "': expected an object with dtype, shape and data_offsets, ",
                   "got ", value.type_name());
  }
  SafetensorsEntry e;
  e.name = name;
  const auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) {
    return Invalid("tensor '", name, "': 'dtype' must be a string");
  }
  e.dtype = dtype->get<std::string>();
  const std::optional<int> size = SafetensorsElementSize(e.dtype);
  if (!size) return Invalid("tensor '", name, "': unknown dtype '", e.dtype, "'");
  KILN_ASSIGN_OR_RETURN(std::vector<uint64_t> shape, UnsignedList(value, "shape", name));
  KILN_ASSIGN_OR_RETURN(std::vector<uint64_t> offsets, UnsignedList(value, "data_offsets", name));
  if (offsets.size() != 2 || offsets[0] > offsets[1]) {
    return Invalid("tensor '", name,
                   "': data_offsets must be [begin, end] with begin <= end, got [",
                   absl::StrJoin(offsets, ", "), "]");
  }
  e.begin = offsets[0];
  e.end = offsets[1];
  for (uint64_t d : shape) e.shape.push_back(static_cast<int64_t>(d));
  // A zero-size tensor needs no bytes whatever its other dims (as the reference's checked
  // product over the whole shape); otherwise the product must not overflow.
  const bool empty = std::find(shape.begin(), shape.end(), 0) != shape.end();
  uint64_t nbytes = empty ? 0 : static_cast<uint64_t>(*size);
  for (uint64_t d : shape) {
    if (empty) break;
    if (__builtin_mul_overflow(nbytes, d, &nbytes) || nbytes > (uint64_t{1} << 62)) {
      return Invalid("tensor '", name, "': shape ", ShapeString(e.shape), " of ", e.dtype,
                     " overflows (more than 2^62 bytes)");
    }
  }
  if (e.nbytes() != nbytes) {
    return Invalid("tensor '", name, "': data_offsets [", e.begin, ", ", e.end, "] hold ",
                   e.nbytes(), " bytes but ", e.dtype, " ", ShapeString(e.shape), " needs ",
                   nbytes);
  }
  return e;
}

// The tensors must tile the data section: sorted by offset, each starts where the previous one
// ended, and the last ends where the file does (the format has no holes, so no hidden payload).
absl::Status CheckTiling(std::vector<SafetensorsEntry>* entries, uint64_t data_size) {
  std::sort(entries->begin(), entries->end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : *entries) {
    if (e.end > data_size) {
      return Invalid("tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end,
                     "] are out of bounds: the data section has ", data_size,
                     " bytes (truncated file?)");
    }
    if (e.begin < covered) {
      return Invalid("tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end,
                     "] overlap tensor '", previous->name, "' [", previous->begin, ", ",
                     previous->end, "]");
    }
    if (e.begin > covered) {
      return Invalid("bytes [", covered, ", ", e.begin, ") of the data section, before tensor '",
                     e.name, "', belong to no tensor (the format allows no holes)");
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != data_size) {
    return Invalid("the data section has ", data_size, " bytes but the tensors cover ", covered,
                   " (the format allows no trailing bytes)");
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<int> SafetensorsElementSize(std::string_view dtype) {
  for (const FormatDType& d : kFormatDTypes) {
    if (d.name == dtype) return d.size;
  }
  return std::nullopt;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* data, size_t size) {
  if (size < 8) {
    return Invalid("truncated: ", size, " bytes, fewer than the 8-byte header length that ",
                   "starts a safetensors file");
  }
  uint64_t n = 0;
  std::memcpy(&n, data, 8);  // little-endian, as the format (static_assert in safetensors.cc)
  if (n > kMaxSafetensorsHeader) {
    return Invalid("header length ", n, " exceeds the format's limit of ", kMaxSafetensorsHeader,
                   " bytes");
  }
  if (n > size - 8) {
    return Invalid("header length ", n, " is larger than the file: only ", size - 8,
                   " bytes follow the length (truncated file?)");
  }
  // As the reference reader: the JSON starts at the header's first byte (no byte-order mark, no
  // leading space), and holds no NUL byte (nlohmann's parser would end the input there).
  if (n == 0 || data[8] != '{') {
    return Invalid("the header must start with '{' (a JSON object), got ",
                   n == 0 ? std::string("an empty header")
                          : absl::StrCat("the byte ", static_cast<int>(data[8])));
  }
  if (const void* nul = std::memchr(data + 8, 0, n); nul != nullptr) {
    return Invalid("the header holds a NUL byte at offset ",
                   static_cast<const uint8_t*>(nul) - (data + 8), ", which JSON text cannot hold");
  }
  KILN_ASSIGN_OR_RETURN(Json json, ParseJson(data + 8, n));
  SafetensorsHeader header;
  header.data_start = 8 + n;
  for (const auto& [key, value] : json.items()) {
    if (key == "__metadata__") {
      KILN_RETURN_IF_ERROR(ParseMetadata(value, &header.metadata));
      continue;
    }
    KILN_ASSIGN_OR_RETURN(SafetensorsEntry entry, ParseEntry(key, value));
    header.entries.push_back(std::move(entry));
  }
  KILN_RETURN_IF_ERROR(CheckTiling(&header.entries, size - header.data_start));
  return header;
}

void LayOutSafetensors(std::vector<SafetensorsEntry>* entries) {
  const auto order = [](const std::string& dtype) {
    const auto* it = std::find_if(std::begin(kFormatDTypes), std::end(kFormatDTypes),
                                  [&](const FormatDType& d) { return d.name == dtype; });
    return it - std::begin(kFormatDTypes);
  };
  std::stable_sort(entries->begin(), entries->end(), [&](const auto& a, const auto& b) {
    const auto oa = order(a.dtype), ob = order(b.dtype);
    return oa != ob ? oa > ob : a.name < b.name;
  });
  uint64_t offset = 0;
  for (SafetensorsEntry& e : *entries) {
    const uint64_t nbytes = e.nbytes();
    e.begin = offset;
    e.end = offset += nbytes;
  }
}

bool IsUtf8Text(const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

std::string BuildSafetensorsHeader(const std::vector<SafetensorsEntry>& entries,
                                   const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    root["__metadata__"] = std::move(meta);
  }
  for (const SafetensorsEntry& e : entries) {
    root[e.name] = {{"dtype", e.dtype},
                    {"shape", std::vector<int64_t>(e.shape.begin(), e.shape.end())},
                    {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = root.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace kiln
