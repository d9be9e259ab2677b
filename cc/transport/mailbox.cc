#include "cc/transport/mailbox.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "cc/transport/format.h"

namespace hetjax {

InboundMessage::InboundMessage(int peer, const wire::FrameHeader& header)
    : peer(peer), header(header) {}

bool InboundMessage::AddChunk(uint64_t offset, uint64_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  received_ += length;
  if (offset == contiguous_) {
    contiguous_ += length;
    for (auto it = ahead_.begin();
         it != ahead_.end() && it->first == contiguous_;
         it = ahead_.erase(it)) {
      contiguous_ += it->second;
    }
  } else {
    ahead_[offset] = length;
  }
  if (op) {
    op->Report(contiguous_);
  } else if (claimed_by_) {
    claimed_by_->Touch();
  }
  if (received_ >= header.payload_bytes && !complete_) {
    complete_ = true;
    return true;
  }
  return false;
}

Mailbox::Mailbox(uint64_t unexpected_limit_bytes, uint64_t late_post_bytes,
                 double late_post_wait_seconds)
    : limit_(unexpected_limit_bytes),
      late_post_bytes_(late_post_bytes),
      late_post_wait_seconds_(late_post_wait_seconds) {}

bool Mailbox::HasPendingReceive(int peer) {
  for (auto it = posted_.lower_bound(Key{peer, 0});
       it != posted_.end() && it->first.first == peer; ++it) {
    for (const auto& op : it->second) {
      if (!op->finished()) return true;
    }
  }
  return false;
}

void Mailbox::Post(std::shared_ptr<RecvOp> op) {
  std::shared_ptr<InboundMessage> ready;
  Status fail;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Key key{op->peer, op->tag};
    auto queue = unexpected_.find(key);
    if (!stopped_.ok()) {
      fail = stopped_;
    } else if (queue != unexpected_.end() && !queue->second.empty()) {
      std::shared_ptr<InboundMessage> msg = queue->second.front();
      queue->second.pop_front();
      fail = wire::CheckExpected(op->peer, op->tag, op->expected,
                                 msg->header.spec);
      std::lock_guard<std::mutex> msg_lock(msg->mu_);
      if (!fail.ok()) {
        // The mismatched message is consumed by this receive, as MPI would;
        // its bytes are dropped once in.
        if (msg->complete_) {
          msg->delivered_ = true;
          unexpected_bytes_ -= msg->header.payload_bytes;
          msg->buffer.reset();
          changed_.notify_all();
        } else {
          msg->dropped_ = true;
        }
      } else if (msg->complete_) {
        msg->delivered_ = true;
        ready = msg;
      } else {
        msg->claimed_by_ = op;
        pending_.push_back(op);
      }
    } else if (auto lost = failed_peers_.find(op->peer);
               lost != failed_peers_.end()) {
      fail = lost->second;
    } else {
      posted_[key].push_back(op);
      pending_.push_back(op);
      changed_.notify_all();
    }
  }
  if (!fail.ok()) {
    op->Finish(fail);
  } else if (ready) {
    Deliver(ready, op);
  }
}

bool Mailbox::Arrive(const std::shared_ptr<InboundMessage>& msg,
                     const KeepGoingFn& keep_going) {
  const uint64_t bytes = msg->header.payload_bytes;
  Key key{msg->peer, msg->header.tag};
  std::shared_ptr<RecvOp> mismatched;
  Status mismatch;
  const bool may_wait_for_post =
      late_post_wait_seconds_ > 0 && bytes > late_post_bytes_;
  // Read the clock only for messages that may wait (not per small message).
  const auto late_post_deadline =
      may_wait_for_post
          ? std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(late_post_wait_seconds_))
          : std::chrono::steady_clock::time_point::min();
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      auto posted = posted_.find(key);
      if (posted != posted_.end()) {
        auto& queue = posted->second;
        while (!queue.empty() && queue.front()->finished()) queue.pop_front();
        if (!queue.empty()) {
          std::shared_ptr<RecvOp> op = queue.front();
          queue.pop_front();
          mismatch = wire::CheckExpected(msg->peer, msg->header.tag,
                                         op->expected, msg->header.spec);
          if (mismatch.ok()) {
            op->Touch();
            msg->op = op;
          } else {
            msg->discard = true;
            mismatched = op;
          }
          break;
        }
      }
      if (may_wait_for_post && stopped_.ok() &&
          std::chrono::steady_clock::now() < late_post_deadline &&
          !HasPendingReceive(msg->peer)) {
        if (!keep_going()) return false;
        changed_.wait_until(
            lock, std::min(late_post_deadline,
                           std::chrono::steady_clock::now() +
                               std::chrono::milliseconds(kPollSliceMs)));
        continue;
      }
      if (unexpected_bytes_ + bytes <= limit_) {
        if (bytes > 0) msg->buffer.reset(new uint8_t[bytes]);
        unexpected_bytes_ += bytes;
        unexpected_[key].push_back(msg);
        break;
      }
      if (!keep_going()) return false;
      changed_.wait_for(lock, std::chrono::milliseconds(kPollSliceMs));
    }
  }
  if (mismatched) mismatched->Finish(mismatch);
  return true;
}

void Mailbox::UnexpectedComplete(const std::shared_ptr<InboundMessage>& msg) {
  std::shared_ptr<RecvOp> op;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::lock_guard<std::mutex> msg_lock(msg->mu_);
    if (msg->delivered_) return;
    if (msg->dropped_) {
      msg->delivered_ = true;
      unexpected_bytes_ -= msg->header.payload_bytes;
      msg->buffer.reset();
      changed_.notify_all();
      return;
    }
    if (!msg->claimed_by_) return;  // stays queued until its receive comes
    msg->delivered_ = true;
    op = std::move(msg->claimed_by_);
  }
  Deliver(msg, op);
}

void Mailbox::Deliver(const std::shared_ptr<InboundMessage>& msg,
                      const std::shared_ptr<RecvOp>& op) {
  const uint64_t bytes = msg->header.payload_bytes;
  if (op->BeginWrite()) {
    if (bytes > 0) std::memcpy(op->dst, msg->buffer.get(), bytes);
    op->EndWrite();
    op->Finish(Status::Ok());
  }
  {
    std::lock_guard<std::mutex> msg_lock(msg->mu_);
    msg->buffer.reset();
  }
  Release(bytes);
}

void Mailbox::Release(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  unexpected_bytes_ -= bytes;
  changed_.notify_all();
}

void Mailbox::FailPeer(int peer, const Status& status) {
  std::vector<std::shared_ptr<RecvOp>> doomed;
  std::vector<std::function<void(const Status&)>> watchers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_peers_.emplace(peer, status);
    for (auto& [key, queue] : unexpected_) {
      if (key.first != peer) continue;
      // Complete messages stay receivable; half-arrived ones never finish.
      auto keep = std::remove_if(queue.begin(), queue.end(), [&](auto& msg) {
        std::lock_guard<std::mutex> msg_lock(msg->mu_);
        if (msg->complete_) return false;
        msg->delivered_ = true;
        unexpected_bytes_ -= msg->header.payload_bytes;
        return true;
      });
      queue.erase(keep, queue.end());
    }
    for (auto& [key, queue] : posted_) {
      if (key.first == peer) queue.clear();
    }
    for (auto& op : pending_) {
      if (op->peer == peer) doomed.push_back(op);
    }
    auto [first, last] = watchers_.equal_range(peer);
    for (auto it = first; it != last; ++it)
      watchers.push_back(std::move(it->second));
    watchers_.erase(first, last);
    changed_.notify_all();
  }
  for (auto& op : doomed) op->Finish(status);
  for (auto& watcher : watchers) watcher(status);
}

void Mailbox::FailAll(const Status& status) {
  std::vector<std::shared_ptr<RecvOp>> doomed;
  std::multimap<int, std::function<void(const Status&)>> watchers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = status;
    posted_.clear();
    doomed.swap(pending_);
    watchers.swap(watchers_);
    changed_.notify_all();
  }
  for (auto& op : doomed) op->Finish(status);
  for (auto& [peer, watcher] : watchers) watcher(status);
}

void Mailbox::WatchPeer(int peer, std::function<void(const Status&)> on_lost) {
  Status already;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto failed = failed_peers_.find(peer);
    if (failed != failed_peers_.end()) {
      already = failed->second;
    } else if (!stopped_.ok()) {
      already = stopped_;
    } else {
      watchers_.emplace(peer, std::move(on_lost));
      return;
    }
  }
  on_lost(already);
}

void Mailbox::ExpireStalled(double timeout_seconds) {
  std::vector<std::shared_ptr<RecvOp>> stalled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto keep = std::remove_if(pending_.begin(), pending_.end(), [&](auto& op) {
      if (op->finished()) return true;
      if (timeout_seconds > 0 &&
          op->seconds_since_progress() > timeout_seconds) {
        stalled.push_back(op);
        return true;
      }
      return false;
    });
    pending_.erase(keep, pending_.end());
  }
  for (auto& op : stalled) {
    op->Finish(Status(StatusCode::kTimeout,
                      "recv from rank " + std::to_string(op->peer) + " tag " +
                          std::to_string(op->tag) + ": no progress for " +
                          FormatSeconds(timeout_seconds) + " (" +
                          std::to_string(op->contiguous_bytes()) + " of " +
                          std::to_string(op->expected.num_bytes()) +
                          " bytes of " + op->expected.ToString() +
                          " arrived)"));
  }
}

std::string Mailbox::DescribeUnreceived() const {
  constexpr int kKeysNamed = 8;  // a log line, not a dump
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t messages = 0, bytes = 0;
  int keys = 0;
  std::string named;
  for (const auto& [key, queue] : unexpected_) {
    if (queue.empty()) continue;
    for (const auto& msg : queue) bytes += msg->header.payload_bytes;
    messages += queue.size();
    if (keys++ < kKeysNamed) {
      named += std::string(named.empty() ? "" : ", ") + "rank " +
               std::to_string(key.first) + " tag " +
               std::to_string(key.second) +
               (queue.size() > 1 ? " x" + std::to_string(queue.size()) : "");
    }
  }
  if (messages == 0) return "";
  if (keys > kKeysNamed) {
    named += " and " + std::to_string(keys - kKeysNamed) + " more tags";
  }
  return std::to_string(messages) + " message" + (messages > 1 ? "s" : "") +
         " (" + std::to_string(bytes) + " bytes) never received: " + named;
}

uint64_t Mailbox::unexpected_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unexpected_bytes_;
}

}  // namespace hetjax
