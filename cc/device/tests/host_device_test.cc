// The host device's contract, which the GPU staging logic relies on when it
// runs on CPU machines: copies move bytes, events are usable handles, and
// flag waits release on signal, on abort and at their deadline.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "cc/device/device.h"

namespace hetjax::device {
namespace {

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

class HostDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    void* device = nullptr;
    ASSERT_TRUE(dev_.AllocMapped(sizeof(WaitFlag), &flag_mem_, &device).ok());
    host_flag_ = static_cast<WaitFlag*>(flag_mem_);
    device_flag_ = static_cast<const WaitFlag*>(device);
    ResetFlag(host_flag_);
  }
  void TearDown() override { dev_.FreeMapped(flag_mem_); }

  Device& dev_ = HostDevice();
  void* flag_mem_ = nullptr;
  WaitFlag* host_flag_ = nullptr;
  const WaitFlag* device_flag_ = nullptr;
};

TEST_F(HostDeviceTest, NameAndSingleDevice) {
  EXPECT_STREQ(dev_.name(), "host");
  int ordinal = -1;
  ASSERT_TRUE(dev_.StreamDevice(nullptr, &ordinal).ok());
  EXPECT_EQ(ordinal, 0);
  EXPECT_TRUE(dev_.SetCurrentDevice(0).ok());
  Status bad = dev_.SetCurrentDevice(3);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("3"), std::string::npos) << bad.message();
}

TEST_F(HostDeviceTest, CopiesRoundTripBytes) {
  const size_t n = 1 << 16;
  void* pinned = nullptr;
  void* device = nullptr;
  ASSERT_TRUE(dev_.AllocPinned(n, &pinned).ok());
  ASSERT_TRUE(dev_.AllocDevice(n, &device).ok());
  std::vector<uint8_t> src(n), back(n);
  std::iota(src.begin(), src.end(), 7);
  std::memcpy(pinned, src.data(), n);
  ASSERT_TRUE(dev_.CopyToDeviceAsync(device, pinned, n, nullptr).ok());
  std::memset(pinned, 0, n);
  ASSERT_TRUE(dev_.CopyToHostAsync(pinned, device, n, nullptr).ok());
  ASSERT_TRUE(dev_.SynchronizeStream(nullptr).ok());
  std::memcpy(back.data(), pinned, n);
  EXPECT_EQ(back, src);

  ASSERT_TRUE(dev_.MemsetAsync(device, 0xab, 10, nullptr).ok());
  ASSERT_TRUE(dev_.CopyToHostAsync(pinned, device, 11, nullptr).ok());
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(static_cast<uint8_t*>(pinned)[i], 0xab);
  EXPECT_EQ(static_cast<uint8_t*>(pinned)[10], src[10]);  // only 10 were set
  dev_.FreeDevice(device);
  dev_.FreePinned(pinned);
}

TEST_F(HostDeviceTest, MappedViewsAliasTheSameBytes) {
  void* host = nullptr;
  void* device = nullptr;
  ASSERT_TRUE(dev_.AllocMapped(64, &host, &device).ok());
  static_cast<uint32_t*>(host)[3] = 42;
  EXPECT_EQ(static_cast<uint32_t*>(device)[3], 42u);
  dev_.FreeMapped(host);
}

TEST_F(HostDeviceTest, EventsAreDistinctAndCompleteOnceRecorded) {
  Event a = nullptr, b = nullptr;
  ASSERT_TRUE(dev_.CreateEvent(&a).ok());
  ASSERT_TRUE(dev_.CreateEvent(&b).ok());
  EXPECT_NE(a, nullptr);
  EXPECT_NE(a, b);
  ASSERT_TRUE(dev_.RecordEvent(a, nullptr).ok());
  bool done = false;
  ASSERT_TRUE(dev_.QueryEvent(a, &done).ok());
  EXPECT_TRUE(done);
  EXPECT_TRUE(dev_.SynchronizeEvent(a).ok());
  EXPECT_FALSE(dev_.RecordEvent(nullptr, nullptr).ok());
  dev_.DestroyEvent(a);
  dev_.DestroyEvent(b);
}

TEST_F(HostDeviceTest, WaitReturnsAtOnceWhenAlreadySignalled) {
  SignalFlag(host_flag_, 3);
  const auto t0 = Clock::now();
  ASSERT_TRUE(dev_.WaitFlagAsync(device_flag_, 3, 0, nullptr).ok());
  ASSERT_TRUE(dev_.WaitFlagAsync(device_flag_, 2, 0, nullptr).ok());
  EXPECT_LT(MillisSince(t0), 50.0);
  EXPECT_FALSE(FlagTimedOut(host_flag_));
}

TEST_F(HostDeviceTest, WaitHoldsUntilTargetReached) {
  // Before the thread starts: it may run its sleeps while this one waits
  // for a core, and the wait then holds for less than 60 ms after it.
  const auto t0 = Clock::now();
  std::thread signaller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    SignalFlag(host_flag_, 1);  // not enough for target 2
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    SignalFlag(host_flag_, 2);
  });
  ASSERT_TRUE(dev_.WaitFlagAsync(device_flag_, 2, 0, nullptr).ok());
  const double waited = MillisSince(t0);
  signaller.join();
  EXPECT_GE(waited, 55.0);
  EXPECT_FALSE(FlagTimedOut(host_flag_));
}

TEST_F(HostDeviceTest, SignalNeverLowersTheCount) {
  SignalFlag(host_flag_, 5);
  SignalFlag(host_flag_, 2);  // a late, stale progress report
  EXPECT_EQ(host_flag_->ready, 5u);
}

TEST_F(HostDeviceTest, AbortReleasesWithoutTimingOut) {
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    AbortFlag(host_flag_);
  });
  const auto t0 = Clock::now();
  ASSERT_TRUE(
      dev_.WaitFlagAsync(device_flag_, 1, 10'000'000'000ull, nullptr).ok());
  aborter.join();
  EXPECT_LT(MillisSince(t0), 5000.0);
  EXPECT_FALSE(FlagTimedOut(host_flag_));
  EXPECT_EQ(host_flag_->ready, 0u);
}

TEST_F(HostDeviceTest, DeadlineReleasesAndMarksTimedOut) {
  const auto t0 = Clock::now();
  ASSERT_TRUE(dev_.WaitFlagAsync(device_flag_, 1, 30'000'000, nullptr).ok());
  const double waited = MillisSince(t0);
  EXPECT_GE(waited, 30.0);
  EXPECT_LT(waited, 5000.0);
  EXPECT_TRUE(FlagTimedOut(host_flag_));
  ResetFlag(host_flag_);
  EXPECT_FALSE(FlagTimedOut(host_flag_));
  EXPECT_EQ(host_flag_->ready, 0u);
}

// The hand-off's default (separate ops) is what every non-fused chunk and
// the whole host device run: it waits for every flag, copies, then signals.
TEST_F(HostDeviceTest, HandoffWaitsCopiesThenSignals) {
  void* other_mem = nullptr;
  void* other_device = nullptr;
  ASSERT_TRUE(
      dev_.AllocMapped(sizeof(WaitFlag), &other_mem, &other_device).ok());
  auto* signal = static_cast<WaitFlag*>(other_mem);
  ResetFlag(signal);
  std::vector<uint8_t> src(4099), dst(4099, 0);
  std::iota(src.begin(), src.end(), uint8_t{3});
  Device::Handoff move;
  move.waits[0] = {device_flag_, 2};
  move.kind = Device::CopyKind::kHostToDevice;
  move.src = move.src_device = src.data();
  move.dst = move.dst_device = dst.data();
  move.bytes = src.size();
  move.signal_host = signal;
  move.signal_device = static_cast<WaitFlag*>(other_device);
  move.signal_value = 5;
  move.fuse = true;  // the host device has one way only
  std::thread raise([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(dst[0], 0) << "copied before the wait released";
    EXPECT_EQ(signal->ready, 0u) << "signalled before the wait released";
    SignalFlag(host_flag_, 2);
  });
  ASSERT_TRUE(dev_.HandoffAsync(move, nullptr).ok());
  raise.join();
  EXPECT_EQ(dst, src);
  EXPECT_EQ(signal->ready, 5u);
  EXPECT_FALSE(FlagTimedOut(host_flag_));
  dev_.FreeMapped(other_mem);
}

TEST_F(HostDeviceTest, HandoffPastItsDeadlineMarksTheFlagItWaitedOn) {
  Device::Handoff move;
  move.waits[1] = {device_flag_, 1};
  move.timeout_ns = 20'000'000;
  ASSERT_TRUE(dev_.HandoffAsync(move, nullptr).ok());
  EXPECT_TRUE(FlagTimedOut(host_flag_));
}

TEST(NoGpuDevice, AbsentWithoutAGpuFlavour) {
#if defined(HETJAX_EXPECT_GPU)
  ASSERT_NE(GpuDevice(), nullptr);
  EXPECT_STRNE(GpuDevice()->name(), "host");
#else
  EXPECT_EQ(GpuDevice(), nullptr);
#endif
}

}  // namespace
}  // namespace hetjax::device
