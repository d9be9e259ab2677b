// How the pair exchange (pair_exchange.h) cuts a chunk into shares: one
// definition for its kernel and for the host tests.
#pragma once

#include <cstdint>

#include "cc/device/pair_exchange.h"

#if defined(__CUDACC__) || defined(__HIPCC__)
#define HETJAX_HOST_DEVICE __host__ __device__
#else
#define HETJAX_HOST_DEVICE
#endif

namespace hetjax::device {

struct ByteRange {
  uint64_t begin = 0;
  uint64_t bytes = 0;
};

// Part `part` of `parts` of a range of `bytes`: 16-byte units split evenly,
// the last part taking the tail.
HETJAX_HOST_DEVICE inline ByteRange PartOf(uint64_t bytes, uint32_t part,
                                           uint32_t parts) {
  const uint64_t units = bytes / 16;
  const uint64_t per = units / parts, extra = units % parts;
  ByteRange r;
  r.begin = 16 * (part * per + (part < extra ? part : extra));
  r.bytes = 16 * (per + (part < extra ? 1 : 0));
  if (part == parts - 1) r.bytes += bytes % 16;
  return r;
}

// Share `share`'s bytes of a chunk holding `bytes` (at most chunk_bytes):
// its place in a full chunk, cut off where this chunk ends. A share keeps
// the same bytes of a buffer whatever a chunk's length, so the freed[share]
// its publisher waits for covers every byte it writes. (Cutting a short
// chunk afresh put its shares over other shares' bytes of the chunk `depth`
// back in the same buffer, which their consumers might still be reading: a
// 256 MiB + 12 byte all-reduce got a wrong element now and then.)
HETJAX_HOST_DEVICE inline ByteRange ShareOf(uint64_t chunk_bytes,
                                            uint64_t bytes, uint32_t share) {
  const ByteRange full = PartOf(chunk_bytes, share, kPairShares);
  const uint64_t end = full.begin + full.bytes;
  const uint64_t begin = full.begin < bytes ? full.begin : bytes;
  return {begin, (end < bytes ? end : bytes) - begin};
}

}  // namespace hetjax::device
