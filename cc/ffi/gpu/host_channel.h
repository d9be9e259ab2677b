// The CPU island's end of a slot channel to a GPU island of the same host
// (SlotChannelConfig::local_cpu). The CPU send/recv handlers run the
// channel's own Send/Recv on the host device, whose "stream" is the calling
// thread: the GPU peer's copy engine writes into (reads from) the shared,
// page-locked slots, and this end copies between them and XLA's buffer on
// several threads (cc/device/host_copy.h). One host memcpy per message,
// where the transport's byte path took three on two single threads (GPU
// staging -> shm ring -> XLA buffer): that path moved 1.4 GB/s cuda -> cpu and
// 8.8 GB/s cpu -> cuda at 256 MiB on a host with one H100
// (docs/performance.md).
//
// When these return, the bytes have moved, so a failure the GPU handlers
// defer to the next op (a mismatch, a timeout, a lost peer: each breaks the
// channel) is returned at once here.
#pragma once

#include <cstdint>

#include "cc/ffi/gpu/slot_channel.h"
#include "cc/transport/bridge.h"
#include "cc/transport/tensor_spec.h"

namespace hetjax::gpu {

Status HostChannelSend(SlotChannel& channel, Bridge& bridge, uint64_t tag,
                       const TensorSpec& spec, const void* src);
Status HostChannelRecv(SlotChannel& channel, Bridge& bridge, uint64_t tag,
                       const TensorSpec& spec, void* dst);

}  // namespace hetjax::gpu
