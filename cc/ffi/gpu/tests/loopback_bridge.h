// Test double: a Bridge that connects sends and receives of one process by
// tag, moving bytes chunk by chunk on its own threads the way the real
// engine does (gate each chunk with ChunkReadyFn, report the contiguous
// prefix, check the spec). Lets the GPU staging logic run on a CPU machine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "cc/transport/bridge.h"

namespace hetjax::gpu::testing {

class LoopbackBridge final : public Bridge {
 public:
  explicit LoopbackBridge(BridgeOptions options) : options_(options) {}
  ~LoopbackBridge() override {
    JoinTransfers();
    // Like Bridge::Stop: what never matched fails with kAborted.
    const Status aborted(StatusCode::kAborted, "loopback bridge destroyed");
    for (auto& [tag, recv] : recvs_) recv.progress(0, true, aborted);
    for (auto& [tag, send] : sends_) send.done(aborted);
  }

  // The next receive fails with `status` once `after_bytes` have arrived.
  void FailNextRecv(uint64_t after_bytes, Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_after_ = after_bytes;
    fail_status_ = std::move(status);
  }
  // Waits for every matched transfer to finish (callbacks included).
  void JoinTransfers() {
    std::vector<std::thread> workers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      workers.swap(workers_);
    }
    for (std::thread& t : workers) t.join();
  }

  const BridgeOptions& options() const override { return options_; }
  Status AddTcpPeer(int, const std::vector<int>&) override { return Unused(); }
  Status AddShmPeer(int, const std::string&, const std::string&,
                    uint64_t) override {
    return Unused();
  }
  Status Send(int, uint64_t, const TensorSpec&, const void*) override {
    return Unused();
  }
  Status Recv(int, uint64_t, const TensorSpec&, void*) override {
    return Unused();
  }
  Stats GetStats() const override { return Stats{}; }
  void WatchPeer(int, PeerLostFn) override {}  // a loopback never loses it

  void SendAsync(int, uint64_t tag, const TensorSpec& spec, const void* data,
                 ChunkReadyFn ready, SendDoneFn done) override {
    std::lock_guard<std::mutex> lock(mu_);
    sends_[tag] = PendingSend{spec, data, std::move(ready), std::move(done)};
    MatchLocked(tag);
  }
  void PostRecv(int, uint64_t tag, const TensorSpec& expected, void* dst,
                RecvProgressFn progress) override {
    std::lock_guard<std::mutex> lock(mu_);
    recvs_[tag] = PendingRecv{expected, dst, std::move(progress)};
    MatchLocked(tag);
  }

 private:
  struct PendingSend {
    TensorSpec spec;
    const void* data;
    ChunkReadyFn ready;
    SendDoneFn done;
  };
  struct PendingRecv {
    TensorSpec expected;
    void* dst;
    RecvProgressFn progress;
  };

  static Status Unused() {
    return Status(StatusCode::kInternal, "not used by the staging tests");
  }

  void MatchLocked(uint64_t tag) {
    auto s = sends_.find(tag);
    auto r = recvs_.find(tag);
    if (s == sends_.end() || r == recvs_.end()) return;
    PendingSend send = std::move(s->second);
    PendingRecv recv = std::move(r->second);
    sends_.erase(s);
    recvs_.erase(r);
    if (send.spec != recv.expected) {
      // Known from the header alone: fails at once, as a buffered message
      // does in the real bridge.
      recv.progress(0, true,
                    Status(StatusCode::kMismatch,
                           "expected " + recv.expected.ToString() +
                               ", received " + send.spec.ToString()));
      send.done(Status::Ok());
      return;
    }
    const uint64_t fail_after = fail_after_;
    const Status fail_status = std::exchange(fail_status_, Status::Ok());
    workers_.emplace_back(
        [this, send = std::move(send), recv = std::move(recv), fail_after,
         fail_status] { Transfer(send, recv, fail_after, fail_status); });
  }

  void Transfer(const PendingSend& send, const PendingRecv& recv,
                uint64_t fail_after, const Status& fail_status) {
    const uint64_t bytes = send.spec.num_bytes();
    const uint64_t chunk = options_.chunk_bytes;
    for (uint64_t offset = 0; offset < bytes; offset += chunk) {
      const uint64_t length = std::min(chunk, bytes - offset);
      if (!fail_status.ok() && offset + length > fail_after) {
        recv.progress(offset, true, fail_status);
        send.done(Status(StatusCode::kPeerLost, "receiver went away"));
        return;
      }
      if (send.ready) send.ready(offset, length);
      std::memcpy(static_cast<char*>(recv.dst) + offset,
                  static_cast<const char*>(send.data) + offset, length);
      recv.progress(offset + length, false, Status::Ok());
    }
    recv.progress(bytes, true, Status::Ok());
    send.done(Status::Ok());
  }

  const BridgeOptions options_;
  std::mutex mu_;
  std::map<uint64_t, PendingSend> sends_;
  std::map<uint64_t, PendingRecv> recvs_;
  std::vector<std::thread> workers_;
  uint64_t fail_after_ = 0;
  Status fail_status_;
};

}  // namespace hetjax::gpu::testing
