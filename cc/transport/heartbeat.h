// Failure detection between bridge ranks.
//
// A peer whose process froze, or whose network vanished, closes nothing: no
// end of stream, no reset, only silence, which tcp alone would notice after
// minutes (or never, for an idle link). So every link sends a header-only
// heartbeat frame (wire::kFlagHeartbeat) on its first tcp stream whenever
// that stream has nothing else to write, and a link that hears nothing from
// its peer (no frame and no payload byte, on any of its streams) for
// BridgeOptions::heartbeat_timeout_seconds declares the peer lost: pending
// and later receives fail with kPeerLost naming the rank and the last tag.
//
// Silence that is this process's own doing does not count: while one of the
// link's readers waits for room in our unexpected-message buffer, the peer
// cannot get bytes through, so the clock only starts again once the wait
// ends. (A reader waiting for an earlier message of the peer's does count:
// that one is on the peer.)
//
// PeerLink::Beat and PeerLink::CheckHeard, which use this, are defined in
// heartbeat.cc as well, so the whole mechanism reads in one place.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "cc/transport/byte_stream.h"

namespace hetjax {

// Time between beats for a given timeout: several beats fit into one
// timeout, so one late beat on a loaded machine is not a loss.
double HeartbeatInterval(double timeout_seconds);

// When a link last heard from its peer.
class Liveness {
 public:
  Liveness() { Heard(); }
  void Heard();
  // Seconds of silence that count against the peer: 0 while a reader of the
  // link waits on this process rather than on the peer.
  double SilentSeconds() const;

  // Held by a reader while it waits on this process; on release the clock
  // restarts (the peer could not get through meanwhile).
  class LocalWait {
   public:
    explicit LocalWait(Liveness* liveness) : liveness_(liveness) {
      liveness_->local_waits_.fetch_add(1);
    }
    ~LocalWait() {
      liveness_->Heard();
      liveness_->local_waits_.fetch_sub(1);
    }
    LocalWait(const LocalWait&) = delete;
    LocalWait& operator=(const LocalWait&) = delete;

   private:
    Liveness* const liveness_;
  };

 private:
  std::atomic<int64_t> last_heard_ns_{0};
  std::atomic<int> local_waits_{0};
};

// `io`, except that every byte read from it counts as hearing from the peer.
std::unique_ptr<ByteStream> WatchReads(std::unique_ptr<ByteStream> io,
                                       Liveness* liveness);

// Runs `tick` every `interval_seconds` on a thread of its own until
// destroyed. The bridge's tick beats and checks every link.
class HeartbeatThread {
 public:
  HeartbeatThread(double interval_seconds, std::function<void()> tick);
  ~HeartbeatThread();
  HeartbeatThread(const HeartbeatThread&) = delete;
  HeartbeatThread& operator=(const HeartbeatThread&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace hetjax
