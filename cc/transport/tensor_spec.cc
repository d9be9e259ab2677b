#include "cc/transport/tensor_spec.h"

#include <algorithm>

namespace hetjax {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kS8:
    case DType::kU8:
    case DType::kBytes:
      return 1;
    case DType::kS16:
    case DType::kU16:
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kS32:
    case DType::kU32:
    case DType::kF32:
      return 4;
    case DType::kS64:
    case DType::kU64:
    case DType::kF64:
    case DType::kC64:
      return 8;
    case DType::kC128:
      return 16;
    case DType::kInvalid:
      break;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return "bool";
    case DType::kS8:
      return "int8";
    case DType::kS16:
      return "int16";
    case DType::kS32:
      return "int32";
    case DType::kS64:
      return "int64";
    case DType::kU8:
      return "uint8";
    case DType::kU16:
      return "uint16";
    case DType::kU32:
      return "uint32";
    case DType::kU64:
      return "uint64";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF32:
      return "float32";
    case DType::kF64:
      return "float64";
    case DType::kC64:
      return "complex64";
    case DType::kC128:
      return "complex128";
    case DType::kBytes:
      return "bytes";
    case DType::kInvalid:
      break;
  }
  return "invalid";
}

TensorSpec MakeSpec(DType dtype, const std::vector<int64_t>& dims) {
  TensorSpec spec;
  spec.dtype = dtype;
  spec.rank = static_cast<int32_t>(std::min<size_t>(dims.size(), kMaxRank));
  for (int i = 0; i < spec.rank; ++i) spec.dims[i] = dims[i];
  return spec;
}

uint64_t TensorSpec::num_elements() const {
  uint64_t count = 1;
  for (int i = 0; i < rank && i < kMaxRank; ++i) {
    count *= dims[i] < 0 ? 0 : static_cast<uint64_t>(dims[i]);
  }
  return count;
}

std::string TensorSpec::ToString() const {
  std::string out = DTypeName(dtype);
  out += '[';
  for (int i = 0; i < rank && i < kMaxRank; ++i) {
    if (i > 0) out += ',';
    out += std::to_string(dims[i]);
  }
  out += ']';
  return out;
}

bool TensorSpec::operator==(const TensorSpec& other) const {
  if (dtype != other.dtype || rank != other.rank) return false;
  for (int i = 0; i < rank && i < kMaxRank; ++i) {
    if (dims[i] != other.dims[i]) return false;
  }
  return true;
}

}  // namespace hetjax
