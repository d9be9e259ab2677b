// How a collective cuts its payload and walks the ring, decided once for
// every platform: the host algorithms (algorithms.cc) and the GPU ones over
// slot channels (channel_collective.cc) both follow this schedule, so they
// agree message for message on which bytes piece k of step s means.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cc/ffi/collectives/group.h"
#include "cc/transport/status.h"

namespace hetjax::collectives {

struct Range {
  size_t begin = 0, count = 0;
};

// Part i of `count` elements split into `parts` near-equal runs.
Range Split(size_t count, int parts, int i);
// The same with every boundary at a multiple of `align` elements (the last
// part takes the rest), for device kernels whose vector path needs aligned
// runs.
Range AlignedSplit(size_t count, int parts, int i, size_t align);

// The pipelining unit: `r` cut into runs of at most chunk_bytes. Every member
// cuts the same range the same way, so piece k means the same bytes to all.
// Fails past kMaxPieces (the tag has 16 bits for the piece).
Status Pieces(Range r, size_t elem_bytes, uint64_t chunk_bytes,
              std::vector<Range>* out);

// One step of member p's ring all-reduce among n members: send segment
// `send` to the successor, receive segment `recv` from the predecessor.
// Steps 0..n-2 reduce-scatter (kPhaseReduce: the received partial is
// combined with this member's contribution and passed on at the next step);
// steps n-1..2n-3 all-gather (kPhaseDistribute: finished segments go round).
// After the reduce-scatter member p holds segment RingFinished(n, p).
struct RingStep {
  Phase phase;
  int step;  // within its phase: the tag's step field
  int send;  // segment index, 0..n-1
  int recv;
};
std::vector<RingStep> RingSteps(int n, int p);
int RingFinished(int n, int p);

// A round robin among n members, for exchanges between pairs (the GPU pair
// kernels beyond two members): every pair meets in exactly one of
// RoundRobinRounds(n) rounds, and each round pairs every member at most
// once. RoundRobinPartner gives member p's peer in `round`, or -1 when p
// sits the round out (odd n).
int RoundRobinRounds(int n);
int RoundRobinPartner(int n, int round, int p);

}  // namespace hetjax::collectives
