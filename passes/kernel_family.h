// What a kernel family answers to the generic compiler: the questions its match/grow pass and the
// IR verifier ask, with no backend in sight. A family (codegen/families/<name>/) implements this
// in its template (codegen/fusion_template.h adds lowering and dumps); its pass is built with it
// and asks it, never the CUDA backend, whether a group may take one more operand or a given set of
// operand types:
//
//   class SoftmaxFusion : public Pass {
//    public:
//     explicit SoftmaxFusion(const KernelFamily& family) : family_(family) {}
//     ... family_.Limits(device).max_operands ... family_.RejectsOperands(types) ...
//   };
//
// Options switch a family off by its name (CompileOptions::disabled_families).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "ir/graph.h"
#include "passes/pass.h"

namespace kiln::passes {

// What one kernel of a family can take on a device.
struct FamilyLimits {
  int max_operands = 32;  // inputs plus outputs of one kernel (its parameter budget)
  int max_rank = 8;       // rank of its iteration space
};

class KernelFamily {
 public:
  virtual ~KernelFamily() = default;
  // The family's name: its folder, its switch in disabled_families, its dumps' label.
  virtual const char* name() const = 0;
  // What one of its kernels can take on `device`.
  virtual FamilyLimits Limits(Device device) const { return {}; }
  // Why its kernel cannot take operands of these types, on their device ("" when it can): the
  // one place a pass (and the lowering) asks, e.g. whether the flash kernel takes q, k, v.
  virtual std::string RejectsOperands(absl::Span<const TensorType> operands) const { return ""; }
  // Whether `node` belongs to this family (a fusion node of its body shape, or an op it owns).
  virtual bool Owns(const ir::Node& node) const = 0;
  // Whether a fusion body has this family's shape (the verifier's dispatch), and its full rule.
  virtual bool OwnsBody(const ir::Graph& body) const { return false; }
  virtual absl::Status VerifyBody(const ir::Graph& body) const { return absl::OkStatus(); }
};

// A family's match/grow pass: built with its family, which it asks (never the backend).
class FamilyPass : public Pass {
 public:
  explicit FamilyPass(const KernelFamily& family) : family_(family) {}

 protected:
  const KernelFamily& family_;
};

}  // namespace kiln::passes
