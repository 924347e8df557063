// NCCL in a build without CUDA (see nccl.h): not available, saying why.
#include "ops/nccl.h"
#include "ops/tcp_store.h"
#include "runtime/status.h"

namespace kiln {

bool NcclAvailable(std::string* why) {
  if (why != nullptr) *why = "kiln was built without CUDA";
  return false;
}

int NcclVersion() { KILN_FAIL("NcclVersion: NCCL is not available: kiln was built without CUDA"); }

void RunNcclRanks(const std::vector<int>&, const std::function<void(ProcessGroup&)>&) {
  KILN_FAIL("RunNcclRanks: NCCL is not available: kiln was built without CUDA");
}

std::unique_ptr<ProcessGroup> NcclGroupThroughStore(std::unique_ptr<TcpStore>, int, int, int) {
  KILN_FAIL("InitProcessGroup(nccl): NCCL is not available: kiln was built without CUDA");
}

}  // namespace kiln
