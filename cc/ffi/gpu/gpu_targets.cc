#include "cc/ffi/gpu/gpu_targets.h"

#include "cc/ffi/collectives/gpu_collectives.h"
#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(HetjaxSendGpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(HetjaxRecvGpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(HetjaxRecvIntoGpu);

namespace hetjax::gpu {

std::vector<std::pair<const char*, void*>> GpuFfiTargets() {
  std::vector<std::pair<const char*, void*>> targets = {
      {"hetjax_send", reinterpret_cast<void*>(&HetjaxSendGpu)},
      {"hetjax_recv", reinterpret_cast<void*>(&HetjaxRecvGpu)},
      {"hetjax_recv_into", reinterpret_cast<void*>(&HetjaxRecvIntoGpu)}};
  for (const auto& target : collectives::GpuCollectiveTargets()) {
    targets.push_back(target);
  }
  return targets;
}

}  // namespace hetjax::gpu
