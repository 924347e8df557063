// Scalar's text form (runtime/scalar.h).
#include "runtime/scalar.h"

#include <charconv>
#include <cmath>

namespace kiln {

std::string Scalar::ToString() const {
  if (bool_) return int_ != 0 ? "true" : "false";
  if (integer_) return std::to_string(int_);
  if (std::isinf(double_)) return double_ > 0 ? "inf" : "-inf";
  if (std::isnan(double_)) return "nan";
  char buf[32];  // the shortest text that reads back as the same double
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), double_);
  std::string s(buf, ec == std::errc() ? end : buf);
  // A floating value that prints like an integer gets ".0", so the text keeps the kind.
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

}  // namespace kiln
