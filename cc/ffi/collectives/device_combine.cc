#include "cc/ffi/collectives/device_combine.h"

#include <string>
#include <vector>

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
Status CombineOnHost(DType in_dtype, ReduceOp op, Operand a, Operand b,
                     void* out, DType out_dtype, size_t count, double divisor) {
  const DType acc_dtype = AccumulatorDType(in_dtype);
  std::vector<char> acc(count * DTypeSize(acc_dtype));
  LoadAccumulator(a.dtype, a.data, acc.data(), count);
  if (b.data != nullptr) AccumulateInto(b.dtype, op, b.data, acc.data(), count);
  StoreAccumulator(acc_dtype, acc.data(), out_dtype, out, count, divisor);
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
