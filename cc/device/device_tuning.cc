#include "cc/device/device_tuning.h"

#include <algorithm>
#include <thread>

namespace hetjax::device {
namespace {

DeviceTuning& Current() {
  static DeviceTuning* tuning = new DeviceTuning();
  return *tuning;
}

}  // namespace

int DefaultHostCopyThreads() {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 1, 16);
}

void SetDeviceTuning(const DeviceTuning& tuning) { Current() = tuning; }

const DeviceTuning& GetDeviceTuning() { return Current(); }

}  // namespace hetjax::device
