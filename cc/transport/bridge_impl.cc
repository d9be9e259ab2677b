// Bridge as the layers above see it: argument checks, one PeerLink per peer,
// the Mailbox, the watchdog that times out stalled receives, and the
// process-wide instance behind Start/Stop/Get.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cc/transport/bridge.h"
#include "cc/transport/heartbeat.h"
#include "cc/transport/mailbox.h"
#include "cc/transport/peer_link.h"
#include "cc/transport/send_op.h"
#include "cc/transport/spin_policy.h"

namespace hetjax {
namespace {

constexpr double kMaxFlushSeconds = 10;

Status CheckOptions(const BridgeOptions& o) {
  auto bad = [](const std::string& what) {
    return Status(StatusCode::kInvalidArgument, "bridge options: " + what);
  };
  if (o.world_size < 1) return bad("world_size must be >= 1");
  if (o.rank < 0 || o.rank >= o.world_size) {
    return bad("rank " + std::to_string(o.rank) + " outside [0, " +
               std::to_string(o.world_size) + ")");
  }
  if (o.chunk_bytes == 0) return bad("chunk_bytes must be > 0");
  return Status::Ok();
}

// Where a blocking Recv waits for its PostRecv to finish. Spins briefly
// first: a small message that is already on its way then costs no sleeping
// wake-up, which is most of a round trip's latency.
class Completion {
 public:
  void Set(const Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    done_.store(true, std::memory_order_release);
    cv_.notify_all();
  }
  Status Wait() {
    auto spin_until = std::chrono::steady_clock::now() + SpinBudget();
    while (!done_.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < spin_until) {
      SpinPause();
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_.load(std::memory_order_relaxed); });
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  Status status_;
};

class BridgeImpl final : public Bridge {
 public:
  explicit BridgeImpl(const BridgeOptions& options)
      : options_(options),
        mailbox_(options.unexpected_limit_bytes, options.eager_limit_bytes,
                 options.late_post_wait_seconds),
        links_(static_cast<size_t>(options.world_size)) {
    watchdog_ = std::thread([this] { WatchdogLoop(); });
    if (options.heartbeat_timeout_seconds > 0) {
      heartbeat_ = std::make_unique<HeartbeatThread>(
          HeartbeatInterval(options.heartbeat_timeout_seconds),
          [this] { BeatAndCheck(); });
    }
  }
  ~BridgeImpl() override { Shutdown(); }

  void Shutdown() {
    std::vector<std::shared_ptr<PeerLink>> links;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
      links = links_;
      watchdog_wake_.notify_all();
    }
    heartbeat_.reset();  // from here on silence is our own doing
    // Sends already accepted (eager copies) go out before we close; bounded,
    // since a peer that stopped reading must not hang our shutdown.
    const double flush_seconds =
        options_.timeout_seconds > 0
            ? std::min(options_.timeout_seconds, kMaxFlushSeconds)
            : kMaxFlushSeconds;
    for (auto& link : links) {
      if (link) link->Flush(flush_seconds);
    }
    // Before the goodbyes: the peer answers one by closing, which must not
    // turn our pending receives into kPeerLost.
    mailbox_.FailAll(Status(StatusCode::kAborted, "the bridge was stopped"));
    for (auto& link : links) {
      if (link) link->SayGoodbye();
    }
    for (auto& link : links) {
      if (link) link->Stop();
    }
    for (auto& link : links) {
      if (link) link->Join();
    }
    watchdog_.join();
    // Messages nobody received are freed with the mailbox; say which, since
    // an unmatched tag is usually a schedule bug on one side.
    const std::string unreceived = mailbox_.DescribeUnreceived();
    if (!unreceived.empty()) {
      std::fprintf(stderr, "hetjax bridge rank %d stopped with %s\n",
                   options_.rank, unreceived.c_str());
    }
    std::lock_guard<std::mutex> lock(mu_);
    // Closes sockets and unlinks shm; links still held by callers in
    // flight go when those calls return.
    std::fill(links_.begin(), links_.end(), nullptr);
    verbs_setups_.clear();
  }

  const BridgeOptions& options() const override { return options_; }

  Status AddTcpPeer(int peer, const std::vector<int>& fds) override {
    Status status = CheckPeer(peer, "AddTcpPeer");
    std::shared_ptr<PeerLink> link;
    if (status.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) {
        status = Status(StatusCode::kAborted, "the bridge was stopped");
      } else {
        if (!links_[peer]) {
          links_[peer] =
              std::make_shared<PeerLink>(peer, options_, &mailbox_, &counters_);
        }
        link = links_[peer];
      }
    }
    if (!status.ok()) {
      for (int fd : fds) ::close(fd);  // we own them whatever happens
      return status;
    }
    return link->AddTcpStreams(fds);
  }

  Status AddShmPeer(int peer, const std::string& outbound_name,
                    const std::string& inbound_name,
                    uint64_t ring_bytes) override {
    std::shared_ptr<PeerLink> link;
    Status status = LinkFor(peer, "AddShmPeer", &link);
    if (!status.ok()) return status;
    return link->AttachShm(outbound_name, inbound_name, ring_bytes);
  }

  Status PrepareVerbsPeer(int peer, const VerbsLinkOptions& options,
                          std::string* local_endpoints) override {
    std::shared_ptr<PeerLink> link;
    Status status = LinkFor(peer, "PrepareVerbsPeer", &link);
    if (!status.ok()) return status;
    std::unique_ptr<VerbsLinkSetup> setup;
    status = VerbsLinkSetup::Create(options, &setup);
    if (!status.ok()) {
      return Status(status.code(), "verbs to rank " + std::to_string(peer) +
                                       ": " + status.message());
    }
    *local_endpoints = setup->local_endpoints();
    std::lock_guard<std::mutex> lock(mu_);
    verbs_setups_[peer] = std::move(setup);
    return Status::Ok();
  }

  Status ConnectVerbsPeer(int peer,
                          const std::string& remote_endpoints) override {
    std::shared_ptr<PeerLink> link;
    Status status = LinkFor(peer, "ConnectVerbsPeer", &link);
    if (!status.ok()) return status;
    std::unique_ptr<VerbsLinkSetup> setup;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = verbs_setups_.find(peer);
      if (it != verbs_setups_.end()) {
        setup = std::move(it->second);
        verbs_setups_.erase(it);
      }
    }
    if (!setup) {
      return Status(StatusCode::kInvalidArgument,
                    "ConnectVerbsPeer(" + std::to_string(peer) +
                        "): PrepareVerbsPeer first");
    }
    std::vector<std::unique_ptr<ByteStream>> streams;
    status = setup->Connect(remote_endpoints, &streams);
    if (!status.ok()) {
      return Status(status.code(), "verbs to rank " + std::to_string(peer) +
                                       ": " + status.message());
    }
    return link->AttachVerbs(std::move(streams));
  }

  Status Send(int peer, uint64_t tag, const TensorSpec& spec,
              const void* data) override {
    std::shared_ptr<PeerLink> link;
    Status status = CheckSpec(spec, "send to", peer, tag);
    if (status.ok()) status = LinkFor(peer, "send", &link);
    if (!status.ok()) return status;
    const uint64_t bytes = spec.num_bytes();
    if (bytes <= options_.eager_limit_bytes) {
      return link->SendSmall(Header(tag, spec), data);
    }
    std::promise<Status> result;
    std::future<Status> done = result.get_future();
    link->Send(Header(tag, spec), data, nullptr, nullptr,
               [&result](const Status& s) { result.set_value(s); });
    return done.get();
  }

  void SendAsync(int peer, uint64_t tag, const TensorSpec& spec,
                 const void* data, ChunkReadyFn ready,
                 SendDoneFn done) override {
    std::shared_ptr<PeerLink> link;
    Status status = CheckSpec(spec, "send to", peer, tag);
    if (status.ok()) status = LinkFor(peer, "send", &link);
    if (!status.ok()) {
      if (done) done(status);
      return;
    }
    link->Send(Header(tag, spec), data, nullptr, std::move(ready),
               std::move(done));
  }

  Status Recv(int peer, uint64_t tag, const TensorSpec& expected,
              void* dst) override {
    auto completion = std::make_shared<Completion>();
    PostRecv(peer, tag, expected, dst,
             [completion](uint64_t, bool finished, const Status& s) {
               if (finished) completion->Set(s);
             });
    return completion->Wait();
  }

  void PostRecv(int peer, uint64_t tag, const TensorSpec& expected, void* dst,
                RecvProgressFn progress) override {
    Status status = CheckSpec(expected, "recv from", peer, tag);
    if (status.ok()) status = CheckPeer(peer, "recv");
    if (!status.ok()) {
      if (progress) progress(0, true, status);
      return;
    }
    mailbox_.Post(std::make_shared<RecvOp>(peer, tag, expected, dst,
                                           std::move(progress)));
  }

  void WatchPeer(int peer, PeerLostFn on_lost) override {
    mailbox_.WatchPeer(peer, std::move(on_lost));
  }

  Stats GetStats() const override {
    Stats stats;
    stats.messages_sent = counters_.messages_sent.load();
    stats.messages_received = counters_.messages_received.load();
    stats.bytes_sent = counters_.bytes_sent.load();
    stats.bytes_received = counters_.bytes_received.load();
    stats.unexpected_bytes_buffered = mailbox_.unexpected_bytes();
    return stats;
  }

 private:
  wire::FrameHeader Header(uint64_t tag, const TensorSpec& spec) const {
    wire::FrameHeader header;
    header.source = options_.rank;
    header.tag = tag;
    header.spec = spec;
    header.payload_bytes = spec.num_bytes();
    return header;
  }

  Status CheckPeer(int peer, const char* op) const {
    if (peer < 0 || peer >= options_.world_size || peer == options_.rank) {
      return Status(StatusCode::kInvalidArgument,
                    std::string(op) + ": peer " + std::to_string(peer) +
                        " is not another rank of [0, " +
                        std::to_string(options_.world_size) +
                        ") (this is rank " + std::to_string(options_.rank) +
                        ")");
    }
    return Status::Ok();
  }

  Status CheckSpec(const TensorSpec& spec, const char* verb, int peer,
                   uint64_t tag) const {
    std::string where = std::string(verb) + " rank " + std::to_string(peer) +
                        " tag " + std::to_string(tag) + ": ";
    if (DTypeSize(spec.dtype) == 0 || spec.rank < 0 || spec.rank > kMaxRank) {
      return Status(StatusCode::kInvalidArgument,
                    where + "unsupported tensor (dtype code " +
                        std::to_string(static_cast<int>(spec.dtype)) +
                        ", rank " + std::to_string(spec.rank) + ")");
    }
    for (int i = 0; i < spec.rank; ++i) {
      if (spec.dims[i] < 0) {
        return Status(StatusCode::kInvalidArgument,
                      where + "negative dimension in " + spec.ToString());
      }
    }
    if (spec.num_bytes() > options_.max_message_bytes) {
      return Status(StatusCode::kResourceExhausted,
                    where + spec.ToString() + " is " +
                        std::to_string(spec.num_bytes()) +
                        " bytes, above max_message_bytes " +
                        std::to_string(options_.max_message_bytes));
    }
    return Status::Ok();
  }

  Status LinkFor(int peer, const char* op, std::shared_ptr<PeerLink>* link) {
    Status status = CheckPeer(peer, op);
    if (!status.ok()) return status;
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return Status(StatusCode::kAborted, "the bridge was stopped");
    *link = links_[peer];
    if (!*link) {
      return Status(StatusCode::kInvalidArgument,
                    std::string(op) + ": no transport attached to rank " +
                        std::to_string(peer) + " (AddTcpPeer first)");
    }
    return Status::Ok();
  }

  void BeatAndCheck() {
    std::vector<std::shared_ptr<PeerLink>> links;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      links = links_;
    }
    for (auto& link : links) {
      if (!link) continue;
      link->Beat();
      link->CheckHeard(options_.heartbeat_timeout_seconds);
    }
  }

  void WatchdogLoop() {
    // Fine enough that a timeout fires within ~10% of its value.
    const double timeout = options_.timeout_seconds;
    const auto period = std::chrono::milliseconds(
        timeout > 0
            ? std::clamp<int64_t>(static_cast<int64_t>(timeout * 100), 5, 100)
            : 100);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopped_) {
      watchdog_wake_.wait_for(lock, period);
      if (stopped_) break;
      lock.unlock();
      mailbox_.ExpireStalled(timeout);
      lock.lock();
    }
  }

  const BridgeOptions options_;
  Mailbox mailbox_;
  Counters counters_;
  mutable std::mutex mu_;
  std::condition_variable watchdog_wake_;
  std::vector<std::shared_ptr<PeerLink>> links_;  // by rank
  // Queue pairs created, waiting for the peer's endpoints.
  std::map<int, std::unique_ptr<VerbsLinkSetup>> verbs_setups_;
  bool stopped_ = false;
  std::thread watchdog_;
  std::unique_ptr<HeartbeatThread> heartbeat_;  // last: it calls into the rest
};

std::mutex g_mu;
std::unique_ptr<BridgeImpl> g_bridge;
std::atomic<Bridge*> g_running{nullptr};

}  // namespace

std::unique_ptr<Bridge> Bridge::Create(const BridgeOptions& options,
                                       Status* status) {
  Status checked = CheckOptions(options);
  if (status != nullptr) *status = checked;
  if (!checked.ok()) return nullptr;
  return std::make_unique<BridgeImpl>(options);
}

Status Bridge::Start(const BridgeOptions& options) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_bridge) {
    return Status(StatusCode::kInvalidArgument,
                  "the bridge is already running in this process (rank " +
                      std::to_string(g_bridge->options().rank) + ")");
  }
  Status status = CheckOptions(options);
  if (!status.ok()) return status;
  g_bridge = std::make_unique<BridgeImpl>(options);
  g_running.store(g_bridge.get());
  return Status::Ok();
}

void Bridge::Stop() {
  std::unique_ptr<BridgeImpl> bridge;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_running.store(nullptr);
    bridge = std::move(g_bridge);
  }
  if (bridge) bridge->Shutdown();
}

Bridge* Bridge::Get() { return g_running.load(); }

}  // namespace hetjax
