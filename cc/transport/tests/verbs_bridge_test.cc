// Two bridges of one process joined over verbs (one queue pair per active
// RDMA port, striped), with a socketpair for liveness. Needs an RDMA device:
// skipped where there is none (CI runs it inside the soft-RoCE guest,
// tests/rdma). Small rings and writes so every size wraps rings and
// exercises credit return.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cc/transport/tests/bridge_pair.h"
#include "cc/transport/verbs_link.h"
#include "gtest/gtest.h"

namespace hetjax {
namespace {

using testing::BridgePair;
using testing::ConnectTcp;
using testing::Pattern;
using testing::Spec;
using testing::TestOptions;

std::vector<std::string> ActiveDevices() {
  std::vector<std::string> names;
  for (const VerbsPort& port : ListVerbsPorts()) {
    if (port.active)
      names.push_back(port.device + ":" + std::to_string(port.port));
  }
  return names;
}

VerbsLinkOptions SmallRings(std::vector<std::string> devices) {
  VerbsLinkOptions options;
  options.devices = std::move(devices);
  options.ring_bytes = 64 << 10;
  options.max_write_bytes = 8 << 10;
  options.max_writes_in_flight = 4;
  return options;
}

// Prepares both sides, then connects both: the order the control plane
// uses (endpoints published before either connects).
void ConnectVerbs(BridgePair& pair, const VerbsLinkOptions& options) {
  std::string ep0, ep1;
  ASSERT_TRUE(pair.rank0->PrepareVerbsPeer(1, options, &ep0).ok());
  ASSERT_TRUE(pair.rank1->PrepareVerbsPeer(0, options, &ep1).ok());
  Status s0 = pair.rank0->ConnectVerbsPeer(1, ep1);
  ASSERT_TRUE(s0.ok()) << s0.message();
  Status s1 = pair.rank1->ConnectVerbsPeer(0, ep0);
  ASSERT_TRUE(s1.ok()) << s1.message();
}

class VerbsBridgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!VerbsCompiledIn()) GTEST_SKIP() << "built without libibverbs";
    devices_ = ActiveDevices();
    if (devices_.empty()) GTEST_SKIP() << "no active RDMA port here";
  }
  std::vector<std::string> devices_;
};

TEST_F(VerbsBridgeTest, OddSizesBothWaysOutOfOrderOverEveryDevice) {
  auto pair = ConnectTcp(1);
  ConnectVerbs(pair, SmallRings(devices_));
  const std::vector<int64_t> sizes = {0, 1, 127, 8191, 65536, 65537, 300001};
  auto send_all = [&](Bridge* from, int to) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto data = Pattern(sizes[i], i + 10 * to);
      Status s =
          from->Send(to, 100 + i, Spec(DType::kU8, {sizes[i]}), data.data());
      EXPECT_TRUE(s.ok()) << s.message();
    }
  };
  std::thread a([&] { send_all(pair.rank0.get(), 1); });
  std::thread b([&] { send_all(pair.rank1.get(), 0); });
  // Reverse order: later messages wait as unexpected ones.
  for (size_t k = sizes.size(); k-- > 0;) {
    for (int me : {0, 1}) {
      Bridge* bridge = me == 0 ? pair.rank0.get() : pair.rank1.get();
      std::vector<uint8_t> out(sizes[k] + 1, 0xee);
      Status s = bridge->Recv(1 - me, 100 + k, Spec(DType::kU8, {sizes[k]}),
                              out.data());
      ASSERT_TRUE(s.ok()) << s.message();
      auto want = Pattern(sizes[k], k + 10 * me);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), out.begin()))
          << "size " << sizes[k] << " to rank " << me;
      EXPECT_EQ(out[sizes[k]], 0xee);
    }
  }
  a.join();
  b.join();
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  EXPECT_EQ(pair.rank1->GetStats().bytes_received,
            static_cast<uint64_t>(total));
}

TEST_F(VerbsBridgeTest, AMismatchNamesBothSidesAndTheLinkGoesOn) {
  auto pair = ConnectTcp(1);
  ConnectVerbs(pair, SmallRings(devices_));
  std::vector<float> x(6, 1.5f);
  ASSERT_TRUE(pair.rank0->Send(1, 7, Spec(DType::kF32, {2, 3}), x.data()).ok());
  std::vector<int32_t> wrong(6);
  Status s = pair.rank1->Recv(0, 7, Spec(DType::kS32, {6}), wrong.data());
  EXPECT_EQ(s.code(), StatusCode::kMismatch);
  EXPECT_CONTAINS(s.message(), "float32[2,3]");
  EXPECT_CONTAINS(s.message(), "int32[6]");
  ASSERT_TRUE(pair.rank0->Send(1, 8, Spec(DType::kF32, {2, 3}), x.data()).ok());
  std::vector<float> y(6);
  ASSERT_TRUE(pair.rank1->Recv(0, 8, Spec(DType::kF32, {2, 3}), y.data()).ok());
  EXPECT_EQ(y, x);
}

TEST_F(VerbsBridgeTest, APeerThatStopsMidMessageFailsTheReceiver) {
  // Rank 0 flushes for at most its timeout before it stops: far too short
  // for 32 MiB through 64 KiB rings, so it leaves mid-message.
  BridgeOptions quick = TestOptions(0);
  quick.timeout_seconds = 0.3;
  auto pair = ConnectTcp(1, quick, TestOptions(1));
  ConnectVerbs(pair, SmallRings(devices_));
  const int64_t big = 32 << 20;
  auto data = Pattern(big, 1);
  std::vector<uint8_t> out(big);
  Status received;
  std::atomic<bool> done{false};
  pair.rank1->PostRecv(0, 9, Spec(DType::kU8, {big}), out.data(),
                       [&](uint64_t, bool finished, const Status& s) {
                         if (finished) received = s, done = true;
                       });
  pair.rank0->SendAsync(1, 9, Spec(DType::kU8, {big}), data.data(), nullptr,
                        nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto start = std::chrono::steady_clock::now();
  pair.rank0.reset();
  ASSERT_TRUE(testing::WaitFor([&] { return done.load(); }, 5.0));
  EXPECT_EQ(received.code(), StatusCode::kPeerLost) << received.message();
  EXPECT_CONTAINS(received.message(), "peer rank 0 lost");
  EXPECT_LT(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count(),
      5.0);
}

TEST_F(VerbsBridgeTest, ConnectRefusesAnEndpointOfAnotherShape) {
  auto pair = ConnectTcp(1);
  std::string ep0;
  ASSERT_TRUE(pair.rank0->PrepareVerbsPeer(1, SmallRings(devices_), &ep0).ok());
  Status s = pair.rank0->ConnectVerbsPeer(1, "hv1;1,2,3");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), "rank 1");
  s = pair.rank0->ConnectVerbsPeer(1, ep0);
  EXPECT_CONTAINS(s.message(), "PrepareVerbsPeer first");
}

TEST(VerbsLinkTest, UnknownDevicesAreNamedWithWhatExists) {
  if (!VerbsCompiledIn()) GTEST_SKIP() << "built without libibverbs";
  auto pair = ConnectTcp(1);
  std::string ep;
  VerbsLinkOptions options;
  options.devices = {"no_such_nic0"};
  Status s = pair.rank0->PrepareVerbsPeer(1, options, &ep);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), "no_such_nic0 not found");
}

}  // namespace
}  // namespace hetjax
