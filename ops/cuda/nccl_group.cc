// The NCCL process group (see ops/nccl.h): libnccl.so.2 loaded at the first use, one
// communicator per local GPU (ncclCommInitAll), each rank a thread on its device issuing NCCL's
// collectives on kiln's current stream.
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ops/factories.h"
#include "ops/nccl.h"
#include "ops/ops.h"
#include "ops/tcp_store.h"
#include "runtime/cuda.h"
#include "runtime/cuda_api.h"
#include "runtime/dynamic_symbols.h"
#include "runtime/status.h"

namespace kiln {
namespace {

struct NcclLib {
  decltype(&ncclGetVersion) GetVersion = nullptr;
  decltype(&ncclGetErrorString) GetErrorString = nullptr;
  decltype(&ncclCommInitAll) CommInitAll = nullptr;
  decltype(&ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&ncclCommInitRank) CommInitRank = nullptr;
  decltype(&ncclCommDestroy) CommDestroy = nullptr;
  decltype(&ncclAllReduce) AllReduce = nullptr;
  decltype(&ncclAllGather) AllGather = nullptr;
  decltype(&ncclReduceScatter) ReduceScatter = nullptr;
  decltype(&ncclBroadcast) Broadcast = nullptr;
  std::string error;  // why NCCL cannot be used; empty when it can
};

const NcclLib& Nccl() {
  static const NcclLib lib = [] {
    NcclLib l;
    if (cuda::DeviceCount() == 0) {
      l.error = "no CUDA device";
      return l;
    }
    void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      l.error = absl::StrCat("libnccl.so.2 could not be loaded: ", why != nullptr ? why : "");
      return l;
    }
    std::string missing;
    ResolveSymbol(handle, "ncclGetVersion", &l.GetVersion, &missing);
    ResolveSymbol(handle, "ncclGetErrorString", &l.GetErrorString, &missing);
    ResolveSymbol(handle, "ncclCommInitAll", &l.CommInitAll, &missing);
    ResolveSymbol(handle, "ncclGetUniqueId", &l.GetUniqueId, &missing);
    ResolveSymbol(handle, "ncclCommInitRank", &l.CommInitRank, &missing);
    ResolveSymbol(handle, "ncclCommDestroy", &l.CommDestroy, &missing);
    ResolveSymbol(handle, "ncclAllReduce", &l.AllReduce, &missing);
    ResolveSymbol(handle, "ncclAllGather", &l.AllGather, &missing);
    ResolveSymbol(handle, "ncclReduceScatter", &l.ReduceScatter, &missing);
    ResolveSymbol(handle, "ncclBroadcast", &l.Broadcast, &missing);
    if (!missing.empty()) l.error = absl::StrCat("libnccl.so.2 has no ", missing);
    return l;
  }();
  return lib;
}

const NcclLib& CheckedNccl(const char* who) {
  const NcclLib& lib = Nccl();
  KILN_CHECK(lib.error.empty(), who, ": NCCL is not available: ", lib.error);
  return lib;
}

void Check(ncclResult_t r, const char* call, int rank) {
  KILN_CHECK(r == ncclSuccess, call, " failed on rank ", rank, ": ", Nccl().GetErrorString(r));
}

// NCCL's type for `t` (bool moves as bytes; the collective ops' inference refuses reductions of
// it before a backend is reached).
ncclDataType_t NcclType(DType t) {
  switch (t) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kBool:
      return ncclUint8;
  }
  KILN_FAIL("NCCL has no type for ", DTypeName(t));
}

// What the ranks of one RunNcclRanks share: the first failure, so that the others stop issuing
// collectives that would wait for the failed rank forever (one already issued still waits: NCCL
// has no timeout and kiln does not abort communicators yet).
struct RanksFailure {
  std::mutex mu;
  std::atomic<bool> failed{false};
  std::string why;
  int rank = -1;  // the first to fail
  void Set(int r, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (failed.load()) return;
    why = absl::StrCat("rank ", r, " failed: ", what);
    rank = r;
    failed.store(true);
  }
};

class NcclGroup : public ProcessGroup {
 public:
  NcclGroup(ncclComm_t comm, int rank, int world, int device, RanksFailure* failure)
      : comm_(comm), rank_(rank), world_(world), device_(device), failure_(failure) {}
  // A group of one process per rank: it owns its communicator and the store it was made through.
  NcclGroup(ncclComm_t comm, int rank, int world, int device, std::unique_ptr<TcpStore> store)
      : comm_(comm), rank_(rank), world_(world), device_(device), store_(std::move(store)) {}
  ~NcclGroup() override {
    if (store_ == nullptr) return;  // RunNcclRanks destroys its communicators itself
    cudaSetDevice(device_);         // the group may be destroyed on another thread
    cudaDeviceSynchronize();
    Nccl().CommDestroy(comm_);
    LeaveStore(*store_, rank_, world_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  // NCCL's out-of-place forms (`in` == `out` is its in-place form); `out` is contiguous.
  void AllReduceInto(const Tensor& in, const Tensor& out, ReduceOp op) override {
    Checked("all_reduce", in);
    const Tensor src = contiguous(in);
    Check(Nccl().AllReduce(src.data_ptr(), out.data_ptr(), out.numel(), NcclType(in.dtype()),
                           NcclOp(op), comm_, cuda::CurrentStream()),
          "ncclAllReduce", rank_);
  }

  void AllGatherInto(const Tensor& in, const Tensor& out) override {
    Checked("all_gather", in);
    const Tensor src = contiguous(in);
    Check(Nccl().AllGather(src.data_ptr(), out.data_ptr(), src.numel(), NcclType(in.dtype()), comm_,
                           cuda::CurrentStream()),
          "ncclAllGather", rank_);
  }

  void ReduceScatterInto(const Tensor& in, const Tensor& out, ReduceOp op) override {
    Checked("reduce_scatter", in);
    const Tensor src = contiguous(in);
    Check(Nccl().ReduceScatter(src.data_ptr(), out.data_ptr(), out.numel(), NcclType(in.dtype()),
                               NcclOp(op), comm_, cuda::CurrentStream()),
          "ncclReduceScatter", rank_);
  }

  void BroadcastInto(const Tensor& in, const Tensor& out, int src) override {
    Checked("broadcast", in);
    const Tensor send = contiguous(in);
    Check(Nccl().Broadcast(send.data_ptr(), out.data_ptr(), out.numel(), NcclType(in.dtype()), src,
                           comm_, cuda::CurrentStream()),
          "ncclBroadcast", rank_);
  }

 private:
  static ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

  void Checked(const char* op, const Tensor& t) const {
    if (failure_ != nullptr && failure_->failed.load()) {
      std::lock_guard<std::mutex> lock(failure_->mu);
      throw Error(absl::AbortedError(
          absl::StrCat(op, " on rank ", rank_, ": not issued, ", failure_->why)));
    }
    KILN_CHECK(t.defined() && t.device().is_cuda() && t.device().index == device_, op,
               ": the NCCL group's rank ", rank_, " works on cuda:", device_, ", got a tensor ",
               t.defined() ? absl::StrCat("on ", t.device().str()) : "undefined");
  }

  ncclComm_t comm_;
  int rank_, world_, device_;
  RanksFailure* failure_ = nullptr;  // RunNcclRanks's ranks only
  std::unique_ptr<TcpStore> store_;
};

}  // namespace

bool NcclAvailable(std::string* why) {
  const NcclLib& lib = Nccl();
  if (why != nullptr) *why = lib.error;
  return lib.error.empty();
}

int NcclVersion() {
  int v = 0;
  Check(CheckedNccl("NcclVersion").GetVersion(&v), "ncclGetVersion", 0);
  return v;
}

void RunNcclRanks(const std::vector<int>& devices, const std::function<void(ProcessGroup&)>& body) {
  const NcclLib& lib = CheckedNccl("RunNcclRanks");
  const int n = static_cast<int>(devices.size()), count = cuda::DeviceCount();
  KILN_CHECK(n >= 1 && std::set<int>(devices.begin(), devices.end()).size() == devices.size(),
             "RunNcclRanks: needs one or more distinct devices, got ", n, " entries");
  for (int d : devices) {
    KILN_CHECK(d >= 0 && d < count, "RunNcclRanks: cuda:", d, " does not exist (", count,
               " CUDA devices)");
  }
  std::vector<ncclComm_t> comms(n);
  Check(lib.CommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll", 0);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  RanksFailure failure;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        KILN_CUDA_CHECK(cudaSetDevice(devices[r]));
        NcclGroup group(comms[r], r, n, devices[r], &failure);
        body(group);
        cuda::Synchronize();
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        failure.Set(r, e.what());
      } catch (...) {
        errors[r] = std::current_exception();
        failure.Set(r, "an exception that is not a std::exception");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (ncclComm_t c : comms) lib.CommDestroy(c);
  if (failure.rank >= 0) std::rethrow_exception(errors[failure.rank]);  // the first failure
}

std::unique_ptr<ProcessGroup> NcclGroupThroughStore(std::unique_ptr<TcpStore> store, int rank,
                                                    int world, int device) {
  const NcclLib& lib = CheckedNccl("InitProcessGroup(nccl)");
  KILN_CHECK(device >= 0 && device < cuda::DeviceCount(), "InitProcessGroup(nccl): rank ", rank,
             "'s device cuda:", device, " does not exist (", cuda::DeviceCount(),
             " CUDA devices; LOCAL_RANK picks it)");
  ncclUniqueId id;
  if (rank == 0) {
    Check(lib.GetUniqueId(&id), "ncclGetUniqueId", rank);
    store->Set("nccl_id", std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  } else {
    const std::string bytes = store->Get("nccl_id");
    KILN_CHECK(bytes.size() == sizeof(id), "InitProcessGroup(nccl): a malformed NCCL id");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  KILN_CUDA_CHECK(cudaSetDevice(device));
  ncclComm_t comm = nullptr;
  Check(lib.CommInitRank(&comm, world, id, rank), "ncclCommInitRank", rank);
  return std::make_unique<NcclGroup>(comm, rank, world, device, std::move(store));
}

}  // namespace kiln
