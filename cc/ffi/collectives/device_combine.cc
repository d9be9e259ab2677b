#include "cc/ffi/collectives/device_combine.h"

#include <algorithm>
#include <string>
#include <vector>

#include "cc/device/host_copy.h"

namespace hetjax::collectives {
namespace {

using device::ElementType;

bool ToElement(DType dtype, ElementType* out) {
  switch (dtype) {
    case DType::kS8:
      *out = ElementType::kS8;
      return true;
    case DType::kS16:
      *out = ElementType::kS16;
      return true;
    case DType::kS32:
      *out = ElementType::kS32;
      return true;
    case DType::kS64:
      *out = ElementType::kS64;
      return true;
    case DType::kU8:
      *out = ElementType::kU8;
      return true;
    case DType::kU16:
      *out = ElementType::kU16;
      return true;
    case DType::kU32:
      *out = ElementType::kU32;
      return true;
    case DType::kU64:
      *out = ElementType::kU64;
      return true;
    case DType::kF16:
      *out = ElementType::kF16;
      return true;
    case DType::kBF16:
      *out = ElementType::kBF16;
      return true;
    case DType::kF32:
      *out = ElementType::kF32;
      return true;
    case DType::kF64:
      *out = ElementType::kF64;
      return true;
    default:
      return false;
  }
}

device::CombineOp ToCombineOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return device::CombineOp::kMax;
    case ReduceOp::kMin:
      return device::CombineOp::kMin;
    case ReduceOp::kSum:
      break;
  }
  return device::CombineOp::kSum;
}

// The host device runs "streams" inline: the host kernels, in the order
// the device kernel uses (widen a, combine b into it, store once).
// Elements per block of the host combine: its accumulators (at most 256
// KiB) stay in the core's cache between the load, the accumulation and the
// store.
constexpr size_t kHostCombineBlock = size_t{1} << 15;

Status CombineOnHost(DType in_dtype, ReduceOp op, Operand a, Operand b,
                     void* out, DType out_dtype, size_t count, double divisor) {
  const DType acc_dtype = AccumulatorDType(in_dtype);
  const size_t acc_size = DTypeSize(acc_dtype);
  const auto at = [](const void* base, DType dtype, size_t i) {
    return static_cast<const char*>(base) + i * DTypeSize(dtype);
  };
  // `out` over an operand of another element size: element i of the
  // result lands where other elements of the operand still wait, so the
  // whole operand is read first.
  const auto overlaps_resized = [&](const Operand& x) {
    const char* lo = static_cast<const char*>(x.data);
    const char* out_lo = static_cast<const char*>(out);
    return x.data != nullptr && DTypeSize(x.dtype) != DTypeSize(out_dtype) &&
           lo < out_lo + count * DTypeSize(out_dtype) &&
           out_lo < lo + count * DTypeSize(x.dtype);
  };
  if (overlaps_resized(a) || overlaps_resized(b)) {
    std::vector<char> acc(count * acc_size);
    LoadAccumulator(a.dtype, a.data, acc.data(), count);
    if (b.data != nullptr) {
      AccumulateInto(b.dtype, op, b.data, acc.data(), count);
    }
    StoreAccumulator(acc_dtype, acc.data(), out_dtype, out, count, divisor);
    return Status::Ok();
  }
  // Element i of the result needs element i of each operand alone: blocks
  // on the host copy threads, as the CPU end's copies run.
  device::ParallelFor(count, kHostCombineBlock, [&](size_t begin, size_t end) {
    std::vector<char> acc(std::min(end - begin, kHostCombineBlock) * acc_size);
    for (size_t i = begin; i < end; i += kHostCombineBlock) {
      const size_t n = std::min(end - i, kHostCombineBlock);
      LoadAccumulator(a.dtype, at(a.data, a.dtype, i), acc.data(), n);
      if (b.data != nullptr) {
        AccumulateInto(b.dtype, op, at(b.data, b.dtype, i), acc.data(), n);
      }
      StoreAccumulator(acc_dtype, acc.data(), out_dtype,
                       const_cast<char*>(at(out, out_dtype, i)), n, divisor);
    }
  });
  return Status::Ok();
}

}  // namespace

Status DescribeCombine(DType in_dtype, ReduceOp op, Operand a, Operand b,
                       void* out, DType out_dtype, size_t count, double divisor,
                       device::Combine* combine) {
  device::Combine& c = *combine;
  const bool known = ToElement(AccumulatorDType(in_dtype), &c.wide) &&
                     ToElement(a.dtype, &c.a_type) &&
                     ToElement(out_dtype, &c.out_type) &&
                     (b.data == nullptr || ToElement(b.dtype, &c.b_type));
  if (!known) {
    return Status(StatusCode::kInvalidArgument,
                  std::string("gpu collective: cannot reduce ") +
                      DTypeName(in_dtype) + " on the device (" +
                      DTypeName(a.dtype) + ", " + DTypeName(b.dtype) + " -> " +
                      DTypeName(out_dtype) + ")");
  }
  c.a = a.data;
  c.b = b.data;
  c.out = out;
  c.count = count;
  c.op = ToCombineOp(op);
  c.divisor = divisor;
  return Status::Ok();
}

bool DeviceReducible(DType dtype) {
  ElementType unused;
  return ToElement(dtype, &unused);
}

Status CombineAsync(device::Device& device, device::Stream stream,
                    DType in_dtype, ReduceOp op, Operand a, Operand b,
                    void* out, DType out_dtype, size_t count, double divisor) {
  if (&device == &device::HostDevice()) {
    return CombineOnHost(in_dtype, op, a, b, out, out_dtype, count, divisor);
  }
  device::Combine c;
  Status s =
      DescribeCombine(in_dtype, op, a, b, out, out_dtype, count, divisor, &c);
  if (!s.ok()) return s;
  return device.CombineAsync(c, stream);
}

}  // namespace hetjax::collectives
