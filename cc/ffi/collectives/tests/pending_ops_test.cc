// The table of started collectives and the per-device host workers that
// start/done share (pending_ops.h): what a done finds, what it refuses, and
// that a device's started work runs in start order off the caller's thread.
#include "cc/ffi/collectives/pending_ops.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace hetjax::collectives {
namespace {

int buffer_a = 0, buffer_b = 0;

TEST(PendingOps, ADoneFinishesItsStartOnce) {
  int finished = 0;
  ASSERT_TRUE(AddPending(1, 0, &buffer_a, [&](void*) {
                ++finished;
                return Status::Ok();
              }).ok());
  EXPECT_TRUE(FinishPendingOp(1, 0, &buffer_a, nullptr).ok());
  EXPECT_EQ(finished, 1);
  // Forgotten once done: a second done has no start.
  Status again = FinishPendingOp(1, 0, &buffer_a, nullptr);
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("done without a start"), std::string::npos);
}

TEST(PendingOps, ATagStartedTwiceOnADeviceIsRefusedButNotOnAnother) {
  auto ok = [](void*) { return Status::Ok(); };
  ASSERT_TRUE(AddPending(2, 0, &buffer_a, ok).ok());
  Status twice = AddPending(2, 0, &buffer_a, ok);
  EXPECT_FALSE(twice.ok());
  EXPECT_NE(twice.message().find("started twice"), std::string::npos);
  EXPECT_TRUE(AddPending(2, 1, &buffer_b, ok).ok());  // device 1's own op
  EXPECT_TRUE(FinishPendingOp(2, 0, &buffer_a, nullptr).ok());
  EXPECT_TRUE(FinishPendingOp(2, 1, &buffer_b, nullptr).ok());
}

TEST(PendingOps, ADoneOnAnotherBufferThanTheStartsResultFailsAfterFinishing) {
  // XLA copying the result between start and done would hand the done a
  // buffer the op never wrote: refused, after the op itself has finished.
  bool finished = false;
  ASSERT_TRUE(AddPending(3, 0, &buffer_a, [&](void*) {
                finished = true;
                return Status::Ok();
              }).ok());
  Status s = FinishPendingOp(3, 0, &buffer_b, nullptr);
  EXPECT_TRUE(finished);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("another buffer than the one the start writes"),
            std::string::npos);
  EXPECT_NE(s.message().find("collective tag 3 on device 0"),
            std::string::npos);
}

TEST(PendingOps, HostWorkRunsOffTheCallerInStartOrderAndTheDoneWaitsForIt) {
  std::mutex mu;
  std::vector<int> ran;
  std::atomic<bool> release{false};
  const auto caller = std::this_thread::get_id();
  std::thread::id worker;
  ASSERT_TRUE(StartOnHostWorker(4, 7, &buffer_a, [&] {
                while (!release.load()) {
                  std::this_thread::sleep_for(std::chrono::milliseconds(1));
                }
                std::lock_guard<std::mutex> lock(mu);
                worker = std::this_thread::get_id();
                ran.push_back(1);
                return Status::Ok();
              }).ok());
  ASSERT_TRUE(StartOnHostWorker(5, 7, &buffer_b, [&] {
                std::lock_guard<std::mutex> lock(mu);
                ran.push_back(2);
                return Status(StatusCode::kPeerLost, "peer lost");
              }).ok());
  // Both starts returned while the first op is still blocked.
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(ran.empty());
  }
  release = true;
  EXPECT_TRUE(FinishPendingOp(4, 7, &buffer_a, nullptr).ok());
  Status second = FinishPendingOp(5, 7, &buffer_b, nullptr);
  EXPECT_EQ(second.code(), StatusCode::kPeerLost);  // the op's own error
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
  EXPECT_NE(worker, caller);
}

}  // namespace
}  // namespace hetjax::collectives
