// What a rank believes a collective op is: kind, reduction, dtypes, logical
// shape, layout. Before any data moves, every member of a slot's group sends
// its descriptor to every other member and checks theirs, so islands that
// call a collective with different shapes or dtypes all fail at once with
// both sides named, instead of hanging on messages that never match.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "cc/ffi/collectives/group.h"
#include "cc/transport/bridge.h"

namespace hetjax::collectives {

// Values are part of the FFI contract.
enum class CollectiveKind : int64_t {
  kAllReduce = 1,
  kAllGather = 2,
  kReduceScatter = 3,
  kBroadcast = 4,
};
enum class Algorithm : int64_t { kRing = 0, kOrdered = 1, kDirect = 2 };
// Where a collective's bytes move: through host buffers and the bridge (CPU
// islands, and GPU islands staged through pinned memory), or device to
// device over GPU slot channels (channel_collective.h). Members must agree:
// the two never exchange a message with each other.
// kGpuPairKernel: the channels, except that a two-member group runs the
// whole op as one pair exchange kernel (cc/ffi/gpu/pair_workspace.h), and a
// larger one a pair kernel per step (channel_halving.cc);
// kGpuPairKernelIpcOnly: two-member groups over device-direct channels only
// (host-staged ones, and larger groups, send messages; HETJAX_GPU_PAIR_HOST=0).
enum class DataPath : int64_t {
  kHost = 0,
  kGpuChannels = 1,
  kGpuPairKernel = 2,
  kGpuPairKernelIpcOnly = 3,
};

const char* KindName(CollectiveKind kind);
const char* AlgorithmName(Algorithm algorithm);
const char* DataPathName(DataPath path);

struct OpDescriptor {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  int64_t reduce_op = -1;  // ReduceOp, or -1 when the op does not reduce
  DType wire_dtype = DType::kInvalid;  // what the reduce phase carries
  Algorithm algorithm = Algorithm::kDirect;
  int64_t root = -1;  // broadcast's root island, else -1
  int64_t slots = 1;
  DataPath path = DataPath::kHost;
  uint64_t piece_bytes = 0;  // 0: the bridge's chunk size
  TensorSpec logical;        // the caller's per-device dtype and shape

  // "all_reduce(sum) of float32[4,5] (wire float32, ring, 2 slots, host
  // buffers)"
  std::string ToString() const;
  bool operator==(const OpDescriptor& other) const;
};

// Exchanges descriptors with every other member of `group` (tags of phase
// kPhaseDescriptor for `slot`); kMismatch naming every disagreeing member.
Status AgreeOnOp(Bridge* bridge, const Group& group, uint64_t base, int slot,
                 const OpDescriptor& mine);

// The bridge's own tags sit at the top of the uint64 range (runtime.py,
// slot_channel.h, pair_workspace.h); PostAgreement's messages take this one.
inline constexpr uint64_t kLateAgreementTag = ~uint64_t{0} - 13;

// AgreeOnOp without waiting, for a data path that is only enqueued and can
// still be stopped once enqueued (the GPU pair exchange): sends this
// member's descriptor with the op's base tag and slot, posts the receives of
// the others', and calls `checked` once with what AgreeOnOp would have
// returned (a differing base tag or slot is a mismatch too), when the last
// has arrived. Every member's late agreements with another must come in the
// same order (the ops' order). `checked` runs on an engine thread (or here):
// it must not block.
void PostAgreement(Bridge* bridge, const Group& group, uint64_t base, int slot,
                   const OpDescriptor& mine,
                   std::function<void(const Status&)> checked);

}  // namespace hetjax::collectives
