#include "cc/device/flag_pool.h"

namespace hetjax::device {

static_assert(sizeof(WaitFlag) <= FlagPool::kSlotBytes,
              "a WaitFlag must fit its cache-line slot");

FlagPool::FlagPool(Device& device) : device_(device) {}

FlagPool::~FlagPool() {
  for (void* slab : slabs_) device_.FreeMapped(slab);
}

Status FlagPool::Acquire(Flag* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) {
    void* host = nullptr;
    void* device = nullptr;
    Status status =
        device_.AllocMapped(kSlotBytes * kSlotsPerSlab, &host, &device);
    if (!status.ok()) return status;
    slabs_.push_back(host);
    for (size_t i = kSlotsPerSlab; i-- > 0;) {
      free_.push_back(Flag{reinterpret_cast<WaitFlag*>(
                               static_cast<char*>(host) + i * kSlotBytes),
                           reinterpret_cast<const WaitFlag*>(
                               static_cast<char*>(device) + i * kSlotBytes)});
    }
  }
  *out = free_.back();
  free_.pop_back();
  ResetFlag(out->host);
  return Status::Ok();
}

void FlagPool::Release(Flag flag) {
  if (flag.host == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(flag);
}

}  // namespace hetjax::device
