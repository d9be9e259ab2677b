// One posted receive: where its bytes go, who to tell, and the guard that
// keeps link threads out of the caller's buffer once the receive has ended
// (timed out, failed, aborted) so the caller may free it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "cc/transport/bridge.h"

namespace hetjax {

class RecvOp {
 public:
  RecvOp(int peer, uint64_t tag, const TensorSpec& expected, void* dst,
         RecvProgressFn progress);

  const int peer;
  const uint64_t tag;
  const TensorSpec expected;
  uint8_t* const dst;

  // A link thread brackets every copy into `dst` with these. BeginWrite
  // returns false once the receive has ended: drain the bytes instead.
  bool BeginWrite();
  void EndWrite();
  // Checked between partial reads so a writer leaves soon after Finish.
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

  // The valid payload prefix grew (also counts as progress for timeouts).
  void Report(uint64_t contiguous_bytes);
  // Bytes are flowing but the prefix did not grow (striped chunks).
  void Touch();
  // Ends the receive; the first call wins. Waits until no writer is inside
  // `dst`, then makes the final progress call.
  void Finish(const Status& status);

  bool finished() const;
  uint64_t contiguous_bytes() const;
  double seconds_since_progress() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable writers_gone_;
  RecvProgressFn progress_;
  int writers_ = 0;
  bool finished_ = false;
  uint64_t contiguous_ = 0;
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> last_progress_ns_;
};

}  // namespace hetjax
