#include "cc/transport/gpu_registration_path.h"

namespace hetjax {
namespace {

// Empty when the dma-buf path works (its registration in *kept), else why
// not.
std::string TryDmabuf(const GpuRegistrationSteps& steps, void* probe,
                      size_t bytes, void** kept) {
  if (!steps.export_dmabuf) return "no dma-buf exporter for this GPU build";
  if (!steps.register_dmabuf) return "no RDMA device to register with";
  int fd = -1;
  Status exported = steps.export_dmabuf(probe, bytes, &fd);
  if (!exported.ok()) return "export failed: " + exported.message();
  void* registration = nullptr;
  Status registered = steps.register_dmabuf(fd, probe, bytes, &registration);
  if (registered.ok()) *kept = registration;
  // The NIC holds its own reference to the dma-buf; our fd is done with.
  if (steps.close_fd) steps.close_fd(fd);
  if (!registered.ok())
    return "ibv_reg_dmabuf_mr failed: " + registered.message();
  return "";
}

std::string TryPeerMemory(const GpuRegistrationSteps& steps, void* probe,
                          size_t bytes, void** kept) {
  if (!steps.register_pointer) return "no RDMA device to register with";
  void* registration = nullptr;
  Status registered = steps.register_pointer(probe, bytes, &registration);
  if (!registered.ok()) {
    return "ibv_reg_mr on a device pointer failed (no peer-memory driver?): " +
           registered.message();
  }
  *kept = registration;
  return "";
}

}  // namespace

GpuRegistrationReport RegisterByPreference(const GpuRegistrationSteps& steps,
                                           void* ptr, size_t bytes,
                                           void** registration) {
  GpuRegistrationReport report;
  *registration = nullptr;
  if (ptr == nullptr) {
    const std::string why =
        "no GPU memory to register (no GPU in this build "
        "or none could be allocated)";
    report.rejected = {{kGpuPathDmabuf, why}, {kGpuPathPeerMemory, why}};
    report.path = kGpuPathHostStaging;
    return report;
  }
  std::string why = TryDmabuf(steps, ptr, bytes, registration);
  if (why.empty()) {
    report.path = kGpuPathDmabuf;
    return report;
  }
  report.rejected.emplace_back(kGpuPathDmabuf, why);
  why = TryPeerMemory(steps, ptr, bytes, registration);
  if (why.empty()) {
    report.path = kGpuPathPeerMemory;
    return report;
  }
  report.rejected.emplace_back(kGpuPathPeerMemory, why);
  report.path = kGpuPathHostStaging;
  return report;
}

GpuRegistrationReport ChooseGpuRegistrationPath(
    const GpuRegistrationSteps& steps, void* probe, size_t bytes) {
  void* registration = nullptr;
  GpuRegistrationReport report =
      RegisterByPreference(steps, probe, bytes, &registration);
  if (registration != nullptr && steps.deregister) {
    steps.deregister(registration);
  }
  return report;
}

}  // namespace hetjax
