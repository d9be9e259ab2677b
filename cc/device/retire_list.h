// Deferred release: resources a stream may still touch (staging buffers the
// copy engine reads, flags a wait kernel polls) are handed back only once an
// event recorded after their last use has completed. Nobody blocks for it:
// whoever enqueues new work polls the list first.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <vector>

#include "cc/device/device.h"

namespace hetjax::device {

class RetireList {
 public:
  explicit RetireList(Device& device);
  ~RetireList();  // waits for and releases whatever is still listed
  RetireList(const RetireList&) = delete;
  RetireList& operator=(const RetireList&) = delete;

  // Runs `release` once `fence` has completed (possibly during this call's
  // successors' Poll, never inside Retire itself).
  void Retire(Event fence, std::function<void()> release);
  // Releases every entry whose fence has completed; returns how many.
  size_t Poll();
  // Waits for every fence and releases everything.
  void Drain();
  size_t pending() const;

 private:
  struct Entry {
    Event fence;
    std::function<void()> release;
  };
  size_t Collect(bool wait);

  Device& device_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace hetjax::device
