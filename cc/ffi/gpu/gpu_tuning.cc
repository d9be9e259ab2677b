#include "cc/ffi/gpu/gpu_tuning.h"

namespace hetjax::gpu {
namespace {

GpuTuning& Current() {
  static GpuTuning* tuning = new GpuTuning();
  return *tuning;
}

}  // namespace

void SetGpuTuning(const GpuTuning& tuning) { Current() = tuning; }

const GpuTuning& GetGpuTuning() { return Current(); }

}  // namespace hetjax::gpu
