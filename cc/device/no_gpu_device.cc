// Built when the flavour is "none": there is no GPU device layer.
#include "cc/device/device.h"

namespace hetjax::device {

Device* GpuDevice() { return nullptr; }

}  // namespace hetjax::device
