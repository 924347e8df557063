// The host side of the kernel cache (see nvrtc.h): the disk files (a header with the magic,
// the payload's length and hash, then the payload), their directory and the hash of their keys.
// No CUDA here: decisions (ops/cuda/device_timing.h) are stored the same way.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "runtime/nvrtc.h"
#include "runtime/settings.h"

namespace kiln::cuda {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'B', 'I', 'N', '1'};

// Disk cache: header (magic, payload length, payload hash) + payload.
std::string CachePath(uint64_t key, const char* extension) {
  const std::string dir = KernelCacheDir();
  return dir.empty() ? "" : absl::StrCat(dir, "/", absl::Hex(key, absl::kZeroPad16), extension);
}

}  // namespace

bool ReadCacheFile(uint64_t key, std::string* payload, const char* extension) {
  const std::string path = CachePath(key, extension);
  if (path.empty()) return false;
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  const size_t header = sizeof(kMagic) + 16;
  if (data.size() < header || data.compare(0, sizeof(kMagic), kMagic, sizeof(kMagic)) != 0) {
    return false;
  }
  uint64_t length = 0, hash = 0;
  std::memcpy(&length, data.data() + 8, 8);
  std::memcpy(&hash, data.data() + 16, 8);
  if (data.size() != header + length) return false;  // truncated or padded
  *payload = data.substr(header);
  return Fnv1a(*payload) == hash;  // corrupt otherwise: the caller rebuilds
}

void WriteCacheFile(uint64_t key, const std::string& payload, const char* extension) {
  const std::string path = CachePath(key, extension);
  if (path.empty()) return;
  // Unique per process and per write (threads of one process may write the same key at once).
  static std::atomic<uint64_t> writes{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", writes.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;  // unwritable directory: the memory cache still works
    const uint64_t length = payload.size(), hash = Fnv1a(payload);
    out.write(kMagic, sizeof(kMagic));
    out.write(reinterpret_cast<const char*>(&length), 8);
    out.write(reinterpret_cast<const char*>(&hash), 8);
    out.write(payload.data(), static_cast<std::streamsize>(payload.size()));
    if (!out) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

uint64_t Fnv1a(const std::string& data, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : data) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string KernelCacheDir() {
  static const std::string dir = [] {
    std::string d;
    if (const std::string dir = EnvPath("KILN_CACHE_DIR"); !dir.empty()) {
      d = dir;
    } else if (const char* xdg = std::getenv("XDG_CACHE_HOME")) {
      d = absl::StrCat(xdg, "/kiln");
    } else if (const char* home = std::getenv("HOME")) {
      d = absl::StrCat(home, "/.cache/kiln");
    }
    std::error_code ec;
    if (!d.empty()) std::filesystem::create_directories(d, ec);
    return ec || d.empty() || access(d.c_str(), W_OK) != 0 ? std::string() : d;
  }();
  return dir;
}

std::string KernelFootprint::ToString() const {
  return absl::StrCat(name, ": ", registers, " registers, ", shared_bytes, " B shared, ",
                      local_bytes, " B local, <= ", max_threads, " threads");
}

}  // namespace kiln::cuda
