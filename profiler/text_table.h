// Plain-text tables for the profiler's reports: columns sized to their widest cell, a rule under
// the header and at the end (the look of torch.profiler's tables).
//
//   TextTable t({"Name", "Calls"}, {true, false});  // left-aligned name, right-aligned count
//   t.AddRow({"add", "3"});
//   std::string text = t.Render();
#pragma once

#include <string>
#include <vector>

namespace kiln::profiler {

class TextTable {
 public:
  TextTable(std::vector<std::string> headers, std::vector<bool> left_aligned);
  void AddRow(std::vector<std::string> cells);
  std::string Render() const;

 private:
  std::vector<std::string> headers_;
  std::vector<bool> left_;
  std::vector<std::vector<std::string>> rows_;
};

// `value` with `decimals` digits after the point ("12.346").
std::string Fixed(double value, int decimals = 3);
// `name` cut to `width` characters, ending in "..." when cut.
std::string Truncate(const std::string& name, size_t width);

}  // namespace kiln::profiler
