// The pass pipeline (see pass.h).
#include "passes/pass.h"

#include "absl/strings/str_cat.h"
#include "ir/verifier.h"
#include "runtime/status.h"

namespace kiln::passes {

std::string StageName(int index, const std::string& stage) {
  return absl::StrCat(absl::Dec(index, absl::kZeroPad2), "_", stage);
}

absl::Status Pipeline::Run(ir::Graph& graph, PassContext& ctx) const {
  std::string given = StageName(0, "traced");  // the graph a pass is given: its %N are that one's
  int index = 0;
  for (const auto& pass : passes_) {
    const size_t explained = ctx.explain.size();
    absl::StatusOr<bool> changed = pass->Run(graph, ctx);
    for (size_t i = explained; i < ctx.explain.size(); ++i) {
      ctx.explain[i] = absl::StrCat("[", pass->name(), "; %N as in ", given, "] ", ctx.explain[i]);
    }
    given = StageName(++index, pass->name());
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
