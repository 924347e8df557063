// JsonForMessage: see json_text.h.
#include "io/json_text.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

constexpr size_t kMaxString = 64;  // characters of a string value
constexpr size_t kMaxEntries = 8;  // entries of a list or object
constexpr int kMaxDepth = 64;      // nesting levels of parsed text (kiln's own files use < 10)

// A value one level down: a scalar as itself, a container elided.
std::string Scalar(const nlohmann::json& v) {
  if (v.is_array()) return v.empty() ? "[]" : "[...]";
  if (v.is_object()) return v.empty() ? "{}" : "{...}";
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s.size() > kMaxString) {
      return nlohmann::json(s.substr(0, kMaxString)).dump() + "... (" + std::to_string(s.size()) +
             " characters)";
    }
  }
  // Scalars and short strings: dump() does not recurse on them. (Invalid UTF-8 is replaced.)
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string JsonForMessage(const nlohmann::json& v) {
  if (!v.is_array() && !v.is_object()) return Scalar(v);
  const bool list = v.is_array();
  std::string out = list ? "[" : "{";
  size_t n = 0;
  for (auto it = v.begin(); it != v.end() && n < kMaxEntries; ++it, ++n) {
    if (n > 0) out += ", ";
    if (!list) absl::StrAppend(&out, Scalar(nlohmann::json(it.key())), ": ");
    out += Scalar(*it);
  }
  if (v.size() > kMaxEntries) absl::StrAppend(&out, ", ... ", v.size(), " entries");
  return out + (list ? "]" : "}");
}

absl::StatusOr<nlohmann::json> ParseJsonStrictly(std::string_view text, const std::string& what) {
  using Json = nlohmann::json;
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  bool too_deep = false;
  // Past the depth limit every value is discarded as it ends, so nothing deep is ever built.
  const Json::parser_callback_t on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > kMaxDepth) too_deep = true;
    if (too_deep) return false;
    if (event == Json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == Json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == Json::parse_event_t::key && !open_objects.empty() && duplicate.empty() &&
        !open_objects.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  Json json;
  try {
    json = Json::parse(text.begin(), text.end(), on_event);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON: ", e.what()));
  }
  if (too_deep) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " nests deeper than ", kMaxDepth, " levels"));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " holds the key '", duplicate, "' twice"));
  }
  return json;
}

}  // namespace kiln
