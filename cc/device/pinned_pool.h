// Recycles page-locked host buffers: cudaHostAlloc of a staging buffer costs
// milliseconds per hundred MiB, far more than moving the bytes, so every
// message after the first reuses what an earlier one released. The same
// pool recycles device memory (a GPU collective's scratch), where cudaMalloc
// and above all cudaFree, which waits for the device, cost as much.
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

  enum class Memory { kPinned, kDevice };

  // Keeps at most `max_cached_bytes` of released buffers for reuse. kDevice
  // buffers belong to the device current at Acquire: keep one pool per
  // device.
  PinnedPool(Device& device, size_t max_cached_bytes,
             Memory memory = Memory::kPinned);
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
  Status Allocate(size_t bytes, void** data);
  void Free(void* data);

  Device& device_;
  const size_t max_cached_bytes_;
  const Memory memory_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // capacity -> buffer
  size_t cached_bytes_ = 0;
  uint64_t allocations_ = 0;
};

}  // namespace hetjax::device
