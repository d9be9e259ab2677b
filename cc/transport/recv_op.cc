#include "cc/transport/recv_op.h"

#include <utility>

#include "cc/transport/monotonic_clock.h"

namespace hetjax {

RecvOp::RecvOp(int peer, uint64_t tag, const TensorSpec& expected, void* dst,
               RecvProgressFn progress)
    : peer(peer),
      tag(tag),
      expected(expected),
      dst(static_cast<uint8_t*>(dst)),
      progress_(std::move(progress)),
      last_progress_ns_(MonotonicNs()) {}

bool RecvOp::BeginWrite() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return false;
  ++writers_;
  return true;
}

void RecvOp::EndWrite() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--writers_ == 0) writers_gone_.notify_all();
  last_progress_ns_.store(MonotonicNs(), std::memory_order_relaxed);
}

void RecvOp::Report(uint64_t contiguous_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  last_progress_ns_.store(MonotonicNs(), std::memory_order_relaxed);
  if (finished_ || contiguous_bytes <= contiguous_) return;
  contiguous_ = contiguous_bytes;
  if (progress_) progress_(contiguous_, false, Status::Ok());
}

void RecvOp::Touch() {
  last_progress_ns_.store(MonotonicNs(), std::memory_order_relaxed);
}

void RecvOp::Finish(const Status& status) {
  std::unique_lock<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  cancelled_.store(true, std::memory_order_relaxed);
  writers_gone_.wait(lock, [&] { return writers_ == 0; });
  if (status.ok()) contiguous_ = expected.num_bytes();
  // Called under our lock so it is ordered after every Report; callbacks
  // must not call back into the bridge (bridge.h).
  if (progress_) progress_(contiguous_, true, status);
  progress_ = nullptr;  // drop captured state (promises, buffers) now
}

bool RecvOp::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

uint64_t RecvOp::contiguous_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return contiguous_;
}

double RecvOp::seconds_since_progress() const {
  return SecondsSince(last_progress_ns_.load(std::memory_order_relaxed));
}

}  // namespace hetjax
