// The cross-island algorithms among members in one process (one bridge and
// one thread per member), against sequential reductions computed here.
#include "cc/ffi/collectives/algorithms.h"

#include <cstdint>
#include <cstring>
#include <future>
#include <numeric>
#include <string>
#include <vector>

#include "cc/ffi/collectives/tests/bridge_mesh.h"
#include "gtest/gtest.h"

namespace hetjax::collectives {
namespace {

using testing::ConnectMesh;
using testing::OnEveryRank;

constexpr uint64_t kBase =
    kCollectiveTagBit | (uint64_t{3} << 52) | (uint64_t{1} << 32);

SlotOp OpFor(const std::vector<std::unique_ptr<Bridge>>& bridges, int rank) {
  Group group;
  for (int r = 0; r < static_cast<int>(bridges.size()); ++r)
    group.ranks.push_back(r);
  group.me = rank;
  return SlotOp{bridges[rank].get(), group, kBase, 0};
}

// Values whose float32 sums depend on the order of additions.
std::vector<float> MemberValues(int member, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    v[i] = (member == 1 ? 1e7f : 1.0f) * (0.1f + 0.37f * float(i % 11)) *
               (member % 2 ? -1.0f : 1.0f) +
           0.013f * float(member);
  }
  return v;
}

class AllReduceTest : public ::testing::TestWithParam<Algorithm> {};

TEST_P(AllReduceTest, EveryMemberGetsTheSumInPiecesOfAnyCount) {
  const int n = 3;
  // 37 elements: segments of 12/12/13, each cut into 16-element pieces.
  for (size_t count : {size_t{1}, size_t{37}, size_t{100}}) {
    auto bridges = ConnectMesh(n);
    std::vector<std::vector<float>> out(n, std::vector<float>(count));
    std::vector<Status> status(n);
    OnEveryRank(n, [&](int rank) {
      std::vector<float> in = MemberValues(rank, count);
      status[rank] =
          AllReduce(OpFor(bridges, rank), GetParam(),
                    Reduction{DType::kF32, DType::kF32, ReduceOp::kSum, 1.0},
                    in.data(), out[rank].data(), count);
    });
    for (int r = 0; r < n; ++r)
      ASSERT_TRUE(status[r].ok()) << status[r].message();
    for (size_t i = 0; i < count; ++i) {
      float sequential =
          (MemberValues(0, count)[i] + MemberValues(1, count)[i]) +
          MemberValues(2, count)[i];
      if (GetParam() == Algorithm::kOrdered) {
        EXPECT_EQ(out[0][i], sequential)
            << "element " << i;  // island order, bitwise
      } else {
        // Another order of additions: a few float32 ulps of the largest term.
        EXPECT_NEAR(out[0][i], sequential, 4e-7f * 4e7f) << "element " << i;
      }
    }
    // Every member holds the same bits, whatever the algorithm.
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(std::memcmp(out[r].data(), out[0].data(), count * 4), 0) << r;
    }
  }
}

TEST_P(AllReduceTest, MaxOfIntegersAndMeanOfFloats) {
  const int n = 2;
  const size_t count = 9;
  auto bridges = ConnectMesh(n);
  std::vector<std::vector<int32_t>> maxes(n, std::vector<int32_t>(count));
  std::vector<std::vector<float>> means(n, std::vector<float>(count));
  OnEveryRank(n, [&](int rank) {
    std::vector<int32_t> in(count);
    std::vector<float> f(count);
    for (size_t i = 0; i < count; ++i) {
      in[i] = (rank ? 1 : -1) * int32_t(i) * 7 + rank;
      f[i] = float(i) + 10.0f * float(rank);
    }
    SlotOp op = OpFor(bridges, rank);
    EXPECT_TRUE(AllReduce(op, GetParam(),
                          {DType::kS32, DType::kS32, ReduceOp::kMax, 1.0},
                          in.data(), maxes[rank].data(), count)
                    .ok());
    op.base += uint64_t{1} << 32;  // the next op of the group
    EXPECT_TRUE(AllReduce(op, GetParam(),
                          {DType::kF32, DType::kF32, ReduceOp::kSum, 2.0},
                          f.data(), means[rank].data(), count)
                    .ok());
  });
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      EXPECT_EQ(maxes[r][i], int32_t(i) * 7 + 1);
      EXPECT_EQ(means[r][i], float(i) + 5.0f);
    }
  }
}

TEST_P(AllReduceTest, BFloat16SumsAreRoundedOnceAtTheEnd) {
  const int n = 3;
  auto bridges = ConnectMesh(n);
  // 256 + 1 + 1 = 258 in float32; bfloat16 after each addition would stay 256.
  const uint16_t values[3] = {0x4380 /* 256 */, 0x3f80 /* 1 */, 0x3f80 /* 1 */};
  std::vector<uint16_t> out(n);
  OnEveryRank(n, [&](int rank) {
    uint16_t in = values[rank];
    EXPECT_TRUE(AllReduce(OpFor(bridges, rank), GetParam(),
                          {DType::kBF16, DType::kBF16, ReduceOp::kSum, 1.0},
                          &in, &out[rank], 1)
                    .ok());
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], 0x4381) << r;  // 258
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AllReduceTest,
                         ::testing::Values(Algorithm::kRing,
                                           Algorithm::kOrdered),
                         [](const auto& info) {
                           return std::string(AlgorithmName(info.param));
                         });

TEST(ReduceScatter, MemberCGetsTheSumOfBlockC) {
  const int n = 3;
  const size_t count = 21;  // per block; two pieces of 16 and 5
  auto bridges = ConnectMesh(n);
  std::vector<std::vector<float>> out(n, std::vector<float>(count));
  OnEveryRank(n, [&](int rank) {
    std::vector<float> in = MemberValues(rank, n * count);
    Status s = ReduceScatter(OpFor(bridges, rank),
                             {DType::kF32, DType::kF32, ReduceOp::kSum, 1.0},
                             in.data(), out[rank].data(), count);
    EXPECT_TRUE(s.ok()) << s.message();
  });
  for (int c = 0; c < n; ++c) {
    for (size_t i = 0; i < count; ++i) {
      size_t at = c * count + i;
      float want =
          (MemberValues(0, n * count)[at] + MemberValues(1, n * count)[at]) +
          MemberValues(2, n * count)[at];
      EXPECT_EQ(out[c][i], want) << "member " << c << " element " << i;
    }
  }
}

TEST(AllGather, ConcatenatesUnevenContributionsInMemberOrder) {
  const int n = 3;
  const std::vector<size_t> counts = {3, 1, 20};
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  auto bridges = ConnectMesh(n);
  std::vector<std::vector<int64_t>> out(n, std::vector<int64_t>(total));
  OnEveryRank(n, [&](int rank) {
    std::vector<int64_t> in(counts[rank]);
    for (size_t i = 0; i < in.size(); ++i) in[i] = 1000 * rank + int64_t(i);
    Status s = AllGather(OpFor(bridges, rank), DType::kS64, in.data(), counts,
                         out[rank].data());
    EXPECT_TRUE(s.ok()) << s.message();
  });
  std::vector<int64_t> want;
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < counts[q]; ++i)
      want.push_back(1000 * q + int64_t(i));
  }
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], want) << r;
}

TEST(Broadcast, EveryMemberGetsTheRootsValue) {
  const int n = 3, root = 1;
  const size_t count = 50;
  auto bridges = ConnectMesh(n);
  std::vector<std::vector<float>> out(n, std::vector<float>(count, -1.0f));
  OnEveryRank(n, [&](int rank) {
    std::vector<float> in = MemberValues(rank, count);
    Status s = Broadcast(OpFor(bridges, rank), root, DType::kF32, in.data(),
                         out[rank].data(), count);
    EXPECT_TRUE(s.ok()) << s.message();
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], MemberValues(root, count)) << r;
}

TEST(AgreeOnOp, DisagreeingMembersAllFailNamingEverySide) {
  const int n = 3;
  auto bridges = ConnectMesh(n);
  std::vector<Status> status(n);
  OnEveryRank(n, [&](int rank) {
    OpDescriptor d;
    d.kind = CollectiveKind::kAllReduce;
    d.reduce_op = static_cast<int64_t>(ReduceOp::kSum);
    d.wire_dtype = DType::kF32;
    d.algorithm = Algorithm::kRing;
    d.logical.dtype = DType::kF32;
    d.logical.rank = 1;
    d.logical.dims[0] =
        rank == 2 ? 5 : 4;  // island 2 calls it with another shape
    status[rank] =
        AgreeOnOp(bridges[rank].get(), OpFor(bridges, rank).group, kBase, 0, d);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(status[r].code(), StatusCode::kMismatch) << r;
    EXPECT_NE(status[r].message().find("float32[5]"), std::string::npos)
        << status[r].message();
    EXPECT_NE(status[r].message().find("float32[4]"), std::string::npos)
        << status[r].message();
  }
  EXPECT_NE(
      status[2].message().find("island 2 (this rank, bridge rank 2) called "
                               "all_reduce(sum) of float32[5]"),
      std::string::npos)
      << status[2].message();
}

TEST(AgreeOnOp, AgreeingMembersPass) {
  const int n = 2;
  auto bridges = ConnectMesh(n);
  std::vector<Status> status(n);
  OnEveryRank(n, [&](int rank) {
    OpDescriptor d;
    d.kind = CollectiveKind::kBroadcast;
    d.root = 1;
    d.logical.dtype = DType::kS32;
    status[rank] =
        AgreeOnOp(bridges[rank].get(), OpFor(bridges, rank).group, kBase, 0, d);
  });
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(status[r].ok()) << status[r].message();
}

// The late variant (GPU pair exchange) reports what AgreeOnOp would have:
// both sides named on a disagreement, ok otherwise; and an op whose base
// tag differs is a disagreement too, not a message left waiting.
TEST(PostAgreement, ReportsWhatAgreeOnOpWould) {
  const int n = 2;
  for (const int variant : {0, 1, 2}) {
    const bool same = variant == 0;
    const bool other_tag = variant == 2;
    auto bridges = ConnectMesh(n);
    std::vector<Status> status(n);
    OnEveryRank(n, [&](int rank) {
      OpDescriptor d;
      d.kind = CollectiveKind::kAllGather;
      d.logical.dtype = DType::kBF16;
      d.logical.rank = 1;
      d.logical.dims[0] = same || rank == 0 ? 6 : 8;
      const Group group = OpFor(bridges, rank).group;
      const uint64_t base =
          other_tag && rank == 1 ? kBase + (uint64_t{1} << 33) : kBase;
      std::promise<Status> checked;
      PostAgreement(bridges[rank].get(), group, base, 0, d,
                    [&checked](const Status& s) { checked.set_value(s); });
      status[rank] = checked.get_future().get();
    });
    for (int r = 0; r < n; ++r) {
      if (same) {
        EXPECT_TRUE(status[r].ok()) << r << ": " << status[r].message();
        continue;
      }
      EXPECT_EQ(status[r].code(), StatusCode::kMismatch) << r;
      EXPECT_NE(status[r].message().find("bfloat16[6]"), std::string::npos)
          << status[r].message();
      EXPECT_NE(status[r].message().find("bfloat16[8]"), std::string::npos)
          << status[r].message();
      if (other_tag) {
        EXPECT_NE(status[r].message().find(" as collective tag "),
                  std::string::npos)
            << status[r].message();
      }
    }
  }
}

}  // namespace
}  // namespace hetjax::collectives
