// The ring schedule the host and GPU collectives share: what every member
// sends and receives at each step, checked for every ring size the layout
// allows against what a ring must do.
#include "cc/ffi/collectives/ring_schedule.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace hetjax::collectives {
namespace {

TEST(Split, NearEqualRunsThatTileTheRange) {
  for (size_t count : {0u, 1u, 2u, 7u, 1000u}) {
    for (int parts : {1, 2, 3, 8}) {
      size_t at = 0;
      for (int i = 0; i < parts; ++i) {
        const Range r = Split(count, parts, i);
        EXPECT_EQ(r.begin, at);
        EXPECT_LE(r.count, count / parts + 1);
        at += r.count;
      }
      EXPECT_EQ(at, count);
    }
  }
}

TEST(AlignedSplit, AlignedRunsThatTileTheRange) {
  for (size_t count : {0u, 1u, 63u, 64u, 1000u, 16777216u, 16777217u}) {
    for (int parts : {1, 2, 3, 5, 8}) {
      size_t at = 0;
      for (int i = 0; i < parts; ++i) {
        const Range r = AlignedSplit(count, parts, i, 64);
        EXPECT_EQ(r.begin, at) << count << "/" << parts;
        EXPECT_EQ(r.begin % 64, 0u) << count << "/" << parts;
        // Near-equal: within one aligned unit of an even share.
        EXPECT_LE(r.count, count / parts + 64) << count << "/" << parts;
        at += r.count;
      }
      EXPECT_EQ(at, count);
    }
  }
}

TEST(Pieces, CutByChunkBytesAndRefuseTooMany) {
  std::vector<Range> pieces;
  ASSERT_TRUE(Pieces({10, 9}, 4, 16, &pieces).ok());  // 4 elements a piece
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].begin, 10u);
  EXPECT_EQ(pieces[2].begin, 18u);
  EXPECT_EQ(pieces[2].count, 1u);
  ASSERT_TRUE(Pieces({0, 0}, 4, 16, &pieces).ok());
  EXPECT_TRUE(pieces.empty());
  // An element larger than a chunk is still one piece.
  ASSERT_TRUE(Pieces({0, 2}, 16, 4, &pieces).ok());
  EXPECT_EQ(pieces.size(), 2u);
  Status too_many = Pieces({0, size_t(kMaxPieces) + 1}, 1, 1, &pieces);
  EXPECT_EQ(too_many.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.message().find("raise the bridge's chunk_bytes"),
            std::string::npos);
}

class RingStepsTest : public ::testing::TestWithParam<int> {};

TEST_P(RingStepsTest, EverySegmentIsReducedOverEveryMemberThenGoesRound) {
  const int n = GetParam();
  std::vector<std::vector<RingStep>> steps(n);
  for (int p = 0; p < n; ++p) {
    steps[p] = RingSteps(n, p);
    ASSERT_EQ(steps[p].size(), size_t(2 * (n - 1)));
  }
  for (int p = 0; p < n; ++p) {
    const int prev = (p + n - 1) % n;
    for (size_t i = 0; i < steps[p].size(); ++i) {
      const RingStep& s = steps[p][i];
      EXPECT_EQ(s.phase, i < size_t(n - 1) ? kPhaseReduce : kPhaseDistribute);
      EXPECT_EQ(s.step, int(i % (n - 1)));
      // What arrives is what the predecessor sent at the same step.
      EXPECT_EQ(s.recv, steps[prev][i].send);
      // Reduce-scatter passes on what arrived; all-gather forwards it too.
      if (i + 1 < steps[p].size() && i + 1 != size_t(n - 1)) {
        EXPECT_EQ(steps[p][i + 1].send, s.recv);
      }
    }
    // The last reduce-scatter step completes the segment this member owns,
    // and that is what the all-gather sends first.
    EXPECT_EQ(steps[p][n - 2].recv, RingFinished(n, p));
    EXPECT_EQ(steps[p][n - 1].send, RingFinished(n, p));
    // The all-gather brings every segment it does not finish itself.
    std::set<int> gathered;
    for (int i = n - 1; i < 2 * (n - 1); ++i) gathered.insert(steps[p][i].recv);
    EXPECT_EQ(gathered.size(), size_t(n - 1));
    EXPECT_EQ(gathered.count(RingFinished(n, p)), 0u);
  }
  // Segment c's partial visits every member once: it starts at its first
  // sender and gains one contribution per step.
  for (int c = 0; c < n; ++c) {
    std::set<int> contributed;
    int holder = c;  // sends segment c at step 0 (RingSteps: send p - s)
    contributed.insert(holder);
    for (int s = 0; s < n - 1; ++s) {
      const int next = (holder + 1) % n;
      EXPECT_EQ(steps[next][s].recv, c);
      contributed.insert(next);
      holder = next;
    }
    EXPECT_EQ(contributed.size(), size_t(n));
    EXPECT_EQ(RingFinished(n, holder), c);
  }
}

INSTANTIATE_TEST_SUITE_P(RingSizes, RingStepsTest,
                         ::testing::Values(2, 3, 4, 7, 64));

TEST(RoundRobin, EveryPairMeetsOnceAndNoMemberTwiceARound) {
  for (int n = 2; n <= 9; ++n) {
    std::set<std::pair<int, int>> met;
    for (int round = 0; round < RoundRobinRounds(n); ++round) {
      int idle = 0;
      for (int p = 0; p < n; ++p) {
        const int q = RoundRobinPartner(n, round, p);
        if (q < 0) {
          ++idle;
          continue;
        }
        ASSERT_NE(q, p) << "n " << n << " round " << round;
        ASSERT_LT(q, n);
        // Symmetric: p's peer has p as its peer, so a round is a matching.
        EXPECT_EQ(RoundRobinPartner(n, round, q), p) << "n " << n;
        if (p < q) EXPECT_TRUE(met.insert({p, q}).second) << p << "," << q;
      }
      EXPECT_EQ(idle, n % 2) << "n " << n << " round " << round;
    }
    EXPECT_EQ(met.size(), size_t(n * (n - 1) / 2)) << "n " << n;
  }
}

}  // namespace
}  // namespace hetjax::collectives
