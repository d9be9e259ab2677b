// Which way a collective handler runs its op, on either platform:
//   channels: the channel collectives (channel_collective.h), on the GPU of
//     a CUDA/ROCm island or on the host device of a CPU island. Taken when
//     the caller allows it (attribute gpu_path, from HETJAX_GPU_COLLECTIVES),
//     the op reduces a dtype the device kernels reduce (if it reduces),
//     every device of the layout is a process of its own, every member's
//     platform is known (channel_members.h) and at least one member is a
//     GPU process. Messages then take the slot channel between two members
//     where one exists, staged bridge messages otherwise.
//   otherwise a GPU handler stages its buffers through host memory and a
//     CPU handler runs the host algorithms (the only path between CPU
//     islands alone, whose host ring needs no device).
// Every input of the choice is the same on every member (the attributes,
// the dtype, the published platforms), so every member chooses alike; the
// members also agree on the path through the op descriptor, so a mismatch
// fails, never hangs.
#pragma once

#include <cstdint>

#include "cc/ffi/collectives/collective_call.h"

namespace hetjax::collectives {

// Whether the op runs over the channels; then `device_index` is this
// process's position in its island (it holds one device there, so the
// index operand, which lives in device memory on a GPU, need not be read).
// `reduces`: the op combines the values of its operand `x`. `on_gpu`: the
// handler is a GPU one (only for counting the other path: staged or host).
bool ChooseChannels(const CallAttrs& attrs, bool reduces,
                    const ffi::AnyBuffer& x, bool on_gpu,
                    int32_t* device_index);

// How many collective ops this process ran over the channels, staged (GPU
// handlers) and on the host algorithms (CPU handlers):
// _native.collective_paths().
struct CollectivePathCounts {
  uint64_t channels = 0;
  uint64_t staged = 0;
  uint64_t host = 0;
};
CollectivePathCounts CollectivePaths();

}  // namespace hetjax::collectives
