// What every staged GPU send and receive of a process shares: the device
// layer, pools of pinned staging buffers, wait flags and events, the list of
// resources waiting for their stream to pass, and the deferred error slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cc/device/device.h"
#include "cc/device/event_pool.h"
#include "cc/device/flag_pool.h"
#include "cc/device/pinned_pool.h"
#include "cc/device/retire_list.h"
#include "cc/ffi/gpu/deferred_error.h"
#include "cc/transport/tensor_spec.h"

namespace hetjax::gpu {

struct StagingContext {
  StagingContext(device::Device& device, size_t max_cached_pinned_bytes)
      : device(device),
        pinned(device, max_cached_pinned_bytes),
        flags(device),
        events(device),
        retired(device) {}

  device::Device& device;
  device::PinnedPool pinned;
  device::FlagPool flags;
  device::EventPool events;
  device::RetireList retired;
  DeferredError errors;
};

// The process-wide context over GpuDevice(), or nullptr without a GPU
// flavour. Never destroyed: at process exit the GPU runtime may already be
// gone, and freeing pinned memory then crashes.
StagingContext* GpuStagingContext();
// The process-wide context over HostDevice(): the CPU island's end of slot
// channels (host_channel.h). It keeps no pinned staging (that end needs
// none); its flags and events are plain host memory.
StagingContext* HostStagingContext();

// Makes the stream's device current for the calling thread (events and
// kernels must go to the device that owns the stream) and restores the
// previous one on destruction.
class StreamDeviceScope {
 public:
  StreamDeviceScope(device::Device& device, device::Stream stream);
  ~StreamDeviceScope();
  StreamDeviceScope(const StreamDeviceScope&) = delete;
  StreamDeviceScope& operator=(const StreamDeviceScope&) = delete;

  const Status& status() const { return status_; }
  int ordinal() const { return ordinal_; }

 private:
  device::Device& device_;
  Status status_;
  int ordinal_ = 0;
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace hetjax::gpu

namespace hetjax::gpu {

// "peer 1, tag 7, float32[2,3]": how every staged-op error names its message.
std::string DescribeMessage(int peer, uint64_t tag, const TensorSpec& spec);
// `status` with its message prefixed by `what` (the code is kept).
Status WithContext(const Status& status, const std::string& what);

}  // namespace hetjax::gpu
