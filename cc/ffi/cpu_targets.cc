#include "cc/ffi/cpu_targets.h"

namespace hetjax::cpu {

std::vector<std::pair<const char*, void*>> CpuFfiTargets() {
  return {
      {"hetjax_send", reinterpret_cast<void*>(&HetjaxSendCpu)},
      {"hetjax_recv", reinterpret_cast<void*>(&HetjaxRecvCpu)},
  };
}

}  // namespace hetjax::cpu
