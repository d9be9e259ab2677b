// The GPU handlers of this build, for cc/python to wrap into capsules and
// register under platform "CUDA" or "ROCM" (hetjax._native.flavour() says
// which). Same target names as on the CPU: the platform picks the handler.
#pragma once

#include <utility>
#include <vector>

namespace hetjax::gpu {

std::vector<std::pair<const char*, void*>> GpuFfiTargets();

}  // namespace hetjax::gpu
