#include "cc/ffi/gpu/staging_context.h"

namespace hetjax::gpu {

StagingContext* GpuStagingContext() {
  // 4 GiB of released staging is kept: enough for a few 256 MiB-class
  // messages in flight each way, small against a GPU host's memory.
  static StagingContext* context =
      device::GpuDevice() == nullptr
          ? nullptr
          : new StagingContext(*device::GpuDevice(), size_t{4} << 30);
  return context;
}

StagingContext* HostStagingContext() {
  static StagingContext* context = new StagingContext(device::HostDevice(), 0);
  return context;
}

StreamDeviceScope::StreamDeviceScope(device::Device& device,
                                     device::Stream stream)
    : device_(device) {
  status_ = device_.StreamDevice(stream, &ordinal_);
  if (status_.ok()) status_ = device_.CurrentDevice(&previous_);
  if (status_.ok() && previous_ != ordinal_) {
    status_ = device_.SetCurrentDevice(ordinal_);
    switched_ = status_.ok();
  }
}

StreamDeviceScope::~StreamDeviceScope() {
  if (switched_) device_.SetCurrentDevice(previous_);
}

}  // namespace hetjax::gpu

namespace hetjax::gpu {

std::string DescribeMessage(int peer, uint64_t tag, const TensorSpec& spec) {
  return "peer " + std::to_string(peer) + ", tag " + std::to_string(tag) +
         ", " + spec.ToString();
}

Status WithContext(const Status& status, const std::string& what) {
  if (status.ok()) return status;
  return Status(status.code(), what + ": " + status.message());
}

}  // namespace hetjax::gpu
