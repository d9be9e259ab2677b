#include "cc/python/raise_status.h"

#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace hetjax::python {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kMismatch:
      return "mismatch";
    case StatusCode::kTimeout:
      return "timeout";
    case StatusCode::kPeerLost:
      return "peer_lost";
    case StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case StatusCode::kAborted:
      return "aborted";
    case StatusCode::kInternal:
      return "internal";
  }
  return "internal";
}

void RaiseIfError(const Status& status) {
  if (status.ok()) return;
  // The classes live in Python (hetjax/errors.py) so that jax-side code can
  // raise the same ones without this module.
  nb::object error_class =
      nb::module_::import_("hetjax.errors")
          .attr("error_class")(StatusCodeName(status.code()));
  PyErr_SetString(error_class.ptr(), status.message().c_str());
  throw nb::python_error();
}

}  // namespace hetjax::python
