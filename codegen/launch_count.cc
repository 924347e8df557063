// Launches of one library call, measured by stream capture (see launch_count.h).
#include "codegen/launch_count.h"

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ops/cuda/gemv_chain.h"
#include "ops/dispatch.h"
#include "runtime/build_config.h"
#include "runtime/cuda.h"
#include "runtime/status.h"

namespace kiln::codegen {

std::string LaunchKey(OpId op, absl::Span<const Tensor> inputs, const OpAttrs& a) {
  std::string key = absl::StrCat(GetOpDef(op).name, "|", EpilogueName(a.epilogue), "|",
                                 a.transpose_a, a.transpose_b);
  for (const Tensor& t : inputs) {
    absl::StrAppend(&key, "|", Describe(t.type()), "/", absl::StrJoin(t.strides(), ","), "@",
                    reinterpret_cast<uintptr_t>(t.data_ptr()) % 256);
  }
  return key;
}

LaunchCount CountLaunchesOnce(OpId op, absl::Span<const Tensor> inputs, const OpAttrs& attrs) {
  if (inputs.empty() || !inputs[0].device().is_cuda()) return {1, 0, "not on CUDA"};
  return CountCallLaunchesOnce(LaunchKey(op, inputs, attrs), [&] { Dispatch(op, inputs, attrs); });
}

LaunchCount CountCallLaunchesOnce(const std::string& key, const std::function<void()>& call) {
  if (cuda::Capturing()) return {1, 0, "the caller is capturing"};
  static std::mutex mu;  // guards `cache` (not held while measuring)
  static auto* cache = new std::map<std::string, LaunchCount>;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache->find(key); it != cache->end()) return it->second;
  }
  // A GEMV deferred into a chain inside the counting capture would launch after it, on the
  // placeholders: the region is paused (what it holds launches first, outside the capture).
  std::optional<std::conditional_t<kWithCuda, cuda_ops::GemvChainPause, int>> no_chains;
  if constexpr (kWithCuda) no_chains.emplace();
  const cuda::LaunchTally t = cuda::CountCapturedLaunches(call);
  const LaunchCount c =
      t.error.empty() ? LaunchCount{t.kernels, t.memsets, ""} : LaunchCount{1, 0, t.error};
  std::lock_guard<std::mutex> lock(mu);
  return cache->emplace(key, c).first->second;
}

}  // namespace kiln::codegen
