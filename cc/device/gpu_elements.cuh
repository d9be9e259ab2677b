// Element arithmetic shared by the device kernels that reduce (the combine
// kernel, gpu_combine.cu; the pair exchange, gpu_pair_exchange.cu): how an
// element of each type widens, combines and rounds, so every GPU path
// computes exactly what the host kernels do
// (cc/ffi/collectives/reduce_kernels.cc). One source for CUDA and HIP.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cc/device/combine.h"
#include "cc/device/gpu_vendor.h"

#if defined(HETJAX_ROCM)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif

namespace hetjax::device::elements {

__device__ inline float FromBF16(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest even, as XLA's convert does and the host kernels
// (cc/ffi/collectives/reduce_kernels.cc) do: both paths round alike, so a
// GPU result equals the CPU one bitwise. NaN stays a (quiet) NaN.
__device__ inline uint16_t ToBF16(float x) {
  uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Loading and storing one element as the arithmetic type W. Only float32
// has narrower storage types (the halves).
template <typename W>
struct Elements {
  __device__ static W Load(const void* p, ElementType, size_t i) {
    return static_cast<const W*>(p)[i];
  }
  __device__ static void Store(void* p, ElementType, size_t i, W x) {
    static_cast<W*>(p)[i] = x;
  }
};

template <>
struct Elements<float> {
  __device__ static float Load(const void* p, ElementType type, size_t i) {
    switch (type) {
      case ElementType::kBF16:
        return FromBF16(static_cast<const uint16_t*>(p)[i]);
      case ElementType::kF16:
        return __half2float(static_cast<const __half*>(p)[i]);
      default:
        return static_cast<const float*>(p)[i];
    }
  }
  __device__ static void Store(void* p, ElementType type, size_t i, float x) {
    switch (type) {
      case ElementType::kBF16:
        static_cast<uint16_t*>(p)[i] = ToBF16(x);
        return;
      case ElementType::kF16:
        static_cast<__half*>(p)[i] = __float2half_rn(x);
        return;
      default:
        static_cast<float*>(p)[i] = x;
    }
  }
};

// Integers add in their unsigned twin so overflow wraps instead of being UB
// (as XLA's integer psum and the host kernels do).
template <typename W>
__device__ W Add(W a, W b, std::true_type /*integral*/) {
  using U = typename std::make_unsigned<W>::type;
  return static_cast<W>(static_cast<U>(a) + static_cast<U>(b));
}
template <typename W>
__device__ W Add(W a, W b, std::false_type) {
  return a + b;
}

// NaN propagates, the first operand's when both are NaN (host kernels too).
template <typename W>
__device__ W Apply(CombineOp op, W a, W b) {
  if (op == CombineOp::kSum) return Add(a, b, std::is_integral<W>());
  if (a != a) return a;
  if (b != b) return b;
  if (op == CombineOp::kMax) return a < b ? b : a;
  return b < a ? b : a;
}

template <typename W>
__device__ W Scale(W x, double, std::true_type /*integral*/) {
  return x;
}
template <typename W>
__device__ W Scale(W x, double divisor, std::false_type) {
  return divisor == 1.0 ? x : static_cast<W>(x / static_cast<W>(divisor));
}

// Whether `type` may hold values of arithmetic type `wide` (itself, or a
// half widened to float32).
inline bool Storable(ElementType wide, ElementType type) {
  return type == wide ||
         (wide == ElementType::kF32 &&
          (type == ElementType::kBF16 || type == ElementType::kF16));
}

// Calls fn(W{}) with W the C++ arithmetic type of `wide` and returns its
// result; `half` when `wide` is a half (never an arithmetic type).
template <typename Fn, typename R>
R WithWideType(ElementType wide, R half, Fn&& fn) {
  switch (wide) {
    case ElementType::kS8:
      return fn(int8_t{});
    case ElementType::kS16:
      return fn(int16_t{});
    case ElementType::kS32:
      return fn(int32_t{});
    case ElementType::kS64:
      return fn(int64_t{});
    case ElementType::kU8:
      return fn(uint8_t{});
    case ElementType::kU16:
      return fn(uint16_t{});
    case ElementType::kU32:
      return fn(uint32_t{});
    case ElementType::kU64:
      return fn(uint64_t{});
    case ElementType::kF32:
      return fn(float{});
    case ElementType::kF64:
      return fn(double{});
    case ElementType::kF16:
    case ElementType::kBF16:
      break;
  }
  return half;
}

}  // namespace hetjax::device::elements
