// Deferring one-row GEMVs into chain kernels (gemv_chain.h).
#include "ops/cuda/gemv_chain.h"

#include <atomic>
#include <optional>
#include <vector>

#include "ops/cuda/gemv_kernels.h"
#include "profiler/host.h"
#include "runtime/cuda_api.h"
#include "runtime/settings.h"

namespace kiln::cuda_ops {
namespace {

struct ChainState {
  int open = 0;  // nesting depth of the open regions (a plan run inside a user's region)
  int paused = 0;
  cudaStream_t stream = nullptr;
  int device = 0;  // current when the pending GEMVs were deferred: their stream's
  std::vector<cuda_kernels::GemvArgs> pending;
  std::vector<Tensor> operands;  // of the pending GEMVs, released once they are launched
  int saved = 0;
};

ChainState& State() {
  thread_local ChainState state;
  return state;
}

// The header's inline flags, after every change of `s`.
void SyncFlags(const ChainState& s) {
  internal::t_deferring = s.open > 0 && s.paused == 0;
  internal::t_pending = !s.pending.empty();
}

// -1: KILN_GEMV_CHAIN decides; 0 / 1: SetGemvChainEnabled's.
std::atomic<int> g_override{-1};

}  // namespace

bool GemvChainEnabled() {
  const int forced = g_override.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1;
  static const bool enabled = EnvBool("KILN_GEMV_CHAIN");
  return enabled;
}

void SetGemvChainEnabled(bool on) { g_override.store(on ? 1 : 0, std::memory_order_relaxed); }

bool BeginGemvChain() {
  if (!GemvChainEnabled()) return false;
  ChainState& s = State();
  ++s.open;
  SyncFlags(s);
  return true;
}

void EndGemvChain(bool opened) {
  ChainState& s = State();
  if (opened && s.open > 0) --s.open;  // closed even when the launch below throws
  SyncFlags(s);
  FlushDeferredGemvs();
}

void AbandonGemvChain(bool opened) noexcept {
  ChainState& s = State();
  if (opened && s.open > 0) --s.open;
  SyncFlags(s);
  try {  // what is pending may write tensors the caller still holds: launch it if the GPU can
    FlushDeferredGemvs();
  } catch (...) {
    s.pending.clear();
    s.operands.clear();
    SyncFlags(s);
  }
}

void internal::LaunchPendingGemvs() {
  ChainState& s = State();
  if (s.pending.empty()) return;
  const std::vector<cuda_kernels::GemvArgs> ops = std::move(s.pending);
  const std::vector<Tensor> operands = std::move(s.operands);  // released after the launch
  s.pending.clear();
  s.operands.clear();
  SyncFlags(s);
  // The profiler shows the chain as an op of its own (inside the op whose launch flushed it).
  std::optional<profiler::OpRange> range;
  if (profiler::IsActive()) range.emplace("gemv_chain", absl::Span<const Tensor>());
  int current = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&current));
  if (current != s.device) KILN_CUDA_CHECK(cudaSetDevice(s.device));
  int launches = 0;
  const cudaError_t launched =
      cuda_kernels::GemvChain(ops.data(), static_cast<int>(ops.size()), s.stream, &launches);
  if (current != s.device) KILN_CUDA_CHECK(cudaSetDevice(current));
  KILN_CUDA_CHECK(launched);
  s.saved += static_cast<int>(ops.size()) - launches;
}

bool DeferGemv(const cuda_kernels::GemvArgs& op, cuda::StreamHandle stream,
               std::vector<Tensor> operands) {
  ChainState& s = State();
  if (!s.open || s.paused > 0 || !cuda_kernels::GemvChainTakes(op)) {
    FlushDeferredGemvs();
    return false;
  }
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  if (!s.pending.empty() &&
      (s.stream != stream || s.device != device || s.pending[0].type != op.type ||
       static_cast<int>(s.pending.size()) == cuda_kernels::kGemvChainMaxOps)) {
    FlushDeferredGemvs();
  }
  s.stream = stream;
  s.device = device;
  s.pending.push_back(op);
  for (Tensor& t : operands) s.operands.push_back(std::move(t));
  SyncFlags(s);
  return true;
}

int GemvChainLaunchesSaved() { return State().saved; }

GemvChainPause::GemvChainPause() {
  FlushDeferredGemvs();
  ChainState& s = State();
  ++s.paused;
  SyncFlags(s);
}

GemvChainPause::~GemvChainPause() {
  ChainState& s = State();
  --s.paused;
  SyncFlags(s);
}

GemvChainIsolate::GemvChainIsolate() {
  FlushDeferredGemvs();
  ChainState& s = State();
  saved_open_ = s.open;
  saved_paused_ = s.paused;
  s.open = 0;
  s.paused = 0;
  SyncFlags(s);
}

GemvChainIsolate::~GemvChainIsolate() {
  ChainState& s = State();
  // The regions opened meanwhile have closed, each launching what it held (an abandoned one too):
  // nothing is pending here.
  s.open = saved_open_;
  s.paused = saved_paused_;
  SyncFlags(s);
}

}  // namespace kiln::cuda_ops
