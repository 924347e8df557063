// kiln's environment variables, in one table: each one's name, kind, default and meaning, and the
// functions every read goes through. Booleans accept 1/0, on/off, true/false, yes/no (any case);
// levels accept a number in their range or a boolean word (on = 1); a value outside what its
// kind accepts is a kiln::Error naming the variable, the value and what it takes, raised where
// the variable is read (a typo is never silently the default).
//
//   if (EnvBool("KILN_CUDA_GRAPHS")) ...          // unset: the table's default
//   int level = EnvLevel("KILN_DEBUG");           // 0 .. 4
//   std::cout << SettingsTable();                 // the table, as README.md shows it
#pragma once

#include <string>
#include <vector>

namespace kiln {

struct Setting {
  enum class Kind { kBool, kLevel, kChoice, kPath, kNames };
  const char* name;
  Kind kind;
  const char* fallback;  // the value when unset ("" for paths: none)
  const char* choices;   // kChoice: "on|off|auto"; kLevel: "0..4"
  const char* meaning;
};

// Every KILN_* variable the library reads (tests and tools read their own, listed apart).
const std::vector<Setting>& Settings();
// The table as Markdown: | variable | values | default | what it does |.
std::string SettingsTable();

bool EnvBool(const char* name);
int EnvLevel(const char* name);
std::string EnvChoice(const char* name);
std::string EnvPath(const char* name);  // "" when unset
// kNames: the comma-separated names, spaces trimmed, empty ones dropped (none when unset).
std::vector<std::string> EnvNames(const char* name);

}  // namespace kiln
