// A GPU collective's host side. The collectives core works on host buffers,
// so a GPU handler copies this device's index and the operand to pinned host
// memory on XLA's stream, waits for that copy, lets the core run on the
// pinned copies (blocking the host thread, as the CPU handlers do: the
// exchange needs every island's data anyway), and enqueues the result's copy
// back on the same stream. The stream is not waited on for that last copy:
// its staging goes back to the pool once an event after it has passed.
//
// Only the device layer is used (no XLA, no vendor header), so this runs and
// is tested on the host device as well (tests/staged_collective_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cc/device/device.h"
#include "cc/device/pinned_pool.h"
#include "cc/ffi/gpu/staging_context.h"
#include "cc/transport/status.h"

namespace hetjax::collectives {

class StagedCollective {
 public:
  // Makes the stream's device current for the life of the op (events and
  // copies belong to it).
  StagedCollective(gpu::StagingContext& context, device::Stream stream);
  ~StagedCollective();  // hands back whatever staging it still holds
  StagedCollective(const StagedCollective&) = delete;
  StagedCollective& operator=(const StagedCollective&) = delete;

  // Copies the int32 at `device_index` and x_bytes at `x` (device memory)
  // to pinned host memory and waits for them; reserves y_bytes of pinned
  // memory for the result. Reports first an earlier asynchronous failure of
  // this process's GPU comm ops, as every GPU handler does.
  Status CopyIn(const void* device_index, const void* x, size_t x_bytes,
                size_t y_bytes);
  // CopyIn in two halves, for a started collective (pending_ops.h): the
  // copies are enqueued at once, and another thread waits for them later.
  Status EnqueueCopyIn(const void* device_index, const void* x, size_t x_bytes,
                       size_t y_bytes);
  Status WaitCopyIn();

  int32_t device_index() const { return index_; }
  const void* x() const;
  void* y() const { return out_.data; }

  // Enqueues the result's copy to `y_device` (y_bytes as given to CopyIn)
  // and then a write of the output token, so the token follows the result
  // in stream order.
  Status CopyOut(void* y_device, void* token_device, size_t token_bytes);

 private:
  // The index sits in front of the operand, one cache line apart, so one
  // pinned buffer and one wait serve both.
  static constexpr size_t kIndexBytes = 64;

  gpu::StagingContext& context_;
  const device::Stream stream_;
  gpu::StreamDeviceScope scope_;
  device::PinnedPool::Buffer in_;
  device::PinnedPool::Buffer out_;
  size_t y_bytes_ = 0;
  int32_t index_ = 0;
  device::Event copied_in_ = nullptr;  // after the operand's copy
  // Copies may still be running on the stream into or out of our staging.
  bool stream_may_use_staging_ = false;
};

}  // namespace hetjax::collectives
