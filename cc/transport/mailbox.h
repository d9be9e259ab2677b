// Tag matching. Receives are posted under (peer, tag); messages arrive under
// (peer, tag) in the sender's order. Each key is a FIFO on both sides, keys
// are independent. A message whose receive is already posted lands straight
// in the receiver's buffer; one that arrives first is buffered (bounded by
// unexpected_limit_bytes: beyond it the link stops reading, which pushes
// back on the sender through the transport) and copied out when its receive
// is posted.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cc/transport/byte_stream.h"
#include "cc/transport/recv_op.h"
#include "cc/transport/wire.h"

namespace hetjax {

// One incoming message while its chunks come in (from any stream).
class InboundMessage {
 public:
  InboundMessage(int peer, const wire::FrameHeader& header);

  const int peer;
  const wire::FrameHeader header;  // chunk fields are those of the first frame

  // Destination, fixed by Mailbox::Arrive before any payload is read:
  std::shared_ptr<RecvOp> op;         // posted first: bytes go to op->dst
  std::unique_ptr<uint8_t[]> buffer;  // unexpected: bytes go here
  bool discard = false;               // mismatched: bytes are drained

  // Records a chunk as stored; reports the grown prefix to the receive that
  // owns the bytes. True when this was the last byte of the message.
  bool AddChunk(uint64_t offset, uint64_t length);

 private:
  friend class Mailbox;
  std::mutex mu_;
  uint64_t received_ = 0;
  uint64_t contiguous_ = 0;
  std::map<uint64_t, uint64_t> ahead_;  // offset -> length, past the prefix
  bool complete_ = false;
  bool delivered_ = false;
  bool dropped_ = false;  // its receive mismatched while it was arriving
  std::shared_ptr<RecvOp> claimed_by_;  // receive posted while buffering
};

class Mailbox {
 public:
  // A message larger than `late_post_bytes` that finds no receive posted
  // waits up to `late_post_wait_seconds` for one before it is buffered, as
  // long as no other receive from that peer is pending (then the receiver is
  // busy elsewhere, and the message must not hold up the stream). Why: a
  // receiver that posts just after the sender starts (the next call of a
  // loop) would otherwise pay an allocation, page faults and a second copy
  // for every large message.
  Mailbox(uint64_t unexpected_limit_bytes, uint64_t late_post_bytes = 0,
          double late_post_wait_seconds = 0);

  // Application side: completes at once from a buffered message, or waits
  // for the matching arrival.
  void Post(std::shared_ptr<RecvOp> op);

  // Link side, once per message and in the sender's order for that peer:
  // picks the message's destination. Waits (back-pressure) while the
  // unexpected buffer has no room and no receive is posted; false if
  // keep_going() turned false meanwhile.
  bool Arrive(const std::shared_ptr<InboundMessage>& msg,
              const KeepGoingFn& keep_going);
  // Link side: every byte of an unexpected message is in.
  void UnexpectedComplete(const std::shared_ptr<InboundMessage>& msg);

  // The peer is gone: its pending receives fail with `status`, and so do
  // later ones unless a complete message is already buffered for them.
  void FailPeer(int peer, const Status& status);
  // Shutdown: every pending and future receive fails with `status`.
  void FailAll(const Status& status);
  // `on_lost` runs once when FailPeer(peer) or FailAll runs, or now if one
  // already did (Bridge::WatchPeer).
  void WatchPeer(int peer, std::function<void(const Status&)> on_lost);
  // Fails receives with no progress for `timeout_seconds` (kTimeout).
  void ExpireStalled(double timeout_seconds);

  uint64_t unexpected_bytes() const;
  // Messages that arrived but were never received, for the log at Stop:
  // "2 messages (96 bytes) never received: rank 1 tag 7 x2"; "" if none.
  std::string DescribeUnreceived() const;

 private:
  using Key = std::pair<int, uint64_t>;
  // Copies a complete buffered message into op's buffer, finishes op and
  // frees the buffer space. Called without mu_.
  void Deliver(const std::shared_ptr<InboundMessage>& msg,
               const std::shared_ptr<RecvOp>& op);
  void Release(uint64_t bytes);
  // Called with mu_ held.
  bool HasPendingReceive(int peer);

  const uint64_t limit_;
  const uint64_t late_post_bytes_;
  const double late_post_wait_seconds_;
  mutable std::mutex mu_;
  std::condition_variable changed_;  // a receive was posted or space freed
  uint64_t unexpected_bytes_ = 0;
  std::map<Key, std::deque<std::shared_ptr<RecvOp>>> posted_;
  std::map<Key, std::deque<std::shared_ptr<InboundMessage>>> unexpected_;
  std::vector<std::shared_ptr<RecvOp>> pending_;  // not yet finished
  std::map<int, Status> failed_peers_;
  std::multimap<int, std::function<void(const Status&)>> watchers_;
  Status stopped_;  // ok while running
};

}  // namespace hetjax
