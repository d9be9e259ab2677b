// The bridge: one per process. Moves tagged tensor messages between bridge
// ranks over whatever transports were attached to each peer, with tag
// matching, header checks and a progress engine.
//
// Control plane (rendezvous, authentication, deciding which transport a peer
// gets) lives in Python (hetjax/bridge/); it hands this class sockets that are
// already connected and authenticated, and names of shared-memory segments it
// agreed on with the peer. This class owns them from then on.
//
// Threading: every public method is thread-safe. Callbacks run on the
// progress engine's threads and must not block or call back into Bridge.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cc/transport/status.h"
#include "cc/transport/tensor_spec.h"
#include "cc/transport/verbs_link.h"

namespace hetjax {

struct BridgeOptions {
  int rank = 0;
  int world_size = 1;
  // A receive (or a send waiting on a full peer) that makes no progress for
  // this long fails with kTimeout. <= 0 waits forever.
  double timeout_seconds = 300.0;
  // Messages that arrive before their receive is posted are buffered up to
  // this many bytes in total; beyond it the sender is back-pressured.
  uint64_t unexpected_limit_bytes = uint64_t{1} << 30;
  // Largest payload a header may claim; anything larger is rejected before
  // allocating (a corrupt or hostile header must not make us allocate 1 TiB).
  uint64_t max_message_bytes = uint64_t{64} << 30;
  // Unit of striping (tcp) and of pipelining (shm ring slots, GPU staging).
  uint64_t chunk_bytes = uint64_t{4} << 20;
  // Sends at most this large are copied and return at once; larger sends
  // stream straight from the caller's buffer (see Send).
  uint64_t eager_limit_bytes = uint64_t{1} << 20;
  // A message above eager_limit_bytes that arrives before its receive is
  // posted waits this long for it (while no other receive from that peer is
  // pending) before it is buffered: see Mailbox. 0: buffer at once.
  double late_post_wait_seconds = 0.01;
  // A peer from which nothing (no data, no heartbeat) arrives for this long
  // is declared lost: a frozen process or a vanished network closes no
  // socket (heartbeat.h). Idle links beat about once a second. <= 0: off.
  double heartbeat_timeout_seconds = 15.0;
};

// Called as a posted receive progresses. `contiguous_bytes` is the length of
// the payload prefix now valid in the destination; the final call has
// done == true and carries the status (ok, mismatch, peer lost, timeout...).
using RecvProgressFn =
    std::function<void(uint64_t contiguous_bytes, bool done, const Status&)>;

// Optional gate for asynchronous sends: the engine calls it before reading
// payload bytes [offset, offset + length) and blocks that stream until it
// returns. GPU senders use it to wait for the device->host copy of a chunk.
using ChunkReadyFn = std::function<void(uint64_t offset, uint64_t length)>;
using SendDoneFn = std::function<void(const Status&)>;
using PeerLostFn = std::function<void(const Status&)>;

struct Stats {
  uint64_t messages_sent = 0, messages_received = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  uint64_t unexpected_bytes_buffered = 0;
};

class Bridge {
 public:
  // Starts the process-wide bridge (progress engine included). Fails if one
  // is already running.
  static Status Start(const BridgeOptions& options);
  // Stops the engine, closes every socket, unmaps and unlinks shared memory
  // this process created, fails pending operations with kAborted. Idempotent.
  static void Stop();
  // The running bridge, or nullptr.
  static Bridge* Get();
  // A bridge of its own, outside the process-wide slot (tests, embedding);
  // destroying it stops it. nullptr with *status set when the options are
  // invalid.
  static std::unique_ptr<Bridge> Create(const BridgeOptions& options,
                                        Status* status = nullptr);

  virtual ~Bridge() = default;
  virtual const BridgeOptions& options() const = 0;

  // Attach transports to a peer. tcp: `fds` are connected, authenticated
  // stream sockets (one per parallel stream, same order on both ends); the
  // bridge takes ownership. Every peer gets at least one tcp socket, which
  // also serves as the liveness channel when data goes over shm.
  virtual Status AddTcpPeer(int peer, const std::vector<int>& fds) = 0;
  // shm: POSIX shared-memory ring names agreed with the peer. This side
  // creates `outbound_name` (and unlinks it on Stop), the peer creates ours.
  // Once attached, data to this peer goes over shm; tcp stays for liveness.
  virtual Status AddShmPeer(int peer, const std::string& outbound_name,
                            const std::string& inbound_name,
                            uint64_t ring_bytes) = 0;
  // verbs: one reliable-connected queue pair per device in options.devices,
  // set up in two steps since each side needs the other's endpoint: Prepare
  // creates them and returns ours (text for the authenticated rendezvous),
  // Connect takes the peer's. From then on data to this peer goes over the
  // queue pairs, striped; tcp stays for liveness. Builds without libibverbs
  // refuse with kInvalidArgument (VerbsCompiledIn()).
  virtual Status PrepareVerbsPeer(int peer, const VerbsLinkOptions& options,
                                  std::string* local_endpoints) {
    (void)peer, (void)options, (void)local_endpoints;
    return Status(StatusCode::kInvalidArgument, "verbs: not supported here");
  }
  virtual Status ConnectVerbsPeer(int peer,
                                  const std::string& remote_endpoints) {
    (void)peer, (void)remote_endpoints;
    return Status(StatusCode::kInvalidArgument, "verbs: not supported here");
  }

  // Blocking send. Returns once `data` may be reused: at once for payloads up
  // to eager_limit_bytes (copied), after the engine has handed the last byte
  // to the transport for larger ones. Never waits for the peer to post its
  // receive, only for buffer space (bounded by timeout_seconds).
  virtual Status Send(int peer, uint64_t tag, const TensorSpec& spec,
                      const void* data) = 0;
  // Asynchronous send: returns at once; `data` must stay valid until `done`
  // runs. `ready` (optional) gates each chunk.
  virtual void SendAsync(int peer, uint64_t tag, const TensorSpec& spec,
                         const void* data, ChunkReadyFn ready,
                         SendDoneFn done) = 0;

  // Blocking receive into `dst` (expected.num_bytes() bytes). Fails with
  // kMismatch naming peer, tag, expected and received dtype/shape when the
  // header disagrees; with kTimeout or kPeerLost instead of hanging.
  virtual Status Recv(int peer, uint64_t tag, const TensorSpec& expected,
                      void* dst) = 0;
  // Pre-posted receive: returns at once; `dst` must stay valid until
  // `progress` reports done. A message already buffered completes at once.
  virtual void PostRecv(int peer, uint64_t tag, const TensorSpec& expected,
                        void* dst, RecvProgressFn progress) = 0;

  virtual Stats GetStats() const = 0;

  // Runs `on_lost` once, with the reason, when `peer` is lost (heartbeat
  // timeout, closed connection, bad frame) or the bridge stops; at once if
  // that already happened. For transports outside the bridge (GPU slot
  // channels) whose waits must end with the peer. Runs on an engine thread:
  // must not block or call back into the Bridge.
  virtual void WatchPeer(int peer, PeerLostFn on_lost) = 0;
};

}  // namespace hetjax
