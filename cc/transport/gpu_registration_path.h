// How GPU memory reaches an RDMA NIC, decided once at start-up by trying
// each way in order of preference on a probe buffer:
//   dmabuf       the GPU exports the memory as a dma-buf fd and the NIC
//                registers that (ibv_reg_dmabuf_mr); upstream kernels.
//   peer_memory  the NIC registers the device pointer itself (ibv_reg_mr),
//                which works only with a peer-memory driver (nvidia-peermem).
//   host_staging copies through pinned host memory; always works.
// The steps are callbacks, so the ordering is tested without a GPU or NIC
// (tests/gpu_registration_path_test.cc); verbs_gpu_registration.h supplies
// the real ones.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cc/transport/status.h"

namespace hetjax {

inline constexpr const char* kGpuPathDmabuf = "dmabuf";
inline constexpr const char* kGpuPathPeerMemory = "peer_memory";
inline constexpr const char* kGpuPathHostStaging = "host_staging";

struct GpuRegistrationSteps {
  // Exports [ptr, ptr + bytes) as a dma-buf fd. Empty: no exporter.
  std::function<Status(void* ptr, size_t bytes, int* fd)> export_dmabuf;
  // Registers a dma-buf / a device pointer with the NIC; `registration` is
  // handed back to `deregister`. Empty: no NIC.
  std::function<Status(int fd, void* ptr, size_t bytes, void** registration)>
      register_dmabuf;
  std::function<Status(void* ptr, size_t bytes, void** registration)>
      register_pointer;
  std::function<void(void* registration)> deregister;
  std::function<void(int fd)> close_fd;
};

struct GpuRegistrationReport {
  std::string path;  // kGpuPathDmabuf, kGpuPathPeerMemory or ..HostStaging
  // Each path tried before the chosen one, with why it was rejected.
  std::vector<std::pair<std::string, std::string>> rejected;
};

// Registers [ptr, ptr + bytes) (GPU memory, page aligned; nullptr when there
// is none) by dmabuf, else peer_memory, and keeps the first registration
// that works in *registration (the caller deregisters it). host_staging
// when neither works: *registration is nullptr and nothing is left behind.
// The verbs transport registers its inbound rings this way.
GpuRegistrationReport RegisterByPreference(const GpuRegistrationSteps& steps,
                                           void* ptr, size_t bytes,
                                           void** registration);

// The start-up probe: RegisterByPreference on `probe`, then released.
GpuRegistrationReport ChooseGpuRegistrationPath(
    const GpuRegistrationSteps& steps, void* probe, size_t bytes);

}  // namespace hetjax
