// Kernel packages (see kernel_package.h): the manifest's parsing and checks, the choice of a
// binary for the device, building a package with NVRTC, loading one with its checks.
#include "io/kernel_package.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "io/files.h"
#include "io/json_text.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "runtime/sha256.h"
#include "runtime/status.h"

namespace kiln {
namespace {

using Json = nlohmann::json;
constexpr int kFormat = 1;
constexpr char kManifest[] = "manifest.json";

// The value of `key` in object `j` (at `where`) as a string matching `rule` (described as `what`).
absl::StatusOr<std::string> StringField(const Json& j, const std::string& where, const char* key,
                                        const std::regex& rule, const char* what) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel package manifest: ", where, key, " must be a string (", what, ")"));
  }
  const std::string value = it->get<std::string>();
  // (Checked before the regex: libstdc++'s matcher recurses once per character repeated.)
  if (value.size() > 256 || !std::regex_match(value, rule)) {
    return absl::InvalidArgumentError(absl::StrCat("kernel package manifest: ", where, key,
                                                   " must be ", what, ", got \"", value, "\""));
  }
  return value;
}

const std::regex& NameRule() {
  static const std::regex r("[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}");
  return r;
}
const std::regex& VersionRule() {
  // SemVer's shape: numbers, then a pre-release after '-' and build metadata after '+'.
  static const std::regex r("[0-9]+(\\.[0-9]+)*(-[A-Za-z0-9_.-]+)?(\\+[A-Za-z0-9_.-]+)?");
  return r;
}
const std::regex& EntryRule() {
  static const std::regex r("[A-Za-z_][A-Za-z0-9_]{0,255}");
  return r;
}
const std::regex& ArchRule() {
  static const std::regex r("(sm|compute)_([1-9][0-9]{1,2})(a?)");  // no leading zero: one spelling
  return r;
}
const std::regex& FileRule() {  // a plain file name inside the package: no folders, no ".."
  static const std::regex r("[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}");
  return r;
}
const std::regex& Sha256Rule() {
  static const std::regex r("[0-9a-f]{64}");
  return r;
}

// `where` ("kernels[0].") names an element that must be a JSON object.
absl::Status RequireObject(const Json& j, const std::string& where) {
  if (j.is_object()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "kernel package manifest: ", where.substr(0, where.size() - 1), " must be an object"));
}

absl::StatusOr<KernelBinary> ParseBinary(const Json& j, const std::string& where) {
  KILN_RETURN_IF_ERROR(RequireObject(j, where));
  KernelBinary b;
  KILN_ASSIGN_OR_RETURN(b.arch, StringField(j, where, "arch", ArchRule(),
                                            "a target like sm_90a, sm_90 or compute_80"));
  KILN_ASSIGN_OR_RETURN(
      b.file, StringField(j, where, "file", FileRule(), "a file name in the package's directory"));
  KILN_ASSIGN_OR_RETURN(
      b.sha256, StringField(j, where, "sha256", Sha256Rule(), "64 lowercase hex digits (SHA-256)"));
  return b;
}

absl::StatusOr<KernelSpec> ParseKernel(const Json& j, const std::string& where) {
  KILN_RETURN_IF_ERROR(RequireObject(j, where));
  KernelSpec k;
  KILN_ASSIGN_OR_RETURN(k.name, StringField(j, where, "name", NameRule(),
                                            "a name of letters, digits, '_', '.', '-'"));
  KILN_ASSIGN_OR_RETURN(k.entry, StringField(j, where, "entry", EntryRule(),
                                             "the kernel's C identifier (extern \"C\")"));
  const auto params = j.find("params");
  if (params == j.end() || !params->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("kernel package manifest: ", where,
                                                   "params must be an array of parameter sizes"));
  }
  for (const Json& p : *params) {
    if (!p.is_number_integer() || p.get<int64_t>() < 1 || p.get<int64_t>() > 4096) {
      return absl::InvalidArgumentError(absl::StrCat("kernel package manifest: ", where,
                                                     "params: sizes are integers in 1..4096 "
                                                     "bytes, got ",
                                                     JsonForMessage(p)));
    }
    k.param_bytes.push_back(p.get<int>());
  }
  const auto binaries = j.find("binaries");
  if (binaries == j.end() || !binaries->is_array() || binaries->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel package manifest: ", where, "binaries must be a non-empty array"));
  }
  std::set<std::string> archs;
  for (size_t i = 0; i < binaries->size(); ++i) {
    KILN_ASSIGN_OR_RETURN(KernelBinary b,
                          ParseBinary((*binaries)[i], absl::StrCat(where, "binaries[", i, "].")));
    if (!archs.insert(b.arch).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("kernel package manifest: ", where, "binaries: two for ", b.arch));
    }
    k.binaries.push_back(std::move(b));
  }
  return k;
}

// The target's (kind, capability as major * 10 + minor, arch-specific).
struct Target {
  bool cubin = false;
  int capability = 0;
  bool specific = false;
};
Target TargetOf(const std::string& arch) {
  std::smatch m;
  Target t;
  if (std::regex_match(arch, m, ArchRule())) {
    t.cubin = m[1] == "sm";
    t.capability = std::stoi(m[2]);
    t.specific = m[3] == "a";
  }
  return t;
}

// "package 'name' 1.2.0 (dir)": how errors name a package.
std::string Describe(const KernelPackageManifest& m, const std::string& dir) {
  return absl::StrCat("kernel package '", m.name, "' ", m.version, " (", dir, ")");
}

// The binary of `spec` that runs on the current device; throws naming what the package has.
const KernelBinary& BinaryForThisGpu(const KernelSpec& spec, const std::string& who) {
  const cuda::DeviceProps& props = cuda::Props();
  const KernelBinary* b = ChooseKernelBinary(spec, props.major, props.minor);
  if (b == nullptr) {
    std::vector<std::string> archs;
    for (const KernelBinary& x : spec.binaries) archs.push_back(x.arch);
    KILN_FAIL(who, ": kernel '", spec.name, "' has no binary for this GPU (", props.name,
              ", compute capability ", props.major, ".", props.minor, "); it has ",
              absl::StrJoin(archs, ", "),
              " (a CUBIN runs on its own major version, arch-specific 'a' code on its exact "
              "capability only, PTX on its capability or newer)");
  }
  return *b;
}

// Kernel `spec` from `image` (the bytes whose checksum passed), its parameters checked.
PackagedKernel LoadKernel(const KernelSpec& spec, const KernelBinary& b, const std::string& image,
                          const std::string& who) {
  absl::StatusOr<cuda::KernelHandle> handle = cuda::LoadKernelImage(image, spec.entry);
  KILN_CHECK(handle.ok(), who, ": kernel '", spec.name, "' (", b.file, ", entry ", spec.entry,
             ") does not load: ", handle.status().message());
  absl::StatusOr<std::vector<size_t>> sizes = cuda::KernelParamSizes(*handle);
  KILN_CHECK(sizes.ok(), who, ": kernel '", spec.name, "' (entry ", spec.entry,
             "): its parameters cannot be read: ", sizes.status().message());
  std::vector<int> got(sizes->begin(), sizes->end());
  KILN_CHECK(got == spec.param_bytes, who, ": kernel '", spec.name, "' (entry ", spec.entry,
             "): the manifest says ", spec.param_bytes.size(), " parameters of [",
             absl::StrJoin(spec.param_bytes, ", "), "] bytes, its binary ", b.file, " has ",
             got.size(), " of [", absl::StrJoin(got, ", "), "]");
  return PackagedKernel{spec.name, spec.entry, b.arch, spec.param_bytes, *handle};
}

}  // namespace

absl::StatusOr<KernelPackageManifest> ParseKernelPackageManifest(const std::string& json_text) {
  KILN_ASSIGN_OR_RETURN(const Json j,
                        ParseJsonStrictly(json_text, "kernel package manifest: the text"));
  if (!j.is_object()) {
    return absl::InvalidArgumentError("kernel package manifest: not a JSON object");
  }
  const auto format = j.find("format");
  if (format == j.end() || !format->is_number_integer() || format->get<int64_t>() != kFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel package manifest: format must be ", kFormat, " (this kiln's), got ",
                     format == j.end() ? "none" : JsonForMessage(*format)));
  }
  KernelPackageManifest m;
  KILN_ASSIGN_OR_RETURN(
      m.name, StringField(j, "", "name", NameRule(), "a name of letters, digits, '_', '.', '-'"));
  KILN_ASSIGN_OR_RETURN(
      m.version, StringField(j, "", "version", VersionRule(), "a version like 1.2.0 or 1.2.0-rc1"));
  const auto kernels = j.find("kernels");
  if (kernels == j.end() || !kernels->is_array() || kernels->empty()) {
    return absl::InvalidArgumentError("kernel package manifest: kernels must be a non-empty array");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < kernels->size(); ++i) {
    KILN_ASSIGN_OR_RETURN(KernelSpec k,
                          ParseKernel((*kernels)[i], absl::StrCat("kernels[", i, "].")));
    if (!names.insert(k.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("kernel package manifest: two kernels named '", k.name, "'"));
    }
    m.kernels.push_back(std::move(k));
  }
  return m;
}

std::string KernelPackageManifestJson(const KernelPackageManifest& m) {
  Json kernels = Json::array();
  for (const KernelSpec& k : m.kernels) {
    Json binaries = Json::array();
    for (const KernelBinary& b : k.binaries) {
      binaries.push_back({{"arch", b.arch}, {"file", b.file}, {"sha256", b.sha256}});
    }
    kernels.push_back(
        {{"name", k.name}, {"entry", k.entry}, {"params", k.param_bytes}, {"binaries", binaries}});
  }
  const Json j = {
      {"format", kFormat}, {"name", m.name}, {"version", m.version}, {"kernels", kernels}};
  return j.dump(2) + "\n";
}

bool KernelPackageVersionMatches(const std::string& version, const std::string& pin) {
  if (pin.empty() || pin == "*") return true;
  KILN_CHECK(pin.size() <= 256 && std::regex_match(pin, VersionRule()), "kernel package: the ",
             "version pin \"", pin.substr(0, 64), "\" is malformed (a version or its leading ",
             "components, like 1.2 or 1.2.0-rc, or * for any)");
  // Build metadata ("+build5") never decides a match (SemVer: it has no precedence).
  auto release = [](const std::string& v) { return v.substr(0, v.find('+')); };
  const std::vector<std::string> have = absl::StrSplit(release(version), '.');
  const std::vector<std::string> want = absl::StrSplit(release(pin), '.');
  if (want.size() > have.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (have[i] != want[i]) return false;
  }
  return true;
}

const KernelBinary* ChooseKernelBinary(const KernelSpec& spec, int major, int minor) {
  if (major < 1 || major > 99 || minor < 0 || minor > 9) return nullptr;  // no such device
  const int device = major * 10 + minor;
  const KernelBinary* best = nullptr;
  int best_rank = 0;
  for (const KernelBinary& b : spec.binaries) {
    const Target t = TargetOf(b.arch);
    int rank = 0;  // higher is better; 0: does not run here
    if (t.cubin && t.specific && t.capability == device) {
      rank = 3000;
    } else if (t.cubin && !t.specific && t.capability / 10 == major && t.capability <= device) {
      rank = 2000 + t.capability;  // CUBINs run on later minors of their major
    } else if (!t.cubin && (t.specific ? t.capability == device : t.capability <= device)) {
      rank = 1000 + t.capability;
    }
    if (rank > best_rank) best = &b, best_rank = rank;
  }
  return best;
}

void BuildKernelPackage(const std::string& dir, const std::string& name, const std::string& version,
                        const std::vector<KernelSource>& kernels,
                        const std::vector<std::string>& archs) {
  KILN_CHECK(!archs.empty(), "kernel package '", name, "': no target architectures");
  // The manifest it will write, with the file names it will use, checked as a reader checks it
  // before anything is compiled or written (names become file names; the checksums stand in as
  // zeros until the binaries exist).
  KernelPackageManifest m{name, version, {}};
  for (const KernelSource& k : kernels) {
    KernelSpec spec{k.name, k.entry, k.param_bytes, {}};
    for (const std::string& arch : archs) {
      const std::string file =
          absl::StrCat(k.name, ".", arch, TargetOf(arch).cubin ? ".cubin" : ".ptx");
      spec.binaries.push_back({arch, file, std::string(64, '0')});
    }
    m.kernels.push_back(std::move(spec));
  }
  const absl::StatusOr<KernelPackageManifest> checked =
      ParseKernelPackageManifest(KernelPackageManifestJson(m));
  KILN_CHECK(checked.ok(), "kernel package '", name, "' not built: ", checked.status().message());
  const std::filesystem::path root(dir);
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  KILN_CHECK(!ec, "kernel package '", name, "': cannot create ", dir, ": ", ec.message());
  std::filesystem::remove(root / kManifest, ec);  // no stale manifest while the binaries change
  for (size_t i = 0; i < kernels.size(); ++i) {
    for (KernelBinary& b : m.kernels[i].binaries) {
      const std::string binary = ValueOrThrow(
          cuda::CompileSource(kernels[i].source, kernels[i].entry, b.arch, TargetOf(b.arch).cubin));
      WriteFileAtomically(root / b.file, binary, "kernel package");
      b.sha256 = Sha256Hex(binary);
    }
  }
  WriteFileAtomically(root / kManifest, KernelPackageManifestJson(m),
                      "kernel package");  // last: the package is whole
}

void PackagedKernel::Launch(const std::vector<unsigned>& grid, const std::vector<unsigned>& block,
                            int shared_bytes, const std::vector<void*>& args) const {
  KILN_CHECK(args.size() == param_bytes.size(), "packaged kernel '", name, "' (entry ", entry,
             ") takes ", param_bytes.size(), " arguments, got ", args.size());
  KILN_CHECK(!grid.empty() && grid.size() <= 3 && !block.empty() && block.size() <= 3,
             "packaged kernel '", name, "': grid and block have 1..3 sides");
  unsigned g[3] = {1, 1, 1}, b[3] = {1, 1, 1};
  for (size_t i = 0; i < grid.size(); ++i) g[i] = grid[i];
  for (size_t i = 0; i < block.size(); ++i) b[i] = block[i];
  std::vector<void*> a = args;
  const absl::Status s =
      cuda::LaunchKernel(static_cast<cuda::KernelHandle>(handle), g, b, shared_bytes, a.data());
  KILN_CHECK(s.ok(), "packaged kernel '", name, "' (entry ", entry, ") launch: ", s.message());
}

KernelPackage KernelPackage::Load(const std::string& dir, const std::string& version_pin) {
  const std::filesystem::path root(dir);
  absl::StatusOr<std::string> text = ReadFileBytes(root / kManifest);
  KILN_CHECK(text.ok(), "kernel package (", dir, "): no readable ", kManifest, " in it");
  absl::StatusOr<KernelPackageManifest> m = ParseKernelPackageManifest(*text);
  KILN_CHECK(m.ok(), "kernel package (", dir, "): ", m.status().message());
  const std::string who = Describe(*m, dir);
  KILN_CHECK(KernelPackageVersionMatches(m->version, version_pin), who,
             ": the version does not match the pin \"", version_pin, "\"");
  // Every binary read once and checked; the driver gets these bytes, not a second read.
  std::map<std::string, std::string> verified;
  for (const KernelSpec& k : m->kernels) {
    for (const KernelBinary& b : k.binaries) {
      absl::StatusOr<std::string> data = ReadFileBytes(root / b.file);
      KILN_CHECK(data.ok(), who, ": kernel '", k.name, "': its binary ", b.file, " is missing");
      const std::string sum = Sha256Hex(*data);
      KILN_CHECK(sum == b.sha256, who, ": kernel '", k.name, "': ", b.file,
                 " fails its checksum (SHA-256 ", sum, ", the manifest says ", b.sha256,
                 "): a corrupted or replaced file");
      verified[b.file] = *std::move(data);
    }
  }
  KILN_CHECK(cuda::IsAvailable(), who,
             ": no CUDA GPU to load its kernels on (this machine or this build of kiln has none)");
  std::vector<const KernelBinary*> chosen;  // every kernel's binary before any is loaded
  for (const KernelSpec& k : m->kernels) chosen.push_back(&BinaryForThisGpu(k, who));
  KernelPackage p;
  p.name_ = m->name;
  p.version_ = m->version;
  for (size_t i = 0; i < m->kernels.size(); ++i) {
    p.kernels_.push_back(LoadKernel(m->kernels[i], *chosen[i], verified.at(chosen[i]->file), who));
  }
  return p;
}

const PackagedKernel& KernelPackage::kernel(const std::string& kernel) const {
  std::vector<std::string> names;
  for (const PackagedKernel& k : kernels_) {
    if (k.name == kernel) return k;
    names.push_back(k.name);
  }
  KILN_FAIL("kernel package '", name_, "' ", version_, " has no kernel '", kernel, "'; it has ",
            absl::StrJoin(names, ", "));
}

CustomOp KernelPackage::RegisterOp(const std::string& kernel, CustomOpSpec spec) const {
  const PackagedKernel& k = this->kernel(kernel);
  KILN_CHECK(spec.source.empty() && spec.image.empty() && spec.kernel == nullptr,
             "kernel package '", name_, "' ", version_, ": the op '", spec.name,
             "' takes the package's kernel '", kernel, "'; give it no source, image or kernel");
  spec.entry = k.entry;
  spec.kernel = k.handle;
  return RegisterCustomOp(std::move(spec));
}

}  // namespace kiln
