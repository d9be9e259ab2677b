// The GPU send path, vendor-neutral: device->host copies into pinned staging
// on the caller's stream, one event per chunk, and an asynchronous bridge
// send whose chunk gate waits for that chunk's event. Chunk i is on the wire
// while chunk i+1 is still being copied, and the caller's stream never waits
// for the network.
#pragma once

#include <cstdint>

#include "cc/device/device.h"
#include "cc/ffi/gpu/staging_context.h"
#include "cc/transport/bridge.h"
#include "cc/transport/tensor_spec.h"

namespace hetjax::gpu {

// Enqueues the copies and starts the send; returns without blocking. An
// error is returned only for what fails now (or an earlier op's deferred
// error); failures after return are deferred to the next op.
Status StagedSend(StagingContext& context, Bridge& bridge,
                  device::Stream stream, int peer, uint64_t tag,
                  const TensorSpec& spec, const void* device_src);

}  // namespace hetjax::gpu
