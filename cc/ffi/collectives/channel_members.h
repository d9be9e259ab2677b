// Which bridge ranks can take part in the channel collectives
// (channel_collective.h), and on which platform: the CUDA and ROCm islands'
// processes on their GPU, the CPU islands' processes on the host device.
// The control plane sets it from every rank's published record
// (hetjax/bridge/runtime.py), this process included, so every member of a
// group knows the same about every other member and chooses the same path
// (channel_choice.h). A rank of unknown platform (JAX_PLATFORMS unset) is
// in neither list.
#pragma once

#include <vector>

namespace hetjax::collectives {

enum class MemberPlatform { kUnknown, kGpu, kCpu };

// Set through _native.set_channel_members; cleared by _native.stop.
void SetChannelMembers(const std::vector<int>& gpu_ranks,
                       const std::vector<int>& cpu_ranks);
MemberPlatform PlatformOf(int rank);
void ClearChannelMembers();

}  // namespace hetjax::collectives
