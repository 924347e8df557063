// kiln_package: builds a kernel package (io/kernel_package.h) from CUDA source files with NVRTC;
// no GPU needed. Each --kernel names the kernel, its source file, its extern "C" entry point and
// its parameters' sizes in bytes; every kernel is compiled for every --arch (sm_XY[a]: CUBIN,
// compute_XY: PTX).
//
//   kiln_package --name adder --version 1.4.2 --out build/adder --arch sm_90a,compute_80
//                --kernel add=tools/kiln_package/add.cu:pkg_add:8,4,4
//
// Exit 0: the package is written (manifest.json last). 1: a compile error or an unwritable
// folder (the message says which). 2: bad arguments.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "io/kernel_package.h"
#include "runtime/status.h"

namespace {

int Usage(const char* why) {
  std::fprintf(stderr,
               "kiln_package: %s\nusage: kiln_package --name NAME --version VERSION --out DIR "
               "--arch ARCH[,ARCH...] --kernel NAME=FILE.cu:ENTRY:SIZE[,SIZE...] [--kernel ...]\n",
               why);
  return 2;
}

// "NAME=FILE:ENTRY:8,4,4" to a kernel source (the file read); false when malformed or unreadable.
bool ParseKernel(const std::string& arg, kiln::KernelSource* k, std::string* why) {
  const std::vector<std::string> eq = absl::StrSplit(arg, absl::MaxSplits('=', 1));
  const std::vector<std::string> parts =
      eq.size() == 2 ? absl::StrSplit(eq[1], ':') : std::vector<std::string>();
  if (parts.size() != 3) {
    *why = "--kernel takes NAME=FILE.cu:ENTRY:SIZES, got \"" + arg + "\"";
    return false;
  }
  k->name = eq[0];
  k->entry = parts[1];
  for (const absl::string_view size : absl::StrSplit(parts[2], ',', absl::SkipEmpty())) {
    int bytes = 0;
    if (!absl::SimpleAtoi(size, &bytes)) {
      *why = "--kernel " + arg + ": parameter sizes are integers";
      return false;
    }
    k->param_bytes.push_back(bytes);
  }
  std::ifstream in(parts[0]);
  if (!in) {
    *why = "cannot read " + parts[0];
    return false;
  }
  std::ostringstream s;
  s << in.rdbuf();
  k->source = s.str();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string name, version, out;
  std::vector<std::string> archs;
  std::vector<kiln::KernelSource> kernels;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return Usage(("no value after " + flag).c_str());
    const std::string value = argv[++i];
    if (flag == "--name") {
      name = value;
    } else if (flag == "--version") {
      version = value;
    } else if (flag == "--out") {
      out = value;
    } else if (flag == "--arch") {
      archs = absl::StrSplit(value, ',', absl::SkipEmpty());
    } else if (flag == "--kernel") {
      kiln::KernelSource k;
      std::string why;
      if (!ParseKernel(value, &k, &why)) return Usage(why.c_str());
      kernels.push_back(std::move(k));
    } else {
      return Usage(("unknown flag " + flag).c_str());
    }
  }
  if (name.empty() || version.empty() || out.empty() || archs.empty() || kernels.empty()) {
    return Usage("--name, --version, --out, --arch and at least one --kernel are needed");
  }
  try {
    kiln::BuildKernelPackage(out, name, version, kernels, archs);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln_package: %s\n", e.what());
    return 1;
  }
  std::printf("kiln_package: wrote %s %s to %s (%zu kernels x %zu targets)\n", name.c_str(),
              version.c_str(), out.c_str(), kernels.size(), archs.size());
  return 0;
}
