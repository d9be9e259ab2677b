// N bridges in one process, every pair joined by a socketpair: the members
// of a collective without launching processes. Each member runs on its own
// thread, as each rank would run in its own process.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "cc/transport/bridge.h"

namespace hetjax::collectives::testing {

// Small chunks so a few hundred elements already cross in several pieces.
inline constexpr uint64_t kTestChunkBytes = 64;

std::vector<std::unique_ptr<Bridge>> ConnectMesh(
    int world_size, uint64_t chunk_bytes = kTestChunkBytes);

// Runs fn(rank) on one thread per rank and joins them all.
void OnEveryRank(int world_size, const std::function<void(int rank)>& fn);

}  // namespace hetjax::collectives::testing
