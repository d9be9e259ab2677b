// One direction of a slot channel (slot_channel.h): a POSIX shared-memory
// segment both processes map, holding per slot a `filled` and a `freed`
// WaitFlag and, for the host-staged path, the slots' bytes themselves. The
// sender creates it, the receiver opens it; both page-lock and map it for
// their GPU, so copies land in it at pinned speed and wait/signal kernels of
// either process can poll and raise its flags. No host memcpy, no host
// thread per chunk: the two streams hand slots to each other through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cc/device/device.h"
#include "cc/transport/status.h"

namespace hetjax::gpu {

class SlotRing {
 public:
  struct Shape {
    uint32_t slots = 0;
    uint64_t slot_bytes = 0;
    bool host_data = false;  // slots' bytes live in the segment (host path)
  };

  // Sender side: creates and sizes `name` (fails if it exists).
  static Status Create(const std::string& name, const Shape& shape,
                       std::unique_ptr<SlotRing>* out);
  // Receiver side: maps `name` as its creator sized it, then unlinks the
  // name (both ends hold the mapping; nothing is left to clean up on a crash).
  static Status Open(const std::string& name, std::unique_ptr<SlotRing>* out);
  ~SlotRing();  // unregisters, unmaps; the creator unlinks if still named

  const Shape& shape() const { return shape_; }
  const std::string& name() const { return name_; }

  // Page-locks and maps the segment for `device` once; later calls are free.
  Status Register(device::Device& device);

  // Host views (for reading a flag without enqueueing a wait, and aborts).
  device::WaitFlag* filled_host(uint32_t slot) const;
  device::WaitFlag* freed_host(uint32_t slot) const;
  uint8_t* data_host(uint32_t slot) const;  // host_data only
  // Device views: valid after Register.
  device::WaitFlag* filled_device(uint32_t slot) const;
  device::WaitFlag* freed_device(uint32_t slot) const;
  uint8_t* data_device(uint32_t slot) const;  // host_data only

  // Releases every wait on either side, for good: the channel is broken.
  void AbortAll();

 private:
  SlotRing() = default;
  size_t FlagOffset(bool freed, uint32_t slot) const;

  std::string name_;
  bool creator_ = false;
  Shape shape_;
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  size_t data_offset_ = 0;
  device::Device* registered_with_ = nullptr;
  uint8_t* device_base_ = nullptr;
};

}  // namespace hetjax::gpu
