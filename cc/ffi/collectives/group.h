// Who takes part in a collective, and the tags its messages carry.
//
// Islands hold different numbers of devices. A collective splits its (padded)
// buffer into `slots` equal slots, slots = lcm of the islands' device counts,
// so each device of island k owns slots/d_k consecutive slots. Each slot is
// reduced across islands by the owners of that slot, one per island: a small
// group of bridge ranks, in island order. With equal device counts every
// device owns one slot and talks only to its counterparts (device j of every
// island), so all device pairs move data in parallel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cc/transport/status.h"

namespace hetjax::collectives {

// The members of one slot's exchange, in island order.
struct Group {
  std::vector<int> ranks;  // bridge rank of each member
  int me = 0;              // my position in `ranks` (= my island index)
  int size() const { return static_cast<int>(ranks.size()); }
  int next() const { return ranks[(me + 1) % size()]; }
  int prev() const { return ranks[(me + size() - 1) % size()]; }
};

class IslandLayout {
 public:
  // `device_ranks`: flat list of every island's devices' bridge ranks, in
  // island order then device order; `island_sizes`: devices per island.
  static Status Parse(const int64_t* device_ranks, size_t num_device_ranks,
                      const int64_t* island_sizes, size_t num_islands,
                      int64_t my_island, int64_t my_device,
                      IslandLayout* layout);

  int num_islands() const { return static_cast<int>(sizes_.size()); }
  int devices(int island) const { return sizes_[island]; }
  int slots() const { return slots_; }
  int my_island() const { return my_island_; }
  // Slots owned by my device: [first_slot, first_slot + slots_per_device).
  int first_slot() const { return my_device_ * slots_per_device(my_island_); }
  int slots_per_device(int island) const { return slots_ / sizes_[island]; }
  // The owners of `slot` in every island; me = my island.
  Group GroupOf(int slot) const;
  std::string ToString() const;

 private:
  std::vector<int> sizes_;
  std::vector<std::vector<int>> ranks_;  // [island][device]
  int slots_ = 1;
  int my_island_ = 0;
  int my_device_ = 0;
};

// Tag of one message of a collective op. `base` comes from Python: bit 62
// set (collective traffic; user send/recv tags stay below it), group id and
// per-group sequence number in bits 32..61, low 32 bits zero. The low bits
// name the message within the op: slot (8 bits), phase (2), step (6),
// piece (16).
enum Phase : int {
  kPhaseDescriptor = 0,
  kPhaseReduce = 1,
  kPhaseDistribute = 2
};

inline constexpr uint64_t kCollectiveTagBit = uint64_t{1} << 62;
inline constexpr int kMaxSlots = 256, kMaxSteps = 64, kMaxPieces = 65536;

Status CheckBaseTag(uint64_t base);
uint64_t MessageTag(uint64_t base, int slot, Phase phase, int step, int piece);

}  // namespace hetjax::collectives
