// The combine kernel's launcher (gpu_combine.cu), for GpuDeviceImpl only:
// one source for CUDA and HIP, like gpu_device.cu.
#pragma once

#include "cc/device/combine.h"
#include "cc/device/device.h"

namespace hetjax::device {

// Enqueues `combine` on `stream` of the current device.
Status LaunchCombine(const Combine& combine, Stream stream);

}  // namespace hetjax::device
