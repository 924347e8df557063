// Custom ops (see custom_op.h): a fixed table of registry rows after the built-in ones, each with
// the spec it was registered from and its kernel, loaded at the first CUDA call.
#include "ops/custom_op.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "runtime/nvrtc.h"
#include "runtime/status.h"

namespace kiln {
namespace {

constexpr int kMaxCustomInputs = 8;
constexpr size_t kMaxNameLength = 64;

struct Entry {
  CustomOpSpec spec;
  std::mutex mu;  // guards loading the kernel
  std::atomic<cuda::KernelHandle> kernel{nullptr};
  std::vector<size_t> param_sizes;  // written once, before `kernel` is published
};

// Rows and entries are written once, before `count` publishes them (release/acquire): readers
// take no lock.
struct Table {
  std::mutex mu;  // serialises registration
  std::atomic<int> count{0};
  std::array<OpDef, kMaxCustomOps> rows{};
  std::array<std::unique_ptr<Entry>, kMaxCustomOps> entries;
};

Table& TheTable() {
  static auto* table = new Table;  // never destroyed: rows may be used during static teardown
  return *table;
}

int SlotOf(OpId id) { return static_cast<int>(id) - kNumOps; }

Entry& EntryOf(const OpDef& def) { return *TheTable().entries[SlotOf(def.id)]; }

[[noreturn]] void Fail(const std::string& op, const std::string& why) {
  KILN_FAIL("custom op '", op, "': ", why);
}

// Calls the user's function `what` of op `op`: an error it throws comes back naming the op.
template <typename F>
auto CallUser(const std::string& op, const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(absl::Status(e.code(), absl::StrCat("custom op '", op, "': its ", what,
                                                    " function failed: ", e.what())));
  }
}

absl::StatusOr<TensorType> InferSlot(int slot, absl::Span<const TensorType> inputs) {
  const CustomOpSpec& spec = TheTable().entries[slot]->spec;
  absl::StatusOr<TensorType> type;
  try {
    type = spec.infer(inputs);
  } catch (const Error& e) {  // thrown instead of returned: the dispatcher names the op
    return e.status();
  }
  if (type.ok()) type->device = inputs[0].device;
  return type;
}

// The registry's InferFn has no row argument: one function per slot.
template <size_t K>
absl::StatusOr<TensorType> InferSlotFn(absl::Span<const TensorType> inputs, const OpAttrs&) {
  return InferSlot(static_cast<int>(K), inputs);
}
template <size_t... K>
constexpr std::array<InferFn, sizeof...(K)> InferSlots(std::index_sequence<K...>) {
  return {&InferSlotFn<K>...};
}
constexpr std::array<InferFn, kMaxCustomOps> kInferSlots =
    InferSlots(std::make_index_sequence<kMaxCustomOps>());

// The kernel of `e`, loaded once (compiled by NVRTC from source, or from the image), with its
// parameter sizes as the driver reports them.
cuda::KernelHandle LoadedKernel(Entry& e) {
  if (cuda::KernelHandle k = e.kernel.load(std::memory_order_acquire)) return k;
  std::lock_guard<std::mutex> lock(e.mu);
  if (cuda::KernelHandle k = e.kernel.load(std::memory_order_acquire)) return k;
  const CustomOpSpec& s = e.spec;
  absl::StatusOr<cuda::KernelHandle> k =
      s.kernel != nullptr ? static_cast<cuda::KernelHandle>(s.kernel)
      : !s.source.empty() ? cuda::GetKernel(s.source, s.entry, cuda::KernelTarget{s.arch_specific})
                          : cuda::LoadKernelImage(s.image, s.entry);
  if (!k.ok()) Fail(s.name, absl::StrCat("loading kernel '", s.entry, "': ", k.status().message()));
  absl::StatusOr<std::vector<size_t>> sizes = cuda::KernelParamSizes(*k);
  if (!sizes.ok()) {
    Fail(s.name,
         absl::StrCat("reading kernel '", s.entry, "''s parameters: ", sizes.status().message()));
  }
  e.param_sizes = *std::move(sizes);
  e.kernel.store(*k, std::memory_order_release);
  return *k;
}

std::string Sizes(const std::vector<size_t>& sizes) {
  return absl::StrCat("(", absl::StrJoin(sizes, ", "), " bytes)");
}

void CheckLaunch(const Entry& e, const CustomLaunch& l) {
  const std::string& op = e.spec.name;
  std::vector<size_t> given;
  for (const std::string& a : l.args.bytes()) given.push_back(a.size());
  if (given != e.param_sizes) {
    Fail(op, absl::StrCat("the launch passes ", given.size(), " arguments ", Sizes(given),
                          " but kernel '", e.spec.entry, "' takes ", e.param_sizes.size(), " ",
                          Sizes(e.param_sizes)));
  }
  uint64_t threads = 1;
  for (int d = 0; d < 3; ++d) {
    if (l.grid[d] == 0 || l.block[d] == 0) {
      Fail(op, absl::StrCat("the launch's grid {", absl::StrJoin(l.grid, ", "), "} and block {",
                            absl::StrJoin(l.block, ", "), "} must have no zero dimension"));
    }
    threads *= l.block[d];
  }
  if (threads > 1024) {
    Fail(op, absl::StrCat("the launch's block {", absl::StrJoin(l.block, ", "), "} has ", threads,
                          " threads (at most 1024)"));
  }
  if (l.shared_bytes < 0) {
    Fail(op, absl::StrCat("the launch asks for ", l.shared_bytes, " bytes of shared memory"));
  }
}

// Runs `kernel` on contiguous copies of the inputs that are not contiguous, into `out` or, when
// `out` is strided (an out= argument), into a contiguous temporary copied into it.
template <typename Kernel>
void RunContiguous(absl::Span<const Tensor> inputs, const Tensor& out, Kernel&& kernel) {
  absl::InlinedVector<Tensor, 4> in;
  for (const Tensor& t : inputs) in.push_back(contiguous(t));
  const Tensor dst = out.is_contiguous() ? out : Tensor::Empty(out.type());
  kernel(absl::Span<const Tensor>(in), dst);
  if (!dst.is_same(out)) DispatchOut(OpId::kContiguous, {dst}, {}, out);
}

void RunCuda(const OpDef& def, absl::Span<const Tensor> inputs, const Tensor& out, const OpAttrs&) {
  Entry& e = EntryOf(def);
  RunContiguous(inputs, out, [&e](absl::Span<const Tensor> in, const Tensor& dst) {
    const CustomLaunch l = CallUser(e.spec.name, "launch", [&] { return e.spec.launch(in, dst); });
    const cuda::KernelHandle kernel = LoadedKernel(e);
    CheckLaunch(e, l);
    absl::InlinedVector<void*, 8> args;
    for (const std::string& a : l.args.bytes()) args.push_back(const_cast<char*>(a.data()));
    const unsigned grid[3] = {l.grid[0], l.grid[1], l.grid[2]};
    const unsigned block[3] = {l.block[0], l.block[1], l.block[2]};
    const absl::Status s = cuda::LaunchKernel(kernel, grid, block, l.shared_bytes, args.data());
    if (!s.ok()) Fail(e.spec.name, absl::StrCat("launching '", e.spec.entry, "': ", s.message()));
  });
}

void RunCpu(const OpDef& def, absl::Span<const Tensor> inputs, const Tensor& out, const OpAttrs&) {
  const Entry& e = EntryOf(def);
  if (!e.spec.cpu) {
    throw Error(absl::UnimplementedError(absl::StrCat(
        "custom op '", e.spec.name, "': no CPU kernel was registered (CustomOpSpec::cpu); ",
        "run it on CUDA tensors")));
  }
  RunContiguous(inputs, out, [&e](absl::Span<const Tensor> in, const Tensor& dst) {
    CallUser(e.spec.name, "cpu", [&] { e.spec.cpu(in, dst); });
  });
}

bool IsIdentifier(const std::string& s) {
  auto start = [](char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  auto rest = [&](char c) { return start(c) || (c >= '0' && c <= '9'); };
  if (s.empty() || s.size() > kMaxNameLength || !start(s[0])) return false;
  for (char c : s) {
    if (!rest(c)) return false;
  }
  return true;
}

void CheckSpec(const CustomOpSpec& s) {
  if (!IsIdentifier(s.name)) {
    KILN_FAIL("RegisterCustomOp: the name '", s.name, "' is not an identifier of at most ",
              kMaxNameLength, " characters ([A-Za-z_][A-Za-z0-9_]*)");
  }
  if (s.name == "constant" || s.name == "fusion" || s.name == "result" || s.name == "graph" ||
      FindOpDef(s.name) != nullptr) {
    Fail(s.name, "the name is taken (by a built-in op, an IR keyword or another custom op)");
  }
  if (s.num_inputs < 1 || s.num_inputs > kMaxCustomInputs) {
    Fail(s.name, absl::StrCat("num_inputs is ", s.num_inputs, " (1..", kMaxCustomInputs, ")"));
  }
  const int kernels = !s.source.empty() + !s.image.empty() + (s.kernel != nullptr);
  if (kernels != 1) {
    Fail(s.name, absl::StrCat("give exactly one of source, image and kernel (got ", kernels, ")"));
  }
  if (s.entry.empty()) Fail(s.name, "no entry (the kernel's extern \"C\" function name)");
  if (!s.infer) Fail(s.name, "no infer function (the output type from the input types)");
  if (!s.launch) Fail(s.name, "no launch function (grid, block and arguments from the tensors)");
}

}  // namespace

KernelArgs& KernelArgs::Add(const Tensor& t) {
  KILN_CHECK(t.defined(), "KernelArgs::Add: an undefined tensor (Tensor())");
  return Add<uintptr_t>(reinterpret_cast<uintptr_t>(t.data_ptr()));
}

CustomOp RegisterCustomOp(CustomOpSpec spec) {
  Table& t = TheTable();
  std::lock_guard<std::mutex> lock(t.mu);
  CheckSpec(spec);  // under the lock: two threads cannot both take a name
  const int slot = t.count.load(std::memory_order_relaxed);
  if (slot == kMaxCustomOps) {
    Fail(spec.name, absl::StrCat("the table of custom ops is full (", kMaxCustomOps, " ops)"));
  }
  auto entry = std::make_unique<Entry>();
  entry->spec = std::move(spec);
  const OpId id = static_cast<OpId>(kNumOps + slot);
  t.rows[slot] = OpDef{.id = id,
                       .name = entry->spec.name.c_str(),
                       .min_inputs = entry->spec.num_inputs,
                       .max_inputs = entry->spec.num_inputs,
                       .kind = FusionKind::kOpaque,
                       .attr_fields = 0,
                       .infer = kInferSlots[slot],
                       .cpu = &RunCpu,
                       .cuda = &RunCuda};
  t.entries[slot] = std::move(entry);
  t.count.store(slot + 1, std::memory_order_release);
  return CustomOp(id);
}

std::optional<CustomOp> FindCustomOp(const std::string& name) {
  const OpDef* row = FindCustomOpRow(name);
  if (row == nullptr) return std::nullopt;
  return CustomOp(row->id);
}

const char* CustomOp::name() const { return GetOpDef(id_).name; }

Tensor CustomOp::operator()(absl::Span<const Tensor> inputs) const {
  const OpDef& def = GetOpDef(id_);
  for (const Tensor& t : inputs) CheckDefined(def.name, t);
  // Contiguous operands in the graph too, so that a compiled plan counts (and shares) the copies.
  absl::InlinedVector<Tensor, 4> in;
  for (const Tensor& t : inputs) in.push_back(contiguous(t));
  return Dispatch(id_, in);
}

const OpDef* CustomOpRow(OpId id) {
  const Table& t = TheTable();
  const int slot = SlotOf(id);
  if (slot < 0 || slot >= t.count.load(std::memory_order_acquire)) return nullptr;
  return &t.rows[slot];
}

const OpDef* FindCustomOpRow(std::string_view name) {
  const Table& t = TheTable();
  const int n = t.count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    if (name == t.rows[i].name) return &t.rows[i];
  }
  return nullptr;
}

bool IsKnownOp(OpId id) { return static_cast<int>(id) < kNumOps || CustomOpRow(id) != nullptr; }

}  // namespace kiln
