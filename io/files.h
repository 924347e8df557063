// Whole files in and out, for the artifacts kiln writes (kernel packages, exported plans).
//
//   absl::StatusOr<std::string> bytes = ReadFileBytes("pkg/manifest.json");
//   WriteFileAtomically("pkg/manifest.json", text, "kernel package");
#pragma once

#include <filesystem>
#include <string>

#include "absl/status/statusor.h"

namespace kiln {

// The file's bytes, or NotFound naming the path.
absl::StatusOr<std::string> ReadFileBytes(const std::filesystem::path& path);

// `data` into `path` through a temporary file renamed into place (removed on failure), so a reader
// never sees half a file. Throws kiln::Error "<what>: cannot write <path>: <why>".
void WriteFileAtomically(const std::filesystem::path& path, const std::string& data,
                         const std::string& what);

}  // namespace kiln
