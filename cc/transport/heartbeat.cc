#include "cc/transport/heartbeat.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>

#include "cc/transport/format.h"
#include "cc/transport/monotonic_clock.h"
#include "cc/transport/peer_link.h"

namespace hetjax {
namespace {

// Five beats per timeout, at least one a second (an idle link costs 128
// bytes a second), and not so often that a tiny test timeout spins.
constexpr double kBeatsPerTimeout = 5;
constexpr double kMaxIntervalSeconds = 1.0;
constexpr double kMinIntervalSeconds = 0.01;

class WatchedStream final : public ByteStream {
 public:
  WatchedStream(std::unique_ptr<ByteStream> io, Liveness* liveness)
      : io_(std::move(io)), liveness_(liveness) {}

  Status ReadSome(void* dst, size_t max, int wait_ms, size_t* got) override {
    Status status = io_->ReadSome(dst, max, wait_ms, got);
    if (*got > 0) liveness_->Heard();
    return status;
  }
  Status WriteSome(const void* src, size_t len, int wait_ms,
                   size_t* put) override {
    return io_->WriteSome(src, len, wait_ms, put);
  }
  void Shutdown() override { io_->Shutdown(); }
  std::string Describe() const override { return io_->Describe(); }

 private:
  const std::unique_ptr<ByteStream> io_;
  Liveness* const liveness_;
};

}  // namespace

double HeartbeatInterval(double timeout_seconds) {
  return std::clamp(timeout_seconds / kBeatsPerTimeout, kMinIntervalSeconds,
                    kMaxIntervalSeconds);
}

void Liveness::Heard() {
  last_heard_ns_.store(MonotonicNs(), std::memory_order_relaxed);
}

double Liveness::SilentSeconds() const {
  if (local_waits_.load() > 0) return 0;
  return SecondsSince(last_heard_ns_.load(std::memory_order_relaxed));
}

std::unique_ptr<ByteStream> WatchReads(std::unique_ptr<ByteStream> io,
                                       Liveness* liveness) {
  return std::make_unique<WatchedStream>(std::move(io), liveness);
}

HeartbeatThread::HeartbeatThread(double interval_seconds,
                                 std::function<void()> tick) {
  const auto interval = std::chrono::duration<double>(interval_seconds);
  thread_ = std::thread([this, interval, tick = std::move(tick)] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!wake_.wait_for(lock, interval, [this] { return stop_; })) {
      lock.unlock();
      tick();
      lock.lock();
    }
  });
}

HeartbeatThread::~HeartbeatThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void PeerLink::Beat() {
  std::lock_guard<std::mutex> lock(send_mu_);
  if (!lost_.ok() || stopping_.load() || closing_ || tcp_streams_.empty()) {
    return;
  }
  Stream* stream = tcp_streams_[0].get();
  std::lock_guard<std::mutex> queue_lock(stream->mu);
  // A stream with frames to write needs no beat: its data is the beat.
  if (stream->busy || !stream->queue.empty()) return;
  wire::FrameHeader header;
  header.source = options_.rank;
  header.flags = wire::kFlagHeartbeat;
  header.spec.dtype = DType::kBytes;
  header.spec.rank = 1;
  // Queued rather than written here: a peer that stopped reading must block
  // the stream's writer (which times out as for data), not this thread,
  // which beats for every link.
  auto op =
      std::make_shared<SendOp>(header, nullptr, nullptr, nullptr, nullptr);
  stream->queue.push_back(OutboundFrame{std::move(op), 0, 0});
  stream->queued.notify_one();
}

void PeerLink::CheckHeard(double timeout_seconds) {
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    // Nothing to hear before streams are attached; nothing owed once we
    // said goodbye ourselves.
    if (tcp_streams_.empty() || closing_) return;
  }
  const double silent = liveness_.SilentSeconds();
  if (silent <= timeout_seconds) return;
  MarkLost("nothing heard from it for " +
           FormatSeconds(std::round(silent * 10) / 10) +
           " (heartbeat timeout " + FormatSeconds(timeout_seconds) +
           ": its process is frozen or its network is gone)");
}

}  // namespace hetjax
