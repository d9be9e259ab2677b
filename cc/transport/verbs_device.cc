#include "cc/transport/verbs_device.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

namespace hetjax::verbs {
namespace {

const char* PortStateName(ibv_port_state state) {
  switch (state) {
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER:
      return "ACTIVE_DEFER";
    default:
      return "NOP";
  }
}

const char* GidTypeName(uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB:
      return "IB";
    case IBV_GID_TYPE_ROCE_V1:
      return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2:
      return "RoCE v2";
    default:
      return "unknown";
  }
}

bool IsZero(const ibv_gid& gid) {
  static const ibv_gid zero{};
  return std::memcmp(&gid, &zero, sizeof(gid)) == 0;
}

// ::ffff:a.b.c.d, the GID RoCE v2 derives from an IPv4 address: routable,
// and what perftest's -x picks on the same setups.
bool IsIpv4Mapped(const ibv_gid& gid) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, prefix, sizeof(prefix)) == 0;
}

std::vector<GidEntry> ReadGids(ibv_context* context, int port, int table_len) {
  std::vector<GidEntry> gids;
  for (int i = 0; i < table_len; ++i) {
    ibv_gid_entry entry{};
    if (ibv_query_gid_ex(context, port, i, &entry, 0) != 0) continue;
    if (IsZero(entry.gid)) continue;
    gids.push_back({i, FormatGid(entry.gid), GidTypeName(entry.gid_type)});
  }
  return gids;
}

// Which GID a queue pair on this port uses (see Device::Open).
int PickGid(ibv_context* context, int port, int table_len) {
  int best = -1, best_rank = 0;
  for (int i = 0; i < table_len; ++i) {
    ibv_gid_entry entry{};
    if (ibv_query_gid_ex(context, port, i, &entry, 0) != 0) continue;
    if (IsZero(entry.gid)) continue;
    const bool v2 = entry.gid_type == IBV_GID_TYPE_ROCE_V2;
    const int rank = v2 && IsIpv4Mapped(entry.gid) ? 3 : v2 ? 2 : 1;
    if (rank > best_rank) best = i, best_rank = rank;
  }
  return best;
}

struct DeviceList {
  int count = 0;
  ibv_device** list = nullptr;
  DeviceList() { list = ibv_get_device_list(&count); }
  ~DeviceList() {
    if (list != nullptr) ibv_free_device_list(list);
  }
};

std::mutex g_cache_mu;
std::map<std::string, std::weak_ptr<Device>> g_cache;

}  // namespace

Status Errno(const std::string& what, int err) {
  return Status(StatusCode::kInternal, what + " failed: " + std::strerror(err) +
                                           " (errno " + std::to_string(err) +
                                           ")");
}

std::string FormatGid(const ibv_gid& gid) {
  char text[40];
  char* p = text;
  for (int i = 0; i < 16; i += 2) {
    p += std::snprintf(p, 6, "%02x%02x%s", gid.raw[i], gid.raw[i + 1],
                       i < 14 ? ":" : "");
  }
  return text;
}

int MtuBytes(ibv_mtu mtu) { return 128 << static_cast<int>(mtu); }

std::vector<PortInfo> ListPorts() {
  std::vector<PortInfo> ports;
  DeviceList devices;
  for (int d = 0; d < devices.count; ++d) {
    ibv_context* context = ibv_open_device(devices.list[d]);
    if (context == nullptr) continue;
    ibv_device_attr attr{};
    if (ibv_query_device(context, &attr) == 0) {
      for (int p = 1; p <= attr.phys_port_cnt; ++p) {
        ibv_port_attr port{};
        if (ibv_query_port(context, p, &port) != 0) continue;
        PortInfo info;
        info.device = ibv_get_device_name(devices.list[d]);
        info.port = p;
        info.active = port.state == IBV_PORT_ACTIVE;
        info.state = PortStateName(port.state);
        info.link_layer = port.link_layer == IBV_LINK_LAYER_ETHERNET
                              ? "Ethernet"
                              : "InfiniBand";
        info.active_mtu = MtuBytes(port.active_mtu);
        info.lid = port.lid;
        info.gids = ReadGids(context, p, port.gid_tbl_len);
        ports.push_back(std::move(info));
      }
    }
    ibv_close_device(context);
  }
  return ports;
}

Status Device::Open(const std::string& name, int gid_index,
                    std::shared_ptr<Device>* device) {
  const std::string key = name + "#" + std::to_string(gid_index);
  std::lock_guard<std::mutex> lock(g_cache_mu);
  if (auto cached = g_cache[key].lock()) {
    *device = cached;
    return Status::Ok();
  }
  std::string dev_name = name;
  int port = 0;
  if (auto colon = name.find(':'); colon != std::string::npos) {
    dev_name = name.substr(0, colon);
    port = std::atoi(name.c_str() + colon + 1);
    if (port <= 0) {
      return Status(StatusCode::kInvalidArgument,
                    "RDMA device " + name + ": expected NAME or NAME:PORT");
    }
  }
  DeviceList devices;
  ibv_device* found = nullptr;
  std::string names;
  for (int d = 0; d < devices.count; ++d) {
    const char* n = ibv_get_device_name(devices.list[d]);
    names += (names.empty() ? "" : ", ") + std::string(n);
    if (dev_name == n) found = devices.list[d];
  }
  if (found == nullptr) {
    return Status(StatusCode::kInvalidArgument,
                  "RDMA device " + dev_name + " not found (this host has: " +
                      (names.empty() ? "none" : names) + ")");
  }
  std::shared_ptr<Device> opened(new Device());
  opened->name_ = name;
  opened->context_ = ibv_open_device(found);
  if (opened->context_ == nullptr)
    return Errno("ibv_open_device(" + dev_name + ")", errno);
  ibv_device_attr attr{};
  if (ibv_query_device(opened->context_, &attr) != 0) {
    return Errno("ibv_query_device(" + dev_name + ")", errno);
  }
  ibv_port_attr port_attr{};
  for (int p = port > 0 ? port : 1; p <= attr.phys_port_cnt; ++p) {
    if (ibv_query_port(opened->context_, p, &port_attr) != 0) continue;
    if (port > 0 || port_attr.state == IBV_PORT_ACTIVE) {
      port = p;
      break;
    }
  }
  if (port <= 0 || port_attr.state != IBV_PORT_ACTIVE) {
    return Status(StatusCode::kInvalidArgument,
                  "RDMA device " + name + " has no ACTIVE port" +
                      (port > 0 ? std::string(" (port state ") +
                                      PortStateName(port_attr.state) + ")"
                                : std::string()));
  }
  opened->port_ = port;
  opened->ethernet_ = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET;
  opened->lid_ = port_attr.lid;
  opened->mtu_ = port_attr.active_mtu;
  opened->gid_index_ =
      gid_index >= 0 ? gid_index
                     : PickGid(opened->context_, port, port_attr.gid_tbl_len);
  if (opened->gid_index_ < 0) {
    if (opened->ethernet_) {
      return Status(StatusCode::kInvalidArgument,
                    "RDMA device " + name +
                        " (RoCE) has no GID: give its netdev an IP address");
    }
    opened->gid_index_ = 0;  // InfiniBand addresses by LID
  }
  if (ibv_query_gid(opened->context_, port, opened->gid_index_,
                    &opened->gid_) != 0) {
    return Errno("ibv_query_gid(" + name + ", index " +
                     std::to_string(opened->gid_index_) + ")",
                 errno);
  }
  opened->pd_ = ibv_alloc_pd(opened->context_);
  if (opened->pd_ == nullptr) return Errno("ibv_alloc_pd(" + name + ")", errno);
  g_cache[key] = opened;
  *device = std::move(opened);
  return Status::Ok();
}

Device::~Device() {
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  if (context_ != nullptr) ibv_close_device(context_);
}

}  // namespace hetjax::verbs
