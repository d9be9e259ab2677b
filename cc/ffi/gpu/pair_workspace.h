// This GPU's end of the pair exchange with one peer GPU of this host
// (cc/device/pair_exchange.h): the workspace we export, the peer's we open,
// and the chunk numbers both directions have reached. A two-member GPU
// collective is then one kernel on XLA's stream (channel_collective.h).
//
// Set up at the first pair op with a peer: both ends allocate and zero
// their workspace, export it, and swap handles and geometry over the
// bridge under a reserved tag (a mismatch fails, naming both sides). Where
// the pair's slot channel is device-direct (ipc) the workspace is GPU
// memory the peer writes over NVLink; where it is host-staged (host:
// HETJAX_GPU_PATH=host, ROCm, a CUDA/ROCm pair) it is a shared-memory
// segment both GPUs map, written and read over PCIe by the same kernel,
// so the bytes cross host memory once; with HETJAX_GPU_PAIR_COPIES=1 copy
// engines move them instead, in stream-ordered hand-offs (pair_copies.h).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "cc/device/device.h"
#include "cc/ffi/gpu/pair_copies.h"
#include "cc/ffi/gpu/slot_channel.h"
#include "cc/ffi/gpu/slot_ring.h"
#include "cc/ffi/gpu/staging_context.h"
#include "cc/transport/bridge.h"

namespace hetjax::gpu {

inline constexpr uint64_t kPairHandshakeTag = ~uint64_t{0} - 14;

// Chunk size of every pair exchange (GpuTuning::pair_chunk_bytes, 8 MiB
// unless set, a multiple of 16) and how many chunks a direction may have in
// flight; both ends must agree (checked at set-up).
uint64_t PairChunkBytes();
inline constexpr uint32_t kPairDepth = 4;

// Whether two-member GPU collectives use the pair exchange over a channel
// of `path` (GpuTuning::pair_exchange off: nowhere;
// GpuTuning::pair_exchange_over_host off: not over host-staged channels,
// which then send slot-channel messages).
bool PairExchangeEnabled(SlotPath path);

// Whether pair exchanges over host segments move their bytes by copy
// engines (pair_copies.h) rather than the kernel's SM loads and stores
// (GpuTuning::pair_copies_over_host; default off: on H100 hosts the two reach
// the same rates, docs/collectives_measured.md). Both ends must agree, checked
// at set-up. Over device-direct channels the kernel always moves them.
bool PairCopiesOverHost();

class PairWorkspace {
 public:
  ~PairWorkspace();

  // Fills in the workspaces, chunk numbers, control flag and deadline of
  // `exchange` (whose publish, consume and combine the caller set), takes
  // the chunk numbers it uses, and enqueues it on `stream`. A wait that
  // gave up on the device (the kernel marks the control flag) breaks the
  // pair: the next pair op finds it and fails, as does every later one.
  Status Enqueue(StagingContext& context, device::Stream stream,
                 device::PairExchange exchange);

  // Stops every exchange in flight (their waits give up) and fails every
  // later one with `why`.
  void Break(const Status& why);

  struct Handshake;  // what each end tells the other once

 private:
  friend Status FindPairWorkspace(StagingContext&, Bridge&,
                                  const SlotChannelConfig&, device::Stream,
                                  std::shared_ptr<PairWorkspace>*);
  PairWorkspace(const SlotChannelConfig& channel, Bridge& bridge)
      : channel_(channel), bridge_(bridge) {}
  Status SetUp(StagingContext& context, device::Stream stream);
  Status CreateLocal(StagingContext& context, device::Stream stream,
                     uint64_t bytes, Handshake* mine);
  Status OpenRemote(const Handshake& theirs);
  // The scratch, lanes and events of exchanges by copies.
  Status SetUpCopies(device::Device& device, uint64_t scratch_bytes);
  // Whether a wait of an earlier exchange gave up (the peer stopped, or ran
  // a different collective).
  bool AnyWaitTimedOut() const;

  const SlotChannelConfig channel_;  // its peer is ours
  Bridge& bridge_;
  device::Device* device_ = nullptr;
  void* local_ = nullptr;   // ours, exported (device view)
  void* remote_ = nullptr;  // the peer's, opened (device view)
  // The host path's shared-memory segments (their one slot is the
  // workspace); null on the ipc path, where local_ is device memory.
  std::unique_ptr<SlotRing> local_segment_;
  std::unique_ptr<SlotRing> remote_segment_;
  // Set on the host path when copy engines move the bytes (its scratch,
  // lanes and events; the segments above).
  bool by_copies_ = false;
  PairCopyRoute copies_;
  device::FlagPool* flags_ = nullptr;  // control_'s pool
  device::FlagPool::Flag control_;
  uint64_t deadline_ns_ = 0;
  // Recorded after every exchange, waited for before the next: exchanges
  // on different streams (XLA's, a started op's) must not overlap, since
  // one counter per share tells only how far a direction has come.
  device::Event order_ = nullptr;

  std::mutex mu_;  // guards the chunk numbers and broken_
  uint64_t next_out_ = 0;
  uint64_t next_in_ = 0;
  Status broken_;
};

// The workspace towards the peer of `channel`, set up on first use (which
// blocks until the peer's first pair op swaps handles).
Status FindPairWorkspace(StagingContext& context, Bridge& bridge,
                         const SlotChannelConfig& channel,
                         device::Stream stream,
                         std::shared_ptr<PairWorkspace>* out);
// The workspace towards `peer` if a pair op set it up already, else null.
std::shared_ptr<PairWorkspace> ExistingPairWorkspace(int peer);
// Drops every workspace (_native.stop).
void ClearPairWorkspaces();

}  // namespace hetjax::gpu
