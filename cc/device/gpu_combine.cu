// The combine kernel (combine.h), one source for CUDA and HIP. A
// grid-stride loop over elements: the collectives call it on pieces of
// megabytes, where it is bound by memory bandwidth, not by arithmetic.
#include <algorithm>
#include <string>
#include <type_traits>

#include "cc/device/gpu_combine.h"
#include "cc/device/gpu_elements.cuh"
#include "cc/device/gpu_vendor.h"

namespace hetjax::device {
namespace {

namespace v = vendor;
using elements::Apply;
using elements::Elements;
using elements::Scale;

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

}  // namespace

Status LaunchCombine(const Combine& c, Stream stream) {
  using elements::Storable;
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
  return elements::WithWideType(
      c.wide,
      Status(StatusCode::kInvalidArgument,
             std::string(v::kName) +
                 " combine: a half type is never an arithmetic type"),
      [&](auto wide) { return Launch<decltype(wide)>(c, stream); });
}

}  // namespace hetjax::device
