// GpuRegistrationPath: which way GPU memory of this process reaches the
// given RDMA device (gpu_registration_path.h), found by registering a probe
// buffer for real. The transport does not link the device layer, so the
// GPU side comes in as callbacks (cc/python wires them to GpuDevice()).
// No ibverbs types here: builds without verbs link a stub that reports
// host_staging (verbs_gpu_registration_disabled.cc).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "cc/transport/gpu_registration_path.h"
#include "cc/transport/status.h"

namespace hetjax {

// Memory that is not plain host memory: a GPU's, or (in the soft-RoCE
// guest's tests) a udmabuf. The verbs transport can also put the inbound
// ring of a queue pair there (VerbsLinkOptions::inbound_memory).
struct GpuMemoryHooks {
  // Empty members: no GPU.
  std::function<Status(size_t bytes, void** ptr)> alloc;
  std::function<void(void* ptr)> free;
  std::function<Status(void* ptr, size_t bytes, int* fd)> export_dmabuf;
  // Copies out of that memory into host memory; empty: memcpy works.
  std::function<Status(void* host_dst, const void* src, size_t bytes)>
      copy_to_host;
};

// `device_name`: "mlx5_0", "rxe0", "rxe0:1"; empty picks the first active
// port. Never fails: what cannot be had is a rejected path with its reason.
GpuRegistrationReport GpuRegistrationPath(const std::string& device_name,
                                          const GpuMemoryHooks& gpu);

namespace verbs {
class Device;
// The real steps on an opened device: ibv_reg_dmabuf_mr, ibv_reg_mr and
// ibv_dereg_mr, with the access a ring needs (local and remote write).
GpuRegistrationSteps RegistrationSteps(const std::shared_ptr<Device>& device,
                                       const GpuMemoryHooks& memory);
}  // namespace verbs

}  // namespace hetjax
