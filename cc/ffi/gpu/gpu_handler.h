// What the GPU send and recv handlers share beyond handler_core: reaching
// the process's staging context and writing the output token in stream
// order. Streams are taken as void*: the handlers never touch a vendor API,
// the device layer does.
#pragma once

#include "cc/ffi/gpu/staging_context.h"
#include "cc/transport/status.h"
#include "xla/ffi/api/ffi.h"

namespace hetjax::gpu {

// The process's staging context, or an error if this build has no GPU
// device layer (cannot happen when the handlers are registered).
Status RequireStagingContext(StagingContext** context);

// The token carries ordering only; a one-byte memset on the stream makes the
// output token come after the op's copies in stream order.
Status WriteToken(StagingContext& context, device::Stream stream,
                  ::xla::ffi::Result<::xla::ffi::AnyBuffer>& token_out);

}  // namespace hetjax::gpu
