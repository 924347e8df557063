// Whole files in and out (see files.h).
#include "io/files.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace kiln {

absl::StatusOr<std::string> ReadFileBytes(const std::filesystem::path& path) {
  // Regular files only (a symlink is followed): a FIFO would block the read, a device file such
  // as /dev/zero never end.
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", path.string(), ": not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFileAtomically(const std::filesystem::path& path, const std::string& data,
                         const std::string& what) {
  const std::filesystem::path tmp = path.string() + ".part";
  bool written;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    written = out.good();
  }
  std::error_code ec;
  if (written) std::filesystem::rename(tmp, path, ec);
  if (!written || ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    KILN_FAIL(what, ": cannot write ", path.string(), ": ",
              written ? ec.message() : std::string(std::strerror(errno)));
  }
}

}  // namespace kiln
