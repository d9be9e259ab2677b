// The pair exchange (cc/device/pair_exchange.h) moved by copy engines, for
// workspaces in shared host memory (the host path: HETJAX_GPU_PATH=host,
// ROCm, a CUDA/ROCm pair). Same workspaces, chunk numbers and arithmetic as
// the kernel; only who moves the bytes differs.
//
// Why: bare copies through host memory outrun SM loads and stores when both
// GPUs exchange at once (2 x H100: 32-42 against 26-29 GB/s a direction,
// bench/bench_host_link.py), and on other GPUs (ROCm's) the gap may be wider.
// Measured whole, though, the two exchanges run within a few percent of
// each other on H100 hosts (docs/collectives_measured.md), so this is an option
// (HETJAX_GPU_PAIR_COPIES=1), not the default. Over NVLink the kernel
// always moves the bytes: there it keeps pace with XLA's own collectives.
//
// Two lanes (streams of the GPU) fork off the caller's stream and join it
// again, so the caller's stream still orders the op and no host thread waits
// for the peer:
//   publish lane:  [wait our freed >= n+1-depth]  copy chunk -> peer's buffer
//                  n % depth  raise the peer's filled to n+1
//   consume lane:  wait our filled >= n+1  copy our buffer n % depth ->
//                  scratch n % depth  raise the peer's freed to n+1
//   caller's stream: combine scratch n % depth into the output
// for chunk number n of the direction. The combines run on the caller's
// stream, so the next chunk's copy does not wait behind them; a scratch
// slot is copied into again only after its combine (events, per slot). The
// flags are slot 0's of each segment's SlotRing header (the kernel's per-share
// counters stay unused): ours are raised by the peer, the peer's by us. A plain
// move copies straight into the output, with no scratch and no combine.
#pragma once

#include <vector>

#include "cc/device/device.h"
#include "cc/ffi/gpu/slot_ring.h"
#include "cc/transport/status.h"

namespace hetjax::gpu {

// Where one pair's copy-engine exchanges run.
struct PairCopyRoute {
  // Ours: the peer's chunks land in its buffers, and we wait on its flags.
  const SlotRing* local = nullptr;
  // The peer's: our chunks land there, and we raise its flags.
  const SlotRing* remote = nullptr;
  device::Stream publish_lane = nullptr;
  device::Stream consume_lane = nullptr;
  // Reused by every exchange of the pair (they never overlap).
  device::Event forked = nullptr;
  device::Event published = nullptr;
  device::Event consumed = nullptr;
  // depth * chunk_bytes of device memory: inbound chunks before combining.
  void* scratch = nullptr;
  // Per scratch slot (depth of each): its chunk has landed (consume lane),
  // its combine has read it (caller's stream).
  std::vector<device::Event> landed;
  std::vector<device::Event> combined;

  // Sizes the per-slot events for `depth`; then every event of the route,
  // for creating and destroying them together.
  void SetDepth(uint32_t depth) {
    landed.assign(depth, nullptr);
    combined.assign(depth, nullptr);
  }
  std::vector<device::Event*> Events() {
    std::vector<device::Event*> all = {&forked, &published, &consumed};
    for (device::Event& e : landed) all.push_back(&e);
    for (device::Event& e : combined) all.push_back(&e);
    return all;
  }
};

// The two lanes of the current device towards bridge rank `peer`, created
// once for the life of the process. Per peer: exchanges with different
// peers may run from different streams at once, and on shared lanes one
// could wait behind another that waits for it.
Status PairCopyLanes(device::Device& device, int peer, device::Stream* publish,
                     device::Stream* consume);

// Enqueues exchange `x` (workspace fields filled in) on `stream` by copies.
Status EnqueuePairCopies(device::Device& device, device::Stream stream,
                         const device::PairExchange& x,
                         const PairCopyRoute& route);

}  // namespace hetjax::gpu
