// Kernel packages: prebuilt GPU kernels that kiln did not generate (the series' "kernels hub"),
// shipped as one directory: `manifest.json` and the binaries it names.
//
//   {"format": 1, "name": "geglu", "version": "1.2.0",
//    "kernels": [{"name": "geglu", "entry": "geglu_bf16", "params": [8, 8, 4],
//                 "binaries": [{"arch": "sm_90a", "file": "geglu.sm_90a.cubin",
//                               "sha256": "…"},
//                              {"arch": "compute_80", "file": "geglu.compute_80.ptx",
//                               "sha256": "…"}]}]}
//
// `params` are the entry point's parameter sizes in bytes; `arch` is a CUBIN's target ("sm_90",
// or "sm_90a" for code that runs on compute capability 9.0 only) or PTX's ("compute_80": the
// driver compiles it for any GPU of that capability or newer). Arch-specific code has no PTX
// that runs elsewhere, so a package that lacks the running GPU's architecture and any portable
// PTX is refused.
//
//   KernelPackage pkg = KernelPackage::Load("/opt/kernels/geglu", "1.2");  // any 1.2.x
//   const PackagedKernel& k = pkg.kernel("geglu");
//   k.Launch({blocks, 1, 1}, {256, 1, 1}, 0, {&x_ptr, &out_ptr, &n});
//   CustomOp geglu = pkg.RegisterOp("geglu", spec);  // or as an op: spec's name, infer, launch
//
// Load checks, in order, with a kiln::Error naming the package and the rule broken: the manifest
// (JSON, fields, types), the version against the pin, every binary's SHA-256, a CUDA GPU, a
// binary for its architecture, then each kernel's parameters as the driver reports them against
// the manifest's. Every binary is read once: the bytes whose checksum passed are the bytes loaded.
// A package that fails a check is not returned; every check but the last (the parameters) runs
// before any of its binaries is loaded, and what was loaded stays only in kiln's kernel cache.
// BuildKernelPackage writes one from CUDA sources with NVRTC (no GPU needed; tools/kiln_package is
// its command line), checking names, version, targets and sizes before it compiles or writes.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ops/custom_op.h"

namespace kiln {

struct KernelBinary {
  std::string arch;    // "sm_90a", "sm_90", "compute_80"
  std::string file;    // relative to the package directory
  std::string sha256;  // 64 lowercase hex digits
};

struct KernelSpec {
  std::string name;              // what users ask the package for
  std::string entry;             // the extern "C" __global__ function
  std::vector<int> param_bytes;  // the entry point's parameter sizes
  std::vector<KernelBinary> binaries;
};

struct KernelPackageManifest {
  std::string name, version;
  std::vector<KernelSpec> kernels;
};

// manifest.json's text to its contents, or an error naming the field and the rule broken.
absl::StatusOr<KernelPackageManifest> ParseKernelPackageManifest(const std::string& json_text);
std::string KernelPackageManifestJson(const KernelPackageManifest& manifest);

// Whether `version` satisfies `pin`: "" or "*" any; otherwise the pin's dot-separated components
// equal the version's leading ones ("1.2" takes 1.2.0 and 1.2.7, not 1.20.0 or 1.3.0), build
// metadata after '+' left out on both sides (1.2.7+cu13 is 1.2.7). A pin that is not a version
// or its leading components ("^", "1.x", "1.") is an error.
bool KernelPackageVersionMatches(const std::string& version, const std::string& pin);

// The binary of `spec` that runs on compute capability major.minor: the arch-specific CUBIN of
// exactly that capability ("sm_90a" on 9.0), else its CUBIN ("sm_90"), else the newest PTX not
// newer than the device; nullptr when none runs there (or major.minor is no device's).
const KernelBinary* ChooseKernelBinary(const KernelSpec& spec, int major, int minor);

// A kernel to put in a package: its CUDA source (NVRTC, C++17) and entry point.
struct KernelSource {
  std::string name, entry, source;
  std::vector<int> param_bytes;
};

// Compiles every kernel for every target of `archs` ("sm_90a", "sm_90": CUBIN; "compute_80":
// PTX) and writes the package into `dir` (created; the manifest last, so a half-written package
// does not parse). Throws kiln::Error on a compile error or an unwritable directory.
void BuildKernelPackage(const std::string& dir, const std::string& name, const std::string& version,
                        const std::vector<KernelSource>& kernels,
                        const std::vector<std::string>& archs);

// One loaded kernel of a package.
struct PackagedKernel {
  std::string name, entry, arch;  // arch: the binary that was loaded
  std::vector<int> param_bytes;
  void* handle = nullptr;  // cudaKernel_t

  // Launches on the current stream; `args` one pointer per parameter (their number checked).
  void Launch(const std::vector<unsigned>& grid, const std::vector<unsigned>& block,
              int shared_bytes, const std::vector<void*>& args) const;
};

class KernelPackage {
 public:
  // Reads, checks and loads the package in `dir` (see the file comment); throws kiln::Error.
  static KernelPackage Load(const std::string& dir, const std::string& version_pin = "");

  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  const std::vector<PackagedKernel>& kernels() const { return kernels_; }
  // Throws kiln::Error naming the package and the kernels it has when there is no `kernel`.
  const PackagedKernel& kernel(const std::string& kernel) const;
  // Registers `kernel` as a custom op (ops/custom_op.h): `spec` gives the op's name, inference,
  // launch and optional CPU reference; its entry and kernel are this package's (any source, image
  // or kernel it names is an error). The loaded kernel stays in kiln's kernel cache, so the op
  // outlives this object. Throws kiln::Error as RegisterCustomOp does.
  CustomOp RegisterOp(const std::string& kernel, CustomOpSpec spec) const;

 private:
  std::string name_, version_;
  std::vector<PackagedKernel> kernels_;
};

}  // namespace kiln
