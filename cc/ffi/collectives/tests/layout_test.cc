// Island layouts (who owns which slot, who talks to whom) and message tags.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "cc/ffi/collectives/group.h"
#include "gtest/gtest.h"

namespace hetjax::collectives {
namespace {

Status ParseLayout(const std::vector<int64_t>& ranks,
                   const std::vector<int64_t>& sizes, int64_t island,
                   int64_t device, IslandLayout* out) {
  return IslandLayout::Parse(ranks.data(), ranks.size(), sizes.data(),
                             sizes.size(), island, device, out);
}

TEST(IslandLayout, SlotsAreTheLcmOfDeviceCountsAndOwnersFormEachSlotsGroup) {
  // Island 0: ranks 0,0 (one process, two devices); island 1: rank 1 (one
  // device); island 2: ranks 2,2,3 (two processes, three devices).
  const std::vector<int64_t> ranks = {0, 0, 1, 2, 2, 3};
  const std::vector<int64_t> sizes = {2, 1, 3};
  IslandLayout layout;
  ASSERT_TRUE(ParseLayout(ranks, sizes, 2, 2, &layout).ok());
  EXPECT_EQ(layout.slots(), 6);
  EXPECT_EQ(layout.slots_per_device(0), 3);
  EXPECT_EQ(layout.slots_per_device(2), 2);
  EXPECT_EQ(layout.first_slot(), 4);  // device 2 of island 2 owns slots 4, 5
  Group g = layout.GroupOf(4);
  EXPECT_EQ(g.ranks, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(g.me, 2);
  EXPECT_EQ(g.next(), 0);
  EXPECT_EQ(g.prev(), 1);
  EXPECT_EQ(layout.GroupOf(0).ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(layout.ToString(), "islands [[0,0], [1], [2,2,3]]");
}

TEST(IslandLayout, EqualIslandsPairDeviceJWithDeviceJ) {
  const std::vector<int64_t> ranks = {0, 1, 2, 3};
  IslandLayout layout;
  ASSERT_TRUE(ParseLayout(ranks, {2, 2}, 0, 1, &layout).ok());
  EXPECT_EQ(layout.slots(), 2);
  EXPECT_EQ(layout.first_slot(), 1);
  EXPECT_EQ(layout.GroupOf(1).ranks, (std::vector<int>{1, 3}));
}

TEST(IslandLayout, RefusesLayoutsThatDoNotAddUp) {
  IslandLayout layout;
  struct Case {
    std::vector<int64_t> ranks, sizes;
    int64_t island, device;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{0, 1}, {}, 0, 0, "at least one island"},
      {{0, 1}, {1, 2}, 0, 0, "island 1 claims 2 devices"},
      {{0, 1, 2}, {1, 1}, 0, 0, "add up to 2 devices, the layout lists 3"},
      {{0, 1}, {1, 1}, 2, 0, "island index 2 outside the group's 2 islands"},
      {{0, 1}, {1, 1}, 1, 1, "device index 1 outside island 1's 1 devices"},
      {std::vector<int64_t>(5 + 7 + 9 + 11, 0),
       {5, 7, 9, 11},
       0,
       0,
       "exceeds 256 slots"},
  };
  for (const Case& c : cases) {
    Status s = ParseLayout(c.ranks, c.sizes, c.island, c.device, &layout);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s.message();
  }
}

TEST(MessageTags, EveryFieldHasItsOwnBitsAndTagsDoNotCollide) {
  const uint64_t base =
      kCollectiveTagBit | (uint64_t{5} << 52) | (uint64_t{9} << 32);
  ASSERT_TRUE(CheckBaseTag(base).ok());
  std::set<uint64_t> seen;
  for (int slot : {0, 1, kMaxSlots - 1}) {
    for (Phase phase : {kPhaseDescriptor, kPhaseReduce, kPhaseDistribute}) {
      for (int step : {0, 1, kMaxSteps - 1}) {
        for (int piece : {0, 1, kMaxPieces - 1}) {
          uint64_t tag = MessageTag(base, slot, phase, step, piece);
          EXPECT_EQ(tag >> 32, base >> 32);  // the op's bits are untouched
          EXPECT_EQ(tag & 0xffff, uint64_t(piece));
          EXPECT_EQ((tag >> 16) & 0x3f, uint64_t(step));
          EXPECT_EQ((tag >> 22) & 0x3, uint64_t(phase));
          EXPECT_EQ((tag >> 24) & 0xff, uint64_t(slot));
          EXPECT_TRUE(seen.insert(tag).second);
        }
      }
    }
  }
}

TEST(MessageTags, MalformedBaseTagsAreRefused) {
  for (uint64_t bad : {uint64_t{7}, kCollectiveTagBit | 1,
                       (uint64_t{1} << 63) | kCollectiveTagBit}) {
    Status s = CheckBaseTag(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("malformed"), std::string::npos);
  }
}

}  // namespace
}  // namespace hetjax::collectives
