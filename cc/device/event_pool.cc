#include "cc/device/event_pool.h"

namespace hetjax::device {

EventPool::EventPool(Device& device) : device_(device) {}

EventPool::~EventPool() {
  for (auto& [ordinal, events] : free_) {
    for (Event event : events) device_.DestroyEvent(event);
  }
}

Status EventPool::Acquire(int ordinal, Event* out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Event>& events = free_[ordinal];
    if (!events.empty()) {
      *out = events.back();
      events.pop_back();
      return Status::Ok();
    }
  }
  return device_.CreateEvent(out);
}

void EventPool::Release(int ordinal, Event event) {
  if (event == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_[ordinal].push_back(event);
}

}  // namespace hetjax::device
