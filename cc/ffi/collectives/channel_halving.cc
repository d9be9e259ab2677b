// The pair kernel beyond two members (channel_collective.h): every step of
// the op is one pair kernel with one peer on XLA's stream, so the bytes
// cross the link once as posted stores, with no per-piece host hand-offs.
//
// 2^k members, ring all-reduce: recursive halving, then doubling. Step j
// pairs member p with p ^ d (d = n/2, ..., 1 halving; 1, ..., n/2
// doubling), every member busy at every step; each sends and receives
// 2 (n-1)/n of the payload, as on the ring, in 2 log2(n) kernels. A pair
// combines its partials lower member first, so with four members every
// element is (x_0 + x_2) + (x_1 + x_3), on every member alike (each segment
// is finished once, by its owner, and copied).
//
// Otherwise (any other count, the ordered all-reduce, the reduce-scatter):
// a round robin (ring_schedule.h) swaps raw segments with one peer a round,
// and each member reduces its own segment in island order,
// ((x_0 + x_1) + x_2) + ..., rounded once: the ordered result bitwise. The
// all-gather doubles on 2^k members and goes round robin otherwise.
#include <algorithm>
#include <memory>
#include <vector>

#include "cc/ffi/collectives/channel_collective.h"
#include "cc/ffi/collectives/device_combine.h"
#include "cc/ffi/collectives/element_offset.h"

namespace hetjax::collectives {
namespace {

bool PowerOfTwo(int n) { return (n & (n - 1)) == 0; }

// Segment boundaries in elements: 16 bytes or more for every dtype.
constexpr size_t kAlignElements = 64;

// Segments [first, last) of `segments` as one run (segments are contiguous).
Range Span(const std::vector<Range>& segments, int first, int last) {
  const size_t begin = segments[first].begin;
  const Range& end = segments[last - 1];
  return {begin, end.begin + end.count - begin};
}

// What Device::ConcurrentPairMoves sized the lanes for: byte-wide moves, no
// copy-engine copies.
bool IsPlainMove(const device::PairExchange& x) {
  return x.publish_copy == nullptr &&
         x.combine.wide == device::ElementType::kU8;
}

}  // namespace

std::vector<std::shared_ptr<gpu::SlotChannel>> ChannelCollective::PairChannels(
    const SlotOp& op) {
  // Only where pair kernels are on for every kind of channel (the agreed
  // path says so): a member sees only its own channels, and with host-staged
  // ones excluded (HETJAX_GPU_PAIR_HOST=0) members whose peers differ in
  // kind could choose differently and wait on each other forever.
  const int n = op.group.size();
  if (n <= 2 || path() != DataPath::kGpuPairKernel ||
      &context_.device == &device::HostDevice()) {
    return {};
  }
  std::vector<std::shared_ptr<gpu::SlotChannel>> channels(n);
  for (int q = 0; q < n; ++q) {
    if (q == op.group.me) continue;
    channels[q] = find_channel_(op.group.ranks[q]);
    const auto& channel = channels[q];
    if (channel == nullptr || channel->config().local_cpu ||
        channel->config().peer_cpu) {
      return {};
    }
  }
  return channels;
}

Status ChannelCollective::PairCombine(const SlotOp& op,
                                      const gpu::SlotChannel& channel,
                                      const Reduction& r, bool peer_first,
                                      DType wire, const void* publish,
                                      size_t publish_count, const void* mine,
                                      void* out, DType out_dtype, size_t count,
                                      double divisor) {
  device::PairExchange x;
  Status s = DescribeCombine(r.in_dtype, r.op, {nullptr, wire}, {mine, wire},
                             out, out_dtype, count, divisor, &x.combine);
  if (!s.ok()) return s;
  x.publish = publish;
  x.publish_bytes = publish_count * DTypeSize(wire);
  x.consume_bytes = count * DTypeSize(wire);
  x.element_bytes = static_cast<uint32_t>(DTypeSize(wire));
  x.peer_first = peer_first;
  return Pair(op, channel, x, stream_);
}

Status ChannelCollective::HalvingReduce(const SlotOp& op,
                                        const PairChannelList& channels,
                                        const Reduction& r, const void* in,
                                        const std::vector<Range>& segments,
                                        void* out) {
  const int n = op.group.size(), me = op.group.me;
  const DType acc = AccumulatorDType(r.in_dtype);
  const Range all = Span(segments, 0, n);
  // Partial sums of the half kept so far, at the elements' own offsets.
  void* partial = nullptr;
  Status st = Scratch((all.begin + all.count) * DTypeSize(acc), &partial);
  if (!st.ok()) return st;
  int first = 0, last = n;  // the segments this member still reduces
  for (int d = n / 2; d >= 1; d /= 2) {
    const int peer = me ^ d, middle = first + (last - first) / 2;
    const bool upper = (me & d) != 0;
    const Range keep =
        upper ? Span(segments, middle, last) : Span(segments, first, middle);
    const Range give =
        upper ? Span(segments, first, middle) : Span(segments, middle, last);
    // The first step carries raw contributions, exact in their own dtype;
    // later ones partial sums in the accumulator's. The last rounds once.
    const bool raw = d == n / 2, done = d == 1;
    const DType wire = raw ? r.in_dtype : acc;
    const void* source = raw ? in : partial;
    st = PairCombine(op, *channels[peer], r, peer < me, wire,
                     Offset(source, give.begin, wire), give.count,
                     Offset(source, keep.begin, wire),
                     done ? out : Offset(partial, keep.begin, acc),
                     done ? r.out_dtype : acc, keep.count,
                     done ? r.divisor : 1.0);
    if (!st.ok()) return st;
    (upper ? first : last) = middle;
  }
  return Status::Ok();
}

Status ChannelCollective::DoublingGather(const SlotOp& op,
                                         const PairChannelList& channels,
                                         const std::vector<Range>& bytes,
                                         void* out) {
  const int n = op.group.size(), me = op.group.me;
  for (int d = 1; d < n; d *= 2) {
    // This member holds the d members' parts from me & ~(d - 1) on; the
    // peer the d after or before them.
    const int peer = me ^ d, mine = me & ~(d - 1), theirs = peer & ~(d - 1);
    const Range held = Span(bytes, mine, mine + d);
    const Range coming = Span(bytes, theirs, theirs + d);
    Status st = PairMove(
        op, *channels[peer], Offset(out, held.begin, DType::kU8), held.count,
        nullptr, Offset(out, coming.begin, DType::kU8), coming.count);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status ChannelCollective::PairRounds(
    const SlotOp& op, const PairChannelList& channels,
    const std::vector<RoundExchange>& exchanges) {
  // The lanes were sized for moves (Device::ConcurrentPairMoves).
  const bool moves = std::all_of(
      exchanges.begin(), exchanges.end(),
      [](const RoundExchange& e) { return IsPlainMove(e.exchange); });
  static const std::vector<device::Stream> kNoLanes;
  const std::vector<device::Stream>& streams =
      round_lanes_ != nullptr ? *round_lanes_ : kNoLanes;
  const int lanes = moves ? std::min<int>(exchanges.size(), streams.size()) : 1;
  if (lanes <= 1) {
    for (const RoundExchange& e : exchanges) {
      Status st = Pair(op, *channels[e.peer], e.exchange, stream_);
      if (!st.ok()) return st;
    }
    return Status::Ok();
  }
  device::Device& dev = context_.device;
  // The lanes start after everything XLA enqueued ahead of the op.
  device::Event fork = nullptr;
  Status st = NewEvent(&fork);
  if (st.ok()) st = dev.RecordEvent(fork, stream_);
  std::vector<bool> forked(lanes, false);
  for (size_t k = 0; k < exchanges.size() && st.ok(); ++k) {
    const int lane = static_cast<int>(k % lanes);
    if (!forked[lane]) st = dev.StreamWaitEvent(streams[lane], fork);
    forked[lane] = st.ok();
    if (st.ok()) {
      st = Pair(op, *channels[exchanges[k].peer], exchanges[k].exchange,
                streams[lane]);
    }
  }
  // XLA's stream goes on after every lane, also after a failure half-way:
  // the op's scratch is handed back behind XLA's stream alone.
  for (int lane = 0; lane < lanes; ++lane) {
    if (!forked[lane]) continue;
    device::Event join = nullptr;
    Status joined = NewEvent(&join);
    if (joined.ok()) joined = dev.RecordEvent(join, streams[lane]);
    if (joined.ok()) joined = dev.StreamWaitEvent(stream_, join);
    if (!joined.ok()) {
      (void)dev.SynchronizeStream(streams[lane]);
      if (st.ok()) st = joined;
    }
  }
  return gpu::WithContext(st, "gpu collective: concurrent rounds");
}

Status ChannelCollective::PairwiseOrderedReduce(
    const SlotOp& op, const PairChannelList& channels, const Reduction& r,
    const void* in, const std::vector<Range>& segments, void* out) {
  const int n = op.group.size(), me = op.group.me;
  const Range mine = segments[me];
  const size_t width = DTypeSize(r.in_dtype);
  std::vector<const void*> contributions(n, nullptr);
  contributions[me] = Offset(in, mine.begin, r.in_dtype);
  std::vector<RoundExchange> exchanges;
  for (int round = 0; round < RoundRobinRounds(n); ++round) {
    const int peer = RoundRobinPartner(n, round, me);
    if (peer < 0) continue;
    // Every round its own landing place: the rounds may run at once.
    void* raw = nullptr;  // nothing comes for an empty segment
    Status st =
        mine.count == 0 ? Status::Ok() : Scratch(mine.count * width, &raw);
    if (!st.ok()) return st;
    exchanges.push_back(
        {peer,
         Move(Offset(in, segments[peer].begin, r.in_dtype),
              segments[peer].count * width, nullptr, raw, mine.count * width)});
    contributions[peer] = raw;
  }
  Status st = PairRounds(op, channels, exchanges);
  if (!st.ok() || mine.count == 0) return st;
  void* partial = nullptr;
  st = Scratch(mine.count * DTypeSize(AccumulatorDType(r.in_dtype)), &partial);
  if (!st.ok()) return st;
  return ReduceInIslandOrder(r, contributions, partial, out, mine.count);
}

Status ChannelCollective::PairwiseGather(const SlotOp& op,
                                         const PairChannelList& channels,
                                         const std::vector<Range>& bytes,
                                         void* out) {
  const int n = op.group.size(), me = op.group.me;
  if (PowerOfTwo(n)) return DoublingGather(op, channels, bytes, out);
  std::vector<RoundExchange> exchanges;
  for (int round = 0; round < RoundRobinRounds(n); ++round) {
    const int peer = RoundRobinPartner(n, round, me);
    if (peer < 0) continue;
    exchanges.push_back(
        {peer, Move(Offset(out, bytes[me].begin, DType::kU8), bytes[me].count,
                    nullptr, Offset(out, bytes[peer].begin, DType::kU8),
                    bytes[peer].count)});
  }
  return PairRounds(op, channels, exchanges);
}

Status ChannelCollective::PairwiseAllReduce(const SlotOp& op,
                                            const PairChannelList& channels,
                                            Algorithm algorithm,
                                            const Reduction& r, const void* in,
                                            void* out, size_t count) {
  const int n = op.group.size();
  std::vector<Range> segments, bytes;
  for (int c = 0; c < n; ++c) {
    // Aligned, so that the kernels take their vector path: plain thirds of
    // 16 Mi floats ran three islands' all-reduce at 0.17 of XLA's. Where the
    // cuts fall does not change any element's order of additions.
    segments.push_back(AlignedSplit(count, n, c, kAlignElements));
    bytes.push_back({segments[c].begin * DTypeSize(r.out_dtype),
                     segments[c].count * DTypeSize(r.out_dtype)});
  }
  // This member's finished segment lands in its place in `out`, which the
  // gather then sends from.
  void* mine = Offset(out, segments[op.group.me].begin, r.out_dtype);
  Status st = algorithm == Algorithm::kRing && PowerOfTwo(n)
                  ? HalvingReduce(op, channels, r, in, segments, mine)
                  : PairwiseOrderedReduce(op, channels, r, in, segments, mine);
  if (st.ok()) st = PairwiseGather(op, channels, bytes, out);
  return st;
}

Status ChannelCollective::PairwiseAllGather(const SlotOp& op,
                                            const PairChannelList& channels,
                                            DType dtype, const void* in,
                                            const std::vector<size_t>& counts,
                                            void* out) {
  std::vector<Range> bytes;
  size_t at = 0;
  for (size_t c : counts) {
    bytes.push_back({at, c * DTypeSize(dtype)});
    at += bytes.back().count;
  }
  const Range own = bytes[op.group.me];
  void* place = Offset(out, own.begin, DType::kU8);
  Status st = place == in ? Status::Ok() : CopyOwn(place, in, own.count);
  if (st.ok()) st = PairwiseGather(op, channels, bytes, out);
  return st;
}

}  // namespace hetjax::collectives
