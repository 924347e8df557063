// Compile dumps (CompileOptions::dump_dir, KILN_DUMP=dir, KILN_DEBUG): the traced graph and the
// graph after each pass (.txt and Graphviz .dot; a pass that changed nothing is marked so in the
// index), each fused kernel's kernel IR (.kir), CUDA source (.cu, headed by what it fused, how it
// launches and, once compiled, each kernel's registers and memory) and PTX for the device's
// architecture, the explain log, and an index.md listing every file.
//
// Each compile writes a folder of its own under the dump directory, compile_001, compile_002,
// ... (the first free number, so processes sharing the directory do not overwrite each other);
// a directory that cannot be created is an error. With dumps off and KILN_DEBUG below 3 nothing
// is rendered: kernel sources, IR and PTX are produced only for a reader.
//
//   codegen::Dumper dump(options.dump_dir);   // "" : only the KILN_DEBUG printing
//   dump.Graph("traced", graph);
//   dump.Kernel(fusion_node, lowered_kernel);
//   dump.Finish();                            // dump.dir(): the folder written
#pragma once

#include <string>
#include <vector>

#include "codegen/fusion_template.h"
#include "ir/graph.h"

namespace kiln::codegen {

class Dumper {
 public:
  // Throws kiln::Error when `root` is not "" and a folder cannot be created under it.
  explicit Dumper(const std::string& root);
  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }  // "" when dumps are off
  // `changed`: whether the pass changed the graph (an unchanged one is marked in the index).
  void Graph(const std::string& stage, const ir::Graph& g, bool changed = true);
  // Writes the kernel IR, source and PTX of a fusion node (nothing for other nodes); `lowered`
  // (may be null) adds its kernels' footprints to the source's header.
  void Kernel(const ir::Node& node, const FusedKernel* lowered);
  void Text(const std::string& name, const std::string& text, const std::string& what);
  void Finish();
  // Kernel sources rendered so far (0 with dumps off and KILN_DEBUG below 3).
  int sources_rendered() const { return sources_rendered_; }

 private:
  void Write(const std::string& name, const std::string& text, const std::string& what);

  std::string dir_;
  int index_ = 0;
  int sources_rendered_ = 0;
  std::vector<std::string> index_lines_ = {"# kiln compile dump", ""};
};

}  // namespace kiln::codegen
