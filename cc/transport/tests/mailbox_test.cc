// Tag matching between two bridges over one socketpair: order across tags,
// FIFO within a tag, receives posted before and after arrival, the bounded
// unexpected buffer, and mismatches that leave the connection usable.
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "cc/transport/tests/bridge_pair.h"
#include "gtest/gtest.h"

namespace hetjax {
namespace {

using testing::BridgePair;
using testing::ConnectTcp;
using testing::Pattern;
using testing::Spec;
using testing::TestOptions;
using testing::WaitFor;

TensorSpec Bytes(int64_t n) { return Spec(DType::kU8, {n}); }

TEST(MailboxTest, ReceivesInAnyTagOrder) {
  auto pair = ConnectTcp(1);
  for (uint64_t tag : {1, 2, 3}) {
    auto data = Pattern(1000, tag);
    ASSERT_TRUE(pair.rank0->Send(1, tag, Bytes(1000), data.data()).ok());
  }
  for (uint64_t tag : {3, 1, 2}) {
    std::vector<uint8_t> out(1000);
    ASSERT_TRUE(pair.rank1->Recv(0, tag, Bytes(1000), out.data()).ok());
    EXPECT_EQ(out, Pattern(1000, tag)) << "tag " << tag;
  }
}

TEST(MailboxTest, SameTagIsFirstInFirstOut) {
  auto pair = ConnectTcp(2);
  for (uint32_t i = 0; i < 5; ++i) {
    auto data = Pattern(300, i);
    ASSERT_TRUE(pair.rank0->Send(1, 9, Bytes(300), data.data()).ok());
  }
  for (uint32_t i = 0; i < 5; ++i) {
    std::vector<uint8_t> out(300);
    ASSERT_TRUE(pair.rank1->Recv(0, 9, Bytes(300), out.data()).ok());
    EXPECT_EQ(out, Pattern(300, i)) << "message " << i;
  }
}

TEST(MailboxTest, PostedReceiveIsFilledInPlaceWithGrowingPrefix) {
  BridgeOptions options = TestOptions(1);
  auto pair = ConnectTcp(1, TestOptions(0), options);
  const size_t n = 10 * options.chunk_bytes + 5;
  std::vector<uint8_t> out(n);
  std::vector<uint64_t> prefixes;
  std::atomic<bool> done{false};
  Status final_status(StatusCode::kInternal, "never finished");
  pair.rank1->PostRecv(0, 4, Bytes(n), out.data(),
                       [&](uint64_t bytes, bool finished, const Status& s) {
                         prefixes.push_back(bytes);  // the last is the final
                         if (finished) {
                           final_status = s;
                           done = true;
                         }
                       });
  auto data = Pattern(n, 4);
  ASSERT_TRUE(pair.rank0->Send(1, 4, Bytes(n), data.data()).ok());
  ASSERT_TRUE(WaitFor([&] { return done.load(); }, 10));
  ASSERT_TRUE(final_status.ok()) << final_status.message();
  EXPECT_EQ(out, data);
  // Never buffered: the bytes went straight into `out`, chunk by chunk.
  EXPECT_EQ(pair.rank1->GetStats().unexpected_bytes_buffered, 0u);
  // One report per chunk as the prefix grows, then the final call.
  ASSERT_EQ(prefixes.size(), 11u + 1u);
  for (size_t i = 1; i + 1 < prefixes.size(); ++i) {
    EXPECT_LT(prefixes[i - 1], prefixes[i]);
  }
  EXPECT_EQ(prefixes[prefixes.size() - 2], n);
  EXPECT_EQ(prefixes.back(), n);
}

TEST(MailboxTest, EarlyMessageIsBufferedUntilItsReceive) {
  auto pair = ConnectTcp(1);
  auto data = Pattern(5000, 11);
  ASSERT_TRUE(pair.rank0->Send(1, 11, Bytes(5000), data.data()).ok());
  ASSERT_TRUE(WaitFor(
      [&] { return pair.rank1->GetStats().messages_received == 1; }, 10));
  EXPECT_EQ(pair.rank1->GetStats().unexpected_bytes_buffered, 5000u);
  std::vector<uint8_t> out(5000);
  ASSERT_TRUE(pair.rank1->Recv(0, 11, Bytes(5000), out.data()).ok());
  EXPECT_EQ(out, data);
  EXPECT_EQ(pair.rank1->GetStats().unexpected_bytes_buffered, 0u);
}

TEST(MailboxTest, FullUnexpectedBufferPushesBackOnTheSender) {
  BridgeOptions receiver = TestOptions(1);
  receiver.unexpected_limit_bytes = 64 << 10;
  BridgeOptions sender = TestOptions(0);
  sender.eager_limit_bytes = 1 << 20;  // every send below is eager
  auto pair = ConnectTcp(1, sender, receiver);
  constexpr int kMessages = 64;
  constexpr size_t kBytes = 32 << 10;  // 2 MiB in all, 32x the buffer
  std::thread producer([&] {
    for (int i = 0; i < kMessages; ++i) {
      auto data = Pattern(kBytes, i);
      ASSERT_TRUE(pair.rank0->Send(1, i, Bytes(kBytes), data.data()).ok());
    }
  });
  // Let the sender run ahead: the receiver holds at most the limit.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Stats stalled = pair.rank1->GetStats();
  EXPECT_LE(stalled.unexpected_bytes_buffered, receiver.unexpected_limit_bytes);
  EXPECT_LT(stalled.messages_received, static_cast<uint64_t>(kMessages));
  for (int i = 0; i < kMessages; ++i) {
    std::vector<uint8_t> out(kBytes);
    ASSERT_TRUE(pair.rank1->Recv(0, i, Bytes(kBytes), out.data()).ok());
    EXPECT_EQ(out, Pattern(kBytes, i)) << "message " << i;
    EXPECT_LE(pair.rank1->GetStats().unexpected_bytes_buffered,
              receiver.unexpected_limit_bytes);
  }
  producer.join();
}

// Sends `data` from rank 0 under `tag` on a thread of its own: a send the
// receiver holds back blocks until it is taken.
std::thread SendInBackground(BridgePair& pair, uint64_t tag,
                             const std::vector<uint8_t>& data) {
  return std::thread([&pair, tag, &data] {
    EXPECT_TRUE(pair.rank0->Send(1, tag, Bytes(data.size()), data.data()).ok());
  });
}

// Receives under `tag` on rank 1 and checks the bytes.
void ExpectReceived(BridgePair& pair, uint64_t tag,
                    const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(data.size());
  ASSERT_TRUE(pair.rank1->Recv(0, tag, Bytes(out.size()), out.data()).ok());
  EXPECT_EQ(out, data) << "tag " << tag;
}

uint64_t Buffered(BridgePair& pair) {
  return pair.rank1->GetStats().unexpected_bytes_buffered;
}

TEST(MailboxTest, MessageLargerThanTheBufferWaitsForItsReceive) {
  BridgeOptions receiver = TestOptions(1);
  receiver.unexpected_limit_bytes = 16 << 10;
  auto pair = ConnectTcp(1, TestOptions(0), receiver);
  auto data = Pattern(256 << 10, 5);
  std::thread producer = SendInBackground(pair, 5, data);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(Buffered(pair), 0u);
  ExpectReceived(pair, 5, data);
  producer.join();
}

// A receiver that waits `late_post_wait_seconds` for the late post of a
// message above 64 KiB; the tests below send 1 MiB.
BridgePair LatePostPair(double late_post_wait_seconds) {
  BridgeOptions receiver = TestOptions(1);
  receiver.eager_limit_bytes = 64 << 10;
  receiver.late_post_wait_seconds = late_post_wait_seconds;
  return ConnectTcp(1, TestOptions(0), receiver);
}
constexpr size_t kLarge = 1 << 20;

// A large message whose receive is posted a little late lands in place: it
// waits for the post instead of being buffered (and copied twice).
TEST(MailboxTest, LargeMessageWaitsBrieflyForALatePost) {
  auto pair = LatePostPair(5);
  auto data = Pattern(kLarge, 21);
  std::thread producer = SendInBackground(pair, 21, data);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(Buffered(pair), 0u);
  ExpectReceived(pair, 21, data);
  producer.join();
}

// Past the wait the message is buffered as before, so a receiver that posts
// much later (or never) cannot hold the stream.
TEST(MailboxTest, LargeMessageIsBufferedOnceTheLatePostWaitRunsOut) {
  auto pair = LatePostPair(0.05);
  auto data = Pattern(kLarge, 22);
  ASSERT_TRUE(pair.rank0->Send(1, 22, Bytes(kLarge), data.data()).ok());
  ASSERT_TRUE(WaitFor(
      [&] { return pair.rank1->GetStats().messages_received == 1; }, 10));
  EXPECT_EQ(Buffered(pair), kLarge);
  ExpectReceived(pair, 22, data);
}

// A receiver already waiting for another message from the same peer is not
// about to post this one: it is buffered at once, and the stream behind it
// (here: the message that receiver waits for) keeps flowing.
TEST(MailboxTest, LargeMessageIsBufferedAtOnceWhileAnotherReceiveIsPending) {
  auto pair = LatePostPair(30);
  auto large = Pattern(kLarge, 23);
  auto small = Pattern(100, 24);
  std::vector<uint8_t> small_out(100);
  std::atomic<bool> small_done{false};
  pair.rank1->PostRecv(0, 24, Bytes(100), small_out.data(),
                       [&](uint64_t, bool finished, const Status& s) {
                         if (finished && s.ok()) small_done = true;
                       });
  ASSERT_TRUE(pair.rank0->Send(1, 23, Bytes(kLarge), large.data()).ok());
  ASSERT_TRUE(pair.rank0->Send(1, 24, Bytes(100), small.data()).ok());
  ASSERT_TRUE(WaitFor([&] { return small_done.load(); }, 5));
  EXPECT_EQ(small_out, small);
  EXPECT_EQ(Buffered(pair), kLarge);
  ExpectReceived(pair, 23, large);
}

TEST(MailboxTest, MismatchIsNamedAndTheConnectionKeepsWorking) {
  auto pair = ConnectTcp(2);
  std::vector<float> values(32, 1.5f);
  std::vector<uint16_t> wrong(32);
  // Receive posted after arrival...
  ASSERT_TRUE(
      pair.rank0->Send(1, 7, Spec(DType::kF32, {4, 8}), values.data()).ok());
  ASSERT_TRUE(WaitFor(
      [&] { return pair.rank1->GetStats().messages_received == 1; }, 10));
  Status status =
      pair.rank1->Recv(0, 7, Spec(DType::kBF16, {4, 8}), wrong.data());
  EXPECT_EQ(status.code(), StatusCode::kMismatch);
  EXPECT_EQ(status.message(),
            "recv from rank 0 tag 7: expected bfloat16[4,8], received "
            "float32[4,8]");
  EXPECT_EQ(pair.rank1->GetStats().unexpected_bytes_buffered, 0u);
  // ...and before it (a multi-chunk payload, drained and discarded).
  std::vector<float> big(100000, 2.0f), out_big(100000);
  std::thread late_sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(
        pair.rank0->Send(1, 8, Spec(DType::kF32, {100000}), big.data()).ok());
  });
  status =
      pair.rank1->Recv(0, 8, Spec(DType::kF32, {1000, 100}), out_big.data());
  late_sender.join();
  EXPECT_EQ(status.code(), StatusCode::kMismatch);
  EXPECT_EQ(status.message(),
            "recv from rank 0 tag 8: expected float32[1000,100], received "
            "float32[100000]");
  // The same connection still carries the next message intact.
  ASSERT_TRUE(
      pair.rank0->Send(1, 9, Spec(DType::kF32, {100000}), big.data()).ok());
  ASSERT_TRUE(
      pair.rank1->Recv(0, 9, Spec(DType::kF32, {100000}), out_big.data()).ok());
  EXPECT_EQ(out_big, big);
}

}  // namespace
}  // namespace hetjax
