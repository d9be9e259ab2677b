// The messages of one collective op in flight: receives posted ahead of time,
// sends started without waiting, and waits on them in whatever order the
// algorithm needs. Lets an algorithm overlap the wire with its own reduction
// (post everything, then reduce piece k while piece k+1 still arrives).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>

#include "cc/transport/bridge.h"

namespace hetjax::collectives {

// A 1-D spec: every collective message is a flat run of elements.
TensorSpec FlatSpec(DType dtype, uint64_t elements);

class Transfers {
 public:
  explicit Transfers(Bridge* bridge) : bridge_(bridge) {}
  // Waits for every transfer still in flight: their buffers are the caller's
  // and must not be freed under the engine. On error paths this waits at most
  // the bridge timeout (there is no cancel).
  ~Transfers();
  Transfers(const Transfers&) = delete;
  Transfers& operator=(const Transfers&) = delete;

  // Posts a receive into `dst`; returns its id for Wait.
  size_t Recv(int peer, uint64_t tag, const TensorSpec& spec, void* dst);
  // Starts a send; `src` must stay valid until WaitAll returns.
  void Send(int peer, uint64_t tag, const TensorSpec& spec, const void* src);

  // Blocks until receive `id` completed; its status.
  Status Wait(size_t id);
  // Blocks until every send and receive completed; the first failure.
  Status WaitAll();

 private:
  struct RecvState {
    bool done = false;
    Status status;
  };
  Bridge* bridge_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RecvState> recvs_;  // deque: ids stay valid as it grows
  size_t sends_in_flight_ = 0;
  Status first_send_error_;
};

}  // namespace hetjax::collectives
