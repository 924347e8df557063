// Per-shape epilogue choice (see epilogue_choice.h).
#include "codegen/families/gemm_epilogue/epilogue_choice.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ops/cuda/device_timing.h"
#include "ops/dispatch.h"
#include "ops/factories.h"
#include "runtime/cuda_api.h"

namespace kiln::codegen {
namespace {

// A tensor of `type` filled with normal values, never zeros: a GEMM on zeros draws less power and
// may run at other clocks than on real data, which would bias the comparison. 64Ki values are
// drawn on the host and tiled by device copies (drawing all of a large operand would cost more
// than the measurement).
Tensor RandomOperand(const TensorType& type, Generator& gen) {
  Tensor out = Tensor::Empty(type);
  const int64_t n = out.numel();
  if (n == 0) return out;
  const int64_t first = std::min<int64_t>(n, int64_t{1} << 16);
  const Tensor seed = randn({first}, gen, type.dtype, type.device);
  char* base = static_cast<char*>(out.data_ptr());
  const size_t esize = out.element_size();
  KILN_CUDA_CHECK(cudaMemcpyAsync(base, seed.data_ptr(), first * esize, cudaMemcpyDeviceToDevice,
                                  cuda::CurrentStream()));
  for (int64_t filled = first; filled < n; filled *= 2) {  // doubling copies of the filled prefix
    const int64_t count = std::min(filled, n - filled);
    KILN_CUDA_CHECK(cudaMemcpyAsync(base + filled * esize, base, count * esize,
                                    cudaMemcpyDeviceToDevice, cuda::CurrentStream()));
  }
  return out;
}

// The op the split form runs after the plain GEMM (its name for the explain line).
const char* SplitOpName(const OpAttrs& attrs) {
  OpAttrs unused;
  return HasResidual(attrs) ? GetOpDef(OpId::kAdd).name
                            : EpilogueActivation(attrs.epilogue, &unused)->name;
}

EpilogueChoice Measure(const ir::Graph& graph, const ir::Node& n) {
  Generator gen(0x6b696c6e);
  std::vector<Tensor> args;
  for (ir::ValueId in : n.inputs) args.push_back(RandomOperand(graph.type(in), gen));
  const Tensor out = Tensor::Empty(n.type);
  const std::vector<double> us = cuda_ops::MedianDeviceUs(
      n.type.device, {[&] { DispatchOut(OpId::kLinear, args, n.attrs, out); },
                      [&] { RunSplit(args, n.attrs, out); }});
  const double fused_us = us[0], split_us = us[1];
  EpilogueChoice c;
  c.fused = fused_us <= split_us * 1.03;  // ties go to the fused form (one launch fewer)
  c.explain = absl::StrFormat(
      "epilogue choice: linear %s x %s %s %s: fused %.1f us, GEMM + %s kernel %.1f us -> %s",
      ShapeString(graph.type(n.inputs[0]).shape), ShapeString(graph.type(n.inputs[1]).shape),
      DTypeName(n.type.dtype), EpilogueName(n.attrs.epilogue), fused_us, SplitOpName(n.attrs),
      split_us, c.fused ? "fused" : "split");
  return c;
}

// The choice stored by an earlier process for this problem on this device and library, or
// measured now (and stored). A stored choice's explain line ends in "(stored)".
EpilogueChoice StoredOrMeasured(const ir::Graph& graph, const ir::Node& n,
                                const std::string& problem) {
  const std::string key =
      absl::StrCat("epilogue|", problem, "|", cuda_ops::DeviceIdentity(n.type.device));
  if (std::optional<std::string> stored = cuda_ops::LoadDecision(key)) {
    const size_t eol = stored->find('\n');
    const std::string form = stored->substr(0, eol);
    if (eol != std::string::npos && (form == "fused" || form == "split")) {
      return {form == "fused", absl::StrCat(stored->substr(eol + 1), " (stored)")};
    }
  }
  const EpilogueChoice c = Measure(graph, n);
  cuda_ops::StoreDecision(key, absl::StrCat(c.fused ? "fused" : "split", "\n", c.explain));
  return c;
}

}  // namespace

EpilogueChoice ChooseEpilogue(const ir::Graph& graph, const ir::Node& n) {
  if (!n.type.device.is_cuda() || n.attrs.epilogue == Epilogue::kNone) return {};
  std::string key = absl::StrCat(EpilogueName(n.attrs.epilogue), n.inputs.size());
  for (ir::ValueId in : n.inputs) absl::StrAppend(&key, "|", Describe(graph.type(in)));
  static std::mutex mu;  // guards `cache` (not held while measuring)
  static std::map<std::string, EpilogueChoice> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  const EpilogueChoice c = StoredOrMeasured(graph, n, key);
  std::lock_guard<std::mutex> lock(mu);
  return cache.emplace(key, c).first->second;
}

}  // namespace kiln::codegen
