// RDMA devices as the verbs transport sees them: discovery (which devices,
// ports, states, GIDs) and one opened device (context + protection domain)
// shared by every queue pair on it.
//
// Only compiled when libibverbs is found (CMake HETJAX_VERBS); the layers
// above reach it through verbs_link.h, which has a stub for builds without.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cc/transport/status.h"

namespace hetjax::verbs {

struct GidEntry {
  int index = 0;
  std::string gid;   // "fe80:0000:...", 8 groups of 4 hex digits
  std::string type;  // "IB", "RoCE v1", "RoCE v2"
};

struct PortInfo {
  std::string device;  // "rxe0", "mlx5_0"
  int port = 1;
  bool active = false;
  std::string state;       // "ACTIVE", "DOWN", ...
  std::string link_layer;  // "Ethernet" (RoCE) or "InfiniBand"
  int active_mtu = 0;      // bytes
  uint16_t lid = 0;
  std::vector<GidEntry> gids;  // non-zero entries only
};

// Every port of every RDMA device this process can open. Empty (with no
// error) on a machine without RDMA.
std::vector<PortInfo> ListPorts();

// An opened port: the context and protection domain are shared by every
// queue pair on it, so memory registered once serves all of them.
class Device {
 public:
  // `name` is "rxe0" or "rxe0:2" (port; default the first active one).
  // `gid_index` < 0 picks the first RoCE v2 IPv4-mapped GID, else the first
  // RoCE v2, else the first non-zero one. Opened devices are cached: two
  // calls with the same name share one context while either is alive.
  static Status Open(const std::string& name, int gid_index,
                     std::shared_ptr<Device>* device);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  ibv_context* context() const { return context_; }
  ibv_pd* pd() const { return pd_; }
  const std::string& name() const { return name_; }
  int port() const { return port_; }
  bool is_ethernet() const { return ethernet_; }
  int gid_index() const { return gid_index_; }
  const ibv_gid& gid() const { return gid_; }
  uint16_t lid() const { return lid_; }
  ibv_mtu active_mtu() const { return mtu_; }

 private:
  Device() = default;
  std::string name_;
  int port_ = 1;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  bool ethernet_ = true;
  int gid_index_ = 0;
  ibv_gid gid_{};
  uint16_t lid_ = 0;
  ibv_mtu mtu_ = IBV_MTU_1024;
};

// "rxe0: ibv_modify_qp(RTR) failed: Invalid argument (errno 22)".
Status Errno(const std::string& what, int err);
std::string FormatGid(const ibv_gid& gid);
int MtuBytes(ibv_mtu mtu);

}  // namespace hetjax::verbs
