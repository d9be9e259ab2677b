// The combine kernel (combine.h), one source for CUDA and HIP. A
// grid-stride loop over elements: the collectives call it on pieces of
// megabytes, where it is bound by memory bandwidth, not by arithmetic.
#include <algorithm>
#include <string>
#include <type_traits>

#include "cc/device/gpu_combine.h"
#include "cc/device/gpu_vendor.h"

#if defined(HETJAX_ROCM)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif

namespace hetjax::device {
namespace {

namespace v = vendor;

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

template <typename W>
__global__ void CombineKernel(Combine c) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < c.count; i += stride) {
    W x = Elements<W>::Load(c.a, c.a_type, i);
    if (c.b != nullptr) {
      x = Apply(c.op, x, Elements<W>::Load(c.b, c.b_type, i));
    }
    Elements<W>::Store(c.out, c.out_type, i,
                       Scale(x, c.divisor, std::is_integral<W>()));
  }
}

template <typename W>
Status Launch(const Combine& c, Stream stream) {
  // Enough blocks to fill an H200 or MI300 several times over; the loop
  // strides across the rest.
  constexpr unsigned kThreads = 256;
  constexpr size_t kMaxBlocks = 4096;
  const size_t blocks =
      std::min(kMaxBlocks, (c.count + kThreads - 1) / kThreads);
  CombineKernel<W><<<static_cast<unsigned>(blocks), kThreads, 0,
                     static_cast<v::StreamT>(stream)>>>(c);
  const v::Error error = v::GetLastError();
  if (error == v::kSuccess) return Status::Ok();
  return Status(StatusCode::kInternal,
                std::string(v::kName) + " launch CombineKernel(" +
                    std::to_string(c.count) +
                    " elements): " + v::ErrorString(error));
}

bool Storable(ElementType wide, ElementType type) {
  return type == wide ||
         (wide == ElementType::kF32 &&
          (type == ElementType::kBF16 || type == ElementType::kF16));
}

}  // namespace

Status LaunchCombine(const Combine& c, Stream stream) {
  if (!Storable(c.wide, c.a_type) || !Storable(c.wide, c.out_type) ||
      (c.b != nullptr && !Storable(c.wide, c.b_type))) {
    return Status(
        StatusCode::kInvalidArgument,
        std::string(v::kName) + " combine: element types " +
            std::to_string(int(c.a_type)) + ", " +
            std::to_string(int(c.b_type)) + " -> " +
            std::to_string(int(c.out_type)) + " do not fit arithmetic type " +
            std::to_string(int(c.wide)) + " (halves only widen to float32)");
  }
  if (c.count == 0) return Status::Ok();
  switch (c.wide) {
    case ElementType::kS8:
      return Launch<int8_t>(c, stream);
    case ElementType::kS16:
      return Launch<int16_t>(c, stream);
    case ElementType::kS32:
      return Launch<int32_t>(c, stream);
    case ElementType::kS64:
      return Launch<int64_t>(c, stream);
    case ElementType::kU8:
      return Launch<uint8_t>(c, stream);
    case ElementType::kU16:
      return Launch<uint16_t>(c, stream);
    case ElementType::kU32:
      return Launch<uint32_t>(c, stream);
    case ElementType::kU64:
      return Launch<uint64_t>(c, stream);
    case ElementType::kF32:
      return Launch<float>(c, stream);
    case ElementType::kF64:
      return Launch<double>(c, stream);
    case ElementType::kF16:
    case ElementType::kBF16:
      break;
  }
  return Status(StatusCode::kInvalidArgument,
                std::string(v::kName) +
                    " combine: a half type is never an arithmetic type");
}

}  // namespace hetjax::device
