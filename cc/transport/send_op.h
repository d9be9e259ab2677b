// One outgoing message while its frames wait in stream queues or are being
// written; and the counters the whole bridge shares.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "cc/transport/bridge.h"
#include "cc/transport/wire.h"

namespace hetjax {

struct Counters {
  std::atomic<uint64_t> messages_sent{0}, messages_received{0};
  std::atomic<uint64_t> bytes_sent{0}, bytes_received{0};
};

class SendOp {
 public:
  SendOp(const wire::FrameHeader& header, const void* data,
         std::unique_ptr<uint8_t[]> owned, ChunkReadyFn ready, SendDoneFn done)
      : header(header),
        data(owned ? owned.get() : static_cast<const uint8_t*>(data)),
        ready(std::move(ready)),
        owned_(std::move(owned)),
        done_(std::move(done)) {}

  // `sequence` is set by PeerLink::Send before any frame is queued; the
  // chunk fields are filled per frame.
  wire::FrameHeader header;
  const uint8_t* const data;
  const ChunkReadyFn ready;

  void set_chunks(uint64_t count) { chunks_left_.store(count); }
  // Records one frame's fate; after the last one, runs `done` with the first
  // error (or ok) and returns true.
  bool ChunkFinished(const Status& status) {
    if (!status.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.ok()) error_ = status;
    }
    if (chunks_left_.fetch_sub(1) != 1) return false;
    Status final_status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      final_status = error_;
    }
    if (done_) done_(final_status);
    done_ = nullptr;
    owned_.reset();
    return true;
  }
  bool failed() {
    std::lock_guard<std::mutex> lock(mu_);
    return !error_.ok();
  }

 private:
  std::unique_ptr<uint8_t[]> owned_;  // eager copy, when there is one
  SendDoneFn done_;
  std::atomic<uint64_t> chunks_left_{1};
  std::mutex mu_;
  Status error_;
};

// One frame of a SendOp in a stream's queue.
struct OutboundFrame {
  std::shared_ptr<SendOp> op;
  uint64_t offset = 0;
  uint64_t length = 0;
};

}  // namespace hetjax
