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
// Patterns are substrings, spaces around them ignored, with LLVM FileCheck's variables:
// `[[X:re]]` matches the regex `re` and binds X to what it matched, `[[X]]` matches X's value
// (so value names need not be hard-coded: `%[[MUL:[0-9]+]] = mul` ... `neg(%[[MUL]])`).
// Directives:
//   CHECK: t          the next occurrence of t after the previous match
//   CHECK-NEXT: t     like CHECK, and on the line right after the previous match's line
//   CHECK-SAME: t     like CHECK, and on the same line as the previous match
//   CHECK-NOT: t      t does not occur between the previous match and the next positive match
//                     (or the end of the output, after the last one)
//   CHECK-COUNT-n: t  n CHECKs of t in a row
// Lines without a directive are ignored. A failure names the check line and shows the output.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
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

// Finds `pattern` in output[from, end) with the variables bound so far; on success sets the
// match's position and length and binds the pattern's new variables.
struct Match {
  size_t at = std::string::npos, length = 0;
};

inline std::string RegexEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view(".^$|()[]{}*+?\\").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

inline Match Find(const std::string& output, const std::string& pattern, size_t from, size_t end,
                  std::map<std::string, std::string>& vars) {
  if (pattern.find("[[") == std::string::npos) {
    const size_t at = output.find(pattern, from);
    if (at == std::string::npos || at + pattern.size() > end) return {};
    return {at, pattern.size()};
  }
  std::string re;
  std::vector<std::string> defined;  // capture group k + 1 binds defined[k]
  size_t i = 0;
  while (i < pattern.size()) {
    const size_t open = pattern.find("[[", i);
    const size_t close = open == std::string::npos ? open : pattern.find("]]", open);
    if (close == std::string::npos) {
      re += RegexEscape(std::string_view(pattern).substr(i));
      break;
    }
    re += RegexEscape(std::string_view(pattern).substr(i, open - i));
    const std::string var = pattern.substr(open + 2, close - open - 2);
    if (const size_t colon = var.find(':'); colon != std::string::npos) {
      defined.push_back(var.substr(0, colon));
      re += "(" + var.substr(colon + 1) + ")";
    } else {
      re += RegexEscape(vars.count(var) ? vars[var] : "\x01undefined variable " + var);
    }
    i = close + 2;
  }
  std::smatch m;
  const auto first = output.begin() + from, last = output.begin() + end;
  if (!std::regex_search(first, last, m, std::regex(re))) return {};
  for (size_t k = 0; k < defined.size(); ++k) vars[defined[k]] = m[k + 1].str();
  return {from + static_cast<size_t>(m.position(0)), static_cast<size_t>(m.length(0))};
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
                                            size_t end, std::map<std::string, std::string> vars) {
  for (const Check* c : nots) {
    const Match m = Find(output, c->pattern, begin, end, vars);
    if (m.at != std::string::npos) {
      return Failure(output, c->line,
                     "found on output line " + std::to_string(LineOf(output, m.at)));
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
  std::map<std::string, std::string> vars;
  for (const Check& c : parsed) {
    if (c.kind == Kind::kNot) {
      nots.push_back(&c);
      continue;
    }
    const std::map<std::string, std::string> before = vars;
    const Match m = Find(output, c.pattern, pos, output.size(), vars);
    const size_t at = m.at;
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
    if (auto r = CheckNots(output, nots, pos, at, before); !r) return r;
    nots.clear();
    pos = at + m.length;
    matched = true;
  }
  return CheckNots(output, nots, pos, output.size(), vars);
}

}  // namespace kiln
