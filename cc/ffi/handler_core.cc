#include "cc/ffi/handler_core.h"

#include <string>

namespace hetjax::ffi_core {

DType ToWireDType(ffi::DataType dtype) {
  switch (dtype) {
    case ffi::DataType::PRED:
      return DType::kBool;
    case ffi::DataType::S8:
      return DType::kS8;
    case ffi::DataType::S16:
      return DType::kS16;
    case ffi::DataType::S32:
      return DType::kS32;
    case ffi::DataType::S64:
      return DType::kS64;
    case ffi::DataType::U8:
      return DType::kU8;
    case ffi::DataType::U16:
      return DType::kU16;
    case ffi::DataType::U32:
      return DType::kU32;
    case ffi::DataType::U64:
      return DType::kU64;
    case ffi::DataType::F16:
      return DType::kF16;
    case ffi::DataType::BF16:
      return DType::kBF16;
    case ffi::DataType::F32:
      return DType::kF32;
    case ffi::DataType::F64:
      return DType::kF64;
    case ffi::DataType::C64:
      return DType::kC64;
    case ffi::DataType::C128:
      return DType::kC128;
    default:
      return DType::kInvalid;
  }
}

namespace {

Status SpecOfParts(ffi::DataType dtype, ffi::Span<const int64_t> dims,
                   const char* op_name, TensorSpec* spec) {
  spec->dtype = ToWireDType(dtype);
  if (spec->dtype == DType::kInvalid) {
    return Status(StatusCode::kInvalidArgument,
                  std::string(op_name) + ": XLA element type " +
                      std::to_string(static_cast<int>(dtype)) +
                      " cannot cross the bridge (expected bool, int8..64, "
                      "uint8..64, float16/bfloat16/32/64 or complex64/128)");
  }
  if (dims.size() > static_cast<size_t>(kMaxRank)) {
    return Status(StatusCode::kInvalidArgument,
                  std::string(op_name) + ": rank " +
                      std::to_string(dims.size()) + " exceeds the bridge's " +
                      "maximum rank " + std::to_string(kMaxRank));
  }
  spec->rank = static_cast<int32_t>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) spec->dims[i] = dims[i];
  for (size_t i = dims.size(); i < static_cast<size_t>(kMaxRank); ++i) {
    spec->dims[i] = 0;
  }
  return Status::Ok();
}

ffi::ErrorCode ToFfiCode(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return ffi::ErrorCode::kOk;
    case StatusCode::kInvalidArgument:
      return ffi::ErrorCode::kInvalidArgument;
    case StatusCode::kMismatch:
      return ffi::ErrorCode::kFailedPrecondition;
    case StatusCode::kTimeout:
      return ffi::ErrorCode::kDeadlineExceeded;
    case StatusCode::kPeerLost:
      return ffi::ErrorCode::kUnavailable;
    case StatusCode::kResourceExhausted:
      return ffi::ErrorCode::kResourceExhausted;
    case StatusCode::kAborted:
      return ffi::ErrorCode::kAborted;
    case StatusCode::kInternal:
      return ffi::ErrorCode::kInternal;
  }
  return ffi::ErrorCode::kInternal;
}

}  // namespace

Status SpecOf(const ffi::AnyBuffer& buffer, const char* op_name,
              TensorSpec* spec) {
  return SpecOfParts(buffer.element_type(), buffer.dimensions(), op_name, spec);
}

Status SpecOf(const ffi::Result<ffi::AnyBuffer>& buffer, const char* op_name,
              TensorSpec* spec) {
  // Result offers no const access; it wraps a cheap buffer view, so copy.
  ffi::Result<ffi::AnyBuffer> view = buffer;
  return SpecOf(*view, op_name, spec);
}

Status RequireBridge(Bridge** bridge) {
  *bridge = Bridge::Get();
  if (*bridge == nullptr) {
    return Status(StatusCode::kAborted,
                  "the bridge is not running in this process: call "
                  "hetjax.init() before running programs that send or recv");
  }
  return Status::Ok();
}

ffi::Error ToFfiError(const Status& status, const char* op_name) {
  if (status.ok()) return ffi::Error::Success();
  return ffi::Error(ToFfiCode(status.code()),
                    std::string("hetjax ") + op_name + ": " + status.message());
}

}  // namespace hetjax::ffi_core
