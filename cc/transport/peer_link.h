// Everything between this process and one peer: its streams (N tcp sockets,
// optionally one shm ring pair or verbs queue pairs), a reader and a writer
// thread per stream, striping of outgoing messages, and reassembly of
// incoming ones in the sender's order before they reach the Mailbox.
//
// Why threads per stream rather than one poll() loop: the parallel streams
// exist to spread copies over cores and NICs (one core copies only ~4 GB/s
// through loopback tcp on the H200 hosts, FACTS.md). A single poll thread
// would do every recv()/send() copy itself and cap the pair at one core.
// Blocking-with-bounded-waits I/O per stream also keeps each state machine a
// plain loop. The cost, two threads per stream, is small at our peer counts.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cc/transport/bridge.h"
#include "cc/transport/byte_stream.h"
#include "cc/transport/heartbeat.h"
#include "cc/transport/mailbox.h"
#include "cc/transport/send_op.h"

namespace hetjax {

class PeerLink {
 public:
  PeerLink(int peer, const BridgeOptions& options, Mailbox* mailbox,
           Counters* counters);
  ~PeerLink();  // Stop() + Join()

  int peer() const { return peer_; }
  // Takes ownership of the fds (closed on failure too). Once per peer.
  Status AddTcpStreams(const std::vector<int>& fds);
  // From now on every message to the peer goes over the rings.
  Status AttachShm(const std::string& outbound_name,
                   const std::string& inbound_name, uint64_t ring_bytes);
  // From now on every message to the peer goes over these (verbs queue
  // pairs, connected already), its chunks striped across them.
  Status AttachVerbs(std::vector<std::unique_ptr<ByteStream>> streams);

  // Blocking send of a message up to eager_limit_bytes: written by the
  // calling thread when its stream is idle, else copied and queued (waiting
  // for room among this peer's queued copies, bounded like the receiver's
  // unexpected buffer).
  Status SendSmall(const wire::FrameHeader& header, const void* data);

  // Sequences and queues the message's frames. The op's done callback runs
  // exactly once, here already when the link is lost or stopping (that
  // status is also returned).
  Status Send(const wire::FrameHeader& header, const void* data,
              std::unique_ptr<uint8_t[]> owned, ChunkReadyFn ready,
              SendDoneFn done);

  // Waits until every queued frame is written (or the link fails, or
  // `seconds` pass), so a Stop right after a send does not drop it.
  void Flush(double seconds);
  // Writes a goodbye frame on every idle stream (after Flush, before Stop).
  void SayGoodbye();
  // Shuts the streams so every thread leaves its loop; then Join() joins
  // them and fails whatever is still queued with kAborted.
  void Stop();
  void Join();

  // Failure detection (defined in heartbeat.cc): Beat queues a heartbeat on
  // the first tcp stream if it is idle; CheckHeard declares the peer lost
  // after `timeout_seconds` without a byte from it.
  void Beat();
  void CheckHeard(double timeout_seconds);

 private:
  struct Stream {
    std::unique_ptr<ByteStream> io;
    std::thread reader, writer;
    std::mutex mu;
    std::condition_variable queued;
    std::deque<OutboundFrame> queue;
    std::vector<uint8_t> scratch;  // header + small payload, one write
    bool busy = false;  // a frame is being written (writer thread or caller)
  };
  struct Opening {
    std::shared_ptr<InboundMessage> msg;
    bool matched = false;
  };

  void StartStream(std::unique_ptr<ByteStream> io, bool carries_data);
  void ReaderLoop(Stream* stream);
  void WriterLoop(Stream* stream);
  // Writes one frame (the caller holds the stream's busy flag); a failure
  // other than shutdown loses the peer.
  Status WriteOne(Stream* stream, const OutboundFrame& frame);
  void FinishFrame(const OutboundFrame& frame, const Status& status);
  Status ReserveEager(uint64_t bytes, uint64_t tag);
  void ReleaseEager(uint64_t bytes);
  Status WriteFrame(Stream* stream, const OutboundFrame& frame);
  Status ReadChunk(Stream* stream, const std::shared_ptr<InboundMessage>& msg,
                   const wire::FrameHeader& header);
  // The message this frame belongs to, matching it in sequence order if it
  // is new. nullptr with ok status: shutting down.
  std::shared_ptr<InboundMessage> FindOrOpen(const wire::FrameHeader& header,
                                             Status* error);
  void Completed(const std::shared_ptr<InboundMessage>& msg);
  void MarkLost(const std::string& why);
  Status LinkStatus();  // ok, kPeerLost or kAborted
  bool KeepGoing() const {
    return !stopping_.load(std::memory_order_relaxed) &&
           !lost_flag_.load(std::memory_order_relaxed);
  }

  const int peer_;
  const BridgeOptions options_;
  Mailbox* const mailbox_;
  Counters* const counters_;

  // Send side: sequence numbers and stream choice.
  std::mutex send_mu_;
  uint64_t next_send_seq_ = 0;
  std::vector<std::unique_ptr<Stream>> tcp_streams_;
  // shm (one ring pair) or verbs (one stream per queue pair): when present
  // they carry all data and tcp only liveness.
  std::vector<std::unique_ptr<Stream>> data_streams_;
  Status lost_;
  bool closing_ = false;  // goodbye written: refuse new sends
  std::atomic<bool> stopping_{false}, lost_flag_{false};

  std::mutex eager_mu_;
  std::condition_variable eager_room_;
  uint64_t eager_queued_ = 0;

  // Receive side: messages are matched strictly in sequence order.
  std::mutex recv_mu_;
  std::condition_variable recv_changed_;
  uint64_t next_match_seq_ = 0;
  std::map<uint64_t, Opening> open_;
  std::atomic<int64_t> last_tag_received_{-1};
  int goodbyes_received_ = 0;  // under send_mu_
  Liveness liveness_;          // every stream's reads count
};

}  // namespace hetjax
