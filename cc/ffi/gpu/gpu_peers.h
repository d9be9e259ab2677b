// The bridge ranks that are GPU processes (CUDA or ROCm islands) with no
// slot channel to this one (another host, a CUDA/ROCm pair,
// HETJAX_GPU_PATH=off): the links hetjax/bridge/mesh.py plans `gpu_staged`.
// The GPU collectives keep their channel path with such a peer: its
// messages go through pinned staging and the bridge, stream-ordered as GPU
// send/recv go (staged_send.h, staged_recv.h), instead of the whole op
// falling back to the host algorithms with the host thread blocked.
#pragma once

#include <vector>

namespace hetjax::gpu {

// Set by the control plane through _native.set_gpu_peers; cleared by
// _native.stop.
void SetGpuPeers(const std::vector<int>& ranks);
bool IsGpuPeer(int rank);
void ClearGpuPeers();

}  // namespace hetjax::gpu
