// Bad input on a running three-rank bridge: garbage, malformed or truncated
// frames on one link lose that peer only, with the reason, while the other
// links keep carrying data; and messages nobody received when Stop runs are
// freed, named in one log line, and do not delay the stop.
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <memory>
#include <random>
#include <vector>

#include "cc/transport/tests/bridge_pair.h"
#include "cc/transport/wire.h"
#include "gtest/gtest.h"

namespace hetjax {
namespace {

using testing::Pattern;
using testing::Spec;
using testing::TestOptions;

constexpr int kStreams = 2;

// Ranks 0, 1, 2 fully connected by socketpairs. `tap` is a duplicate of
// rank 2's end of its first stream to rank 0: writing into it injects bytes
// into that stream as if on the wire.
struct Trio {
  std::array<std::unique_ptr<Bridge>, 3> rank;
  int tap = -1;
  ~Trio() {
    if (tap >= 0) ::close(tap);
  }
};

std::unique_ptr<Trio> ConnectTrio(double heartbeat_timeout = 15) {
  auto trio = std::make_unique<Trio>();
  for (int r = 0; r < 3; ++r) {
    BridgeOptions options = TestOptions(r);
    options.world_size = 3;
    options.heartbeat_timeout_seconds = heartbeat_timeout;
    trio->rank[r] = Bridge::Create(options);
  }
  for (int a = 0; a < 3; ++a) {
    for (int b = a + 1; b < 3; ++b) {
      std::vector<int> ends_a, ends_b;
      for (int s = 0; s < kStreams; ++s) {
        int fds[2];
        EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
        ends_a.push_back(fds[0]);
        ends_b.push_back(fds[1]);
      }
      if (a == 0 && b == 2) trio->tap = ::dup(ends_b[0]);
      EXPECT_TRUE(trio->rank[a]->AddTcpPeer(b, ends_a).ok());
      EXPECT_TRUE(trio->rank[b]->AddTcpPeer(a, ends_b).ok());
    }
  }
  return trio;
}

// A message each way between `a` and `b`, checked byte for byte.
void ExpectLinkWorks(Trio& trio, int a, int b, uint64_t tag) {
  for (auto [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
    auto data = Pattern(100 << 10, static_cast<uint32_t>(tag + from));
    const TensorSpec spec = Spec(DType::kU8, {100 << 10});
    ASSERT_TRUE(trio.rank[from]->Send(to, tag, spec, data.data()).ok());
    std::vector<uint8_t> out(data.size());
    Status s = trio.rank[to]->Recv(from, tag, spec, out.data());
    ASSERT_TRUE(s.ok()) << "rank " << to << " from " << from << ": "
                        << s.message();
    EXPECT_EQ(out, data);
  }
}

// Rank 0's view of rank 2 after the injection, and rank 2's view of rank 0.
void ExpectOnlyLinkZeroTwoLost(Trio& trio, const std::string& reason) {
  uint8_t byte;
  Status at0 = trio.rank[0]->Recv(2, 500, Spec(DType::kU8, {1}), &byte);
  EXPECT_EQ(at0.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(at0.message(), "peer rank 2 lost: it sent a bad frame on");
  EXPECT_CONTAINS(at0.message(), reason);
  // Rank 0 hung up on rank 2, so rank 2 sees rank 0 go (not garbage).
  Status at2 = trio.rank[2]->Recv(0, 500, Spec(DType::kU8, {1}), &byte);
  EXPECT_EQ(at2.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(at2.message(), "peer rank 0 lost");
  ExpectLinkWorks(trio, 0, 1, 600);
  ExpectLinkWorks(trio, 1, 2, 601);
}

// A valid header of an 8-byte message from rank 2, of which tests send
// only the first 60 bytes.
wire::FrameHeader TruncatedVictim() {
  wire::FrameHeader h;
  h.source = 2;
  h.spec = Spec(DType::kU8, {8});
  h.payload_bytes = h.chunk_length = 8;
  return h;
}

TEST(LiveBadInputTest, RandomBytesLoseOnlyTheirLink) {
  auto trio = ConnectTrio();
  ExpectLinkWorks(*trio, 0, 2, 1);  // in frame, traffic already flowed
  std::mt19937 rng(7);
  std::vector<uint8_t> junk(300);
  for (auto& b : junk) b = static_cast<uint8_t>(rng());
  junk[0] = 0x13;  // not "H": never a valid magic by chance
  ASSERT_EQ(::write(trio->tap, junk.data(), junk.size()),
            static_cast<ssize_t>(junk.size()));
  ExpectOnlyLinkZeroTwoLost(*trio, "bad magic");
}

TEST(LiveBadInputTest, MalformedHeaderIsNamedAndLosesOnlyItsLink) {
  auto trio = ConnectTrio();
  wire::FrameHeader h;
  h.source = 2;
  h.tag = 9;
  h.spec = Spec(DType::kF32, {4, 4});  // 64 bytes...
  h.payload_bytes = 60;                // ...claimed as 60
  h.chunk_length = 60;
  uint8_t bytes[wire::kHeaderBytes];
  wire::EncodeHeader(h, bytes);
  ASSERT_EQ(::write(trio->tap, bytes, sizeof(bytes)),
            static_cast<ssize_t>(sizeof(bytes)));
  ExpectOnlyLinkZeroTwoLost(*trio,
                            "payload of 60 bytes does not fit float32[4,4]");
}

TEST(LiveBadInputTest, TruncatedHeaderFollowedByMoreBytesIsMalformed) {
  // Half a header, then rank 2's own next frame (its heartbeat, within a
  // second) lands where the rest should be: the spliced header fails.
  auto trio = ConnectTrio();
  uint8_t bytes[wire::kHeaderBytes];
  wire::EncodeHeader(TruncatedVictim(), bytes);
  ASSERT_EQ(::write(trio->tap, bytes, 60), 60);
  ExpectOnlyLinkZeroTwoLost(*trio, "bad frame header");
}

// Ranks 0 and 1 are bridges of a world of 3; rank 0's link to rank 2 is one
// raw socket end the test writes into (a peer that dies or freezes mid-frame).
struct PairAndRaw {
  std::unique_ptr<Bridge> rank0, rank1;
  int raw = -1;
};

PairAndRaw ConnectPairAndRaw(double heartbeat_timeout) {
  PairAndRaw out;
  auto options = [&](int r) {
    BridgeOptions o = TestOptions(r);
    o.world_size = 3;
    o.heartbeat_timeout_seconds = heartbeat_timeout;
    return o;
  };
  out.rank0 = Bridge::Create(options(0));
  out.rank1 = Bridge::Create(options(1));
  int pair[2], raw[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, raw), 0);
  EXPECT_TRUE(out.rank0->AddTcpPeer(1, {pair[0]}).ok());
  EXPECT_TRUE(out.rank1->AddTcpPeer(0, {pair[1]}).ok());
  EXPECT_TRUE(out.rank0->AddTcpPeer(2, {raw[0]}).ok());
  out.raw = raw[1];
  return out;
}

void ExpectPairWorks(PairAndRaw& p) {
  auto data = Pattern(50 << 10, 5);
  const TensorSpec spec = Spec(DType::kU8, {50 << 10});
  ASSERT_TRUE(p.rank1->Send(0, 1, spec, data.data()).ok());
  ASSERT_TRUE(p.rank0->Send(1, 2, spec, data.data()).ok());
  std::vector<uint8_t> out0(data.size()), out1(data.size());
  ASSERT_TRUE(p.rank0->Recv(1, 1, spec, out0.data()).ok());
  ASSERT_TRUE(p.rank1->Recv(0, 2, spec, out1.data()).ok());
  EXPECT_EQ(out0, data);
  EXPECT_EQ(out1, data);
}

TEST(LiveBadInputTest, TruncatedHeaderThenHangUpLosesOnlyThatPeer) {
  auto p = ConnectPairAndRaw(15);
  uint8_t bytes[wire::kHeaderBytes];
  wire::EncodeHeader(TruncatedVictim(), bytes);
  ASSERT_EQ(::write(p.raw, bytes, 60), 60);
  ::close(p.raw);
  uint8_t out[8];
  Status status = p.rank0->Recv(2, 0, Spec(DType::kU8, {8}), out);
  EXPECT_EQ(status.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(status.message(), "peer rank 2 lost");
  EXPECT_CONTAINS(status.message(), "closed");
  ExpectPairWorks(p);
}

TEST(LiveBadInputTest, TruncatedHeaderThenSilenceIsCaughtByTheHeartbeat) {
  // The peer froze mid-header: the reader must not wait for the rest
  // forever; the heartbeat timeout ends it, the other link carries on.
  constexpr double kHeartbeat = 0.5;
  auto p = ConnectPairAndRaw(kHeartbeat);
  uint8_t bytes[wire::kHeaderBytes];
  wire::EncodeHeader(TruncatedVictim(), bytes);
  ASSERT_EQ(::write(p.raw, bytes, 60), 60);
  auto start = std::chrono::steady_clock::now();
  uint8_t out[8];
  Status status = p.rank0->Recv(2, 0, Spec(DType::kU8, {8}), out);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_EQ(status.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(status.message(), "peer rank 2 lost: nothing heard from it");
  EXPECT_LT(waited, 3 * kHeartbeat + 1);
  ExpectPairWorks(p);
  ::close(p.raw);
}

TEST(LiveBadInputTest, UnreceivedMessagesAtStopAreFreedAndNamed) {
  auto pair = testing::ConnectTcp(2);
  auto data = Pattern(1000, 1);
  for (uint64_t tag : {7, 7, 9}) {
    ASSERT_TRUE(
        pair.rank1->Send(0, tag, Spec(DType::kU8, {1000}), data.data()).ok());
  }
  ASSERT_TRUE(testing::WaitFor(
      [&] { return pair.rank0->GetStats().messages_received == 3; }, 10));
  EXPECT_EQ(pair.rank0->GetStats().unexpected_bytes_buffered, 3000u);
  ::testing::internal::CaptureStderr();
  auto start = std::chrono::steady_clock::now();
  pair.rank0.reset();
  const double stop_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_CONTAINS(log,
                  "hetjax bridge rank 0 stopped with 3 messages (3000 bytes) "
                  "never received: rank 1 tag 7 x2, rank 1 tag 9");
  EXPECT_LT(stop_seconds, 2.0);
}

}  // namespace
}  // namespace hetjax
