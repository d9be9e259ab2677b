// Pools and deferred release: what keeps pinned allocation and event
// creation off the hot path without handing back memory a stream still uses.
#include <gtest/gtest.h>

#include <set>
#include <thread>
#include <vector>

#include "cc/device/event_pool.h"
#include "cc/device/flag_pool.h"
#include "cc/device/pinned_pool.h"
#include "cc/device/retire_list.h"
#include "cc/device/tests/manual_events_device.h"

namespace hetjax::device {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(PinnedPool, RoundsUpWithBoundedWaste) {
  for (size_t bytes : {size_t{1}, size_t{1000}, 3 * kMiB + 1, 100 * kMiB,
                       256 * kMiB, 300 * kMiB}) {
    const size_t rounded = PinnedPool::RoundedSize(bytes);
    EXPECT_GE(rounded, bytes);
    EXPECT_LE(rounded, std::max(bytes + bytes / 4, size_t{64} << 10)) << bytes;
  }
  EXPECT_EQ(PinnedPool::RoundedSize(256 * kMiB), 256 * kMiB);
  EXPECT_EQ(PinnedPool::RoundedSize(0), size_t{64} << 10);
}

TEST(PinnedPool, ReusesReleasedBuffers) {
  PinnedPool pool(HostDevice(), 64 * kMiB);
  PinnedPool::Buffer a;
  ASSERT_TRUE(pool.Acquire(5 * kMiB, &a).ok());
  ASSERT_GE(a.capacity, 5 * kMiB);
  static_cast<char*>(a.data)[a.capacity - 1] = 1;  // really that large
  pool.Release(a);
  EXPECT_EQ(pool.cached_bytes(), a.capacity);

  PinnedPool::Buffer b;
  ASSERT_TRUE(pool.Acquire(5 * kMiB - 100, &b).ok());
  EXPECT_EQ(b.data, a.data);
  EXPECT_EQ(pool.allocations(), 1u);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  pool.Release(b);
}

TEST(PinnedPool, SmallRequestDoesNotTakeAHugeBuffer) {
  PinnedPool pool(HostDevice(), 256 * kMiB);
  PinnedPool::Buffer big, small;
  ASSERT_TRUE(pool.Acquire(64 * kMiB, &big).ok());
  pool.Release(big);
  ASSERT_TRUE(pool.Acquire(kMiB, &small).ok());
  EXPECT_NE(small.data, big.data);
  EXPECT_EQ(pool.allocations(), 2u);
  EXPECT_EQ(pool.cached_bytes(), big.capacity);
  pool.Release(small);
}

TEST(PinnedPool, FreesBeyondTheCacheLimit) {
  PinnedPool pool(HostDevice(), 3 * kMiB);
  PinnedPool::Buffer a, b;
  ASSERT_TRUE(pool.Acquire(2 * kMiB, &a).ok());
  ASSERT_TRUE(pool.Acquire(2 * kMiB, &b).ok());
  pool.Release(a);
  pool.Release(b);  // would exceed 3 MiB cached: freed instead
  EXPECT_EQ(pool.cached_bytes(), a.capacity);
}

TEST(FlagPool, FlagsAreZeroedDistinctAndGrowPastOneSlab) {
  FlagPool pool(HostDevice());
  std::vector<FlagPool::Flag> flags;
  std::set<const void*> seen;
  for (size_t i = 0; i < FlagPool::kSlotsPerSlab + 3; ++i) {
    FlagPool::Flag f;
    ASSERT_TRUE(pool.Acquire(&f).ok());
    EXPECT_EQ(f.host->ready, 0u);
    EXPECT_EQ(f.host->abort, 0u);
    EXPECT_EQ(f.host->timed_out, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f.host) % FlagPool::kSlotBytes, 0u);
    EXPECT_TRUE(seen.insert(f.host).second);
    flags.push_back(f);
  }
  // A flag dirtied by its last user comes back clean.
  SignalFlag(flags[0].host, 9);
  AbortFlag(flags[0].host);
  pool.Release(flags[0]);
  FlagPool::Flag again;
  ASSERT_TRUE(pool.Acquire(&again).ok());
  EXPECT_EQ(again.host, flags[0].host);
  EXPECT_EQ(again.device->ready, 0u);  // the device view sees the reset
  EXPECT_EQ(again.device->abort, 0u);
  flags[0] = again;
  for (auto& f : flags) pool.Release(f);
}

TEST(EventPool, ReusesPerDevice) {
  EventPool pool(HostDevice());
  Event a = nullptr, b = nullptr;
  ASSERT_TRUE(pool.Acquire(0, &a).ok());
  pool.Release(0, a);
  ASSERT_TRUE(pool.Acquire(0, &b).ok());
  EXPECT_EQ(a, b);
  // An event of device 0 is never handed out for device 1.
  pool.Release(0, b);
  Event c = nullptr;
  ASSERT_TRUE(pool.Acquire(1, &c).ok());
  EXPECT_NE(c, a);
  pool.Release(1, c);
}

TEST(RetireList, ReleasesOnlyAfterTheFenceCompletes) {
  testing::ManualEventsDevice dev;
  RetireList list(dev);
  Event fence_a = nullptr, fence_b = nullptr;
  ASSERT_TRUE(dev.CreateEvent(&fence_a).ok());
  ASSERT_TRUE(dev.CreateEvent(&fence_b).ok());
  dev.RecordEvent(fence_a, nullptr);
  dev.RecordEvent(fence_b, nullptr);
  int released_a = 0, released_b = 0;
  list.Retire(fence_a, [&] { ++released_a; });
  list.Retire(fence_b, [&] { ++released_b; });

  EXPECT_EQ(list.Poll(), 0u);
  EXPECT_EQ(released_a + released_b, 0);
  dev.Complete(fence_b);
  EXPECT_EQ(list.Poll(), 1u);
  EXPECT_EQ(released_b, 1);
  EXPECT_EQ(released_a, 0);
  EXPECT_EQ(list.pending(), 1u);

  std::thread completer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    dev.Complete(fence_a);
  });
  list.Drain();  // blocks until fence_a completes
  completer.join();
  EXPECT_EQ(released_a, 1);
  EXPECT_EQ(list.pending(), 0u);
  EXPECT_EQ(list.Poll(), 0u);  // nothing runs twice
  EXPECT_EQ(released_a + released_b, 2);
  dev.DestroyEvent(fence_a);
  dev.DestroyEvent(fence_b);
}

}  // namespace
}  // namespace hetjax::device
