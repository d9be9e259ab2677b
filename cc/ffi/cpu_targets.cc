#include "cc/ffi/cpu_targets.h"

#include "cc/ffi/collectives/cpu_collectives.h"

namespace hetjax::cpu {

std::vector<std::pair<const char*, void*>> CpuFfiTargets() {
  std::vector<std::pair<const char*, void*>> targets = {
      {"hetjax_send", reinterpret_cast<void*>(&HetjaxSendCpu)},
      {"hetjax_recv", reinterpret_cast<void*>(&HetjaxRecvCpu)},
      {"hetjax_recv_into", reinterpret_cast<void*>(&HetjaxRecvIntoCpu)},
  };
  for (const auto& target : collectives::CpuCollectiveTargets()) {
    targets.push_back(target);
  }
  return targets;
}

}  // namespace hetjax::cpu
