#include "cc/ffi/collectives/op_descriptor.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "cc/ffi/collectives/reduce_kernels.h"
#include "cc/ffi/collectives/transfers.h"

namespace hetjax::collectives {
namespace {

constexpr int64_t kMagic = 0x6865746a6178;  // "hetjax"
constexpr int kWords = 10 + kMaxRank;
using Words = std::array<int64_t, kWords>;

Words Encode(const OpDescriptor& d) {
  Words w{};
  w[0] = kMagic;
  w[1] = static_cast<int64_t>(d.kind);
  w[2] = d.reduce_op;
  w[3] = static_cast<int64_t>(d.wire_dtype);
  w[4] = static_cast<int64_t>(d.algorithm);
  w[5] = d.root;
  w[6] = d.slots;
  w[7] = (static_cast<int64_t>(d.logical.dtype) << 8) | d.logical.rank;
  w[8] = static_cast<int64_t>(d.path);
  w[9] = static_cast<int64_t>(d.piece_bytes);
  for (int i = 0; i < kMaxRank; ++i) w[10 + i] = d.logical.dims[i];
  return w;
}

OpDescriptor Decode(const Words& w) {
  OpDescriptor d;
  d.kind = static_cast<CollectiveKind>(w[1]);
  d.reduce_op = w[2];
  d.wire_dtype = static_cast<DType>(w[3]);
  d.algorithm = static_cast<Algorithm>(w[4]);
  d.root = w[5];
  d.slots = w[6];
  d.logical.dtype = static_cast<DType>(w[7] >> 8);
  d.logical.rank = static_cast<int32_t>(w[7] & 0xff);
  d.path = static_cast<DataPath>(w[8]);
  d.piece_bytes = static_cast<uint64_t>(w[9]);
  for (int i = 0; i < kMaxRank; ++i) d.logical.dims[i] = w[10 + i];
  return d;
}

}  // namespace

const char* KindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kBroadcast:
      return "broadcast";
  }
  return "unknown collective";
}

const char* AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kOrdered:
      return "ordered";
    case Algorithm::kDirect:
      return "direct";
  }
  return "unknown algorithm";
}

const char* DataPathName(DataPath path) {
  switch (path) {
    case DataPath::kHost:
      return "host buffers";
    case DataPath::kGpuChannels:
      return "gpu channels";
    case DataPath::kGpuPairKernel:
      return "gpu channels, pair kernel";
    case DataPath::kGpuPairKernelIpcOnly:
      return "gpu channels, pair kernel over ipc only";
  }
  return "unknown data path";
}

std::string OpDescriptor::ToString() const {
  std::string out = KindName(kind);
  if (reduce_op >= 0) {
    out +=
        std::string("(") + ReduceOpName(static_cast<ReduceOp>(reduce_op)) + ")";
  }
  if (root >= 0) out += "(root island " + std::to_string(root) + ")";
  out += " of " + logical.ToString() + " (wire " + DTypeName(wire_dtype) +
         ", " + AlgorithmName(algorithm) + ", " + std::to_string(slots) +
         " slots, " + DataPathName(path) +
         (piece_bytes ? ", pieces of " + std::to_string(piece_bytes) + " bytes"
                      : std::string()) +
         ")";
  return out;
}

bool OpDescriptor::operator==(const OpDescriptor& other) const {
  return Encode(*this) == Encode(other);
}

namespace {

// Ok, or the kMismatch naming every member whose descriptor differs from
// `mine` (got[q] for member q; got[me] is ignored).
Status Compare(const Group& group, uint64_t base, int slot,
               const OpDescriptor& mine, const std::vector<Words>& got) {
  const int n = group.size();
  std::string disagreements;
  for (int q = 0; q < n; ++q) {
    if (q == group.me) continue;
    if (got[q][0] != kMagic) {
      disagreements += "; island " + std::to_string(q) + " (bridge rank " +
                       std::to_string(group.ranks[q]) +
                       ") sent no collective descriptor";
    } else if (!(Decode(got[q]) == mine)) {
      disagreements += "; island " + std::to_string(q) + " (bridge rank " +
                       std::to_string(group.ranks[q]) + ") called " +
                       Decode(got[q]).ToString();
    }
  }
  if (disagreements.empty()) return Status::Ok();
  return Status(StatusCode::kMismatch,
                "islands disagree on collective tag " + std::to_string(base) +
                    " slot " + std::to_string(slot) + ": island " +
                    std::to_string(group.me) + " (this rank, bridge rank " +
                    std::to_string(group.ranks[group.me]) + ") called " +
                    mine.ToString() + disagreements);
}

}  // namespace

Status AgreeOnOp(Bridge* bridge, const Group& group, uint64_t base, int slot,
                 const OpDescriptor& mine) {
  const int n = group.size();
  if (n == 1) return Status::Ok();
  const Words sent = Encode(mine);
  std::vector<Words> got(n);
  const uint64_t tag = MessageTag(base, slot, kPhaseDescriptor, 0, 0);
  const TensorSpec spec = FlatSpec(DType::kS64, kWords);
  Status status;
  {
    Transfers transfers(bridge);
    std::vector<size_t> ids(n);
    for (int q = 0; q < n; ++q) {
      if (q == group.me) continue;
      transfers.Send(group.ranks[q], tag, spec, sent.data());
      ids[q] = transfers.Recv(group.ranks[q], tag, spec, got[q].data());
    }
    status = transfers.WaitAll();
  }
  if (!status.ok()) {
    return Status(status.code(), "while agreeing on " + mine.ToString() +
                                     " (slot " + std::to_string(slot) +
                                     "): " + status.message());
  }
  return Compare(group, base, slot, mine, got);
}

void PostAgreement(Bridge* bridge, const Group& group, uint64_t base, int slot,
                   const OpDescriptor& mine,
                   std::function<void(const Status&)> checked) {
  const int n = group.size();
  if (n == 1) {
    checked(Status::Ok());
    return;
  }
  // The descriptor, then the op's base tag and slot: the message itself goes
  // under kLateAgreementTag, so an op whose tag differs is found (a
  // mismatch), not left waiting for a message that never comes.
  using LateWords = std::array<int64_t, kWords + 2>;
  struct State {
    std::vector<LateWords> got;
    std::atomic<int> left;
    std::mutex mu;
    Status failed;
  };
  auto state = std::make_shared<State>();
  state->got.resize(n);
  state->left.store(n - 1);
  LateWords sent{};
  const Words encoded = Encode(mine);
  std::copy(encoded.begin(), encoded.end(), sent.begin());
  sent[kWords] = static_cast<int64_t>(base);
  sent[kWords + 1] = slot;
  const TensorSpec spec = FlatSpec(DType::kS64, kWords + 2);
  auto finish = [state, group, base, slot, mine, checked] {
    Status result;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      result = state->failed;
    }
    std::vector<Words> got(state->got.size());
    std::string elsewhere;
    for (int q = 0; q < group.size() && result.ok(); ++q) {
      if (q == group.me) continue;
      const LateWords& theirs = state->got[q];
      std::copy(theirs.begin(), theirs.begin() + kWords, got[q].begin());
      if (theirs[kWords] != static_cast<int64_t>(base) ||
          theirs[kWords + 1] != slot) {
        elsewhere += "; island " + std::to_string(q) + " (bridge rank " +
                     std::to_string(group.ranks[q]) + ") called " +
                     Decode(got[q]).ToString() + " as collective tag " +
                     std::to_string(static_cast<uint64_t>(theirs[kWords])) +
                     " slot " + std::to_string(theirs[kWords + 1]);
      }
    }
    if (result.ok() && !elsewhere.empty()) {
      result =
          Status(StatusCode::kMismatch,
                 "islands disagree on collective tag " + std::to_string(base) +
                     " slot " + std::to_string(slot) + ": island " +
                     std::to_string(group.me) + " (this rank) called " +
                     mine.ToString() + elsewhere);
    }
    if (result.ok()) result = Compare(group, base, slot, mine, got);
    checked(result.ok()
                ? result
                : Status(result.code(), "while agreeing on " + mine.ToString() +
                                            " (slot " + std::to_string(slot) +
                                            "): " + result.message()));
  };
  for (int q = 0; q < n; ++q) {
    if (q == group.me) continue;
    // Eager: a descriptor is copied before Send returns.
    Status s =
        bridge->Send(group.ranks[q], kLateAgreementTag, spec, sent.data());
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->failed.ok()) state->failed = s;
    }
    bridge->PostRecv(group.ranks[q], kLateAgreementTag, spec,
                     state->got[q].data(),
                     [state, finish](uint64_t, bool done, const Status& s) {
                       if (!done) return;
                       if (!s.ok()) {
                         std::lock_guard<std::mutex> lock(state->mu);
                         if (state->failed.ok()) state->failed = s;
                       }
                       if (state->left.fetch_sub(1) == 1) finish();
                     });
  }
}

}  // namespace hetjax::collectives
