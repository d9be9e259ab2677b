// A tiny result type: the transport must not depend on absl or XLA, and
// exceptions must not cross the FFI boundary.
#pragma once

#include <string>
#include <utility>

namespace hetjax {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // caller error: bad peer, bad spec
  kMismatch,           // header disagrees with what the receiver expected
  kTimeout,            // nothing arrived within the configured timeout
  kPeerLost,           // connection to the peer closed or failed
  kResourceExhausted,  // unexpected-message buffer full, absurd sizes
  kAborted,            // bridge shutting down or aborted
  kInternal,
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace hetjax
