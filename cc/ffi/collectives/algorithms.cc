#include "cc/ffi/collectives/algorithms.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "cc/ffi/collectives/ring_schedule.h"
#include "cc/ffi/collectives/transfers.h"

namespace hetjax::collectives {
namespace {

template <typename P>
P* Offset(P* base, size_t elements, DType dtype) {
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  return reinterpret_cast<P*>(reinterpret_cast<Byte*>(base) +
                              elements * DTypeSize(dtype));
}

uint64_t Tag(const SlotOp& op, Phase phase, int step, int piece) {
  return MessageTag(op.base, op.slot, phase, step, piece);
}

Status Failed(const Status& status, const SlotOp& op, const char* what) {
  return Status(status.code(), std::string(what) + " slot " +
                                   std::to_string(op.slot) + ": " +
                                   status.message());
}

// Member c's owned segment arrives from every member (raw, r.in_dtype) and is
// reduced in island order; each finished piece goes to `finish(k, piece,
// acc_piece)`. Shared by the ordered all-reduce and the reduce-scatter.
// `segment_of(c)` is member c's segment in `in`.
template <typename SegmentOf, typename Finish>
Status OrderedReduce(Transfers& transfers, const SlotOp& op, const Reduction& r,
                     const void* in, SegmentOf segment_of, Finish finish) {
  const Group& g = op.group;
  const int n = g.size();
  const uint64_t chunk = op.bridge->options().chunk_bytes;
  const DType acc_dtype = AccumulatorDType(r.in_dtype);
  std::vector<Range> pieces;
  // Send every other member its segment of my contribution.
  for (int c = 0; c < n; ++c) {
    if (c == g.me) continue;
    Range seg = segment_of(c);
    Status s = Pieces(seg, DTypeSize(r.in_dtype), chunk, &pieces);
    if (!s.ok()) return s;
    for (size_t k = 0; k < pieces.size(); ++k) {
      transfers.Send(g.ranks[c], Tag(op, kPhaseReduce, 0, int(k)),
                     FlatSpec(r.in_dtype, pieces[k].count),
                     Offset(in, pieces[k].begin, r.in_dtype));
    }
  }
  const Range mine = segment_of(g.me);
  Status s = Pieces(mine, DTypeSize(r.in_dtype), chunk, &pieces);
  if (!s.ok()) return s;
  // Receive the others' contributions to my segment; raw[q] is member q's,
  // laid out like my segment.
  std::vector<std::vector<char>> raw(n);
  std::vector<std::vector<size_t>> ids(n);
  for (int q = 0; q < n; ++q) {
    if (q == g.me) continue;
    raw[q].resize(mine.count * DTypeSize(r.in_dtype));
    for (size_t k = 0; k < pieces.size(); ++k) {
      ids[q].push_back(transfers.Recv(
          g.ranks[q], Tag(op, kPhaseReduce, 0, int(k)),
          FlatSpec(r.in_dtype, pieces[k].count),
          Offset(raw[q].data(), pieces[k].begin - mine.begin, r.in_dtype)));
    }
  }
  std::vector<char> acc(mine.count * DTypeSize(acc_dtype));
  for (size_t k = 0; k < pieces.size(); ++k) {
    const size_t at = pieces[k].begin - mine.begin, len = pieces[k].count;
    void* acc_piece = Offset(acc.data(), at, acc_dtype);
    for (int q = 0; q < n; ++q) {
      const void* src = Offset(in, pieces[k].begin, r.in_dtype);
      if (q != g.me) {
        Status w = transfers.Wait(ids[q][k]);
        if (!w.ok()) return w;
        src = Offset(raw[q].data(), at, r.in_dtype);
      }
      if (q == 0) {
        LoadAccumulator(r.in_dtype, src, acc_piece, len);
      } else {
        AccumulateInto(r.in_dtype, r.op, src, acc_piece, len);
      }
    }
    finish(k, pieces[k], acc_piece);
  }
  return transfers.WaitAll();
}

Status OrderedAllReduce(const SlotOp& op, const Reduction& r, const void* in,
                        void* out, size_t count) {
  const Group& g = op.group;
  const int n = g.size();
  const uint64_t chunk = op.bridge->options().chunk_bytes;
  const DType acc_dtype = AccumulatorDType(r.in_dtype);
  Transfers transfers(op.bridge);
  std::vector<Range> pieces;
  // Every other member's finished segment lands straight in `out`. Both
  // phases cut segments by in_dtype's size, so piece k is the same element
  // range in each (a narrower out_dtype only makes its messages smaller).
  for (int c = 0; c < n; ++c) {
    if (c == g.me) continue;
    Status s =
        Pieces(Split(count, n, c), DTypeSize(r.in_dtype), chunk, &pieces);
    if (!s.ok()) return s;
    for (size_t k = 0; k < pieces.size(); ++k) {
      transfers.Recv(g.ranks[c], Tag(op, kPhaseDistribute, 0, int(k)),
                     FlatSpec(r.out_dtype, pieces[k].count),
                     Offset(out, pieces[k].begin, r.out_dtype));
    }
  }
  auto finish = [&](size_t k, Range piece, const void* acc_piece) {
    void* done = Offset(out, piece.begin, r.out_dtype);
    StoreAccumulator(acc_dtype, acc_piece, r.out_dtype, done, piece.count,
                     r.divisor);
    for (int c = 0; c < n; ++c) {
      if (c == g.me) continue;
      transfers.Send(g.ranks[c], Tag(op, kPhaseDistribute, 0, int(k)),
                     FlatSpec(r.out_dtype, piece.count), done);
    }
  };
  Status s = OrderedReduce(
      transfers, op, r, in, [&](int c) { return Split(count, n, c); }, finish);
  return s.ok() ? s : Failed(s, op, "ordered all_reduce");
}

Status RingAllReduce(const SlotOp& op, const Reduction& r, const void* in,
                     void* out, size_t count) {
  const Group& g = op.group;
  const int n = g.size(), p = g.me;
  const uint64_t chunk = op.bridge->options().chunk_bytes;
  const DType acc_dtype = AccumulatorDType(r.in_dtype);
  const size_t acc_size = DTypeSize(acc_dtype);
  // Partial sums live in `out` when it has the accumulator's type.
  std::vector<char> acc_storage;
  void* acc = out;
  if (acc_dtype != r.out_dtype) {
    acc_storage.resize(count * acc_size);
    acc = acc_storage.data();
  }
  LoadAccumulator(r.in_dtype, in, acc, count);
  // Steps [0, n-1) reduce-scatter, [n-1, 2n-2) all-gather (ring_schedule.h).
  const std::vector<RingStep> steps = RingSteps(n, p);
  const RingStep* reduce = steps.data();
  const RingStep* gather = steps.data() + (n - 1);
  // Both phases cut a segment by the accumulator's element size, so piece k
  // of a segment is the same element range in both.
  std::vector<std::vector<Range>> pieces(n);
  for (int c = 0; c < n; ++c) {
    Status s = Pieces(Split(count, n, c), acc_size, chunk, &pieces[c]);
    if (!s.ok()) return s;
  }
  Transfers transfers(op.bridge);
  // Step 0 moves raw contributions, so they cross in the caller's dtype
  // (half the bytes for bfloat16/float16) and are widened on arrival; later
  // steps move float32 partial sums, which a half dtype would round. The GPU
  // channel ring does the same (channel_collective.cc).
  auto wire = [&](int s) { return s == 0 ? r.in_dtype : acc_dtype; };
  // Reduce-scatter step s: segment reduce[s].recv arrives from prev into
  // scratch.
  std::vector<std::vector<char>> scratch(n - 1);
  std::vector<std::vector<size_t>> reduce_ids(n - 1), gather_ids(n - 1);
  for (int s = 0; s < n - 1; ++s) {
    const Range whole = Split(count, n, reduce[s].recv);
    scratch[s].resize(whole.count * acc_size);
    for (size_t k = 0; k < pieces[reduce[s].recv].size(); ++k) {
      const Range piece = pieces[reduce[s].recv][k];
      reduce_ids[s].push_back(transfers.Recv(
          g.prev(), Tag(op, kPhaseReduce, s, int(k)),
          FlatSpec(wire(s), piece.count),
          Offset(scratch[s].data(), piece.begin - whole.begin, wire(s))));
    }
  }
  // All-gather step s: finished segment gather[s].recv arrives from prev
  // into out. The region may be one this rank still sends partial sums
  // from, but the finished value can only exist after the successor
  // received that send.
  for (int s = 0; s < n - 1; ++s) {
    for (size_t k = 0; k < pieces[gather[s].recv].size(); ++k) {
      const Range piece = pieces[gather[s].recv][k];
      gather_ids[s].push_back(
          transfers.Recv(g.prev(), Tag(op, kPhaseDistribute, s, int(k)),
                         FlatSpec(r.out_dtype, piece.count),
                         Offset(out, piece.begin, r.out_dtype)));
    }
  }
  // Where the accumulator has the input's type it already holds the input.
  const void* raw = acc_dtype == r.in_dtype ? acc : in;
  for (const Range& piece : pieces[reduce[0].send]) {
    const int k = int(&piece - pieces[reduce[0].send].data());
    transfers.Send(g.next(), Tag(op, kPhaseReduce, 0, k),
                   FlatSpec(wire(0), piece.count),
                   Offset(raw, piece.begin, wire(0)));
  }
  for (int s = 0; s < n - 1; ++s) {
    const Range whole = Split(count, n, reduce[s].recv);
    for (size_t k = 0; k < pieces[reduce[s].recv].size(); ++k) {
      const Range piece = pieces[reduce[s].recv][k];
      Status w = transfers.Wait(reduce_ids[s][k]);
      if (!w.ok()) return Failed(w, op, "ring all_reduce");
      void* acc_piece = Offset(acc, piece.begin, acc_dtype);
      AccumulateInto(
          wire(s), r.op,
          Offset(scratch[s].data(), piece.begin - whole.begin, wire(s)),
          acc_piece, piece.count);
      if (s < n - 2) {
        transfers.Send(g.next(), Tag(op, kPhaseReduce, s + 1, int(k)),
                       FlatSpec(acc_dtype, piece.count), acc_piece);
      } else {  // the segment is now complete here: round once, pass it on
        void* done = Offset(out, piece.begin, r.out_dtype);
        StoreAccumulator(acc_dtype, acc_piece, r.out_dtype, done, piece.count,
                         r.divisor);
        transfers.Send(g.next(), Tag(op, kPhaseDistribute, 0, int(k)),
                       FlatSpec(r.out_dtype, piece.count), done);
      }
    }
  }
  for (int s = 0; s < n - 2; ++s) {
    for (size_t k = 0; k < pieces[gather[s].recv].size(); ++k) {
      const Range piece = pieces[gather[s].recv][k];
      Status w = transfers.Wait(gather_ids[s][k]);
      if (!w.ok()) return Failed(w, op, "ring all_reduce");
      transfers.Send(
          g.next(), Tag(op, kPhaseDistribute, s + 1, int(k)),
          FlatSpec(r.out_dtype, piece.count),
          Offset(static_cast<const void*>(out), piece.begin, r.out_dtype));
    }
  }
  Status s = transfers.WaitAll();
  return s.ok() ? s : Failed(s, op, "ring all_reduce");
}

}  // namespace

Status AllReduce(const SlotOp& op, Algorithm algorithm, const Reduction& r,
                 const void* in, void* out, size_t count) {
  if (op.group.size() == 1 || count == 0) {
    // Nothing crosses the bridge; still widen, divide and round like the rest.
    std::vector<char> acc(count * DTypeSize(AccumulatorDType(r.in_dtype)));
    LoadAccumulator(r.in_dtype, in, acc.data(), count);
    StoreAccumulator(AccumulatorDType(r.in_dtype), acc.data(), r.out_dtype, out,
                     count, r.divisor);
    return Status::Ok();
  }
  if (algorithm == Algorithm::kRing)
    return RingAllReduce(op, r, in, out, count);
  return OrderedAllReduce(op, r, in, out, count);
}

Status ReduceScatter(const SlotOp& op, const Reduction& r, const void* in,
                     void* out, size_t count) {
  const DType acc_dtype = AccumulatorDType(r.in_dtype);
  Transfers transfers(op.bridge);
  Status s = OrderedReduce(
      transfers, op, r, in,
      [&](int c) { return Range{count * size_t(c), count}; },
      [&](size_t, Range piece, const void* acc_piece) {
        StoreAccumulator(
            acc_dtype, acc_piece, r.out_dtype,
            Offset(out, piece.begin - count * op.group.me, r.out_dtype),
            piece.count, r.divisor);
      });
  return s.ok() ? s : Failed(s, op, "reduce_scatter");
}

Status AllGather(const SlotOp& op, DType dtype, const void* in,
                 const std::vector<size_t>& counts, void* out) {
  const Group& g = op.group;
  const uint64_t chunk = op.bridge->options().chunk_bytes;
  std::vector<size_t> offsets(g.size() + 1, 0);
  for (int q = 0; q < g.size(); ++q) offsets[q + 1] = offsets[q] + counts[q];
  std::memcpy(Offset(out, offsets[g.me], dtype), in,
              counts[g.me] * DTypeSize(dtype));
  Transfers transfers(op.bridge);
  std::vector<Range> pieces;
  for (int q = 0; q < g.size(); ++q) {
    if (q == g.me) continue;
    Status s = Pieces({0, counts[q]}, DTypeSize(dtype), chunk, &pieces);
    if (!s.ok()) return s;
    for (size_t k = 0; k < pieces.size(); ++k) {
      transfers.Recv(g.ranks[q], Tag(op, kPhaseDistribute, 0, int(k)),
                     FlatSpec(dtype, pieces[k].count),
                     Offset(out, offsets[q] + pieces[k].begin, dtype));
    }
  }
  Status s = Pieces({0, counts[g.me]}, DTypeSize(dtype), chunk, &pieces);
  if (!s.ok()) return s;
  for (int q = 0; q < g.size(); ++q) {
    if (q == g.me) continue;
    for (size_t k = 0; k < pieces.size(); ++k) {
      transfers.Send(g.ranks[q], Tag(op, kPhaseDistribute, 0, int(k)),
                     FlatSpec(dtype, pieces[k].count),
                     Offset(in, pieces[k].begin, dtype));
    }
  }
  s = transfers.WaitAll();
  return s.ok() ? s : Failed(s, op, "all_gather");
}

Status Broadcast(const SlotOp& op, int root, DType dtype, const void* in,
                 void* out, size_t count) {
  const Group& g = op.group;
  std::vector<Range> pieces;
  Status s = Pieces({0, count}, DTypeSize(dtype),
                    op.bridge->options().chunk_bytes, &pieces);
  if (!s.ok()) return s;
  Transfers transfers(op.bridge);
  if (g.me == root) {
    std::memcpy(out, in, count * DTypeSize(dtype));
    for (int q = 0; q < g.size(); ++q) {
      if (q == root) continue;
      for (size_t k = 0; k < pieces.size(); ++k) {
        transfers.Send(g.ranks[q], Tag(op, kPhaseDistribute, 0, int(k)),
                       FlatSpec(dtype, pieces[k].count),
                       Offset(in, pieces[k].begin, dtype));
      }
    }
  } else {
    for (size_t k = 0; k < pieces.size(); ++k) {
      transfers.Recv(g.ranks[root], Tag(op, kPhaseDistribute, 0, int(k)),
                     FlatSpec(dtype, pieces[k].count),
                     Offset(out, pieces[k].begin, dtype));
    }
  }
  s = transfers.WaitAll();
  return s.ok() ? s : Failed(s, op, "broadcast");
}

namespace {

class HostSlotAlgorithms final : public SlotAlgorithms {
 public:
  DataPath path() const override { return DataPath::kHost; }
  Status AllReduce(const SlotOp& op, Algorithm algorithm, const Reduction& r,
                   const void* in, void* out, size_t count) override {
    return collectives::AllReduce(op, algorithm, r, in, out, count);
  }
  Status ReduceScatter(const SlotOp& op, const Reduction& r, const void* in,
                       void* out, size_t count) override {
    return collectives::ReduceScatter(op, r, in, out, count);
  }
  Status AllGather(const SlotOp& op, DType dtype, const void* in,
                   const std::vector<size_t>& counts, void* out) override {
    return collectives::AllGather(op, dtype, in, counts, out);
  }
  Status Broadcast(const SlotOp& op, int root, DType dtype, const void* in,
                   void* out, size_t count) override {
    return collectives::Broadcast(op, root, dtype, in, out, count);
  }
};

}  // namespace

SlotAlgorithms& HostAlgorithms() {
  static HostSlotAlgorithms* algorithms = new HostSlotAlgorithms();
  return *algorithms;
}

}  // namespace hetjax::collectives
