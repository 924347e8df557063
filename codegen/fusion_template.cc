// The table of kernel families and the pipeline built from it (see fusion_template.h).
#include "codegen/fusion_template.h"

#include "absl/strings/str_cat.h"
#include "passes/canonicalize.h"
#include "passes/cat_sinking.h"
#include "passes/gemm_merge.h"
#include "passes/simplify.h"

namespace kiln::codegen {

const std::vector<const FusionTemplate*>& FusionTemplates() {
  static const std::vector<const FusionTemplate*> kTable = {
      &AttentionTemplate(),     // before softmax: takes the whole scores chain
      &GemmTemplate(),          // GeGLU: merged gate/up linear + gelu(gate) * up, after GEMM merge
      &GemmEpilogueTemplate(),  // linear + relu / tanh GELU, after GEMM merge
      &NormLinearTemplate(),    // norm + linear (its epilogue kept): one GEMV for few rows
      &SoftmaxTemplate(),       // before pointwise: takes its prologue producers
      &PointwiseTemplate(),
  };
  return kTable;
}

const FusionTemplate* TemplateFor(const ir::Node& node) {
  for (const FusionTemplate* t : FusionTemplates()) {
    if (t->Owns(node)) return t;
  }
  return nullptr;
}

const FusionTemplate* TemplateNamed(const std::string& name) {
  for (const FusionTemplate* t : FusionTemplates()) {
    if (name == t->name()) return t;
  }
  return nullptr;
}

std::string FamilyNames() {
  std::string names;
  for (const FusionTemplate* t : FusionTemplates()) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", t->name());
  }
  return names;
}

absl::Status CheckFusionBody(const ir::Graph& body) {
  for (const FusionTemplate* t : FusionTemplates()) {
    if (t->OwnsBody(body)) return t->VerifyBody(body);
  }
  return absl::InternalError(
      "no kernel family accepts this body (pointwise: elementwise ops only; softmax: elementwise "
      "ops ending in a last-dim softmax and at most one cast)");
}

passes::Pipeline CompilePipeline() {
  passes::Pipeline p;
  p.Add(std::make_unique<passes::ConstantFolding>());
  p.Add(std::make_unique<passes::CommonSubexpressionElimination>());
  p.Add(std::make_unique<passes::Canonicalize>());
  p.Add(std::make_unique<passes::CatSinking>());
  p.Add(std::make_unique<passes::DeadCodeElimination>());
  p.Add(std::make_unique<passes::GemmMerge>());
  for (const FusionTemplate* t : FusionTemplates()) {
    p.Add(t->MakePass());
    p.Add(std::make_unique<passes::DeadCodeElimination>());  // what the family absorbed
  }
  return p;
}

}  // namespace kiln::codegen
