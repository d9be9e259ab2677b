// Recycles events per device (an event can only be recorded on a stream of
// the device it was created on), so a chunked copy of a large message does
// not create and destroy dozens of events each time.
#pragma once

#include <map>
#include <mutex>
#include <vector>

#include "cc/device/device.h"

namespace hetjax::device {

class EventPool {
 public:
  explicit EventPool(Device& device);
  ~EventPool();  // destroys the pooled events
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // An event of device `ordinal`; creates one on the current device (the
  // caller has made `ordinal` current) when none is pooled.
  Status Acquire(int ordinal, Event* out);
  void Release(int ordinal, Event event);

 private:
  Device& device_;
  std::mutex mu_;
  std::map<int, std::vector<Event>> free_;
};

}  // namespace hetjax::device
