// The host device's combine (what a CPU island's member of a channel
// collective reduces with, on the host copy threads) against the reduce
// kernels run once over the whole operands: bitwise, at sizes spanning many
// blocks and pieces, and with the result written over an operand, of the
// same element size or not.
#include "cc/ffi/collectives/device_combine.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "cc/device/device.h"
#include "gtest/gtest.h"

namespace hetjax::collectives {
namespace {

std::vector<float> Values(size_t n, uint32_t seed) {
  std::vector<float> out(n);
  uint32_t x = seed * 2654435761u + 7;
  for (float& v : out) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(x >> 8)) / 65536.0f;
  }
  return out;
}

std::vector<uint16_t> ToBF16(const std::vector<float>& xs) {
  std::vector<uint16_t> out(xs.size());
  StoreAccumulator(DType::kF32, xs.data(), DType::kBF16, out.data(), xs.size(),
                   1.0);
  return out;
}

// What CombineAsync must produce: the kernels over the whole operands.
template <typename Out, typename A, typename B>
std::vector<Out> Reference(DType in_dtype, ReduceOp op, const A& a,
                           DType a_type, const B& b, DType b_type,
                           DType out_dtype, double divisor) {
  const size_t n = a.size();
  std::vector<float> acc(n);
  LoadAccumulator(a_type, a.data(), acc.data(), n);
  AccumulateInto(b_type, op, b.data(), acc.data(), n);
  std::vector<Out> out(n);
  StoreAccumulator(AccumulatorDType(in_dtype), acc.data(), out_dtype,
                   out.data(), n, divisor);
  return out;
}

// Several blocks per piece and an odd tail, at several sizes.
const size_t kCounts[] = {1, 4097, (size_t{1} << 15) + 3,
                          (size_t{3} << 18) + 5};

TEST(HostCombine, Float32SumsAndMeansEqualOnePassBitwise) {
  for (size_t n : kCounts) {
    const auto a = Values(n, 1), b = Values(n, 2);
    for (double divisor : {1.0, 3.0}) {
      std::vector<float> out(n, -1.0f);
      ASSERT_TRUE(CombineAsync(device::HostDevice(), nullptr, DType::kF32,
                               ReduceOp::kSum, {a.data(), DType::kF32},
                               {b.data(), DType::kF32}, out.data(), DType::kF32,
                               n, divisor)
                      .ok());
      const auto want =
          Reference<float>(DType::kF32, ReduceOp::kSum, a, DType::kF32, b,
                           DType::kF32, DType::kF32, divisor);
      EXPECT_EQ(0, std::memcmp(out.data(), want.data(), n * 4)) << n;
    }
  }
}

TEST(HostCombine, WritesOverAnOperandOfItsOwnSize) {
  for (size_t n : kCounts) {
    auto a = Values(n, 3);
    const auto b = Values(n, 4);
    const auto want =
        Reference<float>(DType::kF32, ReduceOp::kMax, a, DType::kF32, b,
                         DType::kF32, DType::kF32, 1.0);
    ASSERT_TRUE(CombineAsync(device::HostDevice(), nullptr, DType::kF32,
                             ReduceOp::kMax, {a.data(), DType::kF32},
                             {b.data(), DType::kF32}, a.data(), DType::kF32, n,
                             1.0)
                    .ok());
    EXPECT_EQ(0, std::memcmp(a.data(), want.data(), n * 4)) << n;
  }
}

TEST(HostCombine, WritesFloat32OverBFloat16Operands) {
  // A bfloat16 contribution and a float32 partial, the float32 sum landing
  // where the bfloat16 operand starts: its later elements must be read
  // before the wider result covers them.
  for (size_t n : kCounts) {
    const auto partial = Values(n, 5);
    const auto half = ToBF16(Values(n, 6));
    std::vector<uint8_t> buffer(n * 4);
    std::memcpy(buffer.data(), half.data(), n * 2);
    const auto want =
        Reference<float>(DType::kBF16, ReduceOp::kSum, half, DType::kBF16,
                         partial, DType::kF32, DType::kF32, 1.0);
    ASSERT_TRUE(CombineAsync(device::HostDevice(), nullptr, DType::kBF16,
                             ReduceOp::kSum, {buffer.data(), DType::kBF16},
                             {partial.data(), DType::kF32}, buffer.data(),
                             DType::kF32, n, 1.0)
                    .ok());
    EXPECT_EQ(0, std::memcmp(buffer.data(), want.data(), n * 4)) << n;
  }
}

TEST(HostCombine, RoundsOnceIntoBFloat16) {
  for (size_t n : kCounts) {
    const auto a = ToBF16(Values(n, 7)), b = ToBF16(Values(n, 8));
    std::vector<uint16_t> out(n);
    ASSERT_TRUE(CombineAsync(device::HostDevice(), nullptr, DType::kBF16,
                             ReduceOp::kSum, {a.data(), DType::kBF16},
                             {b.data(), DType::kBF16}, out.data(), DType::kBF16,
                             n, 2.0)
                    .ok());
    const auto want =
        Reference<uint16_t>(DType::kBF16, ReduceOp::kSum, a, DType::kBF16, b,
                            DType::kBF16, DType::kBF16, 2.0);
    EXPECT_EQ(out, want) << n;
  }
}

}  // namespace
}  // namespace hetjax::collectives
