// The GPU receive path, vendor-neutral: the receive is pre-posted into pinned
// staging; on the caller's stream each chunk gets a flag wait followed by its
// host->device copy, and the bridge's progress callback raises the flag as
// the contiguous received prefix grows. Work enqueued before the receive
// keeps running; only work after it waits, and only for the bytes it needs.
#pragma once

#include <cstdint>

#include "cc/device/device.h"
#include "cc/ffi/gpu/staging_context.h"
#include "cc/transport/bridge.h"
#include "cc/transport/tensor_spec.h"

namespace hetjax::gpu {

// How long a flag wait may hold a stream: the bridge fails a stalled
// receive after its own timeout and aborts the flag; this is the backstop
// for when nothing on the host side is left to do that.
uint64_t WaitDeadlineNs(const BridgeOptions& options);

// Posts the receive and enqueues waits and copies into `device_dst`
// (spec.num_bytes() bytes). Returns without waiting for data (on a GPU).
// A header mismatch already known is returned now; later failures abort the
// waits (the stream goes on, the data is garbage) and are deferred to the
// next op.
Status StagedRecv(StagingContext& context, Bridge& bridge,
                  device::Stream stream, int peer, uint64_t tag,
                  const TensorSpec& spec, void* device_dst);

}  // namespace hetjax::gpu
