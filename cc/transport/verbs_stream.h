// One reliable-connected queue pair to a peer, as a ByteStream, so the peer
// link's framing, striping, tag matching and header checks work over verbs
// unchanged.
//
// How bytes move: each side registers an inbound ring (host memory, or the
// caller's memory registered by the preferred GPU path, see
// ChannelOptions::inbound_memory). The writer copies into
// a registered staging ring of the same size and RDMA-writes each piece (at
// most max_write_bytes) to the same offset of the peer's ring, with the
// length as immediate data; several writes are in flight at once, so a large
// frame is chunked and pipelined. The reader learns of arrivals from receive
// completions, copies out, and returns credit (bytes consumed) with a
// zero-length write-with-immediate. A progress thread per queue pair waits on
// the completion channel and polls the completion queue; reader and writer
// only wait on its state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cc/transport/byte_stream.h"
#include "cc/transport/verbs_device.h"
#include "cc/transport/verbs_endpoint.h"
#include "cc/transport/verbs_gpu_registration.h"

namespace hetjax::verbs {

struct ChannelOptions {
  uint64_t ring_bytes = 4 << 20;         // inbound ring (and staging) per QP
  uint32_t max_write_bytes = 256 << 10;  // one RDMA write
  uint32_t max_writes_in_flight = 32;    // signalled sends outstanding
  GpuMemoryHooks inbound_memory;         // VerbsLinkOptions::inbound_memory
};

// A queue pair: created first (its endpoint can then be published), then
// connected once the peer's endpoint is known; only then a usable stream.
class Channel : public ByteStream {
 public:
  static Status Create(std::shared_ptr<Device> device,
                       const ChannelOptions& options,
                       std::unique_ptr<Channel>* channel);
  virtual const Endpoint& local() const = 0;
  // How the inbound ring was registered: kGpuPathHostStaging for host
  // memory (also the fallback), else kGpuPathDmabuf / kGpuPathPeerMemory
  // with the paths rejected on the way.
  virtual const GpuRegistrationReport& ring_registration() const = 0;
  // Moves the queue pair to ready-to-send against `remote`. Once.
  virtual Status Connect(const Endpoint& remote) = 0;
};

}  // namespace hetjax::verbs
