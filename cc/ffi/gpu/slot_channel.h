// The fast GPU path between two GPU processes of one host: a slot channel per
// peer. Each direction is a SlotRing of `slots` slots the two streams hand
// back and forth, with no host memcpy and no host thread per chunk:
//
//   sender stream:   [wait freed[s] >= g-1]  copy chunk -> slot s  signal
//   filled[s] = g receiver stream: wait filled[s] >= g     copy slot s ->
//   output  signal freed[s] = g
//
// for chunk number n of the direction (counted alike on both ends): slot
// s = n % slots, generation g = n / slots + 1. Where the slot's bytes live
// is the path:
//   host: in the shared segment itself (page-locked in both processes): the
//         sender's device->host copy lands where the receiver's host->device
//         copy reads.
//   ipc:  in the sender's GPU memory, exported once (CUDA IPC); the receiver
//         copies peer-to-peer out of it (NVLink), no host memory at all.
// Per message one small descriptor goes over the ordinary bridge under a
// reserved tag: tag, dtype, shape and first chunk number, checked by the
// receiver before its stream touches the data, so a mismatch or an
// out-of-order receive is an error naming both sides, never silent garbage.
// Messages of a direction are consumed in the order they were sent (the
// ordering rule every hetjax program follows anyway, docs/INTERFACES.md).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "cc/device/device.h"
#include "cc/ffi/gpu/slot_ring.h"
#include "cc/ffi/gpu/staging_context.h"
#include "cc/transport/bridge.h"
#include "cc/transport/tensor_spec.h"

namespace hetjax::gpu {

enum class SlotPath : uint8_t { kHost = 1, kIpc = 2 };
const char* SlotPathName(SlotPath path);

// The bridge's own tags sit at the top of the uint64 range (runtime.py);
// jax programs cannot reach them (their tags are int64).
inline constexpr uint64_t kSlotDescriptorTag = ~uint64_t{0} - 15;

struct SlotChannelConfig {
  int peer = -1;
  SlotPath path = SlotPath::kHost;
  std::string outbound_name;  // we create it (we send through it)
  std::string inbound_name;   // the peer created it
  uint32_t slots = 8;
  uint64_t slot_bytes = uint64_t{8} << 20;
  // A CPU island's end of the channel runs on the host device
  // (host_channel.h): ours when local_cpu, the peer's when peer_cpu. Only
  // the host path can have one. The GPU end does exactly what it does
  // towards a GPU peer: its copies land in (or leave from) the slots the CPU
  // end copies out of (into), with no staging buffer and no transport memcpy
  // in between.
  bool local_cpu = false;
  bool peer_cpu = false;
};

// How a message of `bytes` is cut: about `target_chunks` chunks so copies
// on both ends overlap, none under kMinChunkBytes (each chunk costs a wait
// and a signal kernel, a few us) and none over a slot. The host path takes
// kTargetChunks (two copy engines of equal speed overlap best with many);
// ipc takes kIpcTargetChunks: the sender's local copy runs ~4x faster than
// the receiver's over NVLink, so more chunks only add hand-offs (measured
// on H200: 36 us per 8 MiB chunk, 26 of them copying).
struct ChunkPlan {
  uint64_t chunk_bytes = 0;
  uint64_t chunks = 0;
};
inline constexpr uint64_t kTargetChunks = 8;
inline constexpr uint64_t kIpcTargetChunks = 2;
inline constexpr uint64_t kMinChunkBytes = uint64_t{1} << 20;
ChunkPlan PlanChunks(uint64_t bytes, uint64_t slot_bytes,
                     uint64_t target_chunks = kTargetChunks);

// Messages up to this size move as one fused hand-off per side
// (Device::HandoffAsync: waits, copy and signal in one kernel) instead of
// separate wait, copy and signal ops (GpuTuning::fused_max_bytes, 64 KiB
// unless set; 0: never fuse). Larger messages keep the copy engines, which
// a single block of threads cannot match.
uint64_t FusedMaxBytes();

// What the sender says about each message (plain bytes on the wire).
struct SlotDescriptor {
  uint32_t magic = 0;
  uint8_t path = 0;
  uint8_t reserved[3] = {};
  uint64_t tag = 0;
  TensorSpec spec;
  uint64_t first_chunk = 0;
  uint64_t chunks = 0;
  uint64_t chunk_bytes = 0;
  device::Device::IpcHandle slots_handle = {};  // ipc: the sender's slots
};
inline constexpr uint32_t kSlotDescriptorMagic = 0x48534c44;  // "HSLD"

// ok, or the mismatch between what the receiver expected and `got`, naming
// both (peer, tag, dtype, shape, position in the stream).
Status CheckDescriptor(int peer, uint64_t tag, const TensorSpec& expected,
                       uint64_t first_chunk, SlotPath path,
                       const SlotDescriptor& got);

class SlotChannel : public std::enable_shared_from_this<SlotChannel> {
 public:
  // Creates our outbound ring now; the inbound one is opened at first use
  // (the peer creates it during the same start-up).
  static Status Create(const SlotChannelConfig& config,
                       std::shared_ptr<SlotChannel>* out);
  ~SlotChannel();

  const SlotChannelConfig& config() const { return config_; }

  // Like StagedSend / StagedRecv (same return and deferral rules), through
  // the slot rings. Neither blocks the calling thread, except the very first
  // ipc receive, which waits for the peer's first descriptor to learn where
  // its slots are.
  Status Send(StagingContext& context, Bridge& bridge, device::Stream stream,
              uint64_t tag, const TensorSpec& spec, const void* device_src);
  Status Recv(StagingContext& context, Bridge& bridge, device::Stream stream,
              uint64_t tag, const TensorSpec& spec, void* device_dst);

  // After a mismatch the two ends disagree on chunk numbers for good: every
  // wait is released and every later op fails with this status.
  void Break(const Status& why);
  // Ok, or why the channel broke. Every failure found after an op returned
  // (mismatch, timeout, lost peer) breaks the channel.
  Status BrokenStatus();

 private:
  explicit SlotChannel(SlotChannelConfig config) : config_(std::move(config)) {}
  Status PrepareSend(StagingContext& context);
  Status PrepareRecv(StagingContext& context);
  Status OpenPeerSlots(device::Device& device,
                       const device::Device::IpcHandle& handle);
  // A slot's bytes as the copy engine and as a kernel address them: in the
  // ring's shared segment (host path) or among the sender's GPU slots (ipc:
  // ours for sends, the peer's opened ones for receives).
  struct SlotBytes {
    uint8_t* host;
    uint8_t* device;
  };
  SlotBytes SlotAt(const SlotRing& ring, void* gpu_slots, uint32_t slot) const;
  // Once per channel: Break when the bridge loses the peer, so device waits
  // on slots it will never fill or free end now, not at their deadline.
  void WatchPeerOnce(Bridge& bridge);
  // What every send and receive checks first: buffers the stream is done
  // with, an error a finished op left behind, the peer's liveness, and
  // whether the channel already broke.
  Status BeginOp(StagingContext& context, Bridge& bridge);

  const SlotChannelConfig config_;
  // Each direction's ops are serialized (chunk numbers are handed out in
  // order); the two directions are independent.
  std::mutex send_mu_;  // guards out_ use, next_send_chunk_, send_slots_
  std::unique_ptr<SlotRing> out_;
  uint64_t next_send_chunk_ = 0;
  void* send_slots_ = nullptr;  // ipc: our slots, in our GPU memory
  device::Device::IpcHandle send_handle_ = {};
  device::Device* send_device_ = nullptr;

  std::mutex recv_mu_;  // guards in_, next_recv_chunk_, recv_slots_
  std::unique_ptr<SlotRing> in_;
  uint64_t next_recv_chunk_ = 0;
  void* recv_slots_ = nullptr;  // ipc: the peer's, opened
  device::Device* recv_device_ = nullptr;

  std::once_flag watching_peer_;
  std::mutex broken_mu_;  // guards broken_ and Break's view of the rings
  Status broken_;
  SlotRing* out_view_ = nullptr;
  SlotRing* in_view_ = nullptr;
};

// The process's channels, by peer (set up by the control plane through
// _native.add_gpu_channel; cleared by _native.stop).
Status AddSlotChannel(const SlotChannelConfig& config);
std::shared_ptr<SlotChannel> FindSlotChannel(int peer);
// The channel to `peer` that this process's handlers of one platform take:
// the CPU handlers (on_host) those whose local end is a CPU island, the GPU
// handlers the others. nullptr: the transport carries the message.
std::shared_ptr<SlotChannel> ChannelForHandler(int peer, bool on_host);
void ClearSlotChannels();

}  // namespace hetjax::gpu
