// The wire format: every frame on every stream (tcp socket or shm ring) is a
// fixed 128-byte little-endian header followed by `chunk_length` payload
// bytes. A message of N bytes travels as one or more frames (chunks) that may
// be spread over several streams; each frame repeats the whole message header
// so the receiver can place a chunk no matter which stream brought it first.
//
// Layout (offsets in bytes, all integers little-endian):
//    0 u32 magic "HJXB"      4 u16 version       6 u8 dtype    7 u8 rank
//    8 i32 source rank      12 u32 flags (kFlagGoodbye, kFlagHeartbeat)
//   16 u64 tag              24 u64 sequence (per sender->receiver pair)
//   32 u64 payload bytes    40 u64 chunk offset  48 u64 chunk length
//   56 i64 dims[8]         120 u64 reserved (0)
#pragma once

#include <cstddef>
#include <cstdint>

#include "cc/transport/status.h"
#include "cc/transport/tensor_spec.h"

namespace hetjax::wire {

inline constexpr uint32_t kMagic = 0x42584a48;  // "HJXB" read as LE bytes
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 128;
// Last frame a stopping bridge writes on each stream (no payload): the
// receiver can tell an orderly stop, after everything sent was read, from a
// crash (end of stream without it).
inline constexpr uint32_t kFlagGoodbye = 1;
// A header-only frame a link sends on an idle stream so its peer can tell a
// quiet peer from a frozen one (heartbeat.h). Not a message: no sequence
// number, never matched.
inline constexpr uint32_t kFlagHeartbeat = 2;

struct FrameHeader {
  int32_t source = 0;
  uint32_t flags = 0;
  uint64_t tag = 0;
  uint64_t sequence = 0;
  TensorSpec spec;
  uint64_t payload_bytes = 0;
  uint64_t chunk_offset = 0;
  uint64_t chunk_length = 0;
};

// Writes exactly kHeaderBytes into `out`.
void EncodeHeader(const FrameHeader& header, uint8_t* out);

// Parses kHeaderBytes of untrusted input. Rejects (kInvalidArgument, with the
// offending values in the message) bad magic, other versions, unknown dtypes,
// rank > kMaxRank, negative dims, a byte count that disagrees with
// dtype x shape, a byte count above `max_message_bytes`, chunks outside
// the payload, and unknown flags. Allocates nothing.
Status ParseHeader(const uint8_t* in, uint64_t max_message_bytes,
                   FrameHeader* header);

// Ok when `received` matches `expected`; otherwise kMismatch worded as
// "recv from rank 1 tag 7: expected float32[4,8], received bfloat16[4,8]".
Status CheckExpected(int peer, uint64_t tag, const TensorSpec& expected,
                     const TensorSpec& received);

}  // namespace hetjax::wire
