#include "cc/device/retire_list.h"

#include <utility>

namespace hetjax::device {

RetireList::RetireList(Device& device) : device_(device) {}

RetireList::~RetireList() { Drain(); }

void RetireList::Retire(Event fence, std::function<void()> release) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back(Entry{fence, std::move(release)});
}

size_t RetireList::Poll() { return Collect(/*wait=*/false); }

void RetireList::Drain() { Collect(/*wait=*/true); }

size_t RetireList::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t RetireList::Collect(bool wait) {
  std::vector<Entry> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Entry> still;
    for (Entry& entry : entries_) {
      bool done = false;
      // A failing query means the device is gone: nothing will touch the
      // resources any more, so releasing them is safe.
      Status status = wait ? device_.SynchronizeEvent(entry.fence)
                           : device_.QueryEvent(entry.fence, &done);
      if (wait || done || !status.ok()) {
        ready.push_back(std::move(entry));
      } else {
        still.push_back(std::move(entry));
      }
    }
    entries_ = std::move(still);
  }
  // Outside the lock: a release may hand resources to pools that call back.
  for (Entry& entry : ready) entry.release();
  return ready.size();
}

}  // namespace hetjax::device
