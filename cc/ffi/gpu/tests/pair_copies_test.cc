// The copy-engine pair exchange on the host device: two threads play the two
// GPUs (a stream wait blocks its thread there, so a publisher really waits
// for buffers its peer frees). Plain moves of several sizes across
// consecutive exchanges: slots wrap, the last chunk is partial, a publisher
// never runs more than `depth` chunks ahead of its peer's frees, and every
// byte arrives where it belongs. The combines need a GPU (tests/gpu).
#include "cc/ffi/gpu/pair_copies.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace hetjax::gpu {
namespace {

constexpr uint32_t kDepth = 4;
constexpr uint64_t kChunk = 64;
constexpr uint64_t kWorkspace = sizeof(device::PairCounters) + kDepth * kChunk;

// One end: its segment (created), the peer's (opened), lanes and scratch.
struct End {
  std::unique_ptr<SlotRing> local, remote;
  PairCopyRoute route;
  uint64_t next_out = 0, next_in = 0;

  ~End() {
    device::Device& host = device::HostDevice();
    for (device::Event* event : route.Events()) {
      if (*event != nullptr) (void)host.DestroyEvent(*event);
    }
    if (route.scratch != nullptr) (void)host.FreeDevice(route.scratch);
  }

  void Connect(const std::string& peer_segment) {
    device::Device& host = device::HostDevice();
    ASSERT_TRUE(SlotRing::Open(peer_segment, &remote).ok());
    ASSERT_TRUE(local->Register(host).ok());
    ASSERT_TRUE(remote->Register(host).ok());
    route.local = local.get();
    route.remote = remote.get();
    ASSERT_TRUE(
        PairCopyLanes(host, 1, &route.publish_lane, &route.consume_lane).ok());
    route.SetDepth(kDepth);
    for (device::Event* event : route.Events()) {
      ASSERT_TRUE(host.CreateEvent(event).ok());
    }
    ASSERT_TRUE(host.AllocDevice(kDepth * kChunk, &route.scratch).ok());
  }

  // Sends `out` and receives `in_bytes` into `in`, as one plain move.
  Status Move(const std::vector<uint8_t>& out, std::vector<uint8_t>* in,
              uint64_t timeout_ns = 0) {
    device::PairExchange x;
    x.depth = kDepth;
    x.chunk_bytes = kChunk;
    x.first_out = next_out;
    x.first_in = next_in;
    x.publish = out.data();
    x.publish_bytes = out.size();
    x.consume_bytes = in->size();
    x.element_bytes = 1;
    x.combine.wide = x.combine.a_type = x.combine.out_type =
        device::ElementType::kU8;
    x.combine.out = in->data();
    x.timeout_ns = timeout_ns;
    next_out += (out.size() + kChunk - 1) / kChunk;
    next_in += (in->size() + kChunk - 1) / kChunk;
    return EnqueuePairCopies(device::HostDevice(), nullptr, x, route);
  }
};

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

class PairCopies : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string base =
        "/hetjax-pair-copies-test-" + std::to_string(getpid());
    names_ = {base + "-a", base + "-b"};
    for (int e = 0; e < 2; ++e) {
      ASSERT_TRUE(
          SlotRing::Create(names_[e], {1, kWorkspace, true}, &ends_[e].local)
              .ok());
    }
    ends_[0].Connect(names_[1]);
    ends_[1].Connect(names_[0]);
  }

  std::vector<std::string> names_;
  End ends_[2];
};

TEST_F(PairCopies, MovesEveryByteAcrossWrappingSlotsAndExchanges) {
  // Sizes a sends / b sends, per exchange (chunks of 64 bytes, 4 buffers).
  // The third makes a's publisher wait on frees b raises while consuming
  // it; the last moves one way only.
  const std::vector<std::pair<size_t, size_t>> sizes = {
      {200, 130}, {64, 1}, {600, 100}, {0, 300}};
  for (size_t op = 0; op < sizes.size(); ++op) {
    const auto [a_bytes, b_bytes] = sizes[op];
    const std::vector<uint8_t> from_a = Bytes(a_bytes, 3 + op);
    const std::vector<uint8_t> from_b = Bytes(b_bytes, 101 + op);
    std::vector<uint8_t> at_a(b_bytes, 0), at_b(a_bytes, 0);
    auto a = std::async(std::launch::async,
                        [&] { return ends_[0].Move(from_a, &at_a); });
    // Alone, a may run at most `depth` chunks ahead of what b has freed.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_LE(ends_[1].local->filled_host(0)->ready,
              ends_[0].local->freed_host(0)->ready + kDepth)
        << "exchange " << op;
    const Status b = ends_[1].Move(from_b, &at_b);
    ASSERT_TRUE(b.ok()) << b.message();
    const Status a_status = a.get();
    ASSERT_TRUE(a_status.ok()) << a_status.message();
    EXPECT_EQ(at_a, from_b) << "exchange " << op;
    EXPECT_EQ(at_b, from_a) << "exchange " << op;
  }
  // Every chunk each end pushed was raised on the peer's segment and freed.
  EXPECT_EQ(ends_[1].local->filled_host(0)->ready, ends_[0].next_out);
  EXPECT_EQ(ends_[0].local->freed_host(0)->ready, ends_[0].next_out);
  EXPECT_EQ(ends_[0].local->filled_host(0)->ready, ends_[1].next_out);
  EXPECT_EQ(ends_[0].next_out, 4u + 1 + 10 + 0);
  EXPECT_EQ(ends_[1].next_out, 3u + 1 + 2 + 5);
}

TEST_F(PairCopies, AWaitThatGivesUpMarksOurSegmentsFlag) {
  // The peer never sends: the wait gives up after its deadline and marks
  // the flag it waited on, where PairWorkspace looks before its next op.
  std::vector<uint8_t> in(10, 0);
  ASSERT_TRUE(ends_[0].Move({}, &in, 2'000'000).ok());
  EXPECT_EQ(ends_[0].local->filled_host(0)->timed_out, 1u);
  EXPECT_EQ(ends_[0].local->freed_host(0)->timed_out, 0u);
}

}  // namespace
}  // namespace hetjax::gpu
