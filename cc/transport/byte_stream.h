// A byte pipe to one peer (a tcp socket, or a pair of shared-memory rings),
// with bounded waits so the threads that use it can notice shutdown, cancelled
// receives and stalled peers instead of blocking forever.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "cc/transport/status.h"

namespace hetjax {

class ByteStream {
 public:
  virtual ~ByteStream() = default;
  // Copies up to `max` bytes that are available now or within `wait_ms`.
  // *got == 0 means nothing came in time. End of stream or a broken
  // connection is an error (kPeerLost) naming the stream.
  virtual Status ReadSome(void* dst, size_t max, int wait_ms, size_t* got) = 0;
  // Hands up to `len` bytes to the transport, waiting at most `wait_ms` for
  // room. *put == 0 means no room came in time.
  virtual Status WriteSome(const void* src, size_t len, int wait_ms,
                           size_t* put) = 0;
  // Wakes blocked calls on every thread; later calls fail. Tells the peer
  // (tcp: FIN) so it sees us go.
  virtual void Shutdown() = 0;
  // "tcp fd 7", "shm /hetjax-0-1": for error messages.
  virtual std::string Describe() const = 0;
};

// Returns false to abandon a read or write (shutdown, cancelled receive).
using KeepGoingFn = std::function<bool()>;

// How long one wait inside ReadExactly/WriteExactly may last before the
// KeepGoingFn is asked again: bounds how late a shutdown is noticed.
inline constexpr int kPollSliceMs = 20;

// Reads exactly `len` bytes. kAborted when keep_going() turned false
// (*done tells how far it got), stream errors as they come.
Status ReadExactly(ByteStream& stream, void* dst, size_t len,
                   const KeepGoingFn& keep_going, size_t* done = nullptr);
// Reads and throws away `len` bytes (mismatched or cancelled payloads).
Status DrainExactly(ByteStream& stream, size_t len,
                    const KeepGoingFn& keep_going);
// Writes exactly `len` bytes. kTimeout when the peer took nothing for
// `timeout_seconds` (<= 0: wait forever), kAborted as for ReadExactly.
Status WriteExactly(ByteStream& stream, const void* src, size_t len,
                    double timeout_seconds, const KeepGoingFn& keep_going);

}  // namespace hetjax
