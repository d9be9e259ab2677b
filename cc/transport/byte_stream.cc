#include "cc/transport/byte_stream.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>

#include "cc/transport/format.h"

namespace hetjax {

Status ReadExactly(ByteStream& stream, void* dst, size_t len,
                   const KeepGoingFn& keep_going, size_t* done) {
  auto* out = static_cast<uint8_t*>(dst);
  size_t have = 0;
  Status status;
  while (have < len) {
    if (!keep_going()) {
      status = Status(StatusCode::kAborted, "read abandoned");
      break;
    }
    size_t got = 0;
    status = stream.ReadSome(out + have, len - have, kPollSliceMs, &got);
    if (!status.ok()) break;
    have += got;
  }
  if (done != nullptr) *done = have;
  return status;
}

Status DrainExactly(ByteStream& stream, size_t len,
                    const KeepGoingFn& keep_going) {
  constexpr size_t kScratchBytes = 256 << 10;
  std::unique_ptr<uint8_t[]> scratch(
      new uint8_t[std::min(len, kScratchBytes) + 1]);
  while (len > 0) {
    size_t piece = std::min(len, kScratchBytes);
    Status status = ReadExactly(stream, scratch.get(), piece, keep_going);
    if (!status.ok()) return status;
    len -= piece;
  }
  return Status::Ok();
}

Status WriteExactly(ByteStream& stream, const void* src, size_t len,
                    double timeout_seconds, const KeepGoingFn& keep_going) {
  using Clock = std::chrono::steady_clock;
  const auto* in = static_cast<const uint8_t*>(src);
  auto last_progress = Clock::now();
  size_t sent = 0;
  while (sent < len) {
    if (!keep_going()) return Status(StatusCode::kAborted, "write abandoned");
    size_t put = 0;
    Status status = stream.WriteSome(in + sent, len - sent, kPollSliceMs, &put);
    if (!status.ok()) return status;
    if (put > 0) {
      sent += put;
      last_progress = Clock::now();
    } else if (timeout_seconds > 0 &&
               std::chrono::duration<double>(Clock::now() - last_progress)
                       .count() > timeout_seconds) {
      return Status(StatusCode::kTimeout, stream.Describe() +
                                              " took no data for " +
                                              FormatSeconds(timeout_seconds));
    }
  }
  return Status::Ok();
}

}  // namespace hetjax
