// Hands out WaitFlags carved from slabs of mapped pinned memory, one cache
// line each, so a flag costs no allocation on the hot path.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include "cc/device/device.h"

namespace hetjax::device {

class FlagPool {
 public:
  struct Flag {
    WaitFlag* host = nullptr;          // what host threads write
    const WaitFlag* device = nullptr;  // what device waits read
  };

  explicit FlagPool(Device& device);
  ~FlagPool();  // frees the slabs: every flag must be back by then
  FlagPool(const FlagPool&) = delete;
  FlagPool& operator=(const FlagPool&) = delete;

  // A flag with every word zero.
  Status Acquire(Flag* out);
  // Only once no enqueued wait can still read it.
  void Release(Flag flag);

  static constexpr size_t kSlotBytes = 64;
  static constexpr size_t kSlotsPerSlab = 256;

 private:
  Device& device_;
  std::mutex mu_;
  std::vector<void*> slabs_;  // host addresses
  std::vector<Flag> free_;
};

}  // namespace hetjax::device
