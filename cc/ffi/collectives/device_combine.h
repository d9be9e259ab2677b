// One stream-ordered reduction step of a GPU collective: out = op(a, b), or
// out = a alone, computed in the accumulator type of the collective's dtype
// (float32 for float16/bfloat16) and rounded once, on store, into
// out_dtype (divided by `divisor` first, as StoreAccumulator does). On a GPU
// this is the device layer's combine kernel (cc/device/combine.h); on the
// host device (the C++ tests) the host kernels (reduce_kernels.h) do the
// same arithmetic in the same operand order, so the two agree bitwise.
#pragma once

#include <cstddef>

#include "cc/device/device.h"
#include "cc/ffi/collectives/reduce_kernels.h"
#include "cc/transport/status.h"
#include "cc/transport/tensor_spec.h"

namespace hetjax::collectives {

struct Operand {
  const void* data = nullptr;  // device memory; null: no such operand
  DType dtype = DType::kInvalid;
};

// Whether the device kernel reduces `dtype` (every integer and float dtype;
// not complex, not bool).
bool DeviceReducible(DType dtype);

// `in_dtype`: the collective's operand dtype (its accumulator is the
// arithmetic type); a.dtype, b.dtype and out_dtype are each in_dtype or the
// accumulator's, or a half when the accumulator is float32.
Status CombineAsync(device::Device& device, device::Stream stream,
                    DType in_dtype, ReduceOp op, Operand a, Operand b,
                    void* out, DType out_dtype, size_t count, double divisor);

// The device layer's description of that step (what CombineAsync runs),
// for kernels that combine on the way (the pair exchange).
Status DescribeCombine(DType in_dtype, ReduceOp op, Operand a, Operand b,
                       void* out, DType out_dtype, size_t count, double divisor,
                       device::Combine* combine);

}  // namespace hetjax::collectives
