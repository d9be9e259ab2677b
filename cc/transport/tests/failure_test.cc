// What a receiver sees when things go wrong: the peer goes away, sends
// garbage or a hostile size, nothing arrives, the receiver stops, or the
// peer stops reading while we send.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "cc/transport/tests/bridge_pair.h"
#include "cc/transport/wire.h"
#include "gtest/gtest.h"

namespace hetjax {
namespace {

using testing::AttachShm;
using testing::ConnectRaw;
using testing::ConnectTcp;
using testing::Pattern;
using testing::Spec;
using testing::TestOptions;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

TEST(FailureTest, PeerGoneFailsPendingAndLaterReceives) {
  auto pair = ConnectTcp(2);
  uint32_t word = 0;
  ASSERT_TRUE(pair.rank1->Send(0, 5, Spec(DType::kU32, {}), &word).ok());
  ASSERT_TRUE(pair.rank0->Recv(1, 5, Spec(DType::kU32, {}), &word).ok());
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pair.rank1.reset();  // stops: its sockets close
  });
  Status pending = pair.rank0->Recv(1, 6, Spec(DType::kU32, {}), &word);
  closer.join();
  EXPECT_EQ(pending.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(pending.message(), "peer rank 1 lost");
  EXPECT_CONTAINS(pending.message(), "last tag received from it: 5");
  Status later = pair.rank0->Recv(1, 7, Spec(DType::kU32, {}), &word);
  EXPECT_EQ(later.code(), StatusCode::kPeerLost);
  Status send = pair.rank0->Send(1, 8, Spec(DType::kU32, {}), &word);
  EXPECT_EQ(send.code(), StatusCode::kPeerLost);
}

TEST(FailureTest, OrderlyStopDeliversEverythingSentBeforeIt) {
  // Sender queues more than its streams can take at once, then stops at
  // once: Stop flushes, says goodbye on every stream, and only then does
  // the receiver consider the peer gone.
  BridgeOptions sender = TestOptions(1);
  sender.eager_limit_bytes = 256 << 10;
  auto pair = ConnectTcp(3, TestOptions(0), sender);
  AttachShm(pair, 64 << 10);
  for (int i = 0; i < 20; ++i) {
    auto data = Pattern(200 << 10, i);
    ASSERT_TRUE(
        pair.rank1->Send(0, i, Spec(DType::kU8, {200 << 10}), data.data())
            .ok());
  }
  pair.rank1.reset();
  std::vector<uint8_t> out(200 << 10);
  for (int i = 0; i < 20; ++i) {
    Status s =
        pair.rank0->Recv(1, i, Spec(DType::kU8, {200 << 10}), out.data());
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(out, Pattern(200 << 10, i));
  }
  uint8_t byte;
  Status after = pair.rank0->Recv(1, 99, Spec(DType::kU8, {1}), &byte);
  EXPECT_EQ(after.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(after.message(),
                  "peer rank 1 lost: it stopped its bridge (last tag "
                  "received from it: 19)");
}

TEST(FailureTest, MessagesThatArrivedBeforeTheLossStayReceivable) {
  auto pair = ConnectTcp(1);
  auto data = Pattern(2000, 1);
  ASSERT_TRUE(
      pair.rank1->Send(0, 1, Spec(DType::kU8, {2000}), data.data()).ok());
  ASSERT_TRUE(testing::WaitFor(
      [&] { return pair.rank0->GetStats().messages_received == 1; }, 10));
  pair.rank1.reset();
  std::vector<uint8_t> out(2000);
  ASSERT_TRUE(
      pair.rank0->Recv(1, 1, Spec(DType::kU8, {2000}), out.data()).ok());
  EXPECT_EQ(out, data);
}

TEST(FailureTest, ShmPeerLossIsSeenThroughTheTcpSocket) {
  auto pair = ConnectTcp(1);
  AttachShm(pair, 64 << 10);
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pair.rank1.reset();
  });
  std::vector<uint8_t> out(1 << 20);
  Status status =
      pair.rank0->Recv(1, 1, Spec(DType::kU8, {1 << 20}), out.data());
  closer.join();
  EXPECT_EQ(status.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(status.message(), "no message received from it yet");
}

TEST(FailureTest, GarbageOnTheWireLosesThePeerWithTheReason) {
  auto raw = ConnectRaw(TestOptions(0));
  std::vector<uint8_t> junk(wire::kHeaderBytes, 0x5a);
  ASSERT_EQ(::write(raw.fd, junk.data(), junk.size()),
            static_cast<ssize_t>(junk.size()));
  uint32_t word;
  Status status = raw.bridge->Recv(1, 1, Spec(DType::kU32, {}), &word);
  EXPECT_EQ(status.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(status.message(), "bad magic 0x5a5a5a5a");
  ::close(raw.fd);
}

TEST(FailureTest, HostileSizeIsRefusedWithoutAllocating) {
  auto raw = ConnectRaw(TestOptions(0));
  wire::FrameHeader h;
  h.source = 1;
  h.tag = 3;
  h.spec = Spec(DType::kU8, {int64_t{1} << 42});  // claims 4 TiB
  h.payload_bytes = uint64_t{1} << 42;
  h.chunk_length = 1;
  uint8_t bytes[wire::kHeaderBytes];
  wire::EncodeHeader(h, bytes);
  ASSERT_EQ(::write(raw.fd, bytes, sizeof(bytes)),
            static_cast<ssize_t>(sizeof(bytes)));
  uint8_t byte;
  Status status = raw.bridge->Recv(1, 3, Spec(DType::kU8, {1}), &byte);
  EXPECT_EQ(status.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(status.message(), "exceeds max_message_bytes");
  ::close(raw.fd);
}

TEST(FailureTest, FrameFromTheWrongRankIsRefused) {
  auto raw = ConnectRaw(TestOptions(0));
  wire::FrameHeader h;
  h.source = 0;  // the raw end is rank 1's socket
  h.spec = Spec(DType::kU8, {0});
  uint8_t bytes[wire::kHeaderBytes];
  wire::EncodeHeader(h, bytes);
  ASSERT_EQ(::write(raw.fd, bytes, sizeof(bytes)),
            static_cast<ssize_t>(sizeof(bytes)));
  uint8_t byte;
  Status status = raw.bridge->Recv(1, 0, Spec(DType::kU8, {0}), &byte);
  EXPECT_EQ(status.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(status.message(), "claims source rank 0");
  ::close(raw.fd);
}

TEST(FailureTest, SilentPeerTimesOutTheReceive) {
  BridgeOptions options = TestOptions(0);
  options.timeout_seconds = 0.3;
  auto pair = ConnectTcp(1, options, TestOptions(1));
  std::vector<float> out(16);
  auto start = std::chrono::steady_clock::now();
  Status status = pair.rank0->Recv(1, 42, Spec(DType::kF32, {16}), out.data());
  double waited = SecondsSince(start);
  EXPECT_EQ(status.code(), StatusCode::kTimeout);
  EXPECT_CONTAINS(status.message(),
                  "recv from rank 1 tag 42: no progress for 0.3 s");
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited,
            10.0);  // the timeout, not never; slack for a loaded machine
  // The link is still fine: a message sent now is received.
  auto data = Pattern(64, 1);
  ASSERT_TRUE(
      pair.rank1->Send(0, 42, Spec(DType::kF32, {16}), data.data()).ok());
  ASSERT_TRUE(
      pair.rank0->Recv(1, 42, Spec(DType::kF32, {16}), out.data()).ok());
}

TEST(FailureTest, PeerThatStopsReadingTimesOutTheSend) {
  BridgeOptions options = TestOptions(0);
  options.timeout_seconds = 0.3;
  auto raw = ConnectRaw(options);  // nobody reads raw.fd
  const int64_t n = 32 << 20;      // far more than the socket buffers hold
  std::vector<uint8_t> data(n);
  auto start = std::chrono::steady_clock::now();
  Status status = raw.bridge->Send(1, 9, Spec(DType::kU8, {n}), data.data());
  EXPECT_EQ(status.code(), StatusCode::kTimeout);
  EXPECT_CONTAINS(status.message(), "send to rank 1 tag 9");
  EXPECT_LT(SecondsSince(start), 10.0);  // slack for a loaded machine
  ::close(raw.fd);
}

TEST(FailureTest, StopAbortsPendingOperations) {
  auto pair = ConnectTcp(1);
  uint32_t word;
  Status status;
  std::atomic<bool> done{false};
  pair.rank0->PostRecv(1, 1, Spec(DType::kU32, {}), &word,
                       [&](uint64_t, bool finished, const Status& s) {
                         if (finished) {
                           status = s;
                           done = true;
                         }
                       });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(done.load());
  pair.rank0.reset();  // Stop: fails what is pending, joins its threads
  ASSERT_TRUE(done.load());
  EXPECT_EQ(status.code(), StatusCode::kAborted);
  EXPECT_CONTAINS(status.message(), "stopped");
}

TEST(FailureTest, ProcessWideStartStopGet) {
  ASSERT_EQ(Bridge::Get(), nullptr);
  BridgeOptions options = TestOptions(0);
  ASSERT_TRUE(Bridge::Start(options).ok());
  ASSERT_NE(Bridge::Get(), nullptr);
  EXPECT_EQ(Bridge::Get()->options().rank, 0);
  Status again = Bridge::Start(options);
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(again.message(), "already running");
  Bridge::Stop();
  EXPECT_EQ(Bridge::Get(), nullptr);
  Bridge::Stop();  // idempotent
  options.world_size = 0;
  EXPECT_FALSE(Bridge::Start(options).ok());
}

}  // namespace
}  // namespace hetjax
