// Compile dumps (see dump.h).
#include "codegen/dump.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/fusion_template.h"
#include "ir/printer.h"
#include "runtime/nvrtc.h"

namespace kiln::codegen {
namespace {

int DebugLevel() {
  const char* v = std::getenv("KILN_DEBUG");
  return v == nullptr ? 0 : std::atoi(v);
}

std::string FusedFrom(const ir::Graph& body) {
  std::vector<std::string> ops;
  for (const ir::Node& n : body.nodes()) {
    if (n.kind == ir::NodeKind::kOp) ops.push_back(GetOpDef(n.op).name);
  }
  return absl::StrJoin(ops, ", ");
}

}  // namespace

Dumper::Dumper(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_ + "/kernels", ec);
  if (ec) {
    std::cerr << "kiln: cannot create dump directory " << dir_ << ": " << ec.message() << "\n";
    dir_.clear();
  }
}

void Dumper::Graph(const std::string& stage, const ir::Graph& g) {
  if (DebugLevel() >= 4) std::cerr << "kiln: graph after " << stage << ":\n" << ir::PrintGraph(g);
  if (!enabled()) return;
  const std::string base = absl::StrCat(absl::Dec(index_++, absl::kZeroPad2), "_", stage);
  Write(base + ".txt", ir::PrintGraph(g), "graph after " + stage);
  Write(base + ".dot", ir::ToDot(g), "Graphviz of the same");
}

void Dumper::Kernel(const ir::Node& n) {
  const FusionTemplate* t = TemplateFor(n);
  if (t == nullptr || n.kind != ir::NodeKind::kFusion) return;
  const std::string src = t->Source(n);
  if (DebugLevel() >= 3) std::cerr << "kiln: kernel " << n.name << ":\n" << src;
  if (!enabled()) return;
  const std::string nodes = FusedFrom(*n.body);
  Write("kernels/" + n.name + ".kir", t->KernelIr(n),
        absl::StrCat("kernel IR, ", t->name(), " family (", nodes, ")"));
  const std::string header =
      absl::StrCat("// ", n.name, ": fused from ", nodes, "\n// ", t->LaunchNote(n), "\n");
  Write("kernels/" + n.name + ".cu", header + src, "CUDA source (" + nodes + ")");
  auto ptx = cuda::CompileSource(src, n.name, "compute_90", /*cubin=*/false);
  Write("kernels/" + n.name + ".ptx", ptx.ok() ? *ptx : std::string(ptx.status().message()),
        "PTX for compute_90");
}

void Dumper::Text(const std::string& name, const std::string& text, const std::string& what) {
  if (enabled()) Write(name, text, what);
}

void Dumper::Finish() {
  if (enabled()) Write("index.md", absl::StrJoin(index_lines_, "\n") + "\n", "");
}

void Dumper::Write(const std::string& name, const std::string& text, const std::string& what) {
  std::ofstream(dir_ + "/" + name) << text;
  if (!what.empty()) index_lines_.push_back(absl::StrCat("- `", name, "`: ", what));
}

}  // namespace kiln::codegen
