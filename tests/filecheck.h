// A small FileCheck (after LLVM's) for pass tests: text in -> pass -> CHECK lines against the
// printed output.
//
//   EXPECT_TRUE(FileCheck(PrintGraph(g), R"(
//     CHECK:      graph(%0: f32[4, 8]@meta)
//     CHECK-NEXT: %1 = gelu(%0) {approximate=tanh}
//     CHECK-NOT:  constant
//     CHECK:      return %1
//   )"));
//
// Patterns are plain substrings (no regexes), spaces around them ignored. Directives:
//   CHECK: t          the next occurrence of t after the previous match
//   CHECK-NEXT: t     like CHECK, and on the line right after the previous match's line
//   CHECK-SAME: t     like CHECK, and on the same line as the previous match
//   CHECK-NOT: t      t does not occur between the previous match and the next positive match
//                     (or the end of the output)
//   CHECK-COUNT-n: t  n CHECKs of t in a row
// Lines without a directive are ignored. A failure names the check line and shows the output.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {
namespace filecheck_internal {

enum class Kind { kCheck, kNext, kSame, kNot };

struct Check {
  Kind kind;
  std::string pattern;
  std::string line;  // the check line as written, for messages
};

inline std::string_view Trim(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r");
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

// Appends the checks of one line of `checks` (none, one, or n for CHECK-COUNT-n).
inline bool ParseCheckLine(std::string_view line, std::vector<Check>* out) {
  const size_t at = line.find("CHECK");
  if (at == std::string_view::npos) return true;
  const size_t colon = line.find(':', at);
  if (colon == std::string_view::npos) return false;
  const std::string_view directive = line.substr(at, colon - at);
  const std::string pattern(Trim(line.substr(colon + 1)));
  const std::string written(Trim(line));
  if (directive == "CHECK") {
    out->push_back({Kind::kCheck, pattern, written});
  } else if (directive == "CHECK-NEXT") {
    out->push_back({Kind::kNext, pattern, written});
  } else if (directive == "CHECK-SAME") {
    out->push_back({Kind::kSame, pattern, written});
  } else if (directive == "CHECK-NOT") {
    out->push_back({Kind::kNot, pattern, written});
  } else if (directive.substr(0, 12) == "CHECK-COUNT-") {
    const int n = std::atoi(std::string(directive.substr(12)).c_str());
    if (n <= 0) return false;
    for (int i = 0; i < n; ++i) out->push_back({Kind::kCheck, pattern, written});
  } else {
    return false;
  }
  return !pattern.empty();
}

inline ::testing::AssertionResult Failure(const std::string& output, const std::string& check,
                                          const std::string& why) {
  return ::testing::AssertionFailure()
         << "FileCheck: `" << check << "` failed: " << why << "\n--- output ---\n"
         << output << "--- end of output ---";
}

inline int CountNewlines(const std::string& s, size_t begin, size_t end) {
  return static_cast<int>(std::count(s.begin() + begin, s.begin() + end, '\n'));
}

inline int LineOf(const std::string& s, size_t pos) { return CountNewlines(s, 0, pos) + 1; }

// Fails if one of the pending CHECK-NOTs occurs in output[begin, end).
inline ::testing::AssertionResult CheckNots(const std::string& output,
                                            const std::vector<const Check*>& nots, size_t begin,
                                            size_t end) {
  for (const Check* c : nots) {
    const size_t at = output.find(c->pattern, begin);
    if (at != std::string::npos && at + c->pattern.size() <= end) {
      return Failure(output, c->line, "found on output line " + std::to_string(LineOf(output, at)));
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace filecheck_internal

inline ::testing::AssertionResult FileCheck(const std::string& output, const std::string& checks) {
  using namespace filecheck_internal;  // NOLINT: a header-local helper namespace
  std::vector<Check> parsed;
  size_t begin = 0;
  while (begin <= checks.size()) {
    const size_t end = std::min(checks.find('\n', begin), checks.size());
    const std::string_view line(checks.data() + begin, end - begin);
    if (!ParseCheckLine(line, &parsed)) return Failure(output, std::string(line), "malformed");
    begin = end + 1;
  }
  if (parsed.empty()) return Failure(output, checks, "no CHECK lines");
  size_t pos = 0;  // end of the previous match
  bool matched = false;
  std::vector<const Check*> nots;
  for (const Check& c : parsed) {
    if (c.kind == Kind::kNot) {
      nots.push_back(&c);
      continue;
    }
    const size_t at = output.find(c.pattern, pos);
    if (at == std::string::npos) {
      return Failure(output, c.line,
                     "not found after output line " + std::to_string(LineOf(output, pos)));
    }
    const int newlines = CountNewlines(output, pos, at);
    if (c.kind != Kind::kCheck && !matched) return Failure(output, c.line, "no previous match");
    if (c.kind == Kind::kNext && newlines != 1) {
      return Failure(output, c.line,
                     "the next match is on output line " + std::to_string(LineOf(output, at)) +
                         ", not the line after the previous match");
    }
    if (c.kind == Kind::kSame && newlines != 0) {
      return Failure(output, c.line, "not on the same line as the previous match");
    }
    if (auto r = CheckNots(output, nots, pos, at); !r) return r;
    nots.clear();
    pos = at + c.pattern.size();
    matched = true;
  }
  return CheckNots(output, nots, pos, output.size());
}

}  // namespace kiln
