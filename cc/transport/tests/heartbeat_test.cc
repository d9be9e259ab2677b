// Heartbeats: a silent peer is lost after the heartbeat timeout, a quiet
// but alive one is not, and silence we cause ourselves (back-pressure) does
// not count against the peer.
#include "cc/transport/heartbeat.h"

#include <fcntl.h>
#include <poll.h>
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

using testing::ConnectRaw;
using testing::ConnectTcp;
using testing::Pattern;
using testing::Spec;
using testing::TestOptions;

constexpr double kHeartbeat = 0.4;  // seconds; tests stay short

BridgeOptions Beating(int rank) {
  BridgeOptions options = TestOptions(rank);
  options.heartbeat_timeout_seconds = kHeartbeat;
  return options;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

void WriteAll(int fd, const uint8_t* bytes, size_t n) {
  ASSERT_EQ(::write(fd, bytes, n), static_cast<ssize_t>(n));
}

void WriteHeader(int fd, const wire::FrameHeader& header) {
  uint8_t bytes[wire::kHeaderBytes];
  wire::EncodeHeader(header, bytes);
  WriteAll(fd, bytes, sizeof(bytes));
}

wire::FrameHeader Beat(int source) {
  wire::FrameHeader h;
  h.source = source;
  h.flags = wire::kFlagHeartbeat;
  h.spec = Spec(DType::kBytes, {0});
  return h;
}

TEST(HeartbeatTest, IntervalFitsSeveralBeatsIntoTheTimeout) {
  EXPECT_DOUBLE_EQ(HeartbeatInterval(15), 1.0);  // idle links: once a second
  EXPECT_DOUBLE_EQ(HeartbeatInterval(2), 0.4);
  EXPECT_GE(HeartbeatInterval(0.001), 0.01);  // never a busy loop
}

TEST(HeartbeatTest, SilentPeerIsLostWithinTheTimeoutEvenWithoutAReceive) {
  // The raw end stays open and says nothing: a frozen process.
  auto start = std::chrono::steady_clock::now();  // before the clock starts
  auto raw = ConnectRaw(Beating(0));
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        uint8_t byte = 0;
        return raw.bridge->Send(1, 1, Spec(DType::kU8, {1}), &byte).code() ==
               StatusCode::kPeerLost;
      },
      10 * kHeartbeat));
  const double noticed = SecondsSince(start);
  EXPECT_GE(noticed, kHeartbeat);
  // Late only by scheduling on a loaded machine; "never" fails the WaitFor.
  EXPECT_LT(noticed, 10 * kHeartbeat + 5);
  uint32_t word;
  Status status = raw.bridge->Recv(1, 2, Spec(DType::kU32, {}), &word);
  EXPECT_EQ(status.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(status.message(), "peer rank 1 lost: nothing heard from it");
  EXPECT_CONTAINS(status.message(), "heartbeat timeout 0.4 s");
  EXPECT_CONTAINS(status.message(), "no message received from it yet");
  ::close(raw.fd);
}

TEST(HeartbeatTest, PendingReceiveFailsWithTheLastTagSeen) {
  auto raw = ConnectRaw(Beating(0));
  wire::FrameHeader h;
  h.source = 1;
  h.tag = 77;
  h.spec = Spec(DType::kU8, {4});
  h.payload_bytes = h.chunk_length = 4;
  WriteHeader(raw.fd, h);
  const uint8_t payload[4] = {1, 2, 3, 4};
  WriteAll(raw.fd, payload, 4);
  uint8_t got[4];
  ASSERT_TRUE(raw.bridge->Recv(1, 77, Spec(DType::kU8, {4}), got).ok());
  auto start = std::chrono::steady_clock::now();
  Status status = raw.bridge->Recv(1, 78, Spec(DType::kU8, {4}), got);
  EXPECT_EQ(status.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(status.message(), "last tag received from it: 77");
  EXPECT_LT(SecondsSince(start),
            10 * kHeartbeat + 5);  // slack for a loaded machine
  ::close(raw.fd);
}

TEST(HeartbeatTest, HeartbeatsAloneKeepAQuietPeerAlive) {
  // The raw peer only beats, four times per timeout, for three timeouts.
  auto raw = ConnectRaw(Beating(0));
  for (int i = 0; i < 12; ++i) {
    WriteHeader(raw.fd, Beat(1));
    std::this_thread::sleep_for(std::chrono::duration<double>(kHeartbeat / 4));
  }
  uint8_t byte = 3;
  Status status = raw.bridge->Send(1, 5, Spec(DType::kU8, {1}), &byte);
  EXPECT_TRUE(status.ok()) << status.message();
  ::close(raw.fd);
}

TEST(HeartbeatTest, AnIdleLinkSendsBeatsThatAreNotMessages) {
  auto raw = ConnectRaw(Beating(0));
  ::fcntl(raw.fd, F_SETFL, ::fcntl(raw.fd, F_GETFL) | O_NONBLOCK);
  int beats = 0;
  auto start = std::chrono::steady_clock::now();
  while (SecondsSince(start) < 2 * kHeartbeat) {
    pollfd p{raw.fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    uint8_t bytes[wire::kHeaderBytes];
    ssize_t n = ::recv(raw.fd, bytes, sizeof(bytes), MSG_WAITALL);
    ASSERT_EQ(n, static_cast<ssize_t>(sizeof(bytes)));
    wire::FrameHeader h;
    ASSERT_TRUE(wire::ParseHeader(bytes, 1 << 20, &h).ok());
    EXPECT_EQ(h.flags, wire::kFlagHeartbeat);
    EXPECT_EQ(h.source, 0);
    EXPECT_EQ(h.payload_bytes, 0u);
    ++beats;
    WriteHeader(raw.fd, Beat(1));  // or the bridge would call us lost
  }
  // Five beats per timeout; allow for a loaded machine.
  EXPECT_GE(beats, 4);
  EXPECT_EQ(raw.bridge->GetStats().messages_sent, 0u);
  ::close(raw.fd);
}

TEST(HeartbeatTest, TwoIdleBridgesStayConnectedPastManyTimeouts) {
  auto pair = ConnectTcp(2, Beating(0), Beating(1));
  std::this_thread::sleep_for(std::chrono::duration<double>(4 * kHeartbeat));
  auto data = Pattern(1000, 9);
  ASSERT_TRUE(
      pair.rank1->Send(0, 3, Spec(DType::kU8, {1000}), data.data()).ok());
  std::vector<uint8_t> out(1000);
  Status status = pair.rank0->Recv(1, 3, Spec(DType::kU8, {1000}), out.data());
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(out, data);
  EXPECT_EQ(pair.rank0->GetStats().messages_received, 1u);
  // Counted once the sender's writer thread finished the frame, which may
  // come after the receiver holds every byte.
  EXPECT_TRUE(testing::WaitFor(
      [&] { return pair.rank1->GetStats().messages_sent == 1u; }, 10.0))
      << pair.rank1->GetStats().messages_sent;
}

TEST(HeartbeatTest, BackPressureIsNotALoss) {
  // rank 1 sends four times what rank 0 buffers, and rank 0 posts nothing
  // for several timeouts: rank 0's reader waits on rank 0, and rank 1's
  // writer waits on rank 0; neither may call the other lost.
  BridgeOptions receiver = Beating(0);
  receiver.unexpected_limit_bytes = 256 << 10;
  auto pair = ConnectTcp(2, receiver, Beating(1));
  constexpr int kMessages = 16;
  constexpr int64_t kBytes = 64 << 10;
  std::thread sender([&] {
    for (int i = 0; i < kMessages; ++i) {
      auto data = Pattern(kBytes, i);
      Status s =
          pair.rank1->Send(0, i, Spec(DType::kU8, {kBytes}), data.data());
      ASSERT_TRUE(s.ok()) << s.message();
    }
  });
  std::this_thread::sleep_for(std::chrono::duration<double>(4 * kHeartbeat));
  std::vector<uint8_t> out(kBytes);
  for (int i = 0; i < kMessages; ++i) {
    Status s = pair.rank0->Recv(1, i, Spec(DType::kU8, {kBytes}), out.data());
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(out, Pattern(kBytes, i));
  }
  sender.join();
}

TEST(HeartbeatTest, OrderlyStopStillEndsWithGoodbyes) {
  // Beats run until the goodbye; the receiver must see the orderly stop,
  // not a torn stream.
  auto pair = ConnectTcp(3, Beating(0), Beating(1));
  std::this_thread::sleep_for(std::chrono::duration<double>(kHeartbeat));
  pair.rank1.reset();
  uint8_t byte;
  Status status = pair.rank0->Recv(1, 1, Spec(DType::kU8, {1}), &byte);
  EXPECT_EQ(status.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(status.message(), "it stopped its bridge");
}

TEST(HeartbeatTest, ZeroTimeoutTurnsDetectionOff) {
  BridgeOptions options = TestOptions(0);
  options.heartbeat_timeout_seconds = 0;
  options.timeout_seconds = 0.5;
  auto raw = ConnectRaw(options);
  uint32_t word;
  Status status = raw.bridge->Recv(1, 1, Spec(DType::kU32, {}), &word);
  EXPECT_EQ(status.code(), StatusCode::kTimeout);  // only the recv timeout
  ::close(raw.fd);
}

}  // namespace
}  // namespace hetjax
