// A two-member collective's whole data path as one kernel (the pair
// exchange): each GPU pushes its bytes straight into a workspace of the
// peer's (device memory the peer exported, opened with CUDA IPC), and
// consumes what the peer pushed into its own, combining it with a local
// operand on the way. One launch per op instead of a wait, copy and signal
// per chunk, no host thread in between, and no staging copy: the bytes
// cross NVLink as posted stores, once.
//
// A workspace (one per GPU and peer, allocated by the collectives layer):
//
//   [PairCounters][depth buffers of chunk_bytes], the peer's inbound data
//
// Each chunk is cut into kPairShares shares. Share s of a chunk is moved by
// one publisher block and one consumer block, which keep two counters per
// share in the workspace of the GPU that polls them, so every poll is a
// local load and every signal one remote store:
//   filled[s] (in the consumer's workspace): chunks of this direction the
//             peer has pushed, raised by the peer's publisher block s;
//   freed[s]  (in the publisher's workspace): chunks the peer has consumed,
//             raised by the peer's consumer block s.
// Chunk k of a direction goes to buffer k % depth; it may be written once
// freed[s] >= k + 1 - depth and read once filled[s] >= k + 1. The counters
// only grow, across ops too: the host hands each op the direction's first
// chunk number (first_out / first_in), counted alike on both GPUs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cc/device/combine.h"

namespace hetjax::device {

struct WaitFlag;

inline constexpr uint32_t kPairShares = 32;

struct PairCounters {
  uint64_t filled[kPairShares];
  uint64_t freed[kPairShares];
};

struct PairExchange {
  // Ours (device memory of this GPU) and the peer's (opened with OpenIpc);
  // each starts with PairCounters, then depth * chunk_bytes of buffers.
  void* local_workspace = nullptr;
  void* peer_workspace = nullptr;
  uint32_t depth = 0;
  uint64_t chunk_bytes = 0;  // a multiple of 16
  uint64_t first_out = 0;    // our next chunk number towards the peer
  uint64_t first_in = 0;     // the peer's next chunk number towards us

  // What we publish: `publish_bytes` of device memory.
  const void* publish = nullptr;
  uint64_t publish_bytes = 0;
  // Optional: where the same bytes also go locally (an all-gather's or a
  // broadcast root's own part of the result), stored by blocks of their
  // own while the exchange runs.
  void* publish_copy = nullptr;

  // What we consume: the peer's `consume_bytes`, elements of
  // combine.a_type (the wire type). With combine.b null they are only
  // converted (a copy when the types match) into combine.out; otherwise
  // combined with combine.b element for element, the peer's operand first
  // when peer_first (island order), exactly as Device::CombineAsync would.
  // combine.a and combine.count are filled in by the kernel per share.
  uint64_t consume_bytes = 0;
  uint32_t element_bytes = 0;  // of combine.a_type
  Combine combine;
  bool peer_first = false;

  // Every wait gives up after timeout_ns (0: never) and when control->abort
  // is raised; a wait that gave up sets control->timed_out and skips the
  // rest (the host reports it and breaks the pair).
  WaitFlag* control_device = nullptr;
  uint64_t timeout_ns = 0;
};

}  // namespace hetjax::device
