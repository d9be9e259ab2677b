// The slot channels' and pair exchanges' tuning knobs, process-wide.
//
// hetjax's Python side reads them from the environment (HETJAX_* variables,
// hetjax/bridge/tuning.py, docs/environment.md) and the native module's
// start hands them over before the bridge runs; the C++ tests set them
// directly. Until then the defaults hold. Set them only while no GPU op
// runs: readers take no lock.
#pragma once

#include <cstdint>

namespace hetjax::gpu {

struct GpuTuning {
  // Messages up to this size move as one fused hand-off per side
  // (FusedMaxBytes(), slot_channel.h); 0: never fuse.
  uint64_t fused_max_bytes = uint64_t{64} << 10;
  // Two-member GPU collectives use the pair exchange (PairExchangeEnabled(),
  // pair_workspace.h): at all, and over host-staged channels. Every member
  // must have the same: it is part of the path the members agree on.
  bool pair_exchange = true;
  bool pair_exchange_over_host = true;
  // Chunk of every pair exchange, a multiple of 16 (PairChunkBytes()). Both
  // ends must agree (checked at set-up).
  uint64_t pair_chunk_bytes = uint64_t{8} << 20;
  // Pair exchanges over host segments move their bytes by copy engines
  // (PairCopiesOverHost()). Both ends must agree (checked at set-up).
  bool pair_copies_over_host = false;
};

void SetGpuTuning(const GpuTuning& tuning);
const GpuTuning& GetGpuTuning();

}  // namespace hetjax::gpu
