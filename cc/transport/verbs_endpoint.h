// What one side of a verbs queue pair tells the other before they connect:
// queue pair number, first packet sequence number, address (GID, LID), the
// inbound ring's address and remote key. It travels as text through the
// authenticated rendezvous (hetjax/bridge/runtime.py), one entry per local
// RDMA device; the parser treats it as untrusted input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cc/transport/status.h"

namespace hetjax::verbs {

struct Endpoint {
  uint32_t qp_num = 0;
  uint32_t psn = 0;  // 24 bits
  uint16_t lid = 0;
  uint8_t gid[16] = {};
  uint32_t mtu = 0;  // ibv_mtu enum value, 1..5
  uint64_t ring_addr = 0;
  uint32_t ring_rkey = 0;
  uint64_t ring_bytes = 0;
};

// "hv1;<entry>;<entry>..." where an entry is comma-separated hex fields.
std::string EncodeEndpoints(const std::vector<Endpoint>& endpoints);
// Fails with kInvalidArgument naming the field that is wrong.
Status DecodeEndpoints(const std::string& text,
                       std::vector<Endpoint>* endpoints);

}  // namespace hetjax::verbs
