// The pass pipeline (see pass.h).
#include "passes/pass.h"

#include "absl/strings/str_cat.h"
#include "ir/verifier.h"
#include "passes/canonicalize.h"
#include "passes/epilogue_fusion.h"
#include "passes/fusion.h"
#include "passes/simplify.h"
#include "passes/softmax_fusion.h"
#include "runtime/status.h"

namespace kiln::passes {

absl::Status Pipeline::Run(ir::Graph& graph, PassContext& ctx) const {
  for (const auto& pass : passes_) {
    absl::StatusOr<bool> changed = pass->Run(graph, ctx);
    if (!changed.ok()) {
      return absl::Status(changed.status().code(),
                          absl::StrCat("pass ", pass->name(), ": ", changed.status().message()));
    }
    const absl::Status verified = ir::Verify(graph, ctx.check_fusion_body);
    if (!verified.ok()) {
      return absl::InternalError(
          absl::StrCat("graph invalid after pass ", pass->name(), ": ", verified.message()));
    }
    if (ctx.after_pass) ctx.after_pass(pass->name(), graph);
  }
  return absl::OkStatus();
}

Pipeline DefaultPipeline() {
  Pipeline p;
  p.Add(std::make_unique<ConstantFolding>());
  p.Add(std::make_unique<CommonSubexpressionElimination>());
  p.Add(std::make_unique<Canonicalize>());
  p.Add(std::make_unique<DeadCodeElimination>());
  p.Add(std::make_unique<GemmMerge>());
  p.Add(std::make_unique<GemmEpilogueFusion>());   // after merge: merged GEMMs feed slices
  p.Add(std::make_unique<DeadCodeElimination>());  // the absorbed activations
  p.Add(std::make_unique<SoftmaxFusion>());        // before elementwise: takes its producers
  p.Add(std::make_unique<ElementwiseFusion>());
  p.Add(std::make_unique<DeadCodeElimination>());
  return p;
}

}  // namespace kiln::passes
