// The pair exchange's shares (pair_shares.h): whatever a chunk's length,
// its shares tile it in order and each stays inside its part of a full
// chunk, the bytes its freed counter guards.
#include "cc/device/pair_shares.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace hetjax::device {
namespace {

void ExpectSharesTile(uint64_t chunk_bytes, uint64_t bytes) {
  uint64_t next = 0;
  for (uint32_t s = 0; s < kPairShares; ++s) {
    const ByteRange full = PartOf(chunk_bytes, s, kPairShares);
    const ByteRange r = ShareOf(chunk_bytes, bytes, s);
    EXPECT_EQ(r.begin, next) << "share " << s << " of " << bytes << " bytes";
    if (r.bytes > 0) {  // an empty share writes nothing, wherever it starts
      EXPECT_GE(r.begin, full.begin) << "share " << s << " of " << bytes;
      EXPECT_LE(r.begin + r.bytes, full.begin + full.bytes)
          << "share " << s << " of " << bytes << " bytes leaves its part";
    }
    next = r.begin + r.bytes;
  }
  EXPECT_EQ(next, bytes) << "shares of a " << bytes << "-byte chunk";
}

TEST(PairShares, TileEveryChunkLengthInsideTheirParts) {
  const std::vector<uint64_t> chunks = {uint64_t{8} << 20, 16 * kPairShares,
                                        (uint64_t{1} << 20) + 16, 48};
  for (uint64_t chunk : chunks) {
    for (uint64_t bytes :
         {chunk, chunk - 4, chunk - 16, chunk / 2 + 3, uint64_t{17},
          uint64_t{16}, uint64_t{12}, uint64_t{1}, uint64_t{0}}) {
      if (bytes > chunk) continue;
      ExpectSharesTile(chunk, bytes);
    }
  }
}

TEST(PairShares, AFullChunkIsCutEvenly) {
  const uint64_t chunk = uint64_t{8} << 20;
  for (uint32_t s = 0; s < kPairShares; ++s) {
    const ByteRange r = ShareOf(chunk, chunk, s);
    EXPECT_EQ(r.bytes, chunk / kPairShares);
    EXPECT_EQ(r.begin, s * (chunk / kPairShares));
  }
}

TEST(PairShares, AShortLastChunkUsesTheFirstSharesBytes) {
  // 256 MiB + 12 bytes in 8 MiB chunks: the last chunk's 12 bytes are
  // share 0's, guarded by freed[0]; once they were share 31's.
  const uint64_t chunk = uint64_t{8} << 20;
  EXPECT_EQ(ShareOf(chunk, 12, 0).bytes, 12u);
  EXPECT_EQ(ShareOf(chunk, 12, 0).begin, 0u);
  EXPECT_EQ(ShareOf(chunk, 12, kPairShares - 1).bytes, 0u);
}

}  // namespace
}  // namespace hetjax::device
