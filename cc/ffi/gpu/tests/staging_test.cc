// The GPU staging logic, run on the host device (and on one whose events
// complete only when the test says so) against an in-process bridge: bytes
// arrive intact, the wire never reads a chunk before its copy is done,
// staging goes back to the pool only when both sides let go, and failures
// end the waits and surface on the next op.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <numeric>
#include <thread>
#include <vector>

#include "cc/device/tests/manual_events_device.h"
#include "cc/ffi/gpu/staged_recv.h"
#include "cc/ffi/gpu/staged_send.h"
#include "cc/ffi/gpu/tests/loopback_bridge.h"

namespace hetjax::gpu {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kChunk = 4096;

BridgeOptions Options(double timeout_seconds = 30) {
  BridgeOptions options;
  options.chunk_bytes = kChunk;
  options.timeout_seconds = timeout_seconds;
  return options;
}

TensorSpec Spec(DType dtype, std::vector<int64_t> dims) {
  return MakeSpec(dtype, dims);
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<uint8_t>(seed + i * 31 + i / 251);
  return v;
}

TEST(Staging, RoundTripsEveryByteAcrossChunkBoundaries) {
  StagingContext context(device::HostDevice(), size_t{64} << 20);
  testing::LoopbackBridge bridge(Options());
  uint64_t tag = 0;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{kChunk - 1},
                    int64_t{kChunk}, int64_t{3 * kChunk + 100}}) {
    SCOPED_TRACE(n);
    const TensorSpec spec = Spec(DType::kU8, {n});
    const std::vector<uint8_t> src = Pattern(n, static_cast<uint8_t>(n));
    std::vector<uint8_t> dst(n, 0);
    ++tag;
    ASSERT_TRUE(
        StagedSend(context, bridge, nullptr, 1, tag, spec, src.data()).ok());
    Status recv =
        StagedRecv(context, bridge, nullptr, 1, tag, spec, dst.data());
    ASSERT_TRUE(recv.ok()) << recv.message();
    EXPECT_EQ(dst, src);
  }
  // A float tensor too: specs other than bytes travel the same way.
  const TensorSpec f32 = Spec(DType::kF32, {3, 1000});
  std::vector<float> x(3000), y(3000, -1.f);
  std::iota(x.begin(), x.end(), 0.5f);
  ASSERT_TRUE(StagedSend(context, bridge, nullptr, 1, 99, f32, x.data()).ok());
  ASSERT_TRUE(StagedRecv(context, bridge, nullptr, 1, 99, f32, y.data()).ok());
  EXPECT_EQ(y, x);
}

TEST(Staging, RepeatedMessagesReuseStaging) {
  StagingContext context(device::HostDevice(), size_t{64} << 20);
  const TensorSpec spec = Spec(DType::kU8, {int64_t{5 * kChunk}});
  const std::vector<uint8_t> src = Pattern(5 * kChunk, 3);
  std::vector<uint8_t> dst(5 * kChunk);
  {
    testing::LoopbackBridge bridge(Options());
    for (uint64_t tag = 1; tag <= 4; ++tag) {
      ASSERT_TRUE(
          StagedSend(context, bridge, nullptr, 0, tag, spec, src.data()).ok());
      ASSERT_TRUE(
          StagedRecv(context, bridge, nullptr, 0, tag, spec, dst.data()).ok());
      EXPECT_EQ(dst, src);
    }
  }  // every transfer has finished
  context.retired.Poll();
  // One buffer for the send side and one for the receive side, reused: a
  // pool that never recycled would have allocated eight.
  EXPECT_LE(context.pinned.allocations(), 3u);
  EXPECT_EQ(context.retired.pending(), 0u);
}

TEST(Staging, WireWaitsForEachChunksCopyAndSendDoesNotBlock) {
  device::testing::ManualEventsDevice dev;
  StagingContext context(dev, size_t{64} << 20);
  testing::LoopbackBridge bridge(Options());
  const TensorSpec spec = Spec(DType::kU8, {int64_t{3 * kChunk}});
  const std::vector<uint8_t> src = Pattern(3 * kChunk, 9);
  std::vector<uint8_t> dst(3 * kChunk, 0);

  std::atomic<uint64_t> contiguous{0};
  std::promise<Status> finished;
  bridge.PostRecv(0, 5, spec, dst.data(),
                  [&](uint64_t bytes, bool done, const Status& s) {
                    contiguous = bytes;
                    if (done) finished.set_value(s);
                  });
  // Copies "in flight": StagedSend still returns at once.
  const auto t0 = Clock::now();
  ASSERT_TRUE(
      StagedSend(context, bridge, nullptr, 0, 5, spec, src.data()).ok());
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
  const std::vector<device::Event> chunk_events = dev.recorded();
  ASSERT_EQ(chunk_events.size(), 3u);

  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(contiguous.load(), 0u) << "chunk 0 went out before its copy";
  dev.Complete(chunk_events[0]);
  for (int i = 0; i < 200 && contiguous.load() < kChunk; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(contiguous.load(), kChunk) << "only chunk 0's copy is done";

  // Staging is still in use by the wire and the copies: not back yet.
  context.retired.Poll();
  EXPECT_EQ(context.pinned.cached_bytes(), 0u);

  dev.Complete(chunk_events[1]);
  dev.Complete(chunk_events[2]);
  auto result = finished.get_future();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(10)),
            std::future_status::ready);
  EXPECT_TRUE(result.get().ok());
  EXPECT_EQ(dst, src);
  // Wire done and copies done: the next op's poll returns the staging.
  for (int i = 0; i < 200 && context.pinned.cached_bytes() == 0; ++i) {
    context.retired.Poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(context.pinned.cached_bytes(), 3 * kChunk);
}

TEST(Staging, LostPeerReleasesTheWaitAndFailsTheNextOp) {
  StagingContext context(device::HostDevice(), size_t{64} << 20);
  testing::LoopbackBridge bridge(Options());
  bridge.FailNextRecv(
      kChunk, Status(StatusCode::kPeerLost, "peer 1 closed the connection"));
  const TensorSpec spec = Spec(DType::kU8, {int64_t{4 * kChunk}});
  const std::vector<uint8_t> src = Pattern(4 * kChunk, 1);
  std::vector<uint8_t> dst(4 * kChunk, 0);

  auto sender = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return StagedSend(context, bridge, nullptr, 1, 7, spec, src.data());
  });
  const auto t0 = Clock::now();
  // The host "stream" is this thread: an unreleased wait would hang here.
  Status recv = StagedRecv(context, bridge, nullptr, 1, 7, spec, dst.data());
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  ASSERT_TRUE(sender.get().ok());
  ASSERT_TRUE(recv.ok()) << "the failure came after the handler returned";
  bridge.JoinTransfers();  // both sides' failures have been reported
  // The first chunk did arrive before the failure.
  EXPECT_TRUE(std::equal(src.begin(), src.begin() + kChunk, dst.begin()));

  Status next = StagedSend(context, bridge, nullptr, 1, 8, spec, src.data());
  EXPECT_EQ(next.code(), StatusCode::kPeerLost);
  EXPECT_NE(next.message().find("peer 1, tag 7, uint8[16384]"),
            std::string::npos)
      << next.message();
  EXPECT_NE(next.message().find("closed the connection"), std::string::npos);
  // Only the first error is kept (the sender's "receiver went away" is its
  // consequence), and it is raised once: the next op pair is clean.
  std::vector<uint8_t> again(4 * kChunk, 0);
  auto late_recv = std::async(std::launch::async, [&] {
    return StagedRecv(context, bridge, nullptr, 1, 9, spec, again.data());
  });
  ASSERT_TRUE(
      StagedSend(context, bridge, nullptr, 1, 9, spec, src.data()).ok());
  EXPECT_TRUE(late_recv.get().ok());
  EXPECT_EQ(again, src);
}

TEST(Staging, MismatchKnownAtPostIsReturnedAtOnce) {
  StagingContext context(device::HostDevice(), size_t{64} << 20);
  testing::LoopbackBridge bridge(Options());
  const TensorSpec sent = Spec(DType::kF32, {4});
  const TensorSpec expected = Spec(DType::kS32, {4});
  const float x[4] = {1, 2, 3, 4};
  int32_t y[4] = {};
  ASSERT_TRUE(StagedSend(context, bridge, nullptr, 2, 11, sent, x).ok());
  Status recv = StagedRecv(context, bridge, nullptr, 2, 11, expected, y);
  EXPECT_EQ(recv.code(), StatusCode::kMismatch);
  EXPECT_NE(recv.message().find("int32[4]"), std::string::npos)
      << recv.message();
  EXPECT_NE(recv.message().find("float32[4]"), std::string::npos)
      << recv.message();
  EXPECT_NE(recv.message().find("peer 2, tag 11"), std::string::npos)
      << recv.message();
  // Reported once, not again by the next op.
  EXPECT_TRUE(context.errors.Take().ok());
}

TEST(Staging, DeviceDeadlineEndsAWaitNobodyAnswers) {
  StagingContext context(device::HostDevice(), size_t{64} << 20);
  const double timeout_s = 0.02;
  testing::LoopbackBridge bridge(Options(timeout_s));
  EXPECT_EQ(WaitDeadlineNs(bridge.options()), 60'000'000u);
  const TensorSpec spec = Spec(DType::kU8, {int64_t{2 * kChunk}});
  std::vector<uint8_t> dst(2 * kChunk);
  const auto t0 = Clock::now();
  ASSERT_TRUE(
      StagedRecv(context, bridge, nullptr, 3, 1, spec, dst.data()).ok());
  const double waited =
      std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(waited, 0.06);
  EXPECT_LT(waited, 5.0);
  const std::vector<uint8_t> src = Pattern(8, 0);
  Status next = StagedSend(context, bridge, nullptr, 3, 2,
                           Spec(DType::kU8, {8}), src.data());
  EXPECT_EQ(next.code(), StatusCode::kTimeout) << next.message();
  EXPECT_NE(next.message().find("peer 3, tag 1"), std::string::npos)
      << next.message();
}

TEST(Staging, WaitDeadlineFollowsTheBridgeTimeout) {
  BridgeOptions options;
  options.timeout_seconds = 120;
  EXPECT_EQ(WaitDeadlineNs(options), uint64_t{250} * 1'000'000'000u);
  options.timeout_seconds = 0;  // the bridge waits forever: so may we
  EXPECT_EQ(WaitDeadlineNs(options), 0u);
}

}  // namespace
}  // namespace hetjax::gpu
