// Without the verbs transport nothing registers GPU memory with a NIC.
#include "cc/transport/verbs_gpu_registration.h"

namespace hetjax {

GpuRegistrationReport GpuRegistrationPath(const std::string&,
                                          const GpuMemoryHooks& gpu) {
  GpuRegistrationSteps no_nic;  // every registrar empty
  no_nic.export_dmabuf = gpu.export_dmabuf;
  GpuRegistrationReport report = ChooseGpuRegistrationPath(no_nic, nullptr, 0);
  for (auto& [path, why] : report.rejected) {
    why = "this hetjax build has no verbs transport (libibverbs not found)";
  }
  return report;
}

}  // namespace hetjax
