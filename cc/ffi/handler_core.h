// What every send/recv/collective handler shares, whatever the platform:
// turning an XLA FFI buffer into the transport's TensorSpec, and a transport
// Status into an ffi::Error whose text reaches Python unchanged.
#pragma once

#include <string>

#include "cc/transport/bridge.h"
#include "cc/transport/status.h"
#include "cc/transport/tensor_spec.h"
#include "xla/ffi/api/ffi.h"

namespace hetjax::ffi_core {

namespace ffi = ::xla::ffi;

// kInvalid for XLA types the wire does not carry (sub-byte ints, fp8, token).
DType ToWireDType(ffi::DataType dtype);

// Spec of an FFI buffer (dtype + dims). Fails for unsupported dtypes or
// ranks above kMaxRank, naming the op for the message.
Status SpecOf(const ffi::AnyBuffer& buffer, const char* op_name,
              TensorSpec* spec);
Status SpecOf(const ffi::Result<ffi::AnyBuffer>& buffer, const char* op_name,
              TensorSpec* spec);

// The running bridge, or an error telling the user to call hetjax.init().
Status RequireBridge(Bridge** bridge);

// ok -> ffi::Error::Success(); anything else keeps its message, prefixed
// with "hetjax <op_name>: ".
ffi::Error ToFfiError(const Status& status, const char* op_name);

}  // namespace hetjax::ffi_core
