// GpuRegistrationPath: which way GPU memory of this process reaches the
// given RDMA device (gpu_registration_path.h), found by registering a probe
// buffer for real. The transport does not link the device layer, so the
// GPU side comes in as callbacks (cc/python wires them to GpuDevice()).
// No ibverbs types here: builds without verbs link a stub that reports
// host_staging (verbs_gpu_registration_disabled.cc).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "cc/transport/gpu_registration_path.h"
#include "cc/transport/status.h"

namespace hetjax {

struct GpuMemoryHooks {
  // Empty members: no GPU.
  std::function<Status(size_t bytes, void** ptr)> alloc;
  std::function<void(void* ptr)> free;
  std::function<Status(void* ptr, size_t bytes, int* fd)> export_dmabuf;
};

// `device_name`: "mlx5_0", "rxe0", "rxe0:1"; empty picks the first active
// port. Never fails: what cannot be had is a rejected path with its reason.
GpuRegistrationReport GpuRegistrationPath(const std::string& device_name,
                                          const GpuMemoryHooks& gpu);

}  // namespace hetjax
