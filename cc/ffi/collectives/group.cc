#include "cc/ffi/collectives/group.h"

#include <numeric>

namespace hetjax::collectives {
namespace {

Status Invalid(const std::string& message) {
  return Status(StatusCode::kInvalidArgument, message);
}

}  // namespace

Status IslandLayout::Parse(const int64_t* device_ranks, size_t num_device_ranks,
                           const int64_t* island_sizes, size_t num_islands,
                           int64_t my_island, int64_t my_device,
                           IslandLayout* layout) {
  IslandLayout out;
  if (num_islands == 0) return Invalid("a group needs at least one island");
  if (static_cast<int>(num_islands) > kMaxSteps) {
    return Invalid("a group has " + std::to_string(num_islands) +
                   " islands; at most " + std::to_string(kMaxSteps) +
                   " are supported");
  }
  size_t at = 0;
  int64_t slots = 1;
  for (size_t k = 0; k < num_islands; ++k) {
    int64_t d = island_sizes[k];
    if (d <= 0 || at + d > num_device_ranks) {
      return Invalid("island " + std::to_string(k) + " claims " +
                     std::to_string(d) + " devices, but the layout lists " +
                     std::to_string(num_device_ranks) + " device ranks in all");
    }
    out.sizes_.push_back(static_cast<int>(d));
    out.ranks_.emplace_back(device_ranks + at, device_ranks + at + d);
    at += d;
    slots = std::lcm(slots, d);
    if (slots > kMaxSlots) {
      return Invalid("the lcm of the islands' device counts exceeds " +
                     std::to_string(kMaxSlots) + " slots");
    }
  }
  if (at != num_device_ranks) {
    return Invalid("island sizes add up to " + std::to_string(at) +
                   " devices, the layout lists " +
                   std::to_string(num_device_ranks));
  }
  if (my_island < 0 || my_island >= static_cast<int64_t>(num_islands)) {
    return Invalid("island index " + std::to_string(my_island) +
                   " outside the group's " + std::to_string(num_islands) +
                   " islands");
  }
  if (my_device < 0 || my_device >= out.sizes_[my_island]) {
    return Invalid("device index " + std::to_string(my_device) +
                   " outside island " + std::to_string(my_island) + "'s " +
                   std::to_string(out.sizes_[my_island]) + " devices");
  }
  out.slots_ = static_cast<int>(slots);
  out.my_island_ = static_cast<int>(my_island);
  out.my_device_ = static_cast<int>(my_device);
  *layout = std::move(out);
  return Status::Ok();
}

Group IslandLayout::GroupOf(int slot) const {
  Group group;
  group.me = my_island_;
  for (int k = 0; k < num_islands(); ++k) {
    group.ranks.push_back(ranks_[k][slot / slots_per_device(k)]);
  }
  return group;
}

std::string IslandLayout::ToString() const {
  std::string out = "islands [";
  for (int k = 0; k < num_islands(); ++k) {
    out += (k ? "], [" : "[");
    for (int j = 0; j < sizes_[k]; ++j) {
      out += (j ? "," : "") + std::to_string(ranks_[k][j]);
    }
  }
  return out + "]]";
}

Status CheckBaseTag(uint64_t base) {
  if ((base & kCollectiveTagBit) == 0 || (base & 0xffffffffu) != 0 ||
      (base >> 63) != 0) {
    return Invalid("collective base tag " + std::to_string(base) +
                   " is malformed (expected bit 62 set, bit 63 and the low "
                   "32 bits clear; build it with hetjax.collectives)");
  }
  return Status::Ok();
}

uint64_t MessageTag(uint64_t base, int slot, Phase phase, int step, int piece) {
  return base | (uint64_t(slot) << 24) | (uint64_t(phase) << 22) |
         (uint64_t(step) << 16) | uint64_t(piece);
}

}  // namespace hetjax::collectives
