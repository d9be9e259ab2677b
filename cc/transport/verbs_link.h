// The verbs transport as the bridge sees it, free of libibverbs types so the
// bridge compiles the same with or without it: verbs_link.cc implements it
// over verbs_stream.h, verbs_link_disabled.cc for builds without libibverbs
// (CMake HETJAX_VERBS=OFF or not found; Bazel always).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cc/transport/byte_stream.h"
#include "cc/transport/status.h"
#include "cc/transport/verbs_gpu_registration.h"

namespace hetjax {

// Whether this build carries the verbs transport.
bool VerbsCompiledIn();

struct VerbsGid {
  int index = 0;
  std::string gid, type;  // "0000:...:ffff:7f00:0002", "RoCE v2"
};
struct VerbsPort {
  std::string device;
  int port = 1;
  bool active = false;
  std::string state, link_layer;
  int active_mtu = 0;
  uint16_t lid = 0;
  std::vector<VerbsGid> gids;
};
// Every RDMA port this process can open; empty without RDMA or verbs.
std::vector<VerbsPort> ListVerbsPorts();

struct VerbsLinkOptions {
  // "rxe0" or "mlx5_0:1" each: one queue pair per entry, striped.
  std::vector<std::string> devices;
  int gid_index = -1;  // < 0: pick (verbs_device.h)
  uint64_t ring_bytes = 4 << 20;
  uint32_t max_write_bytes = 256 << 10;
  uint32_t max_writes_in_flight = 32;
  // Where each queue pair's inbound ring (what the peer's RDMA writes land
  // in) lives. Empty hooks: host memory, registered with ibv_reg_mr. Else
  // memory from the hooks (a GPU's), registered by the preferred path
  // (gpu_registration_path.h: dmabuf, else ibv_reg_mr on the pointer); if
  // neither works, host memory again (host_staging).
  GpuMemoryHooks inbound_memory;
  // Told, per queue pair, how its inbound ring was registered.
  std::function<void(const std::string& queue_pair,
                     const GpuRegistrationReport& report)>
      on_ring_registered;
};

// Queue pairs to one peer, between creation and connection.
class VerbsLinkSetup {
 public:
  static Status Create(const VerbsLinkOptions& options,
                       std::unique_ptr<VerbsLinkSetup>* setup);
  virtual ~VerbsLinkSetup() = default;
  // Our endpoints, as text for the authenticated rendezvous.
  virtual const std::string& local_endpoints() const = 0;
  // Connects queue pair i to the peer's entry i; the streams go to the
  // peer link. Entry counts must agree.
  virtual Status Connect(const std::string& remote_endpoints,
                         std::vector<std::unique_ptr<ByteStream>>* streams) = 0;
};

}  // namespace hetjax
