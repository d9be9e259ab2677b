#include "cc/ffi/gpu/host_channel.h"

#include "cc/device/host_copy.h"

namespace hetjax::gpu {
namespace {

// The host device finished every "stream" op before the channel returned:
// its fences are complete, so polling runs their checks (timeouts) now.
// Whatever went wrong after the op was enqueued broke the channel; the
// deferred error it recorded is that same failure, taken here so that it is
// not reported a second time by an unrelated later op.
Status Finish(StagingContext& context, SlotChannel& channel, Status status) {
  context.retired.Poll();
  if (!status.ok()) return status;
  Status broken = channel.BrokenStatus();
  if (!broken.ok()) (void)context.errors.Take();
  return broken;
}

}  // namespace

Status HostChannelSend(SlotChannel& channel, Bridge& bridge, uint64_t tag,
                       const TensorSpec& spec, const void* src) {
  StagingContext& context = *HostStagingContext();
  Status status = channel.Send(context, bridge, nullptr, tag, spec, src);
  return Finish(context, channel, status);
}

Status HostChannelRecv(SlotChannel& channel, Bridge& bridge, uint64_t tag,
                       const TensorSpec& spec, void* dst) {
  StagingContext& context = *HostStagingContext();
  // XLA:CPU maps each large result anew: without this, faulting its pages
  // in 4 KiB at a time, chunk by chunk, costs more than the copy
  // (host_copy.h). Meanwhile the GPU peer already fills the slots.
  device::PrepareFreshDestination(dst, spec.num_bytes());
  Status status = channel.Recv(context, bridge, nullptr, tag, spec, dst);
  return Finish(context, channel, status);
}

}  // namespace hetjax::gpu
