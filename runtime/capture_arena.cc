// The capture arena (see capture_arena.h): first-fit offsets over one device block.
#include "runtime/capture_arena.h"

#include <algorithm>

#include "runtime/storage.h"

namespace kiln::cuda {

namespace {
size_t AlignUp(size_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}
}  // namespace

OffsetAllocator::OffsetAllocator(size_t capacity) : capacity_(capacity) {}

size_t OffsetAllocator::Allocate(size_t bytes) {
  const size_t size = AlignUp(std::max<size_t>(bytes, 1));
  size_t offset = end_;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    offset = it->first;
    if (it->second > size) free_[offset + size] = it->second - size;
    free_.erase(it);
    break;
  }
  if (offset == end_) end_ += size;
  high_water_ = std::max(high_water_, end_);
  used_[offset] = size;
  live_bytes_ += size;
  return offset;
}

void OffsetAllocator::Free(size_t offset) {
  auto used = used_.find(offset);
  if (used == used_.end()) return;
  size_t size = used->second;
  used_.erase(used);
  live_bytes_ -= size;
  // Merge with the free neighbours.
  auto next = free_.find(offset + size);
  if (next != free_.end()) {
    size += next->second;
    free_.erase(next);
  }
  auto after = free_.lower_bound(offset);
  if (after != free_.begin()) {
    auto before = std::prev(after);
    if (before->first + before->second == offset) {
      offset = before->first;
      size += before->second;
      free_.erase(before);
    }
  }
  if (offset + size == end_) {
    end_ = offset;  // the free space at the end is not kept as a block
  } else {
    free_[offset] = size;
  }
}

bool OffsetAllocator::Fits(size_t offset) const {
  auto used = used_.find(offset);
  return used != used_.end() && offset + used->second <= capacity_;
}

CaptureArena::CaptureArena(size_t bytes, Device device)
    : device_(device), booking_(AlignUp(bytes)) {
  if (booking_.capacity() > 0) {
    block_ = std::make_shared<Storage>(booking_.capacity(), device);
    base_ = static_cast<char*>(block_->data());
  }
}

CaptureArena::~CaptureArena() = default;

void* CaptureArena::Allocate(size_t nbytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t offset = booking_.Allocate(nbytes);
  if (!booking_.Fits(offset)) {
    booking_.Free(offset);  // Booked() books the same range again for the memory given elsewhere
    return nullptr;
  }
  return base_ + offset;
}

void CaptureArena::Booked(void* elsewhere, size_t nbytes) {
  std::lock_guard<std::mutex> lock(mu_);
  overflow_[elsewhere] = booking_.Allocate(nbytes);
}

void CaptureArena::Free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = overflow_.find(ptr); it != overflow_.end()) {
    booking_.Free(it->second);
    overflow_.erase(it);
    return;
  }
  if (Contains(ptr)) booking_.Free(static_cast<size_t>(static_cast<char*>(ptr) - base_));
}

bool CaptureArena::Contains(const void* ptr) const {
  const char* p = static_cast<const char*>(ptr);
  return base_ != nullptr && p >= base_ && p < base_ + booking_.capacity();
}

size_t CaptureArena::needed_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return booking_.high_water();
}

namespace {
thread_local std::shared_ptr<CaptureArena> t_arena;
}  // namespace

ScopedCaptureArena::ScopedCaptureArena(std::shared_ptr<CaptureArena> arena)
    : previous_(std::move(t_arena)) {
  t_arena = std::move(arena);
}

ScopedCaptureArena::~ScopedCaptureArena() { t_arena = std::move(previous_); }

const std::shared_ptr<CaptureArena>& CurrentCaptureArena() { return t_arena; }

}  // namespace kiln::cuda
