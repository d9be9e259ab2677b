#include "cc/ffi/collectives/staged_collective.h"

#include <cstring>
#include <utility>

namespace hetjax::collectives {

StagedCollective::StagedCollective(gpu::StagingContext& context,
                                   device::Stream stream)
    : context_(context), stream_(stream), scope_(context.device, stream) {}

StagedCollective::~StagedCollective() {
  // Only after a failure half-way: let the stream finish with our staging
  // before another op may reuse it.
  if (stream_may_use_staging_) context_.device.SynchronizeStream(stream_);
  if (copied_in_ != nullptr)
    context_.events.Release(scope_.ordinal(), copied_in_);
  if (in_.data != nullptr) context_.pinned.Release(in_);
  if (out_.data != nullptr) context_.pinned.Release(out_);
}

const void* StagedCollective::x() const {
  return static_cast<const uint8_t*>(in_.data) + kIndexBytes;
}

Status StagedCollective::CopyIn(const void* device_index, const void* x,
                                size_t x_bytes, size_t y_bytes) {
  Status s = EnqueueCopyIn(device_index, x, x_bytes, y_bytes);
  return s.ok() ? WaitCopyIn() : s;
}

Status StagedCollective::EnqueueCopyIn(const void* device_index, const void* x,
                                       size_t x_bytes, size_t y_bytes) {
  context_.retired.Poll();
  if (Status earlier = context_.errors.Take(); !earlier.ok()) return earlier;
  if (!scope_.status().ok()) return scope_.status();
  device::Device& dev = context_.device;
  y_bytes_ = y_bytes;
  Status s = context_.pinned.Acquire(kIndexBytes + x_bytes, &in_);
  if (s.ok()) {
    stream_may_use_staging_ = true;
    s = dev.CopyToHostAsync(in_.data, device_index, sizeof(int32_t), stream_);
  }
  if (s.ok() && x_bytes > 0) {
    s = dev.CopyToHostAsync(static_cast<uint8_t*>(in_.data) + kIndexBytes, x,
                            x_bytes, stream_);
  }
  if (s.ok()) s = context_.events.Acquire(scope_.ordinal(), &copied_in_);
  if (s.ok()) s = dev.RecordEvent(copied_in_, stream_);
  return gpu::WithContext(s, "collective: operand to host");
}

Status StagedCollective::WaitCopyIn() {
  Status s = context_.device.SynchronizeEvent(copied_in_);
  if (!s.ok()) return gpu::WithContext(s, "collective: operand to host");
  context_.events.Release(scope_.ordinal(), copied_in_);
  copied_in_ = nullptr;
  stream_may_use_staging_ = false;
  std::memcpy(&index_, in_.data, sizeof(index_));
  if (y_bytes_ > 0) s = context_.pinned.Acquire(y_bytes_, &out_);
  return gpu::WithContext(s, "collective: result staging");
}

Status StagedCollective::CopyOut(void* y_device, void* token_device,
                                 size_t token_bytes) {
  device::Device& dev = context_.device;
  stream_may_use_staging_ = true;
  Status s;
  if (y_bytes_ > 0)
    s = dev.CopyToDeviceAsync(y_device, out_.data, y_bytes_, stream_);
  if (s.ok()) s = dev.MemsetAsync(token_device, 0, token_bytes, stream_);
  device::Event fence = nullptr;
  if (s.ok()) s = context_.events.Acquire(scope_.ordinal(), &fence);
  if (s.ok()) s = dev.RecordEvent(fence, stream_);
  if (!s.ok()) {
    if (fence != nullptr) context_.events.Release(scope_.ordinal(), fence);
    return gpu::WithContext(s, "collective: result to device");
  }
  // The operand's staging was waited for in CopyIn; the result's goes back
  // once the stream has passed its copy.
  gpu::StagingContext& context = context_;
  const int ordinal = scope_.ordinal();
  context_.retired.Retire(fence, [&context, ordinal, fence, out = out_] {
    if (out.data != nullptr) context.pinned.Release(out);
    context.events.Release(ordinal, fence);
  });
  out_ = {};
  stream_may_use_staging_ = false;
  return Status::Ok();
}

}  // namespace hetjax::collectives
