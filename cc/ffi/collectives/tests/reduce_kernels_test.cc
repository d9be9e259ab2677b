// The arithmetic of every collective: widening, reducing, dividing, rounding.
#include "cc/ffi/collectives/reduce_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace hetjax::collectives {
namespace {

uint16_t BF16Bits(float x) {  // exact for the values used below
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}

float FromBF16(uint16_t b) {
  uint32_t bits = uint32_t{b} << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// Reduces `inputs` (one vector per member) the way an algorithm does.
template <typename T, typename A = T>
std::vector<T> Reduce(DType dtype, ReduceOp op,
                      const std::vector<std::vector<T>>& inputs,
                      double divisor = 1.0) {
  const size_t n = inputs[0].size();
  std::vector<A> acc(n);
  LoadAccumulator(dtype, inputs[0].data(), acc.data(), n);
  for (size_t m = 1; m < inputs.size(); ++m) {
    AccumulateInto(dtype, op, inputs[m].data(), acc.data(), n);
  }
  std::vector<T> out(n);
  StoreAccumulator(AccumulatorDType(dtype), acc.data(), dtype, out.data(), n,
                   divisor);
  return out;
}

TEST(ReduceKernels, Float32SumMaxMinAndMean) {
  std::vector<std::vector<float>> in = {{1.5f, -2.0f, 3.0f},
                                        {0.25f, 4.0f, -6.0f}};
  EXPECT_EQ(Reduce<float>(DType::kF32, ReduceOp::kSum, in),
            (std::vector<float>{1.75f, 2.0f, -3.0f}));
  EXPECT_EQ(Reduce<float>(DType::kF32, ReduceOp::kMax, in),
            (std::vector<float>{1.5f, 4.0f, 3.0f}));
  EXPECT_EQ(Reduce<float>(DType::kF32, ReduceOp::kMin, in),
            (std::vector<float>{0.25f, -2.0f, -6.0f}));
  EXPECT_EQ(Reduce<float>(DType::kF32, ReduceOp::kSum, in, 2.0),
            (std::vector<float>{0.875f, 1.0f, -1.5f}));
}

TEST(ReduceKernels, MaxAndMinPropagateNaNWhateverTheOrder) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (auto op : {ReduceOp::kMax, ReduceOp::kMin}) {
    auto a = Reduce<float>(DType::kF32, op, {{nan, 1.0f}, {1.0f, nan}});
    EXPECT_TRUE(std::isnan(a[0]) && std::isnan(a[1])) << ReduceOpName(op);
  }
}

TEST(ReduceKernels, IntegersWrapAndAreNeverDivided) {
  auto sum =
      Reduce<int8_t>(DType::kS8, ReduceOp::kSum, {{120, -128}, {10, -1}}, 4.0);
  EXPECT_EQ(sum, (std::vector<int8_t>{-126, 127}));
  auto big =
      Reduce<uint32_t>(DType::kU32, ReduceOp::kSum, {{0xffffffffu}, {2u}});
  EXPECT_EQ(big[0], 1u);
}

TEST(ReduceKernels, HalvesAccumulateInFloat32AndRoundOnce) {
  EXPECT_EQ(AccumulatorDType(DType::kBF16), DType::kF32);
  EXPECT_EQ(AccumulatorDType(DType::kF16), DType::kF32);
  EXPECT_EQ(AccumulatorDType(DType::kS32), DType::kS32);
  // 256 + 1 + 1: bfloat16 cannot hold 257, so rounding after every addition
  // gives 256 twice; one rounding at the end gives 258.
  std::vector<std::vector<uint16_t>> in = {
      {BF16Bits(256.0f)}, {BF16Bits(1.0f)}, {BF16Bits(1.0f)}};
  auto out = Reduce<uint16_t, float>(DType::kBF16, ReduceOp::kSum, in);
  EXPECT_EQ(FromBF16(out[0]), 258.0f);
}

TEST(ReduceKernels, StoreRoundsFloat32ToBFloat16ToNearestEven) {
  // 1 + 2^-8 is halfway between two bfloat16 neighbours: ties go to even (1.0);
  // 1 + 3 * 2^-8 rounds up to 1 + 2^-6.
  std::vector<float> acc = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256};
  std::vector<uint16_t> out(2);
  StoreAccumulator(DType::kF32, acc.data(), DType::kBF16, out.data(), 2, 1.0);
  EXPECT_EQ(FromBF16(out[0]), 1.0f);
  EXPECT_EQ(FromBF16(out[1]), 1.0f + 1.0f / 64);
}

TEST(ReduceKernels, RefusesWhatItCannotReduceNamingDtypeAndOp) {
  EXPECT_TRUE(CheckReducible(DType::kF32, ReduceOp::kMax, "psum").ok());
  EXPECT_TRUE(CheckReducible(DType::kC64, ReduceOp::kSum, "psum").ok());
  Status bad = CheckReducible(DType::kBool, ReduceOp::kSum, "all_reduce");
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("all_reduce: cannot reduce bool"),
            std::string::npos)
      << bad.message();
  Status complex_max = CheckReducible(DType::kC128, ReduceOp::kMax, "pmax");
  EXPECT_FALSE(complex_max.ok());
  EXPECT_NE(complex_max.message().find("complex128"), std::string::npos)
      << complex_max.message();
}

}  // namespace
}  // namespace hetjax::collectives
