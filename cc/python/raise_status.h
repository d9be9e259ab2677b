// Turning a transport Status into the matching hetjax.errors exception, so
// Python callers catch MismatchError / BridgeTimeoutError / PeerLostError
// with the transport's message unchanged.
#pragma once

#include "cc/transport/status.h"

namespace hetjax::python {

// Snake-case name of a status code, as hetjax.errors.error_class expects.
const char* StatusCodeName(StatusCode code);

// Does nothing for ok; otherwise raises (throws nanobind::python_error).
// Needs the GIL.
void RaiseIfError(const Status& status);

}  // namespace hetjax::python
