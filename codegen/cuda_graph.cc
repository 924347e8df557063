// CUDA graph replay of an executable plan (see cuda_graph.h).
#include "codegen/cuda_graph.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>

#include "absl/strings/str_cat.h"
#include "ops/cuda/gemv_chain.h"
#include "ops/cuda/index_cuda.h"
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "profiler/host.h"
#include "runtime/cuda_api.h"
#include "runtime/settings.h"
#include "runtime/status.h"

namespace kiln::codegen {
namespace {

// Ends a capture that failed half-way, so the stream is usable again.
void AbandonCapture(cudaStream_t stream) {
  cudaGraph_t partial = nullptr;
  cudaStreamEndCapture(stream, &partial);
  if (partial != nullptr) cudaGraphDestroy(partial);
  cudaGetLastError();
}

// With KILN_CUDA_GRAPH_DOT=PREFIX, each captured graph is written as PREFIX.N.dot (Graphviz,
// cudaGraphDebugDotPrint's verbose form: every kernel, allocation and free node with its
// addresses and dependencies), to check the order of graph-memory nodes by eye or by script.
void WriteGraphDot(cudaGraph_t graph) {
  static std::atomic<int> counter{0};
  const std::string dot = EnvPath("KILN_CUDA_GRAPH_DOT");
  const char* prefix = dot.empty() ? nullptr : dot.c_str();
  if (prefix == nullptr || *prefix == 0) return;
  const std::string path = absl::StrCat(prefix, ".", counter++, ".dot");
  (void)cudaGraphDebugDotPrint(graph, path.c_str(), cudaGraphDebugDotFlagsVerbose);
}

size_t Bytes(const Tensor& t) { return t.numel() * DTypeSize(t.dtype()); }

absl::StatusOr<std::vector<cudaGraphNode_t>> GraphNodes(cudaGraph_t graph) {
  size_t count = 0;
  KILN_RETURN_IF_ERROR(
      cuda::ToStatus(cudaGraphGetNodes(graph, nullptr, &count), "cudaGraphGetNodes"));
  std::vector<cudaGraphNode_t> nodes(count);
  KILN_RETURN_IF_ERROR(
      cuda::ToStatus(cudaGraphGetNodes(graph, nodes.data(), &count), "cudaGraphGetNodes"));
  return nodes;
}

// The arena limit (KILN_CAPTURE_ARENA_MB; 0: no arena).
size_t ArenaLimit() { return size_t(EnvLevel("KILN_CAPTURE_ARENA_MB")) << 20; }

// The first arena a capture of `exe` tries: the plan's peak of intermediates and the outputs it
// allocates at the traced sizes (not the inputs it writes in place: a decode step's KV caches),
// plus a quarter and 1 MiB for what ops allocate inside (workspaces, split partials).
size_t FirstArenaBytes(const Executable& exe) {
  size_t bytes = static_cast<size_t>(exe.planned_peak_bytes() + exe.planned_output_bytes());
  return bytes + bytes / 4 + (size_t{1} << 20);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaGraphPlan>> CudaGraphPlan::Capture(
    const Executable& exe, const std::vector<Tensor>& inputs, Binding binding) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].device().is_cuda()) {
      return absl::FailedPreconditionError(
          absl::StrCat("input ", i, " is on ", inputs[i].device().str(), ", not a CUDA device"));
    }
  }
  std::unique_ptr<CudaGraphPlan> plan(new CudaGraphPlan(exe, binding));
  const size_t first = FirstArenaBytes(exe), limit = ArenaLimit();
  KILN_RETURN_IF_ERROR(plan->CaptureOnce(inputs, first <= limit ? first : 0));
  if (first > limit && limit > 0) plan->arena_over_limit_ = first;  // a limit of 0: no arenas
  // An arena too small for what the capture allocated: once more at the size it needed (the
  // capture repeats the same allocations), unless that is beyond the limit.
  if (plan->arena_ != nullptr && plan->arena_->overflowed()) {
    const size_t needed = plan->arena_->needed_bytes();
    if (needed > limit) {
      plan->arena_over_limit_ = needed;
      return plan;
    }
    plan.reset(new CudaGraphPlan(exe, binding));
    KILN_RETURN_IF_ERROR(plan->CaptureOnce(inputs, needed));
  }
  return plan;
}

size_t CudaGraphPlan::arena_bytes() const { return arena_ == nullptr ? 0 : arena_->capacity(); }

absl::Status CudaGraphPlan::CaptureOnce(const std::vector<Tensor>& inputs, size_t arena_bytes) {
  const bool copy_in = binding_ == Binding::kCopyIn;
  const Device device = exe_.graph().node(exe_.graph().outputs()[0]).type.device;
  if (arena_bytes > 0) arena_ = std::make_shared<cuda::CaptureArena>(arena_bytes, device);
  std::vector<Tensor> sources;  // copy-in: contiguous inputs, made before the capture starts
  for (const Tensor& t : inputs) {
    static_inputs_.push_back(copy_in ? Tensor::Empty(t.type()) : t);
    if (copy_in) sources.push_back(contiguous(t));
  }
  // The flag the captured index kernels raise on a bad index, read after each replay.
  const ir::Graph& g = exe_.graph();
  index_flag_ = cuda_ops::ZeroedFlag(g.node(g.outputs()[0]).type.device);
  // GEMVs a caller's chain region holds launch now; during the capture only the plan's own region
  // defers them, and launches them into the graph before the capture ends.
  const cuda_ops::GemvChainIsolate own_chains;
  // The caller's stream only (a device-wide sync would interfere with other threads' captures).
  KILN_CUDA_CHECK(cudaStreamSynchronize(cuda::CurrentStream()));
  std::vector<Tensor> outs;
  {
    cuda::StreamGuard guard(stream_.get());
    KILN_RETURN_IF_ERROR(
        cuda::ToStatus(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal),
                       "cudaStreamBeginCapture"));
    try {
      for (size_t i = 0; i < sources.size(); ++i) {
        KILN_CUDA_CHECK(cudaMemcpyAsync(static_inputs_[i].data_ptr(), sources[i].data_ptr(),
                                        Bytes(sources[i]), cudaMemcpyDeviceToDevice,
                                        stream_.get()));
        bound_sources_.push_back(sources[i].data_ptr());
      }
      cuda_ops::IndexCheckScope checks(index_flag_.data<unsigned>());
      const cuda::ScopedCaptureArena in_arena(arena_);
      outs = exe_.Run(static_inputs_);
      checks_indices_ = checks.used();
    } catch (const Error& e) {
      AbandonCapture(stream_.get());
      return absl::Status(e.status().code(),
                          absl::StrCat("while capturing the plan: ", e.status().message()));
    }
    KILN_RETURN_IF_ERROR(
        cuda::ToStatus(cudaStreamEndCapture(stream_.get(), &graph_), "cudaStreamEndCapture"));
    WriteGraphDot(graph_);
  }
  // Outputs must be memory the graph allocated: not an input, not a constant. The capture-time
  // storages of graph allocations are given up without freeing (the memory exists only during
  // a replay).
  std::vector<const Storage*> foreign;
  for (const Tensor& in : static_inputs_) foreign.push_back(in.storage().get());
  for (const ir::Node& n : exe_.graph().nodes()) {
    if (n.kind == ir::NodeKind::kConstant) foreign.push_back(n.constant.storage().get());
  }
  std::string alias;
  for (size_t i = 0; i < outs.size(); ++i) {
    Storage& s = *outs[i].storage();
    if (std::find(foreign.begin(), foreign.end(), &s) != foreign.end()) {
      alias = absl::StrCat("output ", i, " aliases an input or a constant");
      continue;
    }
    const bool in_arena = arena_ != nullptr && arena_->Contains(s.data());
    outputs_.push_back({s.data(), s.nbytes(), outs[i].device(), outs[i].offset(), outs[i].shape(),
                        outs[i].strides(), outs[i].dtype(), in_arena});
  }
  for (Tensor& t : outs) {
    if (std::find(foreign.begin(), foreign.end(), t.storage().get()) == foreign.end()) {
      t.storage()->Release();
    }
  }
  outs.clear();
  if (!alias.empty()) return absl::FailedPreconditionError(alias);
  KILN_RETURN_IF_ERROR(
      cuda::ToStatus(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate"));
  KILN_RETURN_IF_ERROR(CountNodesAndEdges());
  if (!copy_in) {
    static_inputs_.clear();  // by address: the caller's tensors, not ours to keep alive
    return absl::OkStatus();
  }
  return FindInputCopies();
}

// The graph's nodes, its memory nodes and its programmatic edges (what the report shows).
absl::Status CudaGraphPlan::CountNodesAndEdges() {
  KILN_ASSIGN_OR_RETURN(const std::vector<cudaGraphNode_t> nodes, GraphNodes(graph_));
  nodes_ = static_cast<int>(nodes.size());
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    KILN_RETURN_IF_ERROR(cuda::ToStatus(cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType"));
    memory_nodes_ += type == cudaGraphNodeTypeMemAlloc || type == cudaGraphNodeTypeMemFree;
  }
  size_t edges = 0;
  KILN_RETURN_IF_ERROR(cuda::ToStatus(cudaGraphGetEdges(graph_, nullptr, nullptr, nullptr, &edges),
                                      "cudaGraphGetEdges"));
  std::vector<cudaGraphNode_t> from(edges), to(edges);
  std::vector<cudaGraphEdgeData> data(edges);
  KILN_RETURN_IF_ERROR(cuda::ToStatus(
      cudaGraphGetEdges(graph_, from.data(), to.data(), data.data(), &edges), "cudaGraphGetEdges"));
  for (size_t i = 0; i < edges; ++i) {
    programmatic_edges_ += data[i].type == cudaGraphDependencyTypeProgrammatic;
  }
  return absl::OkStatus();
}

// The memcpy node that fills each static input (matched by destination address).
absl::Status CudaGraphPlan::FindInputCopies() {
  KILN_ASSIGN_OR_RETURN(const std::vector<cudaGraphNode_t> nodes, GraphNodes(graph_));
  input_copies_.assign(static_inputs_.size(), nullptr);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    KILN_RETURN_IF_ERROR(cuda::ToStatus(cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType"));
    if (type != cudaGraphNodeTypeMemcpy) continue;
    cudaMemcpy3DParms p{};
    KILN_RETURN_IF_ERROR(
        cuda::ToStatus(cudaGraphMemcpyNodeGetParams(node, &p), "cudaGraphMemcpyNodeGetParams"));
    for (size_t i = 0; i < static_inputs_.size(); ++i) {
      if (p.dstPtr.ptr == static_inputs_[i].data_ptr()) input_copies_[i] = node;
    }
  }
  for (size_t i = 0; i < input_copies_.size(); ++i) {
    if (input_copies_[i] == nullptr && Bytes(static_inputs_[i]) > 0) {
      return absl::InternalError(absl::StrCat("no memcpy node for input ", i, " in the graph"));
    }
  }
  return absl::OkStatus();
}

CudaGraphPlan::~CudaGraphPlan() {
  // The arena goes back to the pool on the stream that allocated it: the last replay, on whichever
  // stream, must be done first.
  if (arena_ != nullptr && replays_ > 0) cudaEventSynchronize(replayed_.get());
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  if (graph_ != nullptr) cudaGraphDestroy(graph_);
}

bool CudaGraphPlan::PreviousOutputsHeld() const {
  for (const std::weak_ptr<Storage>& s : handed_out_) {
    if (!s.expired()) return true;
  }
  return false;
}

std::vector<Tensor> CudaGraphPlan::Run(const std::vector<Tensor>& inputs) {
  // GEMVs a caller's chain region holds may write what the graph reads: they launch first.
  cuda_ops::FlushDeferredGemvs();
  if (PreviousOutputsHeld()) {  // a replay would overwrite them: run the plan instead
    ++fallbacks_;
    return exe_.Run(inputs);
  }
  std::optional<profiler::OpRange> range;  // the whole replay is one op to the profiler
  if (KILN_PREDICT_FALSE(profiler::IsActive())) range.emplace("cuda_graph_replay", inputs);
  std::vector<Tensor> keep_alive;  // contiguous copies of strided inputs, until enqueued
  for (size_t i = 0; i < bound_sources_.size(); ++i) {  // copy-in binding only
    const Tensor* src = &inputs[i];
    if (!src->is_contiguous()) src = &keep_alive.emplace_back(contiguous(inputs[i]));
    if (src->data_ptr() == bound_sources_[i] || input_copies_[i] == nullptr) continue;
    KILN_CUDA_CHECK(
        cudaGraphExecMemcpyNodeSetParams1D(exec_, input_copies_[i], static_inputs_[i].data_ptr(),
                                           src->data_ptr(), Bytes(*src), cudaMemcpyDeviceToDevice));
    bound_sources_[i] = src->data_ptr();
  }
  KILN_CUDA_CHECK(cudaGraphLaunch(exec_, cuda::CurrentStream()));
  if (arena_ != nullptr) replayed_.Record(cuda::CurrentStream());
  ++replays_;
  // The outputs are adopted first: a throw below frees them (a graph whose allocations are still
  // alive cannot be launched again).
  std::vector<Tensor> outs = AdoptOutputs();
  if (checks_indices_) {  // one wait per replay, before the caller's inputs are written back
    cuda_ops::ThrowIfIndexFlagged(index_flag_.data<unsigned>(), "compiled function (CUDA graph)");
  }
  if (binding_ == Binding::kCopyIn) {  // the plan wrote the graph's copies of written inputs
    for (int i : exe_.graph().input_updates()) {
      DispatchOut(OpId::kContiguous, {static_inputs_[i]}, {}, inputs[i]);
    }
  }
  return outs;
}

// The replay's outputs as tensors over the graph's allocations (the caller frees them).
std::vector<Tensor> CudaGraphPlan::AdoptOutputs() {
  std::vector<Tensor> outs;
  handed_out_.clear();
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const OutputTemplate& o = outputs_[i];
    std::shared_ptr<Storage> s;
    for (size_t j = 0; j < i && s == nullptr; ++j) {  // outputs that view one buffer share it
      if (outputs_[j].data == o.data) s = outs[j].storage();
    }
    if (s == nullptr) {
      s = o.in_arena ? Storage::FromBlob(o.data, o.nbytes, o.device,
                                         [arena = arena_](void*) {})  // keeps the arena alive
                     : Storage::Adopt(o.data, o.nbytes, o.device);
      handed_out_.push_back(s);
    }
    outs.emplace_back(std::move(s), o.offset, o.shape, o.strides, o.dtype, o.device);
  }
  return outs;
}

namespace {

// Calls visit(v) on each value of the address key of `inputs` in order (per input: its data
// pointer, shape and strides; symbolic plans get one graph per shape) while visit returns true.
template <typename Visit>
bool VisitAddressKey(const std::vector<Tensor>& inputs, Visit&& visit) {
  for (const Tensor& t : inputs) {
    if (!visit(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr())))) return false;
    for (int64_t d : t.shape()) {
      if (!visit(d)) return false;
    }
    for (int64_t s : t.strides()) {
      if (!visit(s)) return false;
    }
  }
  return true;
}

}  // namespace

CudaGraphCache::Key CudaGraphCache::AddressKey(const std::vector<Tensor>& inputs) {
  Key key;
  VisitAddressKey(inputs, [&](int64_t v) {
    key.push_back(v);
    return true;
  });
  return key;
}

// AddressKey(inputs) == key, without building the key (the replay path allocates nothing).
bool CudaGraphCache::IsAddressKeyOf(const Key& key, const std::vector<Tensor>& inputs) {
  size_t at = 0;
  return VisitAddressKey(inputs, [&](int64_t v) { return at < key.size() && key[at++] == v; }) &&
         at == key.size();
}

std::vector<Tensor> CudaGraphCache::Run(const std::vector<Tensor>& inputs) {
  if (!off_reason_.empty()) return exe_.Run(inputs);
  const bool symbolic = !exe_.symbols().empty();
  if (copy_in_ != nullptr && (!symbolic || copy_in_shapes_ == ShapeKey(inputs))) {
    return copy_in_->Run(inputs);
  }
  for (size_t i = 0; i < by_address_.size(); ++i) {
    if (!IsAddressKeyOf(by_address_[i].first, inputs)) continue;
    std::rotate(by_address_.begin(), by_address_.begin() + i, by_address_.begin() + i + 1);
    return by_address_[0].second->Run(inputs);
  }
  const Key key = AddressKey(inputs);
  // A symbolic plan sees new shapes all the time (a growing sequence): capture a shape only the
  // second time it comes, so a loop over ever-new sizes pays no capture per call.
  if (symbolic && seen_once_.insert(key).second) {
    if (seen_once_.size() > 64) seen_once_.clear();
    return exe_.Run(inputs);
  }
  return CaptureAfterRun(inputs, key);
}

CudaGraphCache::Key CudaGraphCache::ShapeKey(const std::vector<Tensor>& inputs) {
  Key key;
  for (const Tensor& t : inputs) key.insert(key.end(), t.shape().begin(), t.shape().end());
  return key;
}

// A call whose input addresses have no graph yet: runs the plan (which also compiles any lazily
// built kernel and plans every GEMM), then captures a graph for the next call like it.
std::vector<Tensor> CudaGraphCache::CaptureAfterRun(const std::vector<Tensor>& inputs,
                                                    const Key& key) {
  std::vector<Tensor> out = exe_.Run(inputs);
  ++changes_;
  const bool copy_in = ++captures_ > kMaxCaptures;
  absl::StatusOr<std::unique_ptr<CudaGraphPlan>> plan = CudaGraphPlan::Capture(
      exe_, inputs, copy_in ? CudaGraphPlan::Binding::kCopyIn : CudaGraphPlan::Binding::kByAddress);
  if (!plan.ok()) {
    off_reason_ = std::string(plan.status().message());
    by_address_.clear();
    return out;
  }
  if (copy_in) {
    by_address_.clear();
    copy_in_ = std::move(*plan);
    copy_in_shapes_ = ShapeKey(inputs);
    return out;
  }
  by_address_.insert(by_address_.begin(), {key, std::move(*plan)});
  if (by_address_.size() > kMaxByAddress) by_address_.pop_back();
  return out;
}

namespace {
// How a plan's graph allocates, and its programmatic edges.
std::string MemoryNote(const CudaGraphPlan& plan) {
  std::string note;
  if (plan.arena_bytes() > 0) {
    note = absl::StrCat(", a ", (plan.arena_bytes() + 1023) / 1024, " KiB arena");
  }
  if (plan.arena_bytes() == 0 || plan.memory_nodes() > 0) {
    absl::StrAppend(&note, ", ", plan.memory_nodes(), " memory nodes");
  }
  if (plan.arena_over_limit() > 0) {
    absl::StrAppend(&note, " (an arena would take ",
                    (plan.arena_over_limit() + (1 << 20) - 1) >> 20,
                    " MiB, over KILN_CAPTURE_ARENA_MB)");
  }
  if (plan.programmatic_edges() > 0) {
    absl::StrAppend(&note, ", ", plan.programmatic_edges(), " programmatic edges");
  }
  return note;
}
}  // namespace

std::string CudaGraphCache::Describe() const {
  if (!off_reason_.empty()) return "off: " + off_reason_;
  if (copy_in_ != nullptr) {
    return absl::StrCat("on: ", copy_in_->nodes(),
                        " graph nodes, inputs copied in (they kept moving: ", captures_ - 1,
                        " address sets captured)", MemoryNote(*copy_in_));
  }
  if (by_address_.empty()) return "pending (captured after the first call)";
  return absl::StrCat("on: ", by_address_[0].second->nodes(), " graph nodes, inputs bound by ",
                      "address (", by_address_.size(), " address sets cached)",
                      MemoryNote(*by_address_[0].second));
}

}  // namespace kiln::codegen
