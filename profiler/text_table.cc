// Plain-text tables (see text_table.h).
#include "profiler/text_table.h"

#include <algorithm>
#include <cstdio>

namespace kiln::profiler {

TextTable::TextTable(std::vector<std::string> headers, std::vector<bool> left_aligned)
    : headers_(std::move(headers)), left_(std::move(left_aligned)) {
  left_.resize(headers_.size(), false);
}

void TextTable::AddRow(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

std::string TextTable::Render() const {
  std::vector<size_t> width(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) {
    width[c] = headers_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  size_t total = 0;
  for (size_t w : width) total += w + 2;
  const std::string rule(total, '-');
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::string pad(width[c] - cells[c].size(), ' ');
      out += left_[c] ? cells[c] + pad : pad + cells[c];
      out += c + 1 < cells.size() ? "  " : "";
    }
    return out + "\n";
  };
  std::string out = rule + "\n" + line(headers_) + rule + "\n";
  for (const auto& row : rows_) out += line(row);
  return out + rule + "\n";
}

std::string Fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, value);
  return buf;
}

std::string Truncate(const std::string& name, size_t width) {
  if (name.size() <= width || width < 4) return name;
  return name.substr(0, width - 3) + "...";
}

}  // namespace kiln::profiler
