// What a message claims to carry: dtype and shape. Shared by the wire header,
// the receive-side check and the FFI layer, so every error names both sides
// in the same words.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hetjax {

// Wire codes are ours (not XLA's) so the transport stays XLA-free; the FFI
// layer maps XLA FFI data types onto these. Values are part of the protocol.
enum class DType : uint8_t {
  kInvalid = 0,
  kBool = 1,
  kS8 = 2,
  kS16 = 3,
  kS32 = 4,
  kS64 = 5,
  kU8 = 6,
  kU16 = 7,
  kU32 = 8,
  kU64 = 9,
  kF16 = 10,
  kBF16 = 11,
  kF32 = 12,
  kF64 = 13,
  kC64 = 14,
  kC128 = 15,
  kBytes = 16,  // untyped payload (benchmarks, control data)
};

// Bytes per element; 0 for kInvalid.
size_t DTypeSize(DType dtype);
// Lower-case numpy-style name: "float32", "bfloat16", "bool", ...
const char* DTypeName(DType dtype);

inline constexpr int kMaxRank = 8;

struct TensorSpec {
  DType dtype = DType::kInvalid;
  int32_t rank = 0;
  int64_t dims[kMaxRank] = {};

  uint64_t num_elements() const;
  uint64_t num_bytes() const { return num_elements() * DTypeSize(dtype); }
  // "float32[2,3]"; scalars print as "float32[]".
  std::string ToString() const;
  bool operator==(const TensorSpec& other) const;
  bool operator!=(const TensorSpec& other) const { return !(*this == other); }
};

// A spec from a dtype and its dims; callers pass at most kMaxRank dims.
TensorSpec MakeSpec(DType dtype, const std::vector<int64_t>& dims);

}  // namespace hetjax
