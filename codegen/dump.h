// Compile dumps (CompileOptions::dump_dir, KILN_DUMP=dir, KILN_DEBUG): the traced graph and the
// graph after each pass (.txt and Graphviz .dot), each fused kernel's kernel IR (.kir), CUDA
// source (.cu, headed by what it fused and how it launches) and PTX, the explain log, and an
// index.md listing every file.
//
//   codegen::Dumper dump(options.dump_dir);   // "" : only the KILN_DEBUG printing
//   dump.Graph("traced", graph);
//   dump.Kernel(fusion_node);
//   dump.Finish();
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::codegen {

class Dumper {
 public:
  explicit Dumper(std::string dir);
  bool enabled() const { return !dir_.empty(); }
  void Graph(const std::string& stage, const ir::Graph& g);
  // Writes the kernel IR, source and PTX of a fusion node (nothing for other nodes).
  void Kernel(const ir::Node& node);
  void Text(const std::string& name, const std::string& text, const std::string& what);
  void Finish();

 private:
  void Write(const std::string& name, const std::string& text, const std::string& what);

  std::string dir_;
  int index_ = 0;
  std::vector<std::string> index_lines_ = {"# kiln compile dump", ""};
};

}  // namespace kiln::codegen
