#include "cc/device/pinned_pool.h"

namespace hetjax::device {

PinnedPool::PinnedPool(Device& device, size_t max_cached_bytes, Memory memory)
    : device_(device), max_cached_bytes_(max_cached_bytes), memory_(memory) {}

PinnedPool::~PinnedPool() {
  for (auto& [capacity, data] : free_) Free(data);
}

Status PinnedPool::Allocate(size_t bytes, void** data) {
  return memory_ == Memory::kDevice ? device_.AllocDevice(bytes, data)
                                    : device_.AllocPinned(bytes, data);
}

void PinnedPool::Free(void* data) {
  if (memory_ == Memory::kDevice) {
    (void)device_.FreeDevice(data);
  } else {
    (void)device_.FreePinned(data);
  }
}

size_t PinnedPool::RoundedSize(size_t bytes) {
  constexpr size_t kMinGranule = size_t{64} << 10;
  size_t pow2 = 1;
  while (pow2 < bytes) pow2 <<= 1;
  const size_t granule = pow2 / 8 > kMinGranule ? pow2 / 8 : kMinGranule;
  const size_t rounded = (bytes + granule - 1) / granule * granule;
  return rounded == 0 ? granule : rounded;
}

Status PinnedPool::Acquire(size_t bytes, Buffer* out) {
  const size_t want = RoundedSize(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Best fit, but never more than twice what was asked: a small message
    // must not pin down a huge buffer a large one will want next.
    auto it = free_.lower_bound(want);
    if (it != free_.end() && it->first <= 2 * want) {
      *out = Buffer{it->second, it->first};
      cached_bytes_ -= it->first;
      free_.erase(it);
      return Status::Ok();
    }
    ++allocations_;
  }
  void* data = nullptr;
  Status status = Allocate(want, &data);
  if (!status.ok()) return status;
  *out = Buffer{data, want};
  return Status::Ok();
}

void PinnedPool::Release(Buffer buffer) {
  if (buffer.data == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_bytes_ + buffer.capacity <= max_cached_bytes_) {
      free_.emplace(buffer.capacity, buffer.data);
      cached_bytes_ += buffer.capacity;
      return;
    }
  }
  Free(buffer.data);
}

size_t PinnedPool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_;
}

uint64_t PinnedPool::allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}

}  // namespace hetjax::device
