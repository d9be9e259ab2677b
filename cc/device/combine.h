// Element-wise reduction on a device stream, the arithmetic of the GPU
// collectives (cc/ffi/collectives/device_combine.h maps their dtypes and
// ops onto these). The device layer only runs the kernel; which operands
// are combined in which order is the collectives' business, so a fixed
// order there stays bitwise repeatable here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hetjax::device {

enum class ElementType : uint8_t {
  kS8,
  kS16,
  kS32,
  kS64,
  kU8,
  kU16,
  kU32,
  kU64,
  kF16,
  kBF16,
  kF32,
  kF64,
};
enum class CombineOp : uint8_t { kSum, kMax, kMin };

// Bytes of one element, in the enum's order.
constexpr size_t ElementBytes(ElementType type) {
  constexpr uint8_t kBytes[] = {1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8};
  return kBytes[static_cast<size_t>(type)];
}
static_assert(ElementBytes(ElementType::kF64) == 8 &&
              ElementBytes(ElementType::kBF16) == 2);

// out[i] = Narrow(Op(Widen(a[i]), Widen(b[i])) / divisor), computed in
// `wide`; without b, out[i] = Narrow(Widen(a[i]) / divisor). Each of a, b
// and out is of type `wide`, or bfloat16 / float16 when `wide` is float32:
// halves never take part in arithmetic, they are widened on load and
// rounded once (to nearest even) on store. Integer sums wrap; max/min
// propagate NaN (the first operand's when both are NaN); integers are never
// divided. `out` may alias `a` or `b` element for element.
struct Combine {
  ElementType wide = ElementType::kF32;
  const void* a = nullptr;
  ElementType a_type = ElementType::kF32;
  const void* b = nullptr;
  ElementType b_type = ElementType::kF32;
  void* out = nullptr;
  ElementType out_type = ElementType::kF32;
  size_t count = 0;
  CombineOp op = CombineOp::kSum;
  double divisor = 1.0;
};

}  // namespace hetjax::device
