// Compile dumps (see dump.h).
#include "codegen/dump.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/printer.h"
#include "passes/pass.h"
#include "runtime/cuda.h"
#include "runtime/nvrtc.h"
#include "runtime/settings.h"
#include "runtime/status.h"

namespace kiln::codegen {
namespace {

int DebugLevel() { return EnvLevel("KILN_DEBUG"); }

std::string FusedFrom(const ir::Graph& body) {
  std::vector<std::string> ops;
  for (const ir::Node& n : body.nodes()) {
    if (n.kind == ir::NodeKind::kOp) ops.push_back(GetOpDef(n.op).name);
  }
  return absl::StrJoin(ops, ", ");
}

// The first compile_NNN folder under `root` that did not exist yet, created.
std::string NewCompileFolder(const std::string& root) {
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  KILN_CHECK(!ec, "compile: cannot create the dump directory ", root, ": ", ec.message());
  for (int n = 1;; ++n) {
    const std::string dir = absl::StrCat(root, "/compile_", absl::Dec(n, absl::kZeroPad3));
    if (std::filesystem::create_directory(dir, ec)) return dir;
    KILN_CHECK(!ec, "compile: cannot create the dump directory ", dir, ": ", ec.message());
  }
}

// The PTX target of a kernel for `device`: its own architecture on a CUDA device, else sm_90's.
std::string PtxArch(Device device) {
  if (!device.is_cuda() || !cuda::IsAvailable()) return "compute_90";
  const cuda::DeviceProps& p = cuda::Props(device.index);
  return absl::StrCat("compute_", p.major, p.minor);
}

std::string FootprintLines(const FusedKernel* lowered) {
  std::string lines;
  if (lowered == nullptr) return lines;
  for (const cuda::KernelFootprint& f : lowered->Footprints()) {
    absl::StrAppend(&lines, "// ", f.ToString(), "\n");
  }
  return lines;
}

}  // namespace

Dumper::Dumper(const std::string& root) {
  if (!root.empty()) dir_ = NewCompileFolder(root);
  if (enabled()) std::filesystem::create_directories(dir_ + "/kernels");
}

void Dumper::Graph(const std::string& stage, const ir::Graph& g, bool changed) {
  if (DebugLevel() >= 4) std::cerr << "kiln: graph after " << stage << ":\n" << ir::PrintGraph(g);
  if (!enabled()) return;
  const std::string base = passes::StageName(index_++, stage);
  Write(base + ".txt", ir::PrintGraph(g),
        absl::StrCat("graph after ", stage, changed ? "" : " (unchanged)"));
  Write(base + ".dot", ir::ToDot(g), "Graphviz of the same");
}

void Dumper::Kernel(const ir::Node& n, const FusedKernel* lowered) {
  const FusionTemplate* t = TemplateFor(n);
  if (t == nullptr || n.kind != ir::NodeKind::kFusion) return;
  if (!enabled() && DebugLevel() < 3) return;  // nobody reads it: render nothing
  const std::string src = t->Source(n);
  ++sources_rendered_;
  if (DebugLevel() >= 3) std::cerr << "kiln: kernel " << n.name << ":\n" << src;
  if (!enabled()) return;
  const std::string nodes = FusedFrom(*n.body);
  Write("kernels/" + n.name + ".kir", t->KernelIr(n),
        absl::StrCat("kernel IR, ", t->name(), " family (", nodes, ")"));
  const std::string header = absl::StrCat("// ", n.name, ": fused from ", nodes, "\n// ",
                                          t->LaunchNote(n), "\n", FootprintLines(lowered));
  Write("kernels/" + n.name + ".cu", header + src, "CUDA source (" + nodes + ")");
  const std::string arch = PtxArch(n.type.device);
  auto ptx = cuda::CompileSource(src, n.name, arch, /*cubin=*/false);
  Write("kernels/" + n.name + ".ptx", ptx.ok() ? *ptx : std::string(ptx.status().message()),
        "PTX for " + arch);
}

void Dumper::Text(const std::string& name, const std::string& text, const std::string& what) {
  if (enabled()) Write(name, text, what);
}

void Dumper::Finish() {
  if (enabled()) Write("index.md", absl::StrJoin(index_lines_, "\n") + "\n", "");
}

void Dumper::Write(const std::string& name, const std::string& text, const std::string& what) {
  std::ofstream file(dir_ + "/" + name);
  file << text;
  KILN_CHECK(file.good(), "compile: cannot write the dump file ", dir_, "/", name);
  if (!what.empty()) index_lines_.push_back(absl::StrCat("- `", name, "`: ", what));
}

}  // namespace kiln::codegen
