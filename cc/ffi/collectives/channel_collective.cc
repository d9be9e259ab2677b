#include "cc/ffi/collectives/channel_collective.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cc/ffi/collectives/collective_tuning.h"
#include "cc/ffi/collectives/device_combine.h"
#include "cc/ffi/collectives/element_offset.h"
#include "cc/ffi/collectives/transfers.h"
#include "cc/ffi/gpu/staged_recv.h"
#include "cc/ffi/gpu/staged_send.h"

namespace hetjax::collectives {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
// PlanChunks cuts a message into at most 8 (host) or 2 (ipc) chunks until a
// chunk would exceed a slot (8 MiB host, 32 MiB ipc): up to 64 MiB a piece
// never needs more chunks than the ring's 8 slots.
constexpr uint64_t kMaxPieceBytes = 64 * kMiB;
// Released scratch kept per device for the next op (the partial sums and
// received pieces of a 256 MiB all-reduce are about 128 MiB).
constexpr size_t kCachedScratchBytes = size_t{2} << 30;

// Process-wide per device: the receive stream, the round lanes and the
// scratch pool.
struct DeviceState {
  device::Stream recv_stream = nullptr;
  std::vector<device::Stream> round_lanes;
  std::unique_ptr<device::PinnedPool> scratch;
};

// As many lanes as the device holds pair exchanges at once, within the cap
// and CollectiveTuning::round_lanes; none for one. By default as many as the
// device holds: on four H100s, three one-GPU islands' all-reduce went from
// 125-130 to 192-194 GB/s at 256 MiB with two lanes, and four islands were
// unchanged (docs/collectives_measured.md, "Round lanes").
Status CreateRoundLanes(device::Device& device, int ordinal,
                        std::vector<device::Stream>* lanes) {
  int resident = 1;
  Status status = device.ConcurrentPairMoves(&resident);
  if (!status.ok()) return status;
  const int asked = GetCollectiveTuning().round_lanes;
  const int wanted =
      std::min<int>({resident, kMaxRoundLanes, asked > 0 ? asked : resident});
  for (int lane = 0; wanted > 1 && lane < wanted; ++lane) {
    device::Stream stream = nullptr;
    status = device.CreateStream(&stream);
    if (!status.ok()) return status;
    lanes->push_back(stream);
  }
  // Whoever asked for a number learns what it gave (the GPU test asserts
  // it): the lanes are capped by the moves the device holds at once.
  if (asked > 0) {
    std::fprintf(stderr,
                 "hetjax gpu device %d: %d round lanes "
                 "(HETJAX_GPU_ROUND_LANES=%d, %d pair moves resident, cap "
                 "%d)\n",
                 ordinal, std::max(wanted, 1), asked, resident, kMaxRoundLanes);
  }
  return Status::Ok();
}

Status StateOf(device::Device& device, int ordinal, DeviceState** out) {
  static std::mutex* mu = new std::mutex();
  // Never destroyed: streams and device memory must not be freed after the
  // GPU runtime shut down at exit.
  // By device layer too: a GPU process may also run a CPU handler's op on
  // the host device, whose ordinal 0 is not its GPU 0.
  static auto* states =
      new std::map<std::pair<const device::Device*, int>, DeviceState>();
  std::lock_guard<std::mutex> lock(*mu);
  DeviceState& state = (*states)[{&device, ordinal}];
  if (state.scratch == nullptr) {
    // The caller made `ordinal` current (StreamDeviceScope).
    Status status = device.CreateStream(&state.recv_stream);
    // Round robins of pair kernels are the GPU's alone (PairChannels).
    if (status.ok() && &device != &device::HostDevice()) {
      status = CreateRoundLanes(device, ordinal, &state.round_lanes);
    }
    if (!status.ok()) return status;
    state.scratch = std::make_unique<device::PinnedPool>(
        device, kCachedScratchBytes, device::PinnedPool::Memory::kDevice);
  }
  *out = &state;
  return Status::Ok();
}

Status Failed(const Status& status, const SlotOp& op, const char* what) {
  if (status.ok()) return status;
  return Status(status.code(), std::string("gpu ") + what + " slot " +
                                   std::to_string(op.slot) + ": " +
                                   status.message());
}

}  // namespace

uint64_t GpuPieceBytes() {
  return std::clamp<uint64_t>(GetCollectiveTuning().piece_bytes, 4096,
                              kMaxPieceBytes);
}

ChannelCollective::ChannelCollective(gpu::StagingContext& context,
                                     device::Stream stream,
                                     FindChannel find_channel, Buffers buffers)
    : context_(context),
      stream_(stream),
      find_channel_(std::move(find_channel)),
      buffers_(buffers),
      scope_(context.device, stream),
      piece_bytes_(GpuPieceBytes()) {}

ChannelCollective::~ChannelCollective() { (void)Close(); }

Status ChannelCollective::Begin() {
  context_.retired.Poll();
  if (Status earlier = context_.errors.Take(); !earlier.ok()) return earlier;
  if (!scope_.status().ok()) return scope_.status();
  DeviceState* state = nullptr;
  Status s = StateOf(context_.device, scope_.ordinal(), &state);
  if (!s.ok()) return gpu::WithContext(s, "gpu collective: receive stream");
  recv_stream_ = state->recv_stream;
  round_lanes_ = &state->round_lanes;
  scratch_pool_ = state->scratch.get();
  return Status::Ok();
}

Status ChannelCollective::Fork() {
  if (forked_) return Status::Ok();
  // Receives write XLA's result buffer and our scratch: not before the work
  // XLA enqueued ahead of this op (which may still use that memory).
  device::Event fork = nullptr;
  Status s = NewEvent(&fork);
  if (s.ok()) s = context_.device.RecordEvent(fork, stream_);
  if (s.ok()) s = context_.device.StreamWaitEvent(recv_stream_, fork);
  forked_ = s.ok();
  return gpu::WithContext(s, "gpu collective: fork the receive stream");
}

Status ChannelCollective::NewEvent(device::Event* event) {
  Status s = context_.events.Acquire(scope_.ordinal(), event);
  if (s.ok()) events_.push_back(*event);
  return s;
}

Status ChannelCollective::Scratch(size_t bytes, void** data) {
  device::PinnedPool::Buffer buffer;
  Status s = scratch_pool_->Acquire(bytes, &buffer);
  if (!s.ok()) {
    return gpu::WithContext(
        s, "gpu collective: " + std::to_string(bytes) + " bytes of scratch");
  }
  scratch_.push_back(buffer);
  *data = buffer.data;
  return Status::Ok();
}

Status ChannelCollective::Send(const Message& m, const void* src) {
  const int peer = m.op->group.ranks[m.member];
  const uint64_t tag =
      MessageTag(m.op->base, m.op->slot, m.phase, m.step, m.piece);
  std::shared_ptr<gpu::SlotChannel> channel = find_channel_(peer);
  if (channel == nullptr && buffers_ == Buffers::kHost) {
    return m.op->bridge->Send(peer, tag, FlatSpec(m.dtype, m.count), src);
  }
  if (channel == nullptr) {
    return gpu::StagedSend(context_, *m.op->bridge, stream_, peer, tag,
                           FlatSpec(m.dtype, m.count), src);
  }
  return channel->Send(context_, *m.op->bridge, stream_, tag,
                       FlatSpec(m.dtype, m.count), src);
}

Status ChannelCollective::Recv(const Message& m, void* dst,
                               device::Event* arrived) {
  const int peer = m.op->group.ranks[m.member];
  const uint64_t tag =
      MessageTag(m.op->base, m.op->slot, m.phase, m.step, m.piece);
  std::shared_ptr<gpu::SlotChannel> channel = find_channel_(peer);
  const TensorSpec spec = FlatSpec(m.dtype, m.count);
  Status s;
  if (channel != nullptr) {
    s = channel->Recv(context_, *m.op->bridge, recv_stream_, tag, spec, dst);
  } else if (buffers_ == Buffers::kHost) {
    s = m.op->bridge->Recv(peer, tag, spec, dst);
  } else {
    s = gpu::StagedRecv(context_, *m.op->bridge, recv_stream_, peer, tag, spec,
                        dst);
  }
  if (s.ok() && arrived != nullptr) s = NewEvent(arrived);
  if (s.ok() && arrived != nullptr) {
    s = context_.device.RecordEvent(*arrived, recv_stream_);
  }
  return s;
}

Status ChannelCollective::WaitFor(device::Event event) {
  return context_.device.StreamWaitEvent(stream_, event);
}

Status ChannelCollective::Reduce(DType in_dtype, ReduceOp op, const void* a,
                                 DType a_dtype, const void* b, DType b_dtype,
                                 void* out, DType out_dtype, size_t count,
                                 double divisor) {
  return CombineAsync(context_.device, stream_, in_dtype, op, {a, a_dtype},
                      {b, b_dtype}, out, out_dtype, count, divisor);
}

Status ChannelCollective::CopyOwn(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  return context_.device.CopyDeviceAsync(dst, src, bytes, stream_);
}

Status ChannelCollective::AllReduce(const SlotOp& op, Algorithm algorithm,
                                    const Reduction& r, const void* in,
                                    void* out, size_t count) {
  if (op.group.size() == 1 || count == 0) {
    // Nothing crosses the bridge; still widen, divide and round like the rest.
    return Failed(Reduce(r.in_dtype, r.op, in, r.in_dtype, nullptr,
                         DType::kInvalid, out, r.out_dtype, count, r.divisor),
                  op, "all_reduce");
  }
  if (auto channel = PairChannel(op)) {
    // Two members: both algorithms give x_0 op x_1, rounded once.
    return Failed(PairReduce(op, *channel, r, in, in, out, count), op,
                  "pair all_reduce");
  }
  if (PairChannelList channels = PairChannels(op); !channels.empty()) {
    return Failed(PairwiseAllReduce(op, channels, algorithm, r, in, out, count),
                  op, "pairwise all_reduce");
  }
  if (Status forked = Fork(); !forked.ok()) return forked;
  if (algorithm == Algorithm::kOrdered) {
    return Failed(OrderedAllReduce(op, r, in, out, count), op,
                  "ordered all_reduce");
  }
  return Failed(RingAllReduce(op, r, in, out, count), op, "ring all_reduce");
}

Status ChannelCollective::RingAllReduce(const SlotOp& op, const Reduction& r,
                                        const void* in, void* out,
                                        size_t count) {
  const Group& g = op.group;
  const int n = g.size(), p = g.me;
  const int prev = (p + n - 1) % n, next = (p + 1) % n;
  const DType acc = AccumulatorDType(r.in_dtype);
  // Step 0 carries a member's own contribution, exact in its own dtype;
  // later steps carry partial sums in the accumulator's.
  auto wire = [&](int s) { return s == 0 ? r.in_dtype : acc; };
  const std::vector<RingStep> steps = RingSteps(n, p);
  const RingStep* reduce = steps.data();
  const RingStep* gather = steps.data() + (n - 1);
  // Pieces are cut by the accumulator's size, as the host ring does.
  std::vector<std::vector<Range>> pieces(n);
  for (int c = 0; c < n; ++c) {
    Status s =
        Pieces(Split(count, n, c), DTypeSize(acc), piece_bytes_, &pieces[c]);
    if (!s.ok()) return s;
  }
  // Received pieces of each reduce-scatter step; partial sums (more than
  // two members) where the whole payload's element index says.
  std::vector<void*> received(n - 1, nullptr);
  for (int s = 0; s < n - 1; ++s) {
    const size_t elements = Split(count, n, reduce[s].recv).count;
    if (elements == 0) continue;
    Status st = Scratch(elements * DTypeSize(wire(s)), &received[s]);
    if (!st.ok()) return st;
  }
  void* partial = nullptr;
  if (n > 2) {
    Status st = Scratch(count * DTypeSize(acc), &partial);
    if (!st.ok()) return st;
  }
  for (int s = 0; s < n - 1; ++s) {
    const std::vector<Range>& out_pieces = pieces[reduce[s].send];
    const std::vector<Range>& in_pieces = pieces[reduce[s].recv];
    const Range whole = Split(count, n, reduce[s].recv);
    const bool last = s == n - 2;
    for (size_t k = 0; k < std::max(out_pieces.size(), in_pieces.size()); ++k) {
      if (k < out_pieces.size()) {
        const Range piece = out_pieces[k];
        const void* src = s == 0
                              ? Offset(in, piece.begin, r.in_dtype)
                              : Offset<const void>(partial, piece.begin, acc);
        Status st = Send(
            {&op, next, kPhaseReduce, s, int(k), wire(s), piece.count}, src);
        if (!st.ok()) return st;
      }
      if (k >= in_pieces.size()) continue;
      const Range piece = in_pieces[k];
      void* got = Offset(received[s], piece.begin - whole.begin, wire(s));
      device::Event arrived = nullptr;
      Status st =
          Recv({&op, prev, kPhaseReduce, s, int(k), wire(s), piece.count}, got,
               &arrived);
      if (st.ok()) st = WaitFor(arrived);
      if (!st.ok()) return st;
      const void* own = Offset(in, piece.begin, r.in_dtype);
      // Step 0 combines two raw contributions: in island order, so that two
      // members give exactly the ordered (deterministic) result. Later
      // steps add the partial to this member's value, as the host ring.
      const bool got_first = s == 0 && prev < p;
      const void* a = got_first ? got : own;
      const void* b = got_first ? own : got;
      const DType a_dtype = got_first ? wire(s) : r.in_dtype;
      const DType b_dtype = got_first ? r.in_dtype : wire(s);
      void* dst = last ? Offset(out, piece.begin, r.out_dtype)
                       : Offset(partial, piece.begin, acc);
      st =
          Reduce(r.in_dtype, r.op, a, a_dtype, b, b_dtype, dst,
                 last ? r.out_dtype : acc, piece.count, last ? r.divisor : 1.0);
      if (!st.ok()) return st;
    }
  }
  // All-gather: finished segments go round, received straight into `out`.
  std::vector<std::vector<device::Event>> forwarded(n - 1);
  for (int s = 0; s < n - 1; ++s) {
    const std::vector<Range>& out_pieces = pieces[gather[s].send];
    const std::vector<Range>& in_pieces = pieces[gather[s].recv];
    for (size_t k = 0; k < std::max(out_pieces.size(), in_pieces.size()); ++k) {
      if (k < out_pieces.size()) {
        const Range piece = out_pieces[k];
        // Step 0 sends what this stream reduced; later steps forward what
        // the receive stream got at the step before.
        Status st = s == 0 ? Status::Ok() : WaitFor(forwarded[s - 1][k]);
        if (st.ok()) {
          st = Send({&op, next, kPhaseDistribute, s, int(k), r.out_dtype,
                     piece.count},
                    Offset<const void>(out, piece.begin, r.out_dtype));
        }
        if (!st.ok()) return st;
      }
      if (k >= in_pieces.size()) continue;
      const Range piece = in_pieces[k];
      device::Event arrived = nullptr;
      Status st = Recv(
          {&op, prev, kPhaseDistribute, s, int(k), r.out_dtype, piece.count},
          Offset(out, piece.begin, r.out_dtype),
          s < n - 2 ? &arrived : nullptr);
      if (!st.ok()) return st;
      forwarded[s].push_back(arrived);
    }
  }
  return Status::Ok();
}

Status ChannelCollective::ReduceScatter(const SlotOp& op, const Reduction& r,
                                        const void* in, void* out,
                                        size_t count) {
  if (auto channel = PairChannel(op)) {
    const int peer = 1 - op.group.me;
    return Failed(
        PairReduce(op, *channel, r, Offset(in, count * peer, r.in_dtype),
                   Offset(in, count * op.group.me, r.in_dtype), out, count),
        op, "pair reduce_scatter");
  }
  std::vector<Range> blocks;
  for (int c = 0; c < op.group.size(); ++c)
    blocks.push_back({count * c, count});
  if (PairChannelList channels = PairChannels(op); !channels.empty()) {
    return Failed(PairwiseOrderedReduce(op, channels, r, in, blocks, out), op,
                  "pairwise reduce_scatter");
  }
  if (Status forked = Fork(); !forked.ok()) return forked;
  return Failed(OrderedReduce(op, r, in, blocks, out), op, "reduce_scatter");
}

Status ChannelCollective::OrderedAllReduce(const SlotOp& op, const Reduction& r,
                                           const void* in, void* out,
                                           size_t count) {
  const int n = op.group.size();
  std::vector<Range> segments;
  std::vector<size_t> counts;
  for (int c = 0; c < n; ++c) {
    segments.push_back(Split(count, n, c));
    counts.push_back(segments.back().count);
  }
  // My finished segment is reduced in its place in `out` and sent from
  // there, so the gather has nothing of its own to copy.
  void* mine = Offset(out, segments[op.group.me].begin, r.out_dtype);
  Status st = OrderedReduce(op, r, in, segments, mine);
  if (st.ok()) st = Gather(op, r.out_dtype, mine, counts, out);
  return st;
}

Status ChannelCollective::OrderedReduce(const SlotOp& op, const Reduction& r,
                                        const void* in,
                                        const std::vector<Range>& segments,
                                        void* out) {
  const Group& g = op.group;
  const int n = g.size();
  const DType acc = AccumulatorDType(r.in_dtype);
  const Range mine = segments[g.me];
  // Cut by the accumulator's size, as the host algorithms cut, so that a
  // piece's partial sums fit a piece too.
  std::vector<std::vector<Range>> pieces(n);
  size_t most = 0;
  for (int c = 0; c < n; ++c) {
    Status st = Pieces(segments[c], DTypeSize(acc), piece_bytes_, &pieces[c]);
    if (!st.ok()) return st;
    most = std::max(most, pieces[c].size());
  }
  // Every other member's raw contribution to my segment, by member.
  std::vector<void*> raw(n, nullptr);
  for (int q = 0; q < n && mine.count > 0; ++q) {
    if (q == g.me) continue;
    Status st = Scratch(mine.count * DTypeSize(r.in_dtype), &raw[q]);
    if (!st.ok()) return st;
  }
  void* partial = nullptr;
  if (n > 2 && mine.count > 0) {
    Status st = Scratch(mine.count * DTypeSize(acc), &partial);
    if (!st.ok()) return st;
  }
  auto contribution = [&](int q, const Range& piece) -> const void* {
    return q == g.me ? Offset(in, piece.begin, r.in_dtype)
                     : Offset<const void>(raw[q], piece.begin - mine.begin,
                                          r.in_dtype);
  };
  // Segments may differ by an element, so by a piece: a member sends the
  // pieces others still need after its own are done.
  for (size_t k = 0; k < most; ++k) {
    for (int c = 0; c < n; ++c) {
      if (c == g.me || k >= pieces[c].size()) continue;
      const Range piece = pieces[c][k];
      Status st =
          Send({&op, c, kPhaseReduce, 0, int(k), r.in_dtype, piece.count},
               Offset(in, piece.begin, r.in_dtype));
      if (!st.ok()) return st;
    }
    if (k >= pieces[g.me].size()) continue;
    const Range piece = pieces[g.me][k];
    const size_t at = piece.begin - mine.begin;
    for (int q = 0; q < n; ++q) {
      if (q == g.me) continue;
      device::Event arrived = nullptr;
      Status st =
          Recv({&op, q, kPhaseReduce, 0, int(k), r.in_dtype, piece.count},
               Offset(raw[q], at, r.in_dtype), &arrived);
      if (st.ok()) st = WaitFor(arrived);
      if (!st.ok()) return st;
    }
    std::vector<const void*> contributions;
    for (int q = 0; q < n; ++q) contributions.push_back(contribution(q, piece));
    Status st = ReduceInIslandOrder(r, contributions,
                                    n > 2 ? Offset(partial, at, acc) : nullptr,
                                    Offset(out, at, r.out_dtype), piece.count);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status ChannelCollective::ReduceInIslandOrder(
    const Reduction& r, const std::vector<const void*>& contributions,
    void* partial, void* out, size_t count) {
  // ((x_0 op x_1) op x_2) ..., in the accumulator, rounded once at the end.
  const int n = static_cast<int>(contributions.size());
  const DType acc = AccumulatorDType(r.in_dtype);
  const void* a = contributions[0];
  DType a_dtype = r.in_dtype;
  Status st;
  for (int q = 1; q < n && st.ok(); ++q) {
    const bool last = q == n - 1;
    void* dst = last ? out : partial;
    st = Reduce(r.in_dtype, r.op, a, a_dtype, contributions[q], r.in_dtype, dst,
                last ? r.out_dtype : acc, count, last ? r.divisor : 1.0);
    a = dst;
    a_dtype = acc;
  }
  if (n == 1 && st.ok()) {
    st = Reduce(r.in_dtype, r.op, a, a_dtype, nullptr, DType::kInvalid, out,
                r.out_dtype, count, r.divisor);
  }
  return st;
}

Status ChannelCollective::AllGather(const SlotOp& op, DType dtype,
                                    const void* in,
                                    const std::vector<size_t>& counts,
                                    void* out) {
  if (PairChannelList channels = PairChannels(op); !channels.empty()) {
    return Failed(PairwiseAllGather(op, channels, dtype, in, counts, out), op,
                  "pairwise all_gather");
  }
  return Failed(Gather(op, dtype, in, counts, out), op, "all_gather");
}

Status ChannelCollective::Gather(const SlotOp& op, DType dtype, const void* in,
                                 const std::vector<size_t>& counts, void* out) {
  const Group& g = op.group;
  const int n = g.size();
  std::vector<size_t> offsets(n + 1, 0);
  for (int q = 0; q < n; ++q) offsets[q + 1] = offsets[q] + counts[q];
  void* own = Offset(out, offsets[g.me], dtype);
  if (auto channel = PairChannel(op)) {
    // The kernel's copier blocks store our part beside the exchange.
    const int peer = 1 - g.me;
    return PairMove(op, *channel, in, counts[g.me] * DTypeSize(dtype),
                    own == in ? nullptr : own,
                    Offset(out, offsets[peer], dtype),
                    counts[peer] * DTypeSize(dtype));
  }
  Status st = own == in ? Status::Ok()
                        : CopyOwn(own, in, counts[g.me] * DTypeSize(dtype));
  if (!st.ok()) return st;
  st = Fork();
  if (!st.ok()) return st;
  std::vector<std::vector<Range>> pieces(n);
  size_t most = 0;
  for (int q = 0; q < n; ++q) {
    st = Pieces({0, counts[q]}, DTypeSize(dtype), piece_bytes_, &pieces[q]);
    if (!st.ok()) return st;
    most = std::max(most, pieces[q].size());
  }
  for (size_t k = 0; k < most; ++k) {
    for (int q = 0; q < n && k < pieces[g.me].size(); ++q) {
      if (q == g.me) continue;
      const Range piece = pieces[g.me][k];
      st = Send({&op, q, kPhaseDistribute, 0, int(k), dtype, piece.count},
                Offset(in, piece.begin, dtype));
      if (!st.ok()) return st;
    }
    for (int q = 0; q < n; ++q) {
      if (q == g.me || k >= pieces[q].size()) continue;
      const Range piece = pieces[q][k];
      st = Recv({&op, q, kPhaseDistribute, 0, int(k), dtype, piece.count},
                Offset(out, offsets[q] + piece.begin, dtype), nullptr);
      if (!st.ok()) return st;
    }
  }
  return Status::Ok();
}

Status ChannelCollective::Broadcast(const SlotOp& op, int root, DType dtype,
                                    const void* in, void* out, size_t count) {
  const Group& g = op.group;
  const size_t bytes = count * DTypeSize(dtype);
  if (auto channel = PairChannel(op)) {
    Status st = g.me == root
                    ? PairMove(op, *channel, in, bytes, out, nullptr, 0)
                    : PairMove(op, *channel, nullptr, 0, nullptr, out, bytes);
    return Failed(st, op, "pair broadcast");
  }
  std::vector<Range> pieces;
  Status st = Fork();
  if (st.ok()) st = Pieces({0, count}, DTypeSize(dtype), piece_bytes_, &pieces);
  if (!st.ok()) return st;
  if (g.me == root) {
    st = CopyOwn(out, in, count * DTypeSize(dtype));
    for (size_t k = 0; k < pieces.size() && st.ok(); ++k) {
      for (int q = 0; q < g.size() && st.ok(); ++q) {
        if (q == root) continue;
        st = Send({&op, q, kPhaseDistribute, 0, int(k), dtype, pieces[k].count},
                  Offset(in, pieces[k].begin, dtype));
      }
    }
  } else {
    for (size_t k = 0; k < pieces.size() && st.ok(); ++k) {
      st =
          Recv({&op, root, kPhaseDistribute, 0, int(k), dtype, pieces[k].count},
               Offset(out, pieces[k].begin, dtype), nullptr);
    }
  }
  return Failed(st, op, "broadcast");
}

std::shared_ptr<gpu::SlotChannel> ChannelCollective::PairChannel(
    const SlotOp& op) {
  if (op.group.size() != 2 || &context_.device == &device::HostDevice()) {
    return nullptr;
  }
  std::shared_ptr<gpu::SlotChannel> channel =
      find_channel_(op.group.ranks[1 - op.group.me]);
  const bool fits = channel != nullptr &&
                    gpu::PairExchangeEnabled(channel->config().path) &&
                    !channel->config().local_cpu && !channel->config().peer_cpu;
  return fits ? channel : nullptr;
}

std::function<void(const Status&)> ChannelCollective::LateAgreement(
    const SlotOp& op) {
  if (PairChannel(op) == nullptr) return {};
  std::shared_ptr<gpu::PairWorkspace> workspace =
      gpu::ExistingPairWorkspace(op.group.ranks[1 - op.group.me]);
  if (workspace == nullptr) return {};
  gpu::StagingContext* context = &context_;  // process-wide, never destroyed
  return [workspace, context](const Status& agreed) {
    if (agreed.ok()) return;
    workspace->Break(agreed);
    context->errors.Record(agreed);
  };
}

Status ChannelCollective::Pair(const SlotOp& op,
                               const gpu::SlotChannel& channel,
                               const device::PairExchange& exchange,
                               device::Stream stream) {
  std::shared_ptr<gpu::PairWorkspace> workspace;
  Status s = gpu::FindPairWorkspace(context_, *op.bridge, channel.config(),
                                    stream_, &workspace);
  if (!s.ok()) return s;
  return workspace->Enqueue(context_, stream, exchange);
}

Status ChannelCollective::PairReduce(const SlotOp& op,
                                     const gpu::SlotChannel& channel,
                                     const Reduction& r, const void* publish,
                                     const void* mine, void* out,
                                     size_t count) {
  device::PairExchange x;
  Status s = DescribeCombine(r.in_dtype, r.op, {nullptr, r.in_dtype},
                             {mine, r.in_dtype}, out, r.out_dtype, count,
                             r.divisor, &x.combine);
  if (!s.ok()) return s;
  x.publish = publish;
  x.publish_bytes = x.consume_bytes = count * DTypeSize(r.in_dtype);
  x.element_bytes = static_cast<uint32_t>(DTypeSize(r.in_dtype));
  x.peer_first = op.group.me == 1;  // island order: x_0 op x_1
  return Pair(op, channel, x, stream_);
}

device::PairExchange ChannelCollective::Move(const void* publish,
                                             size_t publish_bytes,
                                             void* publish_copy, void* out,
                                             size_t consume_bytes) {
  device::PairExchange x;
  x.publish = publish;
  x.publish_bytes = publish_bytes;
  x.publish_copy = publish_copy;
  x.consume_bytes = consume_bytes;
  x.element_bytes = 1;
  x.combine.wide = x.combine.a_type = x.combine.out_type =
      device::ElementType::kU8;
  x.combine.out = out;
  return x;
}

Status ChannelCollective::PairMove(const SlotOp& op,
                                   const gpu::SlotChannel& channel,
                                   const void* publish, size_t publish_bytes,
                                   void* publish_copy, void* out,
                                   size_t consume_bytes) {
  return Pair(op, channel,
              Move(publish, publish_bytes, publish_copy, out, consume_bytes),
              stream_);
}

Status ChannelCollective::Finish(void* token_device, size_t token_bytes) {
  Status s = Close();
  if (s.ok() && token_bytes > 0) {
    s = context_.device.MemsetAsync(token_device, 0, token_bytes, stream_);
  }
  return gpu::WithContext(s, "gpu collective: finish");
}

Status ChannelCollective::Close() {
  if (closed_) return Status::Ok();
  closed_ = true;
  device::Device& dev = context_.device;
  Status s;
  // Join: XLA's stream goes on only after the last receive landed.
  if (forked_) {
    device::Event join = nullptr;
    s = NewEvent(&join);
    if (s.ok()) s = dev.RecordEvent(join, recv_stream_);
    if (s.ok()) s = dev.StreamWaitEvent(stream_, join);
  }
  // Nothing to hand back (the pair kernel's ops): no fence either.
  if (s.ok() && scratch_.empty() && events_.empty()) return s;
  device::Event fence = nullptr;
  if (s.ok()) s = context_.events.Acquire(scope_.ordinal(), &fence);
  if (s.ok()) s = dev.RecordEvent(fence, stream_);
  if (!s.ok()) {
    // Cannot fence: wait for both streams before anything is reused.
    (void)dev.SynchronizeStream(stream_);
    if (forked_) (void)dev.SynchronizeStream(recv_stream_);
    if (fence != nullptr) events_.push_back(fence);
    for (auto& buffer : scratch_) scratch_pool_->Release(buffer);
    for (device::Event e : events_)
      context_.events.Release(scope_.ordinal(), e);
    scratch_.clear();
    events_.clear();
    return s;
  }
  gpu::StagingContext& context = context_;
  device::PinnedPool* pool = scratch_pool_;
  const int ordinal = scope_.ordinal();
  context_.retired.Retire(
      fence, [&context, pool, ordinal, fence, scratch = std::move(scratch_),
              events = std::move(events_)] {
        for (const auto& buffer : scratch) pool->Release(buffer);
        for (device::Event e : events) context.events.Release(ordinal, e);
        context.events.Release(ordinal, fence);
      });
  scratch_.clear();
  events_.clear();
  return Status::Ok();
}

}  // namespace hetjax::collectives
