// The GPU collectives' host staging, run on the host device: two members,
// each staging its "device" operand to pinned memory, running the core's
// all-reduce on the staged copies and copying the result back, as the CUDA /
// ROCm handlers do on XLA's stream.
#include "cc/ffi/collectives/staged_collective.h"

#include <cstdint>
#include <vector>

#include "cc/ffi/collectives/algorithms.h"
#include "cc/ffi/collectives/tests/bridge_mesh.h"
#include "gtest/gtest.h"

namespace hetjax::collectives {
namespace {

using testing::ConnectMesh;
using testing::OnEveryRank;

constexpr uint64_t kBase =
    kCollectiveTagBit | (uint64_t{5} << 52) | (uint64_t{1} << 32);

std::vector<float> Values(int rank, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i)
    v[i] = 0.5f * float(i) + 100.0f * float(rank);
  return v;
}

TEST(StagedCollective, AllReduceThroughStagingReachesTheDeviceBuffer) {
  const int n = 2;
  const size_t count = 1000;  // several bridge chunks (bridge_mesh: 64 bytes)
  auto bridges = ConnectMesh(n);
  std::vector<std::vector<float>> y(n, std::vector<float>(count, -1.0f));
  std::vector<uint8_t> token(n, 0xAB);
  std::vector<int32_t> seen_index(n, -1);
  std::vector<Status> status(n);
  std::vector<size_t> cached_after(n);
  OnEveryRank(n, [&](int rank) {
    gpu::StagingContext context(device::HostDevice(), size_t{16} << 20);
    const std::vector<float> x = Values(rank, count);
    const int32_t device_index = 3 + rank;  // what lax.axis_index would hold
    {
      StagedCollective staged(context, /*stream=*/nullptr);
      Status s = staged.CopyIn(&device_index, x.data(), count * sizeof(float),
                               count * sizeof(float));
      seen_index[rank] = staged.device_index();
      Group group{{0, 1}, rank};
      if (s.ok()) {
        s = AllReduce(SlotOp{bridges[rank].get(), group, kBase, 0},
                      Algorithm::kRing,
                      Reduction{DType::kF32, DType::kF32, ReduceOp::kSum, 1.0},
                      staged.x(), staged.y(), count);
      }
      if (s.ok()) s = staged.CopyOut(y[rank].data(), &token[rank], 1);
      status[rank] = s;
    }
    // Both staging buffers are back in the pool once the stream passed them.
    context.retired.Poll();
    cached_after[rank] = context.pinned.cached_bytes();
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r].message();
    EXPECT_EQ(seen_index[r], 3 + r);
    EXPECT_EQ(token[r], 0) << "token not written after the result";
    EXPECT_GE(cached_after[r], 2 * count * sizeof(float));
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(y[r][i], Values(0, count)[i] + Values(1, count)[i])
          << "element " << i;
    }
  }
}

TEST(StagedCollective, AnEarlierDeferredErrorIsReportedFirst) {
  gpu::StagingContext context(device::HostDevice(), size_t{1} << 20);
  context.errors.Record(
      Status(StatusCode::kPeerLost, "receive from peer 1, tag 9 failed"));
  StagedCollective staged(context, nullptr);
  const int32_t index = 0;
  const float x = 1.0f;
  Status s = staged.CopyIn(&index, &x, sizeof(x), sizeof(x));
  EXPECT_EQ(s.code(), StatusCode::kPeerLost);
  EXPECT_NE(s.message().find("tag 9"), std::string::npos) << s.message();
  // Reported once: the next op goes ahead.
  StagedCollective next(context, nullptr);
  EXPECT_TRUE(next.CopyIn(&index, &x, sizeof(x), sizeof(x)).ok());
  EXPECT_EQ(*static_cast<const float*>(next.x()), 1.0f);
}

}  // namespace
}  // namespace hetjax::collectives
