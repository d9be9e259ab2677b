// Recycles page-locked host buffers: cudaHostAlloc of a staging buffer costs
// milliseconds per hundred MiB, far more than moving the bytes, so every
// message after the first reuses what an earlier one released.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "cc/device/device.h"

namespace hetjax::device {

class PinnedPool {
 public:
  struct Buffer {
    void* data = nullptr;
    size_t capacity = 0;
  };

  // Keeps at most `max_cached_bytes` of released buffers for reuse.
  PinnedPool(Device& device, size_t max_cached_bytes);
  ~PinnedPool();  // frees the cached buffers (buffers still out are leaked)
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A buffer of at least `bytes` (a cached one when one fits).
  Status Acquire(size_t bytes, Buffer* out);
  void Release(Buffer buffer);

  size_t cached_bytes() const;
  // How many times Acquire had to go to the device allocator.
  uint64_t allocations() const;

  // Sizes are rounded up to a granule of 1/8 of their power of two (at least
  // 64 KiB), so repeated messages of one size hit the same capacity and no
  // buffer wastes more than about 12.5%.
  static size_t RoundedSize(size_t bytes);

 private:
  Device& device_;
  const size_t max_cached_bytes_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // capacity -> buffer
  size_t cached_bytes_ = 0;
  uint64_t allocations_ = 0;
};

}  // namespace hetjax::device
