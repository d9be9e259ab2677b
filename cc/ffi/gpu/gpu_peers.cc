#include "cc/ffi/gpu/gpu_peers.h"

#include <mutex>
#include <set>

namespace hetjax::gpu {
namespace {

std::mutex& PeersMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

std::set<int>& Peers() {
  static auto* peers = new std::set<int>();
  return *peers;
}

}  // namespace

void SetGpuPeers(const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> lock(PeersMutex());
  Peers() = std::set<int>(ranks.begin(), ranks.end());
}

bool IsGpuPeer(int rank) {
  std::lock_guard<std::mutex> lock(PeersMutex());
  return Peers().count(rank) != 0;
}

void ClearGpuPeers() {
  std::lock_guard<std::mutex> lock(PeersMutex());
  Peers().clear();
}

}  // namespace hetjax::gpu
