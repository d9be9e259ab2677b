#include "cc/transport/peer_link.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "cc/transport/format.h"
#include "cc/transport/shm_ring.h"
#include "cc/transport/tcp_stream.h"

namespace hetjax {
namespace {

// Payloads up to this size go out in one write together with their header.
constexpr uint64_t kCoalesceBytes = 64 << 10;

}  // namespace

PeerLink::PeerLink(int peer, const BridgeOptions& options, Mailbox* mailbox,
                   Counters* counters)
    : peer_(peer), options_(options), mailbox_(mailbox), counters_(counters) {}

PeerLink::~PeerLink() {
  Stop();
  Join();
}

Status PeerLink::AddTcpStreams(const std::vector<int>& fds) {
  std::vector<std::unique_ptr<ByteStream>> streams;
  Status status;
  for (int fd : fds) {
    std::unique_ptr<ByteStream> io;
    // Keep converting after a failure so every fd is owned and closed.
    Status made = MakeTcpStream(fd, &io);
    if (made.ok()) {
      streams.push_back(std::move(io));
    } else if (status.ok()) {
      status = made;
    }
  }
  if (!status.ok()) return status;
  if (streams.empty()) {
    return Status(
        StatusCode::kInvalidArgument,
        "AddTcpPeer(" + std::to_string(peer_) + "): no sockets given");
  }
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (!tcp_streams_.empty()) {
      return Status(StatusCode::kInvalidArgument,
                    "rank " + std::to_string(peer_) +
                        " already has tcp streams attached");
    }
  }
  for (auto& io : streams) StartStream(std::move(io), /*is_shm=*/false);
  return Status::Ok();
}

Status PeerLink::AttachShm(const std::string& outbound_name,
                           const std::string& inbound_name,
                           uint64_t ring_bytes) {
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (!data_streams_.empty()) {
      return Status(StatusCode::kInvalidArgument,
                    "rank " + std::to_string(peer_) +
                        " already has shm rings or verbs attached");
    }
  }
  std::unique_ptr<ByteStream> io;
  Status status = MakeShmStream(outbound_name, inbound_name, ring_bytes,
                                options_.timeout_seconds, &io);
  if (!status.ok()) return status;
  StartStream(std::move(io), /*carries_data=*/true);
  return Status::Ok();
}

Status PeerLink::AttachVerbs(std::vector<std::unique_ptr<ByteStream>> streams) {
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (!data_streams_.empty()) {
      return Status(StatusCode::kInvalidArgument,
                    "rank " + std::to_string(peer_) +
                        " already has shm rings or verbs attached");
    }
  }
  for (auto& io : streams) StartStream(std::move(io), /*carries_data=*/true);
  return Status::Ok();
}

void PeerLink::StartStream(std::unique_ptr<ByteStream> io, bool carries_data) {
  auto stream = std::make_unique<Stream>();
  stream->io = WatchReads(std::move(io), &liveness_);
  liveness_.Heard();  // the silence clock starts with the first stream
  Stream* raw = stream.get();
  std::lock_guard<std::mutex> lock(send_mu_);
  if (stopping_.load()) {
    raw->io->Shutdown();
  }
  raw->reader = std::thread([this, raw] { ReaderLoop(raw); });
  raw->writer = std::thread([this, raw] { WriterLoop(raw); });
  if (carries_data) {
    data_streams_.push_back(std::move(stream));
  } else {
    tcp_streams_.push_back(std::move(stream));
  }
}

Status PeerLink::ReserveEager(uint64_t bytes, uint64_t tag) {
  // The eager queue is bounded like the receiver's unexpected buffer, so a
  // sender far ahead of its receiver stops instead of eating memory.
  const uint64_t limit =
      std::max(options_.unexpected_limit_bytes, options_.eager_limit_bytes);
  std::unique_lock<std::mutex> lock(eager_mu_);
  auto last_progress = std::chrono::steady_clock::now();
  uint64_t last_queued = eager_queued_;
  while (eager_queued_ > 0 && eager_queued_ + bytes > limit) {
    Status status = LinkStatus();
    if (!status.ok()) return status;
    if (eager_queued_ < last_queued) {
      last_progress = std::chrono::steady_clock::now();
    }
    last_queued = eager_queued_;
    double waited = std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - last_progress)
                        .count();
    if (options_.timeout_seconds > 0 && waited > options_.timeout_seconds) {
      return Status(StatusCode::kTimeout,
                    "send to rank " + std::to_string(peer_) + " tag " +
                        std::to_string(tag) + ": " +
                        std::to_string(eager_queued_) +
                        " bytes of earlier sends made no progress for " +
                        FormatSeconds(options_.timeout_seconds));
    }
    eager_room_.wait_for(lock, std::chrono::milliseconds(kPollSliceMs));
  }
  eager_queued_ += bytes;
  return Status::Ok();
}

void PeerLink::ReleaseEager(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(eager_mu_);
  eager_queued_ -= bytes;
  eager_room_.notify_all();
}

Status PeerLink::LinkStatus() {
  std::lock_guard<std::mutex> lock(send_mu_);
  if (!lost_.ok()) return lost_;
  if (stopping_.load() || closing_) {
    return Status(StatusCode::kAborted, "the bridge is stopping");
  }
  return Status::Ok();
}

Status PeerLink::Send(const wire::FrameHeader& header, const void* data,
                      std::unique_ptr<uint8_t[]> owned, ChunkReadyFn ready,
                      SendDoneFn done) {
  auto op = std::make_shared<SendOp>(header, data, std::move(owned),
                                     std::move(ready), std::move(done));
  const uint64_t bytes = header.payload_bytes;
  const uint64_t chunk = std::max<uint64_t>(1, options_.chunk_bytes);
  const uint64_t chunks = std::max<uint64_t>(1, (bytes + chunk - 1) / chunk);
  op->set_chunks(chunks);
  Status refused;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (!lost_.ok()) {
      refused = lost_;
    } else if (stopping_.load() || closing_) {
      refused = Status(StatusCode::kAborted, "the bridge is stopping");
    } else if (tcp_streams_.empty()) {
      refused =
          Status(StatusCode::kInvalidArgument,
                 "no transport attached to rank " + std::to_string(peer_));
    } else {
      // Queued under send_mu_ so every stream's queue is in sequence order.
      const uint64_t seq = next_send_seq_++;
      op->header.sequence = seq;
      for (uint64_t i = 0; i < chunks; ++i) {
        const auto& streams =
            data_streams_.empty() ? tcp_streams_ : data_streams_;
        Stream* target = streams[(seq + i) % streams.size()].get();
        OutboundFrame frame{op, i * chunk, std::min(chunk, bytes - i * chunk)};
        std::lock_guard<std::mutex> queue_lock(target->mu);
        target->queue.push_back(std::move(frame));
        target->queued.notify_one();
      }
    }
  }
  if (!refused.ok()) {
    op->set_chunks(1);
    op->ChunkFinished(refused);
  }
  return refused;
}

void PeerLink::WriterLoop(Stream* stream) {
  while (true) {
    OutboundFrame frame;
    {
      std::unique_lock<std::mutex> lock(stream->mu);
      stream->queued.wait(lock, [&] {
        return (!stream->queue.empty() && !stream->busy) ||
               (stream->queue.empty() && stopping_.load());
      });
      if (stream->queue.empty()) return;
      frame = std::move(stream->queue.front());
      stream->queue.pop_front();
      stream->busy = true;
    }
    Status status = WriteOne(stream, frame);
    {
      std::lock_guard<std::mutex> lock(stream->mu);
      stream->busy = false;
    }
    FinishFrame(frame, status);
  }
}

void PeerLink::FinishFrame(const OutboundFrame& frame, const Status& status) {
  const uint64_t bytes = frame.op->header.payload_bytes;
  const bool ok = status.ok();
  const bool heartbeat = (frame.op->header.flags & wire::kFlagHeartbeat) != 0;
  if (frame.op->ChunkFinished(status) && ok && !heartbeat) {
    counters_->messages_sent.fetch_add(1);
    counters_->bytes_sent.fetch_add(bytes);
  }
}

Status PeerLink::WriteOne(Stream* stream, const OutboundFrame& frame) {
  Status status = LinkStatus();
  if (status.ok() && frame.op->failed()) {
    status = Status(StatusCode::kAborted, "an earlier chunk failed");
  }
  if (!status.ok()) return status;
  if (frame.op->ready) frame.op->ready(frame.offset, frame.length);
  status = WriteFrame(stream, frame);
  if (status.ok()) return status;
  if (status.code() == StatusCode::kAborted) {
    Status link = LinkStatus();
    return link.ok() ? Status(StatusCode::kAborted, "the bridge is stopping")
                     : link;
  }
  if ((frame.op->header.flags & wire::kFlagHeartbeat) != 0 &&
      status.code() == StatusCode::kPeerLost) {
    // The connection is gone under a heartbeat: let the reader say why (a
    // goodbye it has yet to read means an orderly stop, not a failure).
    return status;
  }
  // A half-written frame leaves the stream unusable: the pair is lost.
  std::string what = "send to rank " + std::to_string(peer_) + " tag " +
                     std::to_string(frame.op->header.tag) + ": " +
                     status.message();
  MarkLost(what);
  return Status(status.code(), what);
}

Status PeerLink::SendSmall(const wire::FrameHeader& header, const void* data) {
  const uint64_t bytes = header.payload_bytes;
  if (bytes <= options_.chunk_bytes) {
    // Fast path: if the stream this message would use is idle, the caller
    // writes the frame itself, straight from its buffer: no copy, and no
    // hand-off to the writer thread (a wake-up each way dominates the
    // latency of small messages).
    Stream* target = nullptr;
    std::shared_ptr<SendOp> op;
    {
      std::lock_guard<std::mutex> lock(send_mu_);
      if (lost_.ok() && !stopping_.load() && !closing_ &&
          !tcp_streams_.empty()) {
        const auto& streams =
            data_streams_.empty() ? tcp_streams_ : data_streams_;
        Stream* candidate = streams[next_send_seq_ % streams.size()].get();
        std::lock_guard<std::mutex> queue_lock(candidate->mu);
        if (candidate->queue.empty() && !candidate->busy) {
          candidate->busy = true;
          target = candidate;
          op =
              std::make_shared<SendOp>(header, data, nullptr, nullptr, nullptr);
          op->header.sequence = next_send_seq_++;
        }
      }
    }
    if (target != nullptr) {
      OutboundFrame frame{op, 0, bytes};
      Status status = WriteOne(target, frame);
      {
        std::lock_guard<std::mutex> lock(target->mu);
        target->busy = false;
        target->queued.notify_one();
      }
      FinishFrame(frame, status);
      return status;
    }
  }
  // The stream is busy: copy, queue, return.
  Status status = ReserveEager(bytes, header.tag);
  if (!status.ok()) return status;
  std::unique_ptr<uint8_t[]> copy(new uint8_t[bytes + 1]);
  if (bytes > 0) std::memcpy(copy.get(), data, bytes);
  // Failures after we return surface on the next call to this peer (the
  // link is then lost), as with MPI's buffered sends.
  return Send(header, nullptr, std::move(copy), nullptr,
              [this, bytes](const Status&) { ReleaseEager(bytes); });
}

Status PeerLink::WriteFrame(Stream* stream, const OutboundFrame& frame) {
  wire::FrameHeader header = frame.op->header;
  header.chunk_offset = frame.offset;
  header.chunk_length = frame.length;
  const uint8_t* payload = frame.op->data + frame.offset;
  auto keep_going = [this] { return KeepGoing(); };
  const double timeout = options_.timeout_seconds;
  if (frame.length <= kCoalesceBytes) {
    stream->scratch.resize(wire::kHeaderBytes + frame.length);
    wire::EncodeHeader(header, stream->scratch.data());
    if (frame.length > 0) {
      std::memcpy(stream->scratch.data() + wire::kHeaderBytes, payload,
                  frame.length);
    }
    return WriteExactly(*stream->io, stream->scratch.data(),
                        stream->scratch.size(), timeout, keep_going);
  }
  uint8_t encoded[wire::kHeaderBytes];
  wire::EncodeHeader(header, encoded);
  Status status =
      WriteExactly(*stream->io, encoded, sizeof(encoded), timeout, keep_going);
  if (!status.ok()) return status;
  return WriteExactly(*stream->io, payload, frame.length, timeout, keep_going);
}

void PeerLink::ReaderLoop(Stream* stream) {
  auto keep_going = [this] { return KeepGoing(); };
  uint8_t encoded[wire::kHeaderBytes];
  while (true) {
    Status status =
        ReadExactly(*stream->io, encoded, sizeof(encoded), keep_going);
    if (!status.ok()) {
      if (status.code() != StatusCode::kAborted) MarkLost(status.message());
      return;
    }
    wire::FrameHeader header;
    status = wire::ParseHeader(encoded, options_.max_message_bytes, &header);
    if (!status.ok()) {
      MarkLost("it sent a bad frame on " + stream->io->Describe() + ": " +
               status.message());
      return;
    }
    if ((header.flags & wire::kFlagGoodbye) != 0) {
      // Nothing more will come on this stream; once every stream has said
      // so, the peer has stopped in order.
      bool all_said_goodbye;
      {
        std::lock_guard<std::mutex> lock(send_mu_);
        size_t streams = tcp_streams_.size() + data_streams_.size();
        all_said_goodbye = ++goodbyes_received_ >= static_cast<int>(streams);
      }
      if (all_said_goodbye) MarkLost("it stopped its bridge");
      return;
    }
    if (header.source != peer_) {
      MarkLost("a frame on " + stream->io->Describe() + " claims source rank " +
               std::to_string(header.source));
      return;
    }
    if ((header.flags & wire::kFlagHeartbeat) != 0) continue;  // heard: done
    std::shared_ptr<InboundMessage> msg = FindOrOpen(header, &status);
    if (!msg) {
      if (!status.ok()) MarkLost(status.message());
      return;
    }
    status = ReadChunk(stream, msg, header);
    if (!status.ok()) {
      if (status.code() != StatusCode::kAborted) MarkLost(status.message());
      return;
    }
    last_tag_received_.store(static_cast<int64_t>(header.tag));
    if (msg->AddChunk(header.chunk_offset, header.chunk_length)) {
      Completed(msg);
    }
  }
}

Status PeerLink::ReadChunk(Stream* stream,
                           const std::shared_ptr<InboundMessage>& msg,
                           const wire::FrameHeader& header) {
  auto keep_going = [this] { return KeepGoing(); };
  const uint64_t offset = header.chunk_offset;
  const uint64_t length = header.chunk_length;
  if (msg->op) {
    RecvOp* op = msg->op.get();
    if (!op->BeginWrite()) return DrainExactly(*stream->io, length, keep_going);
    size_t done = 0;
    Status status = ReadExactly(
        *stream->io, op->dst + offset, length,
        [&] { return KeepGoing() && !op->cancelled(); }, &done);
    op->EndWrite();
    if (status.code() == StatusCode::kAborted && KeepGoing()) {
      // The receive ended (timed out) mid-chunk: keep the stream in frame.
      return DrainExactly(*stream->io, length - done, keep_going);
    }
    return status;
  }
  if (msg->buffer) {
    return ReadExactly(*stream->io, msg->buffer.get() + offset, length,
                       keep_going);
  }
  return DrainExactly(*stream->io, length, keep_going);
}

std::shared_ptr<InboundMessage> PeerLink::FindOrOpen(
    const wire::FrameHeader& header, Status* error) {
  *error = Status::Ok();
  const uint64_t seq = header.sequence;
  std::unique_lock<std::mutex> lock(recv_mu_);
  while (KeepGoing()) {
    auto it = open_.find(seq);
    if (it != open_.end()) {
      if (!it->second.matched) {
        recv_changed_.wait_for(lock, std::chrono::milliseconds(kPollSliceMs));
        continue;
      }
      const wire::FrameHeader& first = it->second.msg->header;
      if (first.tag != header.tag || first.spec != header.spec ||
          first.payload_bytes != header.payload_bytes) {
        *error = Status(StatusCode::kPeerLost,
                        "frames of message " + std::to_string(seq) +
                            " disagree: tag " + std::to_string(first.tag) +
                            " " + first.spec.ToString() + " vs tag " +
                            std::to_string(header.tag) + " " +
                            header.spec.ToString());
        return nullptr;
      }
      return it->second.msg;
    }
    if (seq < next_match_seq_) {
      *error = Status(StatusCode::kPeerLost,
                      "a frame of message " + std::to_string(seq) +
                          " came after the message was complete");
      return nullptr;
    }
    if (seq == next_match_seq_) {
      auto msg = std::make_shared<InboundMessage>(peer_, header);
      open_[seq].msg = msg;
      lock.unlock();
      // Outside our lock: may wait for buffer space (back-pressure), while
      // other streams keep filling messages already matched.
      bool matched;
      {
        Liveness::LocalWait waiting_on_us(&liveness_);  // not the peer's fault
        matched = mailbox_->Arrive(msg, [this] { return KeepGoing(); });
      }
      lock.lock();
      if (!matched) return nullptr;
      open_[seq].matched = true;
      ++next_match_seq_;
      recv_changed_.notify_all();
      return msg;
    }
    recv_changed_.wait_for(lock, std::chrono::milliseconds(kPollSliceMs));
  }
  return nullptr;
}

void PeerLink::Completed(const std::shared_ptr<InboundMessage>& msg) {
  {
    std::lock_guard<std::mutex> lock(recv_mu_);
    open_.erase(msg->header.sequence);
  }
  counters_->messages_received.fetch_add(1);
  counters_->bytes_received.fetch_add(msg->header.payload_bytes);
  if (msg->op) {
    msg->op->Finish(Status::Ok());
  } else if (!msg->discard) {
    mailbox_->UnexpectedComplete(msg);
  }
}

void PeerLink::MarkLost(const std::string& why) {
  Status lost;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (!lost_.ok() || stopping_.load()) return;
    int64_t tag = last_tag_received_.load();
    lost_ = Status(StatusCode::kPeerLost,
                   "peer rank " + std::to_string(peer_) + " lost: " + why +
                       (tag < 0 ? " (no message received from it yet)"
                                : " (last tag received from it: " +
                                      std::to_string(tag) + ")"));
    lost = lost_;
    lost_flag_.store(true);
    for (auto& stream : tcp_streams_) stream->io->Shutdown();
    for (auto& stream : data_streams_) stream->io->Shutdown();
  }
  for (auto& stream : tcp_streams_) stream->queued.notify_all();
  for (auto& stream : data_streams_) stream->queued.notify_all();
  recv_changed_.notify_all();
  eager_room_.notify_all();
  mailbox_->FailPeer(peer_, lost);
}

void PeerLink::Flush(double seconds) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  auto idle = [this] {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (!lost_.ok() || stopping_.load()) return true;
    auto stream_idle = [](Stream* stream) {
      std::lock_guard<std::mutex> queue_lock(stream->mu);
      return stream->queue.empty() && !stream->busy;
    };
    for (auto& stream : tcp_streams_) {
      if (!stream_idle(stream.get())) return false;
    }
    for (auto& stream : data_streams_) {
      if (!stream_idle(stream.get())) return false;
    }
    return true;
  };
  while (!idle() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void PeerLink::SayGoodbye() {
  std::vector<Stream*> streams;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (!lost_.ok()) return;
    closing_ = true;  // no new frames behind the goodbye
    for (auto& stream : tcp_streams_) streams.push_back(stream.get());
    for (auto& stream : data_streams_) streams.push_back(stream.get());
  }
  wire::FrameHeader header;
  header.source = options_.rank;
  header.flags = wire::kFlagGoodbye;
  header.spec.dtype = DType::kBytes;
  header.spec.rank = 1;
  uint8_t encoded[wire::kHeaderBytes];
  wire::EncodeHeader(header, encoded);
  // A heartbeat queued just before closing_ may still be on its way out;
  // it is short, so wait for it rather than skip the stream's goodbye.
  const auto beat_deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (Stream* stream : streams) {
    {
      std::unique_lock<std::mutex> lock(stream->mu);
      while ((stream->busy || !stream->queue.empty()) &&
             std::chrono::steady_clock::now() < beat_deadline) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        lock.lock();
      }
      if (stream->busy || !stream->queue.empty()) continue;  // flush gave up
      stream->busy = true;  // for good: we are stopping
    }
    WriteExactly(*stream->io, encoded, sizeof(encoded), /*timeout=*/1.0,
                 [this] { return KeepGoing(); });
  }
}

void PeerLink::Stop() {
  std::lock_guard<std::mutex> lock(send_mu_);
  stopping_.store(true);
  auto wake = [](Stream* stream) {
    stream->io->Shutdown();
    std::lock_guard<std::mutex> queue_lock(stream->mu);
    stream->queued.notify_all();
  };
  for (auto& stream : tcp_streams_) wake(stream.get());
  for (auto& stream : data_streams_) wake(stream.get());
  recv_changed_.notify_all();
  eager_room_.notify_all();
}

void PeerLink::Join() {
  std::vector<Stream*> streams;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    for (auto& stream : tcp_streams_) streams.push_back(stream.get());
    for (auto& stream : data_streams_) streams.push_back(stream.get());
  }
  for (Stream* stream : streams) {
    if (stream->reader.joinable()) stream->reader.join();
    if (stream->writer.joinable()) stream->writer.join();
    // Writers drain their queues before leaving; this catches the rest.
    std::deque<OutboundFrame> left;
    {
      std::lock_guard<std::mutex> lock(stream->mu);
      left.swap(stream->queue);
    }
    for (auto& frame : left) {
      frame.op->ChunkFinished(
          Status(StatusCode::kAborted, "the bridge is stopping"));
    }
  }
}

}  // namespace hetjax
