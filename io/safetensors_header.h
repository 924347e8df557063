// The safetensors header: parsing and validating it (reading), building it (writing). Internal to
// io/safetensors.cc, separate so that the rules can be read (and fuzzed) in one place.
//
//   KILN_ASSIGN_OR_RETURN(SafetensorsHeader h, ParseSafetensorsHeader(bytes, size));
//   LayOutSafetensors(&entries);                                       // the writer's order
//   std::string header = BuildSafetensorsHeader(entries, metadata);   // padded to 8 bytes
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "io/safetensors.h"

namespace kiln {

struct SafetensorsHeader {
  uint64_t data_start = 0;  // 8 + the header's length
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsEntry> entries;  // sorted by offset
};

// The reference reader's limit on the header's length.
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// Parses and validates the header of the file image [data, data + size) (see safetensors.h for
// the rules). Errors are kInvalidArgument and name the tensor concerned, not the file.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* data, size_t size);

// Bytes per element of a format dtype ("F32" -> 4), or nullopt for a name the format lacks.
std::optional<int> SafetensorsElementSize(std::string_view dtype);

// Orders `entries` as the reference writer does (descending dtype, so that each tensor's data is
// aligned to its element size, then by name) and sets their offsets from their sizes (end - begin
// on entry).
void LayOutSafetensors(std::vector<SafetensorsEntry>* entries);

// Whether `text` can stand in the header: JSON text is UTF-8 (the JSON library's own check).
bool IsUtf8Text(const std::string& text);

// The header's JSON for `entries` (in data order, offsets set): "__metadata__" first when not
// empty, then the tensors, padded with spaces to a multiple of 8 bytes. Every name and metadata
// string must pass IsUtf8Text (the writer checks them first, naming the one that does not).
std::string BuildSafetensorsHeader(const std::vector<SafetensorsEntry>& entries,
                                   const std::map<std::string, std::string>& metadata);

}  // namespace kiln
