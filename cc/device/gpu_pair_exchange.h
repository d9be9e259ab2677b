// The pair exchange kernel's launcher (gpu_pair_exchange.cu), for
// GpuDeviceImpl only: one source for CUDA and HIP, like gpu_device.cu.
#pragma once

#include "cc/device/device.h"
#include "cc/device/pair_exchange.h"

namespace hetjax::device {

// Enqueues `exchange` on `stream` of the current device.
Status LaunchPairExchange(const PairExchange& exchange, Stream stream);

// How many moves (byte-wide exchanges without own-part copies), every block
// of each, the current device holds at once (at least 1).
Status PairMovesResident(int* count);

}  // namespace hetjax::device
