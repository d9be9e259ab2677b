// Striping over several socketpairs between two bridges: sizes that do not
// divide by the chunk or the stream count, empty payloads, many messages in
// flight at once, and the asynchronous send/receive callbacks.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "cc/transport/tests/bridge_pair.h"
#include "gtest/gtest.h"

namespace hetjax {
namespace {

using testing::ConnectTcp;
using testing::Pattern;
using testing::Spec;
using testing::TestOptions;
using testing::WaitFor;

BridgeOptions Striped(int rank) {
  BridgeOptions options = TestOptions(rank);
  options.chunk_bytes = 1000;       // many chunks per message
  options.eager_limit_bytes = 512;  // most sends stream from the caller
  return options;
}

TEST(TcpBridgeTest, StripesOddSizesAcrossThreeStreams) {
  auto pair = ConnectTcp(3, Striped(0), Striped(1));
  const std::vector<int64_t> sizes = {0,    1,    511,  999,  1000,
                                      1001, 2999, 3000, 3007, 100003};
  std::thread sender([&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto data = Pattern(sizes[i], i);
      Status s = pair.rank0->Send(1, 100 + i, Spec(DType::kU8, {sizes[i]}),
                                  data.data());
      EXPECT_TRUE(s.ok()) << s.message();
    }
  });
  // Receive in reverse so later messages overtake earlier ones in flight.
  for (size_t k = sizes.size(); k-- > 0;) {
    std::vector<uint8_t> out(sizes[k] + 1, 0xee);
    Status s =
        pair.rank1->Recv(0, 100 + k, Spec(DType::kU8, {sizes[k]}), out.data());
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_TRUE(std::equal(out.begin(), out.begin() + sizes[k],
                           Pattern(sizes[k], k).begin()))
        << "size " << sizes[k];
    EXPECT_EQ(out[sizes[k]], 0xee) << "wrote past the end, size " << sizes[k];
  }
  sender.join();
  // A send is counted once its writer thread has finished the frame, which
  // for an eager send may come after the receiver already holds every byte.
  EXPECT_TRUE(WaitFor(
      [&] { return pair.rank0->GetStats().messages_sent == sizes.size(); },
      10.0))
      << pair.rank0->GetStats().messages_sent << " of " << sizes.size()
      << " sends counted";
  Stats got = pair.rank1->GetStats();
  EXPECT_EQ(got.messages_received, sizes.size());
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  EXPECT_EQ(got.bytes_received, static_cast<uint64_t>(total));
}

TEST(TcpBridgeTest, BothDirectionsAndManyConcurrentSendersKeepTagOrder) {
  auto pair = ConnectTcp(4, Striped(0), Striped(1));
  constexpr int kThreads = 3, kPerThread = 8;
  auto run = [&](Bridge* from, Bridge* to, int to_rank, int from_rank) {
    std::vector<std::thread> senders;
    for (int t = 0; t < kThreads; ++t) {
      senders.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          auto data = Pattern(4321, t * 100 + i);
          ASSERT_TRUE(
              from->Send(to_rank, t, Spec(DType::kU8, {4321}), data.data())
                  .ok());
        }
      });
    }
    for (int t = 0; t < kThreads; ++t) {
      for (int i = 0; i < kPerThread; ++i) {
        std::vector<uint8_t> out(4321);
        ASSERT_TRUE(
            to->Recv(from_rank, t, Spec(DType::kU8, {4321}), out.data()).ok());
        EXPECT_EQ(out, Pattern(4321, t * 100 + i)) << t << "/" << i;
      }
    }
    for (auto& s : senders) s.join();
  };
  std::thread forward([&] { run(pair.rank0.get(), pair.rank1.get(), 1, 0); });
  run(pair.rank1.get(), pair.rank0.get(), 0, 1);
  forward.join();
}

TEST(TcpBridgeTest, AsyncSendGatesEveryChunkOnce) {
  auto pair = ConnectTcp(2, Striped(0), Striped(1));
  const int64_t n = 10500;
  auto data = Pattern(n, 77);
  std::mutex mu;
  std::map<uint64_t, uint64_t> gated;  // offset -> length
  std::atomic<bool> sent{false};
  Status send_status(StatusCode::kInternal, "not done");
  pair.rank0->SendAsync(
      1, 77, Spec(DType::kU8, {n}), data.data(),
      [&](uint64_t offset, uint64_t length) {
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_TRUE(gated.emplace(offset, length).second);
      },
      [&](const Status& s) {
        send_status = s;
        sent = true;
      });
  std::vector<uint8_t> out(n);
  ASSERT_TRUE(pair.rank1->Recv(0, 77, Spec(DType::kU8, {n}), out.data()).ok());
  ASSERT_TRUE(WaitFor([&] { return sent.load(); }, 10));
  EXPECT_TRUE(send_status.ok());
  EXPECT_EQ(out, data);
  uint64_t next = 0;
  for (auto [offset, length] : gated) {
    EXPECT_EQ(offset, next);
    next += length;
  }
  EXPECT_EQ(next, static_cast<uint64_t>(n));
  EXPECT_EQ(gated.size(), 11u);
}

TEST(TcpBridgeTest, ReportsBadArguments) {
  auto pair = ConnectTcp(1);
  uint8_t byte = 0;
  EXPECT_EQ(pair.rank0->Send(0, 1, Spec(DType::kU8, {1}), &byte).code(),
            StatusCode::kInvalidArgument);  // to itself
  EXPECT_EQ(pair.rank0->Send(5, 1, Spec(DType::kU8, {1}), &byte).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(pair.rank0->Send(1, 1, Spec(DType::kInvalid, {1}), &byte).code(),
            StatusCode::kInvalidArgument);
  Status too_big =
      pair.rank0->Send(1, 1, Spec(DType::kU8, {int64_t{1} << 40}), &byte);
  EXPECT_EQ(too_big.code(), StatusCode::kResourceExhausted);
  EXPECT_CONTAINS(too_big.message(), "max_message_bytes");
  Status status;
  EXPECT_EQ(Bridge::Create(BridgeOptions{.rank = 2, .world_size = 2}, &status),
            nullptr);
  EXPECT_CONTAINS(status.message(), "rank 2 outside [0, 2)");
}

}  // namespace
}  // namespace hetjax
