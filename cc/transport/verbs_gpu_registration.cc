// The real registration steps: ibv_reg_dmabuf_mr and ibv_reg_mr on the
// opened device's protection domain, with the access a ring buffer needs.
#include "cc/transport/verbs_gpu_registration.h"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <memory>

#include "cc/transport/verbs_device.h"

namespace hetjax {
namespace {

constexpr int kAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
// One 2 MiB GPU page: aligned for dma-buf export on every GPU we run.
constexpr size_t kProbeBytes = size_t{2} << 20;

// The device name to open, or why there is none.
Status PickPort(const std::string& requested, std::string* name) {
  if (!requested.empty()) {
    *name = requested;
    return Status::Ok();
  }
  for (const verbs::PortInfo& port : verbs::ListPorts()) {
    if (port.active) {
      *name = port.device + ":" + std::to_string(port.port);
      return Status::Ok();
    }
  }
  return Status(StatusCode::kInvalidArgument,
                "no active RDMA port on this machine");
}

}  // namespace

GpuRegistrationReport GpuRegistrationPath(const std::string& device_name,
                                          const GpuMemoryHooks& gpu) {
  std::string name;
  std::shared_ptr<verbs::Device> device;
  Status opened = PickPort(device_name, &name);
  if (opened.ok()) opened = verbs::Device::Open(name, -1, &device);

  void* probe = nullptr;
  Status allocated = gpu.alloc ? gpu.alloc(kProbeBytes, &probe)
                               : Status(StatusCode::kInvalidArgument, "no GPU");
  if (!allocated.ok()) probe = nullptr;

  GpuRegistrationReport report = ChooseGpuRegistrationPath(
      verbs::RegistrationSteps(device, gpu), probe, kProbeBytes);
  if (probe != nullptr && gpu.free) gpu.free(probe);
  // Say why the steps were missing rather than the generic reason.
  for (auto& [path, why] : report.rejected) {
    if (!allocated.ok()) {
      why = "no GPU memory to register: " + allocated.message();
      if (!opened.ok()) why += "; no RDMA device: " + opened.message();
    } else if (!opened.ok() && why.rfind("no RDMA device", 0) == 0) {
      why = "no RDMA device: " + opened.message();
    }
  }
  return report;
}

namespace verbs {

GpuRegistrationSteps RegistrationSteps(const std::shared_ptr<Device>& device,
                                       const GpuMemoryHooks& memory) {
  GpuRegistrationSteps steps;
  steps.export_dmabuf = memory.export_dmabuf;
  steps.close_fd = [](int fd) { ::close(fd); };
  steps.deregister = [](void* mr) { ibv_dereg_mr(static_cast<ibv_mr*>(mr)); };
  if (!device) return steps;
  ibv_pd* pd = device->pd();
  const std::string name = device->name();
  steps.register_dmabuf = [pd, name](int fd, void* ptr, size_t bytes,
                                     void** registration) {
    ibv_mr* mr = ibv_reg_dmabuf_mr(
        pd, 0, bytes, reinterpret_cast<uint64_t>(ptr), fd, kAccess);
    if (mr == nullptr) return Errno(name + ": ibv_reg_dmabuf_mr", errno);
    *registration = mr;
    return Status::Ok();
  };
  steps.register_pointer = [pd, name](void* ptr, size_t bytes,
                                      void** registration) {
    ibv_mr* mr = ibv_reg_mr(pd, ptr, bytes, kAccess);
    if (mr == nullptr) return Errno(name + ": ibv_reg_mr", errno);
    *registration = mr;
    return Status::Ok();
  };
  return steps;
}

}  // namespace verbs
}  // namespace hetjax
