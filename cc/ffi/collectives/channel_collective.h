// The collectives between processes of which at least one is a GPU's
// (channel_choice.h), over the channels GPU send/recv use: between
// processes of one host the slot channels (cc/ffi/gpu/slot_channel.h),
// device-direct (CUDA IPC) or through shared pinned memory
// (HETJAX_GPU_PATH=host, ROCm, a CPU island's end), as the pair's channel
// goes; where no slot channel joins two members (another host, a CUDA/ROCm
// pair, HETJAX_GPU_PATH=off) staged bridge messages, pinned copies on the
// streams and the transport between them (gpu/staged_send.h,
// gpu/staged_recv.h). Every reduction is a device kernel
// (device_combine.h), and the whole op is only enqueued: the host thread
// never waits for a peer's data, XLA's stream does, in its flag-wait
// kernels. A CPU island's member runs the same code on the host device,
// whose "streams" are the calling thread: it blocks, as every CPU
// collective does, and its messages and reductions are the GPU members'.
//
// Two streams per op. XLA's stream sends and reduces; a receive stream of
// the same device (created once, cached) takes every receive and records
// an event after each piece, which XLA's stream waits for before reducing
// or forwarding it. So piece k+1 arrives while piece k is reduced, and a
// send never waits behind a receive. The receive stream starts after
// everything XLA enqueued before the op (a fork event) and XLA's stream
// continues only after the last receive (a join event).
//
// Deadlock freedom: every member enqueues its messages in the same
// (phase, step, piece) order, each piece's sends before its receives, and a
// piece never needs more chunks than a channel has slots. A send then only
// waits for slots freed by receives of earlier pieces, and a receive only for
// sends of the same piece, which depend on earlier pieces alone.
//
// Orders of reduction are the host algorithms' (algorithms.h, ring
// schedule from ring_schedule.h): the ring combines its partial sums as the
// host ring does, in the same accumulator type, and rounds once; with two
// members the ring's one combination is taken in island order. The ordered
// (deterministic) all-reduce and the reduce-scatter share one exchange:
// every member sends member c its raw segment c, and c reduces the n
// contributions in island order, rounding once, so any number of islands
// gives the host's ordered result bitwise; the all-reduce then gathers the
// finished segments straight into every member's output.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "cc/device/device.h"
#include "cc/device/pinned_pool.h"
#include "cc/ffi/collectives/algorithms.h"
#include "cc/ffi/collectives/ring_schedule.h"
#include "cc/ffi/gpu/pair_workspace.h"
#include "cc/ffi/gpu/slot_channel.h"
#include "cc/ffi/gpu/staging_context.h"

namespace hetjax::collectives {

// The pipelining unit of the GPU collectives (each piece is one
// slot-channel message): CollectiveTuning::piece_bytes, 16 MiB unless set.
// Members agree on it through the op descriptor. Within [4 KiB, 64 MiB]: a
// piece must fit the channel's ring (8 slots; see PlanChunks).
uint64_t GpuPieceBytes();

class ChannelCollective final : public SlotAlgorithms {
 public:
  // The slot channel to a bridge rank: the process's registry, or a test's
  // own (several ranks in one process).
  using FindChannel = std::function<std::shared_ptr<gpu::SlotChannel>(int)>;

  // Where an op's buffers live. kHost: a CPU island's (XLA:CPU's memory, on
  // the host device): a message with no slot channel goes straight from and
  // into them over the bridge, blocking as the host device does. kDevice:
  // staged bridge messages, also on the host device, where the C++ tests run
  // the GPU's staging logic.
  enum class Buffers { kDevice, kHost };

  ChannelCollective(gpu::StagingContext& context, device::Stream stream,
                    FindChannel find_channel = gpu::FindSlotChannel,
                    Buffers buffers = Buffers::kDevice);
  // Joins and retires whatever an op that failed half-way left enqueued.
  ~ChannelCollective() override;
  ChannelCollective(const ChannelCollective&) = delete;
  ChannelCollective& operator=(const ChannelCollective&) = delete;

  // Reports an earlier asynchronous failure of this process's GPU comm ops
  // (as every GPU handler does). The receive stream is forked off XLA's
  // only by an op that receives on it (not the pair kernel's).
  Status Begin();

  // Whether two-member groups take the pair kernel is part of the path
  // the members agree on.
  DataPath path() const override {
    if (!gpu::PairExchangeEnabled(gpu::SlotPath::kIpc)) {
      return DataPath::kGpuChannels;
    }
    return gpu::PairExchangeEnabled(gpu::SlotPath::kHost)
               ? DataPath::kGpuPairKernel
               : DataPath::kGpuPairKernelIpcOnly;
  }
  uint64_t piece_bytes() const override { return piece_bytes_; }
  // A pair exchange agrees on its op while it runs: the host thread does
  // not wait a round trip for the peer's descriptor before enqueueing. A
  // disagreement stops the kernels (the pair breaks) and is reported by the
  // next GPU comm op. The first op with a peer still agrees first.
  std::function<void(const Status&)> LateAgreement(const SlotOp& op) override;
  // Buffers are device memory on the stream's device.
  Status AllReduce(const SlotOp& op, Algorithm algorithm, const Reduction& r,
                   const void* in, void* out, size_t count) override;
  Status ReduceScatter(const SlotOp& op, const Reduction& r, const void* in,
                       void* out, size_t count) override;
  Status AllGather(const SlotOp& op, DType dtype, const void* in,
                   const std::vector<size_t>& counts, void* out) override;
  Status Broadcast(const SlotOp& op, int root, DType dtype, const void* in,
                   void* out, size_t count) override;

  // Joins the receive stream into XLA's, writes the output token after
  // everything, and hands back scratch memory and events once XLA's stream
  // has passed them.
  Status Finish(void* token_device, size_t token_bytes);

 private:
  struct Message {
    const SlotOp* op;
    int member;  // index in op->group
    Phase phase;
    int step;
    int piece;
    DType dtype;
    size_t count;
  };
  // Sends on XLA's stream: over the peer's slot channel, or without one as
  // a staged bridge message (gpu/staged_send.h), enqueued alike.
  Status Send(const Message& m, const void* src);
  // Receives on the receive stream, over the slot channel or staged from
  // the bridge (gpu/staged_recv.h); with `arrived`, records an event there
  // after the data has landed.
  Status Recv(const Message& m, void* dst, device::Event* arrived);
  // XLA's stream waits for an event of the receive stream.
  Status WaitFor(device::Event event);
  Status NewEvent(device::Event* event);
  Status Scratch(size_t bytes, void** data);
  Status Reduce(DType in_dtype, ReduceOp op, const void* a, DType a_dtype,
                const void* b, DType b_dtype, void* out, DType out_dtype,
                size_t count, double divisor);
  Status CopyOwn(void* dst, const void* src, size_t bytes);
  Status RingAllReduce(const SlotOp& op, const Reduction& r, const void* in,
                       void* out, size_t count);
  Status OrderedAllReduce(const SlotOp& op, const Reduction& r, const void* in,
                          void* out, size_t count);
  // Member c's segments[c] of `in` goes to member c; this member's own
  // segment, reduced over all members in island order, lands in `out`
  // (segments[me].count elements of r.out_dtype). Every member passes the
  // same segments.
  Status OrderedReduce(const SlotOp& op, const Reduction& r, const void* in,
                       const std::vector<Range>& segments, void* out);
  // AllGather without the op's name on errors; `in` may already be this
  // member's place in `out`.
  Status Gather(const SlotOp& op, DType dtype, const void* in,
                const std::vector<size_t>& counts, void* out);
  // The other member's channel when the op is one pair exchange kernel
  // (cc/device/pair_exchange.h) on XLA's stream: two GPU members with a
  // slot channel the pair exchange is enabled for. Null otherwise.
  std::shared_ptr<gpu::SlotChannel> PairChannel(const SlotOp& op);
  // Enqueues `exchange` (publish, consume and combine set) with the other
  // member on `stream`, over the workspace set up beside `channel`.
  Status Pair(const SlotOp& op, const gpu::SlotChannel& channel,
              const device::PairExchange& exchange, device::Stream stream);
  // The pair exchange that combines the peer's `count` elements of
  // r.in_dtype with ours at `mine` into `out`, in island order, publishing
  // our `count` elements at `publish`.
  Status PairReduce(const SlotOp& op, const gpu::SlotChannel& channel,
                    const Reduction& r, const void* publish, const void* mine,
                    void* out, size_t count);
  // The pair exchange that moves bytes as they are: ours at `publish` to
  // the peer (and to `publish_copy` here, unless null), the peer's into
  // `out`. Move describes it, PairMove enqueues it on XLA's stream.
  static device::PairExchange Move(const void* publish, size_t publish_bytes,
                                   void* publish_copy, void* out,
                                   size_t consume_bytes);
  Status PairMove(const SlotOp& op, const gpu::SlotChannel& channel,
                  const void* publish, size_t publish_bytes, void* publish_copy,
                  void* out, size_t consume_bytes);
  // ((x_0 op x_1) op x_2) ... over `contributions` (r.in_dtype), widened,
  // into `out` (r.out_dtype) rounded once; `partial` (count elements of the
  // accumulator) holds the sums between, needed beyond two members.
  Status ReduceInIslandOrder(const Reduction& r,
                             const std::vector<const void*>& contributions,
                             void* partial, void* out, size_t count);
  // Beyond two members, every step a pair kernel with one peer
  // (channel_halving.cc).
  using PairChannelList = std::vector<std::shared_ptr<gpu::SlotChannel>>;
  // Every other member's channel, by member, when the group takes pair
  // kernels: more than two members, each pair with a slot channel between
  // GPUs, and the pair exchange on for every kind of channel. Empty
  // otherwise.
  PairChannelList PairChannels(const SlotOp& op);
  // One pair exchange: our `publish_count` elements of `wire` at `publish`
  // to the peer; the peer's `count` combined with ours at `mine` (both of
  // `wire`) into `out` (out_dtype, divided by `divisor`), the peer's first
  // when peer_first. `out` may be `mine`.
  Status PairCombine(const SlotOp& op, const gpu::SlotChannel& channel,
                     const Reduction& r, bool peer_first, DType wire,
                     const void* publish, size_t publish_count,
                     const void* mine, void* out, DType out_dtype, size_t count,
                     double divisor);
  // Recursive halving (2^k members): leaves this member's segments[me] of
  // `in`, reduced over all members, in `out` (r.out_dtype).
  Status HalvingReduce(const SlotOp& op, const PairChannelList& channels,
                       const Reduction& r, const void* in,
                       const std::vector<Range>& segments, void* out);
  // One exchange of a round robin: the peer and what moves.
  struct RoundExchange {
    int peer;
    device::PairExchange exchange;
  };
  // A round robin's moves, in round order, none depending on another's
  // data: up to round_lanes_->size() at once, this member's k-th on lane
  // k % lanes (streams of this device forked off XLA's and joined back), so
  // an odd count's idle round costs nothing and every link of a member is
  // busy. Each lane runs its moves in round order, whatever the lane count
  // on other members, so a waiting move only ever waits for earlier rounds
  // or its own round's peer; and the lanes never exceed the moves the device
  // holds resident, so none waits for a multiprocessor. Anything but plain
  // moves runs one after another on XLA's stream.
  Status PairRounds(const SlotOp& op, const PairChannelList& channels,
                    const std::vector<RoundExchange>& exchanges);
  // The same in island order, any number of members: each round of a round
  // robin swaps raw segments with one peer, then ReduceInIslandOrder.
  Status PairwiseOrderedReduce(const SlotOp& op,
                               const PairChannelList& channels,
                               const Reduction& r, const void* in,
                               const std::vector<Range>& segments, void* out);
  // `out` holds this member's byte range `bytes[me]`; every other member's
  // lands in its own: recursive doubling (2^k members) or a round robin.
  Status DoublingGather(const SlotOp& op, const PairChannelList& channels,
                        const std::vector<Range>& bytes, void* out);
  Status PairwiseGather(const SlotOp& op, const PairChannelList& channels,
                        const std::vector<Range>& bytes, void* out);
  // The ops: ring all-reduce halving and doubling on 2^k members, else (and
  // ordered) in island order; all-gather.
  Status PairwiseAllReduce(const SlotOp& op, const PairChannelList& channels,
                           Algorithm algorithm, const Reduction& r,
                           const void* in, void* out, size_t count);
  Status PairwiseAllGather(const SlotOp& op, const PairChannelList& channels,
                           DType dtype, const void* in,
                           const std::vector<size_t>& counts, void* out);
  // Once per op, before its first slot-channel message: the receive stream
  // starts after everything XLA enqueued ahead of the op.
  Status Fork();
  // Joins the streams and retires this op's resources; idempotent.
  Status Close();

  gpu::StagingContext& context_;
  const device::Stream stream_;
  const FindChannel find_channel_;
  const Buffers buffers_;
  gpu::StreamDeviceScope scope_;
  const uint64_t piece_bytes_;
  device::Stream recv_stream_ = nullptr;
  // The device's streams for a round robin's concurrent rounds (PairRounds;
  // process-wide, never freed); empty where they run one after another on
  // XLA's stream.
  const std::vector<device::Stream>* round_lanes_ = nullptr;
  device::PinnedPool* scratch_pool_ = nullptr;
  std::vector<device::PinnedPool::Buffer> scratch_;
  std::vector<device::Event> events_;
  bool forked_ = false;
  bool closed_ = false;
};

}  // namespace hetjax::collectives
