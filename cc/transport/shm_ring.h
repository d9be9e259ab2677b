// Shared-memory transport: one single-producer/single-consumer byte ring per
// direction, each in its own POSIX shm segment. The sender copies into the
// ring while the receiver copies out of it, slice by slice, so a large
// message crosses in about one memcpy's time. Waits spin briefly (small
// messages stay in the microseconds), then sleep on a futex in the segment.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cc/transport/byte_stream.h"

namespace hetjax {

// Creates `outbound_name` (ring_bytes of data; fails if it exists) and opens
// `inbound_name`, which the peer creates: retried until it appears, fully
// initialised, or `timeout_seconds` pass (<= 0: wait forever). The stream
// unlinks the outbound segment when destroyed.
Status MakeShmStream(const std::string& outbound_name,
                     const std::string& inbound_name, uint64_t ring_bytes,
                     double timeout_seconds,
                     std::unique_ptr<ByteStream>* stream);

}  // namespace hetjax
