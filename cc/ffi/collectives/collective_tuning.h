// The channel collectives' tuning knobs, process-wide.
//
// hetjax's Python side reads them from the environment (HETJAX_* variables,
// hetjax/bridge/tuning.py, docs/environment.md) and the native module's
// start hands them over before the bridge runs; the C++ tests set them
// directly. Until then the defaults hold. Set them only while no collective
// runs: readers take no lock.
#pragma once

#include <cstdint>

namespace hetjax::collectives {

// At most this many of a round robin's exchanges run at once.
inline constexpr int kMaxRoundLanes = 8;

struct CollectiveTuning {
  // The pipelining unit of the GPU collectives (GpuPieceBytes(),
  // channel_collective.h). Members agree on it through the op descriptor.
  uint64_t piece_bytes = uint64_t{16} << 20;
  // How many of a round robin's pair moves run at once, each on a stream of
  // its own, up to kMaxRoundLanes and what the device holds resident; 1 runs
  // them one after another on XLA's stream. 0: as many as the device holds.
  // Set (not 0), each device says on stderr what it gave.
  int round_lanes = 0;
};

void SetCollectiveTuning(const CollectiveTuning& tuning);
const CollectiveTuning& GetCollectiveTuning();

}  // namespace hetjax::collectives
