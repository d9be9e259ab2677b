#include "cc/ffi/gpu/pair_copies.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace hetjax::gpu {
namespace {

using device::Device;

// Buffer `slot` of a workspace that starts at `workspace`.
template <typename Byte>
Byte* BufferOf(Byte* workspace, uint64_t slot, uint64_t chunk_bytes) {
  return workspace + sizeof(device::PairCounters) + slot * chunk_bytes;
}

// Chunk numbers ride in a WaitFlag's 32-bit count: it wraps after 2^32
// chunks of one direction (32 PiB at the default 8 MiB chunk).
uint32_t Count(uint64_t chunk_number) {
  return static_cast<uint32_t>(chunk_number);
}

Status PublishChunks(Device& device, const device::PairExchange& x,
                     const PairCopyRoute& route) {
  const auto* source = static_cast<const uint8_t*>(x.publish);
  for (uint64_t offset = 0, k = 0; offset < x.publish_bytes;
       offset += x.chunk_bytes, ++k) {
    const uint64_t n = x.first_out + k;
    const uint64_t slot = n % x.depth;
    Device::Handoff push;
    if (n + 1 > x.depth) {
      push.waits[0] = {route.local->freed_device(0), Count(n + 1 - x.depth)};
    }
    push.kind = Device::CopyKind::kDeviceToHost;
    push.dst = BufferOf(route.remote->data_host(0), slot, x.chunk_bytes);
    push.dst_device =
        BufferOf(route.remote->data_device(0), slot, x.chunk_bytes);
    push.src = push.src_device = source + offset;
    push.bytes = std::min(x.chunk_bytes, x.publish_bytes - offset);
    push.signal_host = route.remote->filled_host(0);
    push.signal_device = route.remote->filled_device(0);
    push.signal_value = Count(n + 1);
    push.timeout_ns = x.timeout_ns;
    Status s = device.HandoffAsync(push, route.publish_lane);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

// Chunk `k`'s combine as the kernel computes it (pair_exchange.h): the
// peer's elements `theirs` with ours, in island order, into the output.
device::Combine ChunkCombine(const device::PairExchange& x, uint64_t offset,
                             uint64_t bytes, const void* theirs) {
  device::Combine c = x.combine;
  const uint64_t first = offset / x.element_bytes;
  c.count = bytes / x.element_bytes;
  c.out =
      static_cast<uint8_t*>(c.out) + first * device::ElementBytes(c.out_type);
  c.a = theirs;
  if (c.b == nullptr) return c;
  c.b =
      static_cast<const uint8_t*>(c.b) + first * device::ElementBytes(c.b_type);
  if (!x.peer_first) {
    std::swap(c.a, c.b);
    std::swap(c.a_type, c.b_type);
  }
  return c;
}

Status ConsumeChunks(Device& device, device::Stream stream,
                     const device::PairExchange& x,
                     const PairCopyRoute& route) {
  const device::Combine& c = x.combine;
  const bool plain_move =
      c.b == nullptr && c.a_type == c.out_type && c.divisor == 1.0;
  for (uint64_t offset = 0, k = 0; offset < x.consume_bytes;
       offset += x.chunk_bytes, ++k) {
    const uint64_t n = x.first_in + k;
    const uint64_t slot = n % x.depth;
    Status s;
    if (!plain_move && k >= x.depth) {
      // The combine of this op's chunk k - depth still reads the slot.
      s = device.StreamWaitEvent(route.consume_lane, route.combined[slot]);
      if (!s.ok()) return s;
    }
    Device::Handoff pull;
    pull.waits[0] = {route.local->filled_device(0), Count(n + 1)};
    pull.kind = Device::CopyKind::kHostToDevice;
    pull.src = BufferOf(route.local->data_host(0), slot, x.chunk_bytes);
    pull.src_device =
        BufferOf(route.local->data_device(0), slot, x.chunk_bytes);
    pull.dst = pull.dst_device =
        plain_move
            ? static_cast<uint8_t*>(c.out) + offset
            : static_cast<uint8_t*>(route.scratch) + slot * x.chunk_bytes;
    pull.bytes = std::min(x.chunk_bytes, x.consume_bytes - offset);
    pull.signal_host = route.remote->freed_host(0);
    pull.signal_device = route.remote->freed_device(0);
    pull.signal_value = Count(n + 1);
    pull.timeout_ns = x.timeout_ns;
    s = device.HandoffAsync(pull, route.consume_lane);
    if (!s.ok()) return s;
    if (plain_move) continue;
    s = device.RecordEvent(route.landed[slot], route.consume_lane);
    if (s.ok()) s = device.StreamWaitEvent(stream, route.landed[slot]);
    if (s.ok()) {
      s = device.CombineAsync(ChunkCombine(x, offset, pull.bytes, pull.dst),
                              stream);
    }
    if (s.ok()) s = device.RecordEvent(route.combined[slot], stream);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace

Status PairCopyLanes(Device& device, int peer, device::Stream* publish,
                     device::Stream* consume) {
  static std::mutex* mu = new std::mutex();
  // Never destroyed, like every cached stream (device.h). Keyed by device
  // ordinal and peer.
  static auto* lanes =
      new std::map<std::pair<int, int>,
                   std::pair<device::Stream, device::Stream>>();
  int ordinal = 0;
  Status s = device.CurrentDevice(&ordinal);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(*mu);
  auto it = lanes->find({ordinal, peer});
  if (it == lanes->end()) {
    std::pair<device::Stream, device::Stream> created;
    s = device.CreateStream(&created.first);
    if (s.ok()) s = device.CreateStream(&created.second);
    if (!s.ok()) return s;
    it = lanes->emplace(std::make_pair(ordinal, peer), created).first;
  }
  *publish = it->second.first;
  *consume = it->second.second;
  return Status::Ok();
}

Status EnqueuePairCopies(Device& device, device::Stream stream,
                         const device::PairExchange& x,
                         const PairCopyRoute& route) {
  if (x.element_bytes == 0 || x.consume_bytes % x.element_bytes != 0 ||
      x.depth == 0 || x.depth > route.landed.size() ||
      x.depth > route.combined.size() || x.chunk_bytes == 0 ||
      x.chunk_bytes % x.element_bytes != 0) {
    return Status(
        StatusCode::kInvalidArgument,
        "pair exchange by copies: " + std::to_string(x.consume_bytes) +
            " bytes of " + std::to_string(x.element_bytes) +
            "-byte elements in " + std::to_string(x.chunk_bytes) +
            "-byte chunks, depth " + std::to_string(x.depth));
  }
  Status s = device.RecordEvent(route.forked, stream);
  if (s.ok()) s = device.StreamWaitEvent(route.publish_lane, route.forked);
  if (s.ok()) s = device.StreamWaitEvent(route.consume_lane, route.forked);
  if (s.ok() && x.publish_copy != nullptr && x.publish_bytes != 0) {
    s = device.CopyDeviceAsync(x.publish_copy, x.publish, x.publish_bytes,
                               stream);
  }
  if (s.ok()) s = PublishChunks(device, x, route);
  if (s.ok()) s = ConsumeChunks(device, stream, x, route);
  if (s.ok()) s = device.RecordEvent(route.published, route.publish_lane);
  if (s.ok()) s = device.RecordEvent(route.consumed, route.consume_lane);
  if (s.ok()) s = device.StreamWaitEvent(stream, route.published);
  if (s.ok()) s = device.StreamWaitEvent(stream, route.consumed);
  return s;
}

}  // namespace hetjax::gpu
