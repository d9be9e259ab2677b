// Errors of asynchronous GPU comm ops. Once a send or recv handler has
// returned, its failure (peer lost, mismatch, a wait that timed out) can no
// longer be returned to XLA; it is kept here and raised by the next hetjax
// GPU op of the process, so a failed message never goes unnoticed.
#pragma once

#include <mutex>
#include <utility>

#include "cc/transport/status.h"

namespace hetjax::gpu {

class DeferredError {
 public:
  // Keeps the first error: later ones are usually its consequences.
  void Record(Status status) {
    if (status.ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (first_.ok()) first_ = std::move(status);
  }
  // The recorded error (cleared), or ok.
  Status Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(first_, Status::Ok());
  }

 private:
  std::mutex mu_;
  Status first_;
};

}  // namespace hetjax::gpu
