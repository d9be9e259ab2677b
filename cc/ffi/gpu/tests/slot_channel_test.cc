// Slot channels on the host device, between two real bridges of one process
// (tcp socketpair): chunk and slot accounting across ring wrap-around on both
// paths, descriptor checks, and what a mismatch does to the channel. Two
// threads play the two processes: on the host device a stream wait blocks its
// caller, so the sender really waits for slots the receiver frees.
#include "cc/ffi/gpu/slot_channel.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "cc/ffi/gpu/host_channel.h"
#include "cc/transport/tests/bridge_pair.h"

namespace hetjax::gpu {
namespace {

using hetjax::testing::Pattern;
using hetjax::testing::Spec;

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(PlanChunks, CutsAboutEightChunksWithinMinimumAndSlot) {
  EXPECT_EQ(PlanChunks(0, 8 * kMiB).chunks, 0u);
  ChunkPlan small = PlanChunks(4096, 8 * kMiB);
  EXPECT_EQ(small.chunks, 1u);
  EXPECT_EQ(small.chunk_bytes, kMinChunkBytes);
  ChunkPlan mid = PlanChunks(32 * kMiB, 8 * kMiB);
  EXPECT_EQ(mid.chunk_bytes, 4 * kMiB);
  EXPECT_EQ(mid.chunks, 8u);
  ChunkPlan big = PlanChunks(256 * kMiB + 1, 8 * kMiB);
  EXPECT_EQ(big.chunk_bytes, 8 * kMiB);  // capped by the slot
  EXPECT_EQ(big.chunks, 33u);
  ChunkPlan tiny_slots = PlanChunks(3 * kMiB, kMiB / 2);
  EXPECT_EQ(tiny_slots.chunk_bytes, kMiB / 2);
  EXPECT_EQ(tiny_slots.chunks, 6u);
  ChunkPlan ipc = PlanChunks(64 * kMiB, 32 * kMiB, kIpcTargetChunks);
  EXPECT_EQ(ipc.chunk_bytes, 32 * kMiB);
  EXPECT_EQ(ipc.chunks, 2u);
  EXPECT_EQ(PlanChunks(256 * kMiB, 32 * kMiB, kIpcTargetChunks).chunks, 8u);
}

SlotDescriptor Described(uint64_t tag, const TensorSpec& spec, uint64_t first) {
  SlotDescriptor d;
  d.magic = kSlotDescriptorMagic;
  d.path = static_cast<uint8_t>(SlotPath::kHost);
  d.tag = tag;
  d.spec = spec;
  d.first_chunk = first;
  return d;
}

TEST(CheckDescriptor, NamesBothSidesOfEveryMismatch) {
  const TensorSpec f32 = Spec(DType::kF32, {4});
  EXPECT_TRUE(
      CheckDescriptor(1, 7, f32, 3, SlotPath::kHost, Described(7, f32, 3))
          .ok());
  Status dtype = CheckDescriptor(1, 7, Spec(DType::kS32, {4}), 3,
                                 SlotPath::kHost, Described(7, f32, 3));
  EXPECT_EQ(dtype.code(), StatusCode::kMismatch);
  EXPECT_CONTAINS(dtype.message(), "peer 1, tag 7, int32[4]");
  EXPECT_CONTAINS(dtype.message(), "tag 7, float32[4]");
  Status order =
      CheckDescriptor(1, 8, f32, 3, SlotPath::kHost, Described(7, f32, 3));
  EXPECT_CONTAINS(order.message(), "expected tag 8");
  EXPECT_CONTAINS(order.message(), "next message is tag 7");
  Status position =
      CheckDescriptor(1, 7, f32, 5, SlotPath::kHost, Described(7, f32, 3));
  EXPECT_CONTAINS(position.message(), "starts at chunk 3");
  EXPECT_CONTAINS(position.message(), "at chunk 5");
  Status path =
      CheckDescriptor(1, 7, f32, 3, SlotPath::kIpc, Described(7, f32, 3));
  EXPECT_EQ(path.code(), StatusCode::kMismatch);
  SlotDescriptor corrupt = Described(7, f32, 3);
  corrupt.magic = 0;
  EXPECT_CONTAINS(
      CheckDescriptor(1, 7, f32, 3, SlotPath::kHost, corrupt).message(),
      "corrupt");
}

// Rank 0 sends to rank 1 through one direction of a channel pair.
struct ChannelPair {
  explicit ChannelPair(SlotPath path, uint32_t slots, uint64_t slot_bytes)
      : bridges(hetjax::testing::ConnectTcp(1)),
        sender_context(device::HostDevice(), 64 * kMiB),
        receiver_context(device::HostDevice(), 64 * kMiB) {
    const std::string base = "/hetjax-slot-test-" + std::to_string(getpid()) +
                             "-" + std::to_string(counter++);
    SlotChannelConfig config0{1,     path,      base + "-01", base + "-10",
                              slots, slot_bytes};
    SlotChannelConfig config1{0,     path,      base + "-10", base + "-01",
                              slots, slot_bytes};
    EXPECT_TRUE(SlotChannel::Create(config0, &sender).ok());
    EXPECT_TRUE(SlotChannel::Create(config1, &receiver).ok());
  }

  Status Send(uint64_t tag, const TensorSpec& spec, const void* src) {
    return sender->Send(sender_context, *bridges.rank0, nullptr, tag, spec,
                        src);
  }
  Status Recv(uint64_t tag, const TensorSpec& spec, void* dst) {
    return receiver->Recv(receiver_context, *bridges.rank1, nullptr, tag, spec,
                          dst);
  }

  static inline int counter = 0;
  hetjax::testing::BridgePair bridges;
  StagingContext sender_context, receiver_context;
  std::shared_ptr<SlotChannel> sender, receiver;
};

class SlotChannelPaths : public ::testing::TestWithParam<SlotPath> {};

TEST_P(SlotChannelPaths, MessagesLargerThanTheRingArriveIntactInOrder) {
  // Two slots of 1 MiB: every message past the first wraps the ring, and
  // the sender must wait for slots the receiver frees.
  ChannelPair pair(GetParam(), 2, kMiB);
  const std::vector<uint64_t> sizes = {
      0, 1, 4096, kMiB - 1, kMiB, 5 * kMiB + 3, 7, 3 * kMiB};
  auto sender = std::async(std::launch::async, [&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::vector<uint8_t> src = Pattern(sizes[i], 100 + i);
      Status s =
          pair.Send(i + 1, Spec(DType::kU8, {int64_t(sizes[i])}), src.data());
      if (!s.ok()) return s;
    }
    return Status::Ok();
  });
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE(sizes[i]);
    std::vector<uint8_t> dst(sizes[i], 0xEE);
    Status s =
        pair.Recv(i + 1, Spec(DType::kU8, {int64_t(sizes[i])}), dst.data());
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_TRUE(dst == Pattern(sizes[i], 100 + i));
  }
  Status sent = sender.get();
  EXPECT_TRUE(sent.ok()) << sent.message();
}

INSTANTIATE_TEST_SUITE_P(HostAndIpc, SlotChannelPaths,
                         ::testing::Values(SlotPath::kHost, SlotPath::kIpc));

TEST(SlotChannel, MismatchRaisesNamingBothAndBreaksTheChannel) {
  ChannelPair pair(SlotPath::kHost, 2, kMiB);
  const std::vector<uint8_t> src = Pattern(16, 1);
  ASSERT_TRUE(pair.Send(7, Spec(DType::kF32, {4}), src.data()).ok());
  std::vector<uint8_t> dst(16);
  // Known at the receive or deferred to the next op: within two ops.
  Status first = pair.Recv(7, Spec(DType::kS32, {4}), dst.data());
  Status second =
      first.ok() ? pair.Recv(8, Spec(DType::kF32, {4}), dst.data()) : first;
  EXPECT_EQ(second.code(), StatusCode::kMismatch);
  EXPECT_CONTAINS(second.message(), "tag 7, int32[4]");
  EXPECT_CONTAINS(second.message(), "float32[4]");
  // Chunk numbers may disagree from here on: every later op says so.
  Status later = pair.Recv(9, Spec(DType::kF32, {4}), dst.data());
  EXPECT_CONTAINS(later.message(), "is broken");
}

TEST(SlotChannel, PeerLossReleasesAReceiveWaitingForSlots) {
  // The sender's descriptor arrives, its data never does: the sender's
  // bridge goes away. The receive must end with the peer (Bridge::WatchPeer
  // breaks the channel), not at the device deadline (30 s here).
  ChannelPair pair(SlotPath::kHost, 2, kMiB);
  const TensorSpec spec = Spec(DType::kU8, {64});
  const ChunkPlan plan = PlanChunks(64, kMiB);
  SlotDescriptor descriptor;
  descriptor.magic = kSlotDescriptorMagic;
  descriptor.path = static_cast<uint8_t>(SlotPath::kHost);
  descriptor.tag = 5;
  descriptor.spec = spec;
  descriptor.chunks = plan.chunks;
  descriptor.chunk_bytes = plan.chunk_bytes;
  ASSERT_TRUE(pair.bridges.rank0
                  ->Send(1, kSlotDescriptorTag,
                         Spec(DType::kBytes, {int64_t(sizeof(descriptor))}),
                         &descriptor)
                  .ok());
  std::thread sender_dies([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    pair.bridges.rank0.reset();
  });
  const auto start = std::chrono::steady_clock::now();
  std::vector<uint8_t> dst(64);
  Status first = pair.Recv(5, spec, dst.data());
  // Known now or deferred to the next op, as for every device-side failure.
  Status error = first.ok() ? pair.Recv(6, spec, dst.data()) : first;
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  sender_dies.join();
  EXPECT_LT(waited, 5.0);
  EXPECT_EQ(error.code(), StatusCode::kPeerLost);
  EXPECT_CONTAINS(error.message(), "peer rank 0 lost");
}

TEST(SlotChannel, ReceivingOutOfSendOrderIsAnErrorNotSwappedData) {
  ChannelPair pair(SlotPath::kHost, 4, kMiB);
  const std::vector<uint8_t> a = Pattern(64, 1), b = Pattern(64, 2);
  ASSERT_TRUE(pair.Send(1, Spec(DType::kU8, {64}), a.data()).ok());
  ASSERT_TRUE(pair.Send(2, Spec(DType::kU8, {64}), b.data()).ok());
  std::vector<uint8_t> dst(64);
  Status first = pair.Recv(2, Spec(DType::kU8, {64}), dst.data());
  Status error =
      first.ok() ? pair.Recv(1, Spec(DType::kU8, {64}), dst.data()) : first;
  EXPECT_EQ(error.code(), StatusCode::kMismatch);
  EXPECT_CONTAINS(error.message(), "expected tag 2");
  EXPECT_CONTAINS(error.message(), "next message is tag 1");
}

// The CPU island's end (host_channel.h): the same channel, but what a GPU op
// defers to the next op is returned by the op itself, since the host device
// has finished every step when the call returns.
TEST(HostChannel, LargeMessagesBothWaysArriveBitwise) {
  // Rank 1 is the CPU end of both directions; 4 slots of 1 MiB, so every
  // message wraps the ring while the other end frees slots.
  ChannelPair there(SlotPath::kHost, 4, kMiB), back(SlotPath::kHost, 4, kMiB);
  const std::vector<uint64_t> sizes = {5 * kMiB + 3, 0, 17, 9 * kMiB};
  auto far_end = std::async(std::launch::async, [&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::vector<uint8_t> src = Pattern(sizes[i], 10 + i);
      const TensorSpec spec = Spec(DType::kU8, {int64_t(sizes[i])});
      Status s = there.Send(i, spec, src.data());
      std::vector<uint8_t> dst(sizes[i]);
      if (s.ok()) s = back.Recv(i, spec, dst.data());
      if (s.ok() && dst != src) {
        return Status(StatusCode::kInternal,
                      "echo of " + std::to_string(sizes[i]) + " bytes differs");
      }
      if (!s.ok()) return s;
    }
    return Status::Ok();
  });
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE(sizes[i]);
    const TensorSpec spec = Spec(DType::kU8, {int64_t(sizes[i])});
    std::vector<uint8_t> got(sizes[i], 0xEE);
    Status s = HostChannelRecv(*there.receiver, *there.bridges.rank1, i, spec,
                               got.data());
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_TRUE(got == Pattern(sizes[i], 10 + i));
    s = HostChannelSend(*back.sender, *back.bridges.rank0, i, spec, got.data());
    ASSERT_TRUE(s.ok()) << s.message();
  }
  Status echoed = far_end.get();
  EXPECT_TRUE(echoed.ok()) << echoed.message();
}

TEST(HostChannel, AMismatchIsReturnedByTheReceiveThatFoundIt) {
  ChannelPair pair(SlotPath::kHost, 2, kMiB);
  const std::vector<uint8_t> src = Pattern(16, 1);
  ASSERT_TRUE(pair.Send(7, Spec(DType::kF32, {4}), src.data()).ok());
  std::vector<uint8_t> dst(16);
  Status error = HostChannelRecv(*pair.receiver, *pair.bridges.rank1, 7,
                                 Spec(DType::kS32, {4}), dst.data());
  EXPECT_EQ(error.code(), StatusCode::kMismatch);
  EXPECT_CONTAINS(error.message(), "peer 0, tag 7, int32[4]");
  EXPECT_CONTAINS(error.message(), "float32[4]");
  // Taken, not left for an unrelated op of the process to report.
  EXPECT_TRUE(HostStagingContext()->errors.Take().ok());
  Status later = HostChannelRecv(*pair.receiver, *pair.bridges.rank1, 8,
                                 Spec(DType::kF32, {4}), dst.data());
  EXPECT_CONTAINS(later.message(), "is broken");
}

TEST(HostChannel, ACpuEndNeedsTheHostPath) {
  std::shared_ptr<SlotChannel> channel;
  SlotChannelConfig config{
      1, SlotPath::kIpc, "/hetjax-slot-test-ipc-cpu", "/unused", 2, kMiB};
  config.peer_cpu = true;
  Status status = SlotChannel::Create(config, &channel);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(status.message(), "needs the host path");
}

}  // namespace
}  // namespace hetjax::gpu
