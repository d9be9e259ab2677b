// Element-wise reduction over host buffers, for every dtype a collective
// accepts. float16 and bfloat16 accumulate in float32 and are rounded once,
// when the result is stored; every other dtype accumulates in itself
// (integers wrap around, as XLA's own integer psum does).
//
// These kernels are the whole of the arithmetic a collective does: the CPU
// handlers call them on XLA's buffers, a GPU variant on its staging buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cc/transport/status.h"
#include "cc/transport/tensor_spec.h"

namespace hetjax::collectives {

// Values are part of the FFI contract (attribute `op`).
enum class ReduceOp : int64_t { kSum = 0, kMax = 1, kMin = 2 };

const char* ReduceOpName(ReduceOp op);

// float32 for float16/bfloat16, the dtype itself otherwise.
DType AccumulatorDType(DType dtype);

// Ok if `op` is defined on `dtype` (no bool; complex only sums).
Status CheckReducible(DType dtype, ReduceOp op, const char* what);

// acc[i] = (acc type) in[i]
void LoadAccumulator(DType in_dtype, const void* in, void* acc, size_t n);
// acc[i] = op(acc[i], (acc type) in[i])
void AccumulateInto(DType in_dtype, ReduceOp op, const void* in, void* acc,
                    size_t n);
// out[i] = (out type) (acc[i] / divisor); divisor 1 leaves values unchanged
// (integers are never divided). The only rounding of a half-precision
// result happens here.
void StoreAccumulator(DType acc_dtype, const void* acc, DType out_dtype,
                      void* out, size_t n, double divisor);

}  // namespace hetjax::collectives
