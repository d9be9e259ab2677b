// The frame header: round trips, and every way untrusted bytes are refused.
#include "cc/transport/wire.h"

#include <random>
#include <string>

#include "cc/transport/tests/bridge_pair.h"
#include "gtest/gtest.h"

namespace hetjax {
namespace {

using testing::Spec;

constexpr uint64_t kMax = 1 << 20;

wire::FrameHeader Valid() {
  wire::FrameHeader h;
  h.source = 3;
  h.tag = 0x0123456789abcdefull;
  h.sequence = 42;
  h.spec = Spec(DType::kF32, {4, 8});
  h.payload_bytes = 128;
  h.chunk_offset = 64;
  h.chunk_length = 64;
  return h;
}

std::string Rejection(const uint8_t* bytes, uint64_t max = kMax) {
  wire::FrameHeader out;
  Status status = wire::ParseHeader(bytes, max, &out);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  return status.message();
}

void PutU64(uint8_t* at, uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<uint8_t>(v >> (8 * i));
}

TEST(WireTest, RoundTripKeepsEveryField) {
  for (const TensorSpec& spec :
       {Spec(DType::kBF16, {}), Spec(DType::kF32, {4, 8}),
        Spec(DType::kC128, {1, 2, 3, 4, 5, 6, 7, 8}),
        Spec(DType::kU8, {0, 1000})}) {
    wire::FrameHeader h = Valid();
    h.spec = spec;
    h.payload_bytes = spec.num_bytes();
    h.chunk_offset = 0;
    h.chunk_length = h.payload_bytes;
    uint8_t bytes[wire::kHeaderBytes];
    wire::EncodeHeader(h, bytes);
    wire::FrameHeader back;
    ASSERT_TRUE(wire::ParseHeader(bytes, kMax, &back).ok()) << spec.ToString();
    EXPECT_EQ(back.spec, spec);
    EXPECT_EQ(back.source, h.source);
    EXPECT_EQ(back.tag, h.tag);
    EXPECT_EQ(back.sequence, h.sequence);
    EXPECT_EQ(back.payload_bytes, h.payload_bytes);
    EXPECT_EQ(back.chunk_offset, h.chunk_offset);
    EXPECT_EQ(back.chunk_length, h.chunk_length);
  }
}

TEST(WireTest, LayoutIsLittleEndianAtFixedOffsets) {
  uint8_t bytes[wire::kHeaderBytes];
  wire::EncodeHeader(Valid(), bytes);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(bytes), 4), "HJXB");
  EXPECT_EQ(bytes[16], 0xef);  // tag, least significant byte first
  EXPECT_EQ(bytes[23], 0x01);
  EXPECT_EQ(bytes[56], 4);  // dims[0]
  EXPECT_EQ(bytes[64], 8);  // dims[1]
}

TEST(WireTest, RejectsBadMagic) {
  uint8_t bytes[wire::kHeaderBytes];
  wire::EncodeHeader(Valid(), bytes);
  bytes[0] ^= 0xff;
  EXPECT_CONTAINS(Rejection(bytes), ("bad magic"));
}

TEST(WireTest, RejectsOtherVersion) {
  uint8_t bytes[wire::kHeaderBytes];
  wire::EncodeHeader(Valid(), bytes);
  bytes[4] = 9;
  EXPECT_CONTAINS(Rejection(bytes), ("protocol version 9"));
}

TEST(WireTest, RejectsUnknownDType) {
  uint8_t bytes[wire::kHeaderBytes];
  wire::EncodeHeader(Valid(), bytes);
  bytes[6] = 200;
  EXPECT_CONTAINS(Rejection(bytes), ("unknown dtype code 200"));
  bytes[6] = 0;
  EXPECT_CONTAINS(Rejection(bytes), ("unknown dtype code 0"));
}

TEST(WireTest, RejectsRankAboveEight) {
  uint8_t bytes[wire::kHeaderBytes];
  wire::EncodeHeader(Valid(), bytes);
  bytes[7] = 9;
  EXPECT_CONTAINS(Rejection(bytes), ("rank 9 exceeds the maximum 8"));
}

TEST(WireTest, RejectsNegativeDims) {
  uint8_t bytes[wire::kHeaderBytes];
  wire::EncodeHeader(Valid(), bytes);
  PutU64(bytes + 64, static_cast<uint64_t>(int64_t{-8}));
  EXPECT_CONTAINS(Rejection(bytes), ("negative dimension -8 at axis 1"));
}

TEST(WireTest, RejectsByteCountThatDisagreesWithShape) {
  uint8_t bytes[wire::kHeaderBytes];
  wire::FrameHeader h = Valid();
  h.payload_bytes = 129;
  wire::EncodeHeader(h, bytes);
  EXPECT_CONTAINS(Rejection(bytes),
                  ("payload of 129 bytes does not fit float32[4,8] "
                   "(128 bytes)"));
}

TEST(WireTest, RejectsShapesWhoseSizeOverflows) {
  uint8_t bytes[wire::kHeaderBytes];
  wire::FrameHeader h = Valid();
  h.spec = Spec(DType::kF64, {int64_t{1} << 40, int64_t{1} << 40});
  h.payload_bytes = 0;
  h.chunk_offset = h.chunk_length = 0;
  wire::EncodeHeader(h, bytes);
  EXPECT_CONTAINS(Rejection(bytes), ("shape overflows"));
}

TEST(WireTest, RejectsPayloadAboveMaxMessageBytesBeforeAllocating) {
  uint8_t bytes[wire::kHeaderBytes];
  wire::FrameHeader h = Valid();
  h.spec = Spec(DType::kU8, {int64_t{1} << 40});  // a hostile 1 TiB claim
  h.payload_bytes = uint64_t{1} << 40;
  h.chunk_offset = 0;
  h.chunk_length = 16;
  wire::EncodeHeader(h, bytes);
  EXPECT_CONTAINS(Rejection(bytes), ("payload of 1099511627776 bytes exceeds "
                                     "max_message_bytes 1048576"));
}

TEST(WireTest, RejectsChunkOutsidePayload) {
  uint8_t bytes[wire::kHeaderBytes];
  wire::FrameHeader h = Valid();
  h.chunk_offset = 100;
  h.chunk_length = 29;  // ends at 129 > 128
  wire::EncodeHeader(h, bytes);
  EXPECT_CONTAINS(Rejection(bytes), ("lies outside the 128-byte payload"));
  h.chunk_offset = ~uint64_t{0};  // would wrap around when added
  h.chunk_length = 2;
  wire::EncodeHeader(h, bytes);
  EXPECT_CONTAINS(Rejection(bytes), ("lies outside"));
}

TEST(WireTest, GoodbyeFlagRoundTripsAndOtherFlagsAreRefused) {
  uint8_t bytes[wire::kHeaderBytes];
  wire::FrameHeader h = Valid();
  h.spec = Spec(DType::kBytes, {0});
  h.payload_bytes = h.chunk_offset = h.chunk_length = 0;
  h.flags = wire::kFlagGoodbye;
  wire::EncodeHeader(h, bytes);
  wire::FrameHeader back;
  ASSERT_TRUE(wire::ParseHeader(bytes, kMax, &back).ok());
  EXPECT_EQ(back.flags, wire::kFlagGoodbye);
  h.flags = 6;
  wire::EncodeHeader(h, bytes);
  EXPECT_CONTAINS(Rejection(bytes), "unknown flags");
  h = Valid();
  h.flags = wire::kFlagGoodbye;
  wire::EncodeHeader(h, bytes);
  EXPECT_CONTAINS(Rejection(bytes), "goodbye frame with a payload of 128");
}

TEST(WireTest, RandomHeadersAreRejectedOrSelfConsistent) {
  std::mt19937_64 rng(7);
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    uint8_t bytes[wire::kHeaderBytes];
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    wire::EncodeHeader(Valid(), bytes);  // keep magic/version valid...
    for (int i = 6; i < 128; ++i) {      // ...and scramble the rest sparsely
      if (rng() % 4 == 0) bytes[i] = static_cast<uint8_t>(rng() % 3);
    }
    wire::FrameHeader h;
    if (!wire::ParseHeader(bytes, kMax, &h).ok()) continue;
    ++accepted;
    EXPECT_EQ(h.spec.num_bytes(), h.payload_bytes);
    EXPECT_LE(h.payload_bytes, kMax);
    EXPECT_LE(h.chunk_offset + h.chunk_length, h.payload_bytes);
  }
  EXPECT_GT(accepted, 0);
}

TEST(WireTest, MismatchNamesPeerTagAndBothSpecs) {
  Status status = wire::CheckExpected(1, 7, Spec(DType::kF32, {4, 8}),
                                      Spec(DType::kBF16, {4, 8}));
  EXPECT_EQ(status.code(), StatusCode::kMismatch);
  EXPECT_EQ(status.message(),
            "recv from rank 1 tag 7: expected float32[4,8], received "
            "bfloat16[4,8]");
  EXPECT_TRUE(wire::CheckExpected(1, 7, Spec(DType::kF32, {4, 8}),
                                  Spec(DType::kF32, {4, 8}))
                  .ok());
}

TEST(TensorSpecTest, NamesSizesAndEquality) {
  EXPECT_EQ(Spec(DType::kF32, {}).ToString(), "float32[]");
  EXPECT_EQ(Spec(DType::kS64, {2, 3}).num_bytes(), 48u);
  EXPECT_EQ(DTypeSize(DType::kC128), 16u);
  EXPECT_EQ(DTypeSize(DType::kInvalid), 0u);
  EXPECT_STREQ(DTypeName(DType::kBF16), "bfloat16");
  TensorSpec a = Spec(DType::kF32, {2, 3});
  TensorSpec b = a;
  b.dims[5] = 99;  // beyond rank: ignored
  EXPECT_EQ(a, b);
  EXPECT_NE(a, Spec(DType::kF32, {3, 2}));
}

}  // namespace
}  // namespace hetjax
