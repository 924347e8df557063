// The pass pipeline (see pass.h).
#include "passes/pass.h"

#include "absl/strings/str_cat.h"
#include "ir/verifier.h"
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
    if (ctx.after_pass) ctx.after_pass(pass->name(), graph, *changed);
  }
  return absl::OkStatus();
}

}  // namespace kiln::passes
