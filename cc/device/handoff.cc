// The hand-off as separate stream ops, for every device; the GPU layer runs
// fused hand-offs as one kernel instead (gpu_device.cu).
#include "cc/device/device.h"

namespace hetjax::device {

Status Device::HandoffAsync(const Handoff& handoff, Stream stream) {
  for (const FlagTarget& wait : handoff.waits) {
    if (wait.flag_device == nullptr) continue;
    Status status = WaitFlagAsync(wait.flag_device, wait.target,
                                  handoff.timeout_ns, stream);
    if (!status.ok()) return status;
  }
  if (handoff.bytes != 0) {
    Status status = HandoffCopyAsync(handoff, stream);
    if (!status.ok()) return status;
  }
  if (handoff.signal_device == nullptr) return Status::Ok();
  return SignalFlagAsync(handoff.signal_host, handoff.signal_device,
                         handoff.signal_value, stream);
}

Status Device::HandoffCopyAsync(const Handoff& handoff, Stream stream) {
  switch (handoff.kind) {
    case CopyKind::kDeviceToHost:
      return CopyToHostAsync(handoff.dst, handoff.src, handoff.bytes, stream);
    case CopyKind::kHostToDevice:
      return CopyToDeviceAsync(handoff.dst, handoff.src, handoff.bytes, stream);
    case CopyKind::kDeviceToDevice:
      break;
  }
  return CopyDeviceAsync(handoff.dst, handoff.src, handoff.bytes, stream);
}

}  // namespace hetjax::device
