// JSON from files a user does not control (safetensors headers, config.json, checkpoint indexes,
// kernel package manifests, exported plans): parsed strictly, and quoted in errors in bounded
// text. nlohmann keeps the last of a key given twice, and its dump() and copies recurse once per
// nesting level (a 100,000-deep list overflows the stack), so kiln parses with
// ParseJsonStrictly and quotes a value with JsonForMessage.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kiln {

// Scalars as JSON (strings cut at 64 characters); a list or object as its first few entries with
// nested ones elided ("[1, 2, [...], ... 10 entries]", "{"a": 1, "b": {...}}"). Never recurses.
std::string JsonForMessage(const nlohmann::json& v);

// `text` parsed; InvalidArgument "<what> is not valid JSON: ...", "<what> holds the key 'k'
// twice" (in one object), or "<what> nests deeper than 64 levels".
absl::StatusOr<nlohmann::json> ParseJsonStrictly(std::string_view text, const std::string& what);

}  // namespace kiln
